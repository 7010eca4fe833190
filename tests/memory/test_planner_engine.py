"""The planner prices the rollout engine a run gets: ``generation_engine: auto`` resolved for each
shipped model and way of training as the trainer resolves it on a real (tiny) model of the same
architecture, and each row of the ``--gpu_memory`` table with its own engine."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from groupwise.memory import MemoryOptions, main, plan_grpo
from groupwise.memory import plan as planmod
from groupwise.memory.engine import STATIC_MODEL_TYPES, planned_engine, static_refusal
from groupwise.memory.fit import fit_rows
from groupwise.memory.shapes import BUILTIN_SHAPES, resolve_model_shape, shipped_configs
from groupwise.sections.generation import resolve_generation_engine

METHODS = ("full", "lora", "qlora")
# Small sizes: the static engine's checks read the config's fields, not its sizes.
TINY_SIZES = {
    "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 128,
}  # fmt: skip


def _tiny_model(model_type: str, fields: dict, method: str) -> torch.nn.Module:
    """A random model of ``model_type`` with ``fields`` at tiny sizes, trained as ``method``
    (LoRA through peft; QLoRA on a base quantised to 4 bits as groupwise quantises one)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    kept = {k: v for k, v in fields.items() if k not in ("hf_id", "model_type", "name")}
    config = AutoConfig.for_model(model_type, **{**kept, **TINY_SIZES})
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    if method == "qlora":
        pytest.importorskip("bitsandbytes")
        from groupwise.runtime.quantization import quantize_4bit

        model = quantize_4bit(model, "nf4", True, torch.float32, torch.device("cpu"))
    if method != "full":
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=2, target_modules="all-linear"))
    return model


def _cases() -> list[tuple[str, str, dict]]:
    cases = [(name, cfg["model_type"], cfg) for name, cfg in shipped_configs().items()]
    cases += [(name, shape.model_type, {}) for name, shape in BUILTIN_SHAPES.items()]
    return cases


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize(("name", "model_type", "fields"), _cases(), ids=lambda c: str(c)[:24])
def test_the_planned_engine_is_the_one_the_trainer_resolves(name, model_type, fields, method):
    from groupwise.rollout.static import supports

    model = _tiny_model(model_type, fields, method)
    expected, _ = resolve_generation_engine(
        "auto", device_type="cuda", static_unsupported=supports(model)
    )
    shape = resolve_model_shape(name)
    opts = MemoryOptions(
        generation_engine="auto", device="cuda", lora_r=0 if method == "full" else 2,
        load_in_4bit=method == "qlora",
    )  # fmt: skip
    assert planmod.resolved_engine(shape, opts) == expected == "static"
    # On a CPU, auto always gives the HF engine.
    assert planmod.resolved_engine(shape, replace(opts, device="cpu")) == "hf"


def test_the_static_model_types_and_prefill_chunk_are_the_engines():
    from groupwise.memory import engine
    from groupwise.rollout import static

    assert STATIC_MODEL_TYPES == static.SUPPORTED_MODEL_TYPES
    assert engine.PREFILL_TOKENS == static.PREFILL_TOKENS
    assert engine.prefill_prompts("static", 32, 1000) == 4  # whole prompts, 4096 tokens at most
    assert (
        engine.prefill_prompts("static", 32, 9000) == 1
        and engine.prefill_prompts("hf", 32, 9000) == 32
    )


@pytest.mark.parametrize(
    ("fields", "refused"),
    [
        ({"model_type": "gemma2"}, "model_type"),
        ({"model_type": "llama", "hidden_act": "gelu"}, "hidden_act"),
        ({"model_type": "llama", "mlp_bias": True}, "mlp_bias"),
        ({"model_type": "qwen2", "use_sliding_window": True}, "sliding"),
        ({"model_type": "mistral", "sliding_window": 4096}, "sliding"),
        ({"model_type": "mistral", "sliding_window": None}, None),
    ],
)
def test_what_the_static_engine_refuses_matches_supports(fields, refused):
    """The pure rule and supports() on a model of that config agree, refusal and all."""
    from groupwise.rollout.static import supports

    reason = static_refusal(fields)
    assert (reason is None) == (refused is None)
    if refused is not None:
        assert refused in reason
    model_type = fields["model_type"]
    if model_type == "gemma2":
        return  # no need to build another architecture to know it is not Llama-family
    model = _tiny_model(model_type, fields, "full")
    assert (supports(model) is None) == (reason is None)


