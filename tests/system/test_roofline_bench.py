"""benchmarks/roofline.py: the ceiling arithmetic against hand-computed values, and a --quick run
whose table has every row it should (an engine that cannot be imported is a line, not a crash).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
from transformers import LlamaConfig

from groupwise.runtime.models import tiny_random_model

PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "roofline.py"


@pytest.fixture(scope="module")
def roofline() -> ModuleType:
    spec = importlib.util.spec_from_file_location("roofline_bench", PATH)
    module = importlib.util.module_from_spec(spec)
    sys.modules["roofline_bench"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def small_config() -> LlamaConfig:
    return LlamaConfig(
        hidden_size=8,
        intermediate_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=4,
        vocab_size=10,
    )


def test_shape_counts_by_hand(roofline):
    shape = roofline.DecodeShape.from_config(small_config())
    # q 8x8, k and v 8x4 each, o 8x8 = 192; MLP 3 x 8 x 16 = 384; two norms 16.
    assert shape.layer_params == 192 + 384 + 16
    assert shape.non_embedding_params == 2 * 592 + 8  # + the final norm
    assert shape.lm_head_params == 10 * 8
    assert shape.matmul_params == 1272
    assert shape.kv_values_per_token == 2 * 2 * 1 * 4  # K and V, 2 layers, 1 head of 4


def test_step_cost_and_ceiling_by_hand(roofline):
    shape = roofline.DecodeShape.from_config(small_config())
    cost = roofline.decode_step_cost(shape, batch=3, context=5, weight_bytes=2, kv_bytes=2)
    # 2 x 1272 x 3 weight FLOPs + 4 x 2 layers x 3 rows x 5 positions x 8 attention width.
    assert cost.flops == 7632 + 960
    # 1272 weights x 2 bytes + 16 cached values x 3 rows x 5 positions x 2 bytes.
    assert cost.bytes == 2544 + 480
    # A step takes 0.1 s of compute and 0.01 s of memory: 3 tokens / 0.1 s, compute-bound.
    c = roofline.ceiling(cost, 3, flops_per_s=8592 * 10, bytes_per_s=3024 * 100)
    assert c.compute_tokens_per_s == pytest.approx(30.0)
    assert c.memory_tokens_per_s == pytest.approx(300.0)
    assert c.tokens_per_s == pytest.approx(30.0) and c.binds == "compute"
    c = roofline.ceiling(cost, 3, flops_per_s=8592 * 1000, bytes_per_s=3024 * 100)
    assert c.tokens_per_s == pytest.approx(300.0) and c.binds == "memory"


def test_mean_context_and_compile_payoff(roofline):
    assert roofline.mean_context(100, 48) == 124.5  # tokens 1..48 see 101..148 positions
    assert roofline.payoff_steps(10.0, 1.0, 0.5) == pytest.approx(20.0)
    assert roofline.payoff_steps(10.0, 0.5, 0.6) is None  # compiling never pays off


def test_parameter_counts_match_real_models(roofline):
    """The formula agrees with the parameters a model actually holds (SmolLM2-135M's sizes
    are checked against its known count without loading it)."""
    model = tiny_random_model()
    shape = roofline.DecodeShape.from_config(model.config)
    held = sum(p.numel() for n, p in model.named_parameters() if "embed_tokens" not in n)
    assert shape.non_embedding_params == held
    smollm2 = LlamaConfig(
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        head_dim=64,
        vocab_size=49152,
    )
    shape = roofline.DecodeShape.from_config(smollm2)
    assert shape.non_embedding_params + shape.lm_head_params == 134_515_008  # tied: 134.5M


def test_unknown_engine_is_refused(roofline):
    with pytest.raises(ValueError, match="unknown engine"):
        roofline.build_engine("nope", None, None, None)


def test_quick_run_prints_every_row(roofline, capsys, tmp_path):
    report = roofline.main(["--quick", "--json", str(tmp_path / "roofline.json")])
    text = capsys.readouterr().out
    assert "Roofline of decoding: tiny-random" in text
    assert "fp32 matmul: best" in text and "bf16 matmul: best" in text
    lines = text.splitlines()
    for dtype in ("fp32", "bf16"):
        for batch in (16, 64):
            assert any(line.split()[:2] == [dtype, str(batch)] for line in lines), (dtype, batch)
    for engine in ("hf-fp32", "hf-bf16", "static"):
        for batch in (16, 64):
            rows = [line.split() for line in lines if line.strip().startswith(engine + " ")]
            assert any(str(batch) in row for row in rows), (engine, batch)
    assert sum(line.startswith("target: ") for line in lines) == 2
    baseline = [r for r in report["engines"] if r["engine"] == "hf-bf16"]
    assert [r["ratio_to_baseline"] for r in baseline] == [1.0, 1.0]
    assert all(r["tokens_per_s"] > 0 for r in report["engines"])
    assert (tmp_path / "roofline.json").exists()
