"""The memory planner: the seeds' numbers, hand-computed components, the CLI and a measurement."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from groupwise import memory as mem
from groupwise.memory import (
    KV_CACHE,
    LOGITS,
    POLICY_ACTS,
    POLICY_GRADS,
    POLICY_MASTER,
    POLICY_OPTIM,
    POLICY_WEIGHTS,
    REF_WEIGHTS,
    MemoryOptions,
    ModelShape,
    main,
    plan_grpo,
    plan_ppo,
    total_bytes,
)

# A shape small enough to count by hand: head_dim 4, q = 8, kv = 4.
TINY = ModelShape(hidden=8, layers=2, heads=2, kv_heads=1, intermediate=16, vocab=10)
FP32 = MemoryOptions(dtype="fp32", batch=2, group_size=2, prompt_len=3, completion_len=5)
SEVEN_B = ModelShape(params=7_000_000_000)


def run_json(capsys, *argv: str) -> dict:
    assert main(list(argv)) == 0
    return json.loads(capsys.readouterr().out)


# --- the seeds' figures --------------------------------------------------------------------------


def test_seeds_7b_fp16_exact(capsys):
    weights = mem.seeds_weights_only(7_000_000_000, 2)
    assert set(weights["ppo"].values()) == {14_000_000_000}  # 14 GB per model copy
    assert sum(weights["ppo"].values()) == 56_000_000_000
    assert sum(weights["grpo"].values()) == 42_000_000_000
    seeds = run_json(
        capsys, "--params", "7e9", "--dtype", "fp16", "--accounting", "seeds", "--json"
    )
    assert seeds["ppo"]["total_bytes"] == 112_000_000_000
    assert seeds["grpo"]["total_bytes"] == 56_000_000_000
    assert seeds["ratio"] == 0.5
    # The full planner's weights rows are the same 14 GB copies; 16 B per trained parameter
    # makes one trained network 112 GB on its own.
    full = run_json(capsys, "--params", "7e9", "--dtype", "fp16", "--json")
    grpo = full["grpo"]["components"]
    assert grpo[POLICY_WEIGHTS] == grpo[REF_WEIGHTS] == 14_000_000_000
    trained = grpo[POLICY_WEIGHTS] + grpo[POLICY_GRADS] + grpo[POLICY_MASTER] + grpo[POLICY_OPTIM]
    assert trained == 112_000_000_000
    assert full["ppo"]["components"]["critic weights"] == 14_000_000_000


def test_seeds_lines_state_the_accounting():
    text = "\n".join(mem.seeds_lines(7_000_000_000, "fp16"))
    for figure in ("14.0 GB", "112.0 GB", "56.0 GB", "42.0 GB", "252.0 GB", "140.0 GB"):
        assert figure in text


def test_table_for_7b_has_weights_rows_and_says_what_is_missing(capsys):
    assert main(["--params", "7e9", "--dtype", "fp16"]) == 0
    out = capsys.readouterr().out
    assert "policy weights" in out and "14.0 GB" in out
    assert "needs --layers/--hidden" in out
    assert "GRPO / PPO" in out


# --- hand-computed components --------------------------------------------------------------------


def test_num_params_by_hand():
    # per layer: q 64 + k 32 + v 32 + o 64 + gate 128 + up 128 + down 128 + norms 16 = 592
    assert TINY.computed_params() == 80 + 2 * 592 + 8 + 80
    assert replace(TINY, tie_embeddings=True).num_params() == 80 + 2 * 592 + 8
    assert replace(TINY, params=999).num_params() == 999


def test_weights_grads_adam_by_precision():
    p = TINY.num_params()
    fp32 = plan_grpo(TINY, FP32)
    assert (fp32[POLICY_WEIGHTS], fp32[POLICY_GRADS], fp32[POLICY_OPTIM]) == (4 * p, 4 * p, 8 * p)
    assert POLICY_MASTER not in fp32  # fp32 training has no master copy
    mixed = plan_grpo(TINY, replace(FP32, dtype="bf16"))
    assert [mixed[k] for k in (POLICY_WEIGHTS, POLICY_GRADS, POLICY_MASTER, POLICY_OPTIM)] == [
        2 * p, 2 * p, 4 * p, 8 * p,
    ]  # fmt: skip
    pure = plan_grpo(TINY, replace(FP32, dtype="bf16", precision="pure"))
    assert (pure[POLICY_OPTIM], POLICY_MASTER in pure) == (4 * p, False)
    assert (
        plan_grpo(TINY, replace(FP32, dtype="bf16", optimizer="adamw8bit"))[POLICY_OPTIM] == 2 * p
    )
    assert POLICY_OPTIM not in plan_grpo(TINY, replace(FP32, optimizer="sgd"))


def test_lora_trainable_count_by_hand():
    # r (d_in + d_out): q 2*16, k 2*12, v 2*12, o 2*16, gate/up/down 2*24 each = 256 per layer
    assert TINY.lora_params(2) == 2 * 256
    assert TINY.lora_params(2, ["q_proj", "v_proj"]) == 2 * (32 + 24)
    with pytest.raises(mem.MemoryPlanError, match="lora-targets"):
        TINY.lora_params(2, ["nope_proj"])


def test_lora_drops_grads_and_optimizer_to_adapter_and_reference_to_zero():
    p, lora = TINY.num_params(), TINY.lora_params(2)
    for plan in (plan_grpo, plan_ppo):
        rows = plan(TINY, replace(FP32, lora_r=2))
        assert rows[POLICY_WEIGHTS] == 4 * (p + lora)
        assert rows[POLICY_GRADS] == 4 * lora
        assert rows[POLICY_OPTIM] == 8 * lora
        assert rows[REF_WEIGHTS] == 0  # the adapter-disabled base
    full = plan_grpo(TINY, FP32)
    assert full[REF_WEIGHTS] == 4 * p


def test_beta_zero_removes_the_reference_row():
    for plan in (plan_grpo, plan_ppo):
        assert REF_WEIGHTS in plan(TINY, FP32)
        assert REF_WEIGHTS not in plan(TINY, replace(FP32, beta=0.0))


def test_kv_cache_by_hand():
    # 2 x layers 2 x kv 4 x (3 + 5) tokens x 2 sequences x 2 B
    assert mem.kv_cache_bytes(TINY, 2, 3, 5, 2) == 512
    rows = plan_grpo(TINY, replace(FP32, grad_accum=3))  # 6 sequences generated together, fp32
    assert rows[KV_CACHE] == 2 * 2 * 4 * 8 * 6 * 4


def test_logits_naive_vs_chunked_by_hand():
    # naive: 3 fp32 buffers of [2 x 5 completion tokens, vocab 10]
    assert mem.logits_bytes(10, 2, 5, "naive", 4) == 3 * 2 * 5 * 10 * 4
    assert mem.logits_bytes(10, 2, 5, "chunked", 4) == 2 * 4 * 10 * 4  # one chunk of 4 tokens
    assert mem.logits_bytes(10, 2, 5, "chunked", 512) == 2 * 10 * 10 * 4  # fewer tokens
    assert plan_grpo(TINY, replace(FP32, logprob_impl="naive"))[LOGITS] == 1200
    assert plan_grpo(TINY, FP32)[LOGITS] == 800


def test_activations_with_and_without_checkpointing_by_hand():
    assert mem.layer_activation_values(TINY) == 4 * 8 + 2 * 8 + 2 * 4 + 4 * 16  # 120
    # 2 x 8 = 16 tokens: 2 layers x 120 x 16 + final norm 2 x 8 x 16, fp32
    assert mem.activation_bytes(TINY, 2, 3, 5, 4, checkpointing=False) == 4 * (3840 + 256)
    # checkpointing: layer inputs 2 x 8 x 16 + one layer 120 x 16 + final norm 256
    assert mem.activation_bytes(TINY, 2, 3, 5, 4, checkpointing=True) == 4 * (256 + 1920 + 256)
    # shared prompt, G = 2: 1 x 3 + 2 x 5 = 13 tokens, plus 1 repeated prompt's K,V (3 x 8)
    shared = mem.activation_bytes(TINY, 2, 3, 5, 4, checkpointing=False, group_size=2)
    assert shared == 4 * (2 * (120 * 13 + 24) + 2 * 8 * 13)
    assert plan_grpo(TINY, FP32)[POLICY_ACTS] == shared
    ppo = plan_ppo(TINY, replace(FP32, gradient_checkpointing=True))
    assert ppo[POLICY_ACTS] == ppo["critic activations"] == 4 * 2432


def test_critic_is_backbone_plus_value_head():
    p = TINY.num_params()
    assert plan_ppo(TINY, FP32)["critic weights"] == 4 * (p - 80 + 8 + 1)  # no LM head
    tied = replace(TINY, tie_embeddings=True)
    assert plan_ppo(tied, FP32)["critic weights"] == 4 * (tied.num_params() + 9)
    assert "critic weights" not in plan_grpo(TINY, FP32)


def test_total_is_resident_plus_the_larger_phase():
    rows = {POLICY_WEIGHTS: 10, POLICY_OPTIM: 5, KV_CACHE: 7, POLICY_GRADS: 2, POLICY_ACTS: 3}
    assert total_bytes(rows) == 15 + 7
    assert total_bytes({**rows, LOGITS: 4}) == 15 + 9
    assert total_bytes({"a": 1, "b": 2}) == 3


def test_reward_model_row():
    rows = plan_grpo(TINY, replace(FP32, reward_model_params=1000))
    assert rows["reward model weights"] == 4000
    assert "reward model weights" not in plan_grpo(TINY, FP32)


# --- shapes of the real models -------------------------------------------------------------------


def test_num_params_matches_tiny_random():
    from groupwise.models import tiny_random_model

    with torch.device("meta"):
        model = tiny_random_model()
    actual = sum(p.numel() for p in model.parameters())
    assert mem.BUILTIN_SHAPES["tiny-random"].num_params() == actual
    assert mem.shape_from_hf_config(model.config.to_dict()).num_params() == actual


def test_num_params_matches_smollm2_config():
    from transformers import AutoConfig, AutoModelForCausalLM

    from groupwise.models import cache_dir

    folder = cache_dir() / "models" / "smollm2-135m-instruct"
    if not (folder / "config.json").exists():
        pytest.skip("SmolLM2-135M-Instruct has not been converted on this machine")
    config = AutoConfig.from_pretrained(folder)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    actual = sum(p.numel() for p in model.parameters())
    assert mem.BUILTIN_SHAPES["smollm2-135m-instruct"].num_params() == actual == 134_515_008
    assert mem.resolve_model_shape(str(folder)) == replace(
        mem.BUILTIN_SHAPES["smollm2-135m-instruct"], name=str(folder)
    )


# --- the command line ----------------------------------------------------------------------------


def test_json_shape_exactly(capsys):
    out = run_json(capsys, "--model", "smollm2-135m-instruct", "--json")
    assert set(out) == {"ppo", "grpo", "ratio"}
    for name in ("ppo", "grpo"):
        assert set(out[name]) == {"components", "total_bytes"}
        assert all(isinstance(v, int) for v in out[name]["components"].values())
        assert out[name]["total_bytes"] == total_bytes(out[name]["components"])
    assert out["ratio"] == out["grpo"]["total_bytes"] / out["ppo"]["total_bytes"]
    assert "critic weights" in out["ppo"]["components"]
    assert "critic weights" not in out["grpo"]["components"]


def test_config_yaml_supplies_defaults_and_flags_override(tmp_path: Path, capsys):
    cfg = tmp_path / "run.yaml"
    cfg.write_text("model: tiny-random\nbeta: 0.0\nper_device_train_batch_size: 4\n"
                   "num_generations: 4\nmax_completion_length: 32\n")  # fmt: skip
    out = run_json(capsys, str(cfg), "--json", "--dtype", "fp32")
    assert REF_WEIGHTS not in out["grpo"]["components"]
    expected = plan_grpo(
        mem.BUILTIN_SHAPES["tiny-random"],
        MemoryOptions(dtype="fp32", batch=4, group_size=4, completion_len=32, beta=0.0),
    )
    assert out["grpo"]["components"] == expected
    out = run_json(capsys, str(cfg), "--json", "--beta", "0.1", "--batch", "8")
    assert REF_WEIGHTS in out["grpo"]["components"]


@pytest.mark.parametrize(
    ("argv", "option"),
    [
        (["--params", "7e9", "--dtype", "fp8"], "--dtype"),
        (["--params", "seven"], "--params"),
        (["--model", "tiny-random", "--batch", "0"], "--batch"),
        (["--model", "tiny-random", "--batch", "6", "--group-size", "4"], "--group-size"),
        (["--params", "7e9", "--lora-r", "8"], "--lora-r"),
        (["--model", "tiny-random", "--lora-r", "8", "--lora-targets", "x_proj"], "--lora-targets"),
        (["--model", "no/such/model"], "--model"),
        (["--hidden", "64", "--layers", "2"], "--params"),
        (["--params", "7e9", "--measure"], "--measure"),
        (["--model", "tiny-random", "--optimizer", "lion"], "--optimizer"),
    ],
)
def test_bad_options_name_the_option(argv, option, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("groupwise memory: error:") and option in err


# --- measurement ---------------------------------------------------------------------------------


def test_measure_grpo_tiny_random_smoke():
    """One real GRPO step in a fresh process: a sanity check of the planner, not a benchmark."""
    opts = MemoryOptions(batch=2, group_size=2, completion_len=4, prompt_len=512)
    (result,) = mem.run_measurement("tiny-random", opts, algorithms=("grpo",), timeout=300)
    assert "error" not in result, result.get("error")
    assert result["device"] in ("cpu", "cuda") and result["steps"] == 1
    assert result["measured_bytes"] > 0 and result["predicted_bytes"] > 0
    assert 0.2 < result["ratio"] < 5.0
    assert mem.format_measurement([result]).count("measured") >= 2


def test_intermediate_inferred_from_params():
    known = replace(TINY, intermediate=None, params=TINY.num_params())
    inferred = mem.infer_intermediate(known)
    assert inferred.intermediate == 16 and "inferred" in inferred.note