def test_auto_gives_the_hf_engine_for_dora_multi_turn_and_generation_kwargs():
    shape = resolve_model_shape("qwen3-8b")
    lora = MemoryOptions(generation_engine="auto", lora_r=16)
    assert planmod.resolved_engine(shape, lora) == "static"
    for changed in (
        replace(lora, use_dora=True), replace(lora, multi_turn=True),
        replace(lora, generation_kwargs=True), replace(lora, device="cpu"),
    ):  # fmt: skip
        assert planmod.resolved_engine(shape, changed) == "hf", changed
    # DoRA matters only with an adapter; a named engine is kept as set.
    assert planmod.resolved_engine(shape, replace(lora, lora_r=0, use_dora=True)) == "static"
    assert planmod.resolved_engine(shape, replace(lora, generation_engine="hf")) == "hf"
    assert planned_engine("vllm", device="cpu", refusal="x") == "vllm"


def test_each_fit_row_prices_its_own_engine():
    """A full fine-tune under auto gets the static engine with its own bf16 copy; LoRA and QLoRA
    get it without one; the HF engine on a CPU-less plan (multi-turn) holds none."""
    shape = resolve_model_shape("qwen3-8b")
    opts = MemoryOptions(
        generation_engine="auto", lora_r=16, load_in_4bit=True, double_quant=True,
        gradient_checkpointing=True, batch=8, group_size=8, grad_accum=4, prompt_len=256,
        completion_len=512, adapter_dtype="fp32", precision="pure",
    )  # fmt: skip
    dtypes = {
        "full": ("fp32", "pure", None, "bf16"),
        "lora": ("bf16", "pure", "fp32", "bf16"),
        "qlora": ("bf16", "pure", "fp32"),  # a 3-tuple: the generation dtype of the options
    }
    rows = fit_rows(shape, opts, 2**50, dtypes)
    assert len(rows) == 24 and {r.engine for r in rows} == {"static"}
    for row in rows:
        o = replace(
            opts, lora_r=0 if row.method == "full" else 16, load_in_4bit=row.method == "qlora",
            optimizer=row.optim, activation_offloading=row.offload,
            gradient_checkpointing=row.checkpointing, dtype=dtypes[row.method][0],
            adapter_dtype=dtypes[row.method][2], generation_dtype="bf16",
        )  # fmt: skip
        components = plan_grpo(shape, o)
        assert row.peak == planmod.total_bytes(components)
        if row.method == "full":
            assert components[planmod.GENERATION_WEIGHTS] == 2 * shape.num_params()
            assert planmod.STATIC_LOAD in components
        else:
            assert planmod.GENERATION_WEIGHTS not in components
    multi = fit_rows(shape, replace(opts, multi_turn=True), 2**50, dtypes)
    assert {r.engine for r in multi} == {"hf"}


def test_the_table_names_the_engine_each_row_gets(capsys):
    argv = [
        "--model", "qwen3-8b", "--lora_r", "16", "--batch", "8", "--group_size", "8",
        "--grad_accum", "4", "--prompt_len", "256", "--completion_len", "512",
        "--gpu_memory", "80",
    ]  # fmt: skip
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "rollout engine: static (auto on cuda): no weight copy" in text
    assert "engine" in text.split("What fits", 1)[1]
    assert main([*argv, "--generation_engine", "hf"]) == 0
    assert "rollout engine: hf (as set)" in capsys.readouterr().out
