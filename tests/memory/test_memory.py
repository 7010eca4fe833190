"""The memory planner: the often-quoted 7B numbers, hand-computed components, the CLI, --measure."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from groupwise import memory as mem
from groupwise.memory import (
    GENERATION_WEIGHTS,
    KV_CACHE,
    LOGITS,
    POLICY_ACTS,
    POLICY_GRADS,
    POLICY_MASTER,
    POLICY_OPTIM,
    POLICY_WEIGHTS,
    REF_WEIGHTS,
    STATIC_LOAD,
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


# --- the quoted 7B figures -----------------------------------------------------------------------


def test_quoted_7b_fp16_exact(capsys):
    weights = mem.quoted_weights_only(7_000_000_000, 2)
    assert set(weights["ppo"].values()) == {14_000_000_000}  # 14 GB per model copy
    assert sum(weights["ppo"].values()) == 56_000_000_000
    assert sum(weights["grpo"].values()) == 42_000_000_000
    quoted = run_json(
        capsys, "--params", "7e9", "--dtype", "fp16", "--accounting", "quoted", "--json"
    )
    assert quoted["ppo"]["total_bytes"] == 112_000_000_000
    assert quoted["grpo"]["total_bytes"] == 56_000_000_000
    assert quoted["ratio"] == 0.5
    # The full planner's weights rows are the same 14 GB copies; 16 B per trained parameter
    # makes one trained network 112 GB on its own.
    full = run_json(capsys, "--params", "7e9", "--dtype", "fp16", "--beta", "0.04", "--json")
    grpo = full["grpo"]["components"]
    assert grpo[POLICY_WEIGHTS] == grpo[REF_WEIGHTS] == 14_000_000_000
    trained = grpo[POLICY_WEIGHTS] + grpo[POLICY_GRADS] + grpo[POLICY_MASTER] + grpo[POLICY_OPTIM]
    assert trained == 112_000_000_000
    assert full["ppo"]["components"]["critic weights"] == 14_000_000_000


def test_quoted_lines_state_the_accounting():
    text = "\n".join(mem.quoted_lines(7_000_000_000, "fp16"))
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
    # Every TINY tensor is under bitsandbytes' min_8bit_size (4096): fp32 m and v, 8 B/param
    # (large tensors: tests/memory/test_planner_gpu.py).
    assert (
        plan_grpo(TINY, replace(FP32, dtype="bf16", optimizer="adamw8bit"))[POLICY_OPTIM] == 8 * p
    )
    assert POLICY_OPTIM not in plan_grpo(TINY, replace(FP32, optimizer="sgd"))


def test_lora_trainable_count_by_hand():
    # r (d_in + d_out): q 2*16, k 2*12, v 2*12, o 2*16, gate/up/down 2*24 each = 256 per layer
    assert TINY.lora_params(2) == 2 * 256
    assert TINY.lora_params(2, ["q_proj", "v_proj"]) == 2 * (32 + 24)
    with pytest.raises(mem.MemoryPlanError, match="lora_targets"):
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
    # (2 x layers 2 + one layer's K in flight while the cache grows) x kv 4 x (3 + 5) tokens
    # x 2 sequences x 2 B
    assert mem.kv_cache_bytes(TINY, 2, 3, 5, 2) == 5 * 4 * 8 * 2 * 2 == 640
    rows = plan_grpo(TINY, replace(FP32, grad_accum=3))  # 6 sequences generated together, fp32
    assert rows[KV_CACHE] == (2 * 2 + 1) * 4 * 8 * 6 * 4


def test_logits_naive_vs_chunked_by_hand():
    # naive: 3 fp32 buffers of [2 x 5 completion tokens, vocab 10]
    assert mem.logits_bytes(10, 2, 5, "naive", 4) == 3 * 2 * 5 * 10 * 4
    assert mem.logits_bytes(10, 2, 5, "chunked", 4) == 2 * 4 * 10 * 4  # one chunk of 4 tokens
    assert mem.logits_bytes(10, 2, 5, "chunked", 512) == 2 * 10 * 10 * 4  # fewer tokens
    assert plan_grpo(TINY, replace(FP32, logprob_impl="naive"))[LOGITS] == 1200
    assert plan_grpo(TINY, FP32)[LOGITS] == 800


def test_activations_with_and_without_checkpointing_by_hand():
    # Both norms' input, normalised values and output (6h), q and attention output (2q), k and v
    # (2kv), SiLU's input and output, up and their product (4i): fp32 values per token.
    assert mem.layer_activation_values(TINY) == 6 * 8 + 2 * 8 + 2 * 4 + 4 * 16  # 136
    # 2 x 8 = 16 tokens: 2 layers x 136 x 16 + final norm 3 x 8 x 16 + the backward's own
    # buffers (2h + i) x 16, fp32
    assert mem.activation_bytes(TINY, 2, 3, 5, 4, checkpointing=False) == 4 * (
        2 * 136 * 16 + 3 * 8 * 16 + 32 * 16
    )
    # checkpointing: layer inputs 2 x 8 x 16 + one layer 136 x 16 + final norm + backward
    ckpt = 4 * (2 * 8 * 16 + 136 * 16 + 3 * 8 * 16 + 32 * 16)
    assert mem.activation_bytes(TINY, 2, 3, 5, 4, checkpointing=True) == ckpt
    # shared prompt, G = 2: 1 x 3 + 2 x 5 = 13 tokens, plus 1 repeated prompt's K,V (3 x 8)
    shared = mem.activation_bytes(TINY, 2, 3, 5, 4, checkpointing=False, group_size=2)
    assert shared == 4 * (2 * (136 * 13 + 24) + 3 * 8 * 13 + 32 * 13)
    assert plan_grpo(TINY, FP32)[POLICY_ACTS] == shared
    ppo = plan_ppo(TINY, replace(FP32, gradient_checkpointing=True))
    assert ppo[POLICY_ACTS] == ppo["critic activations"] == ckpt


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


def test_static_engine_copy_is_counted_and_resident():
    params = TINY.num_params()
    hf = plan_grpo(TINY, FP32)
    assert GENERATION_WEIGHTS not in hf  # the HF engine samples from the policy's own weights
    cpu = replace(FP32, generation_engine="static", device="cpu")
    static = plan_grpo(TINY, cpu)
    assert static[GENERATION_WEIGHTS] == 4 * params  # an fp32 run's copy: 4 B per parameter
    # Loaded one decoder layer at a time: q 64 + k 32 + v 32 + o 64 + MLP 3 x 128 + norms 16.
    assert static[STATIC_LOAD] == 4 * 592
    # The KV cache: a prompt cache (1 prompt) and a row cache (2 rows) of 3 + 5 slots, fp32.
    assert static[KV_CACHE] == 2 * 2 * 4 * 8 * (1 + 2) * 4
    # With CUDA graphs the slots round up to a multiple of 64.
    cuda = plan_grpo(TINY, replace(cpu, device="cuda"))
    assert cuda[KV_CACHE] == 2 * 2 * 4 * 64 * (1 + 2) * 4
    assert (
        plan_grpo(TINY, replace(cpu, device="cuda", cuda_graphs=False))[KV_CACHE]
        == (static[KV_CACHE])
    )
    # The copy is resident for the whole run, the one-layer load only at a sync.
    phases = {k: v for k, v in static.items() if k not in (GENERATION_WEIGHTS, STATIC_LOAD)}
    assert total_bytes(static) == total_bytes(phases) + 4 * params
    bf16 = plan_grpo(TINY, replace(cpu, generation_dtype="bf16"))
    assert bf16[GENERATION_WEIGHTS] == 2 * params
    # LoRA and QLoRA: the static engine reads the frozen base in place, no copy and no load.
    for lora in (replace(cpu, lora_r=2), replace(cpu, lora_r=2, load_in_4bit=True)):
        rows = plan_grpo(TINY, lora)
        assert GENERATION_WEIGHTS not in rows and STATIC_LOAD not in rows
        assert rows[KV_CACHE] == static[KV_CACHE]
    assert plan_ppo(TINY, cpu)[GENERATION_WEIGHTS] == 4 * params


def test_vllm_memory_is_named_as_not_counted(capsys):
    plan = mem.make_plan(TINY, replace(FP32, generation_engine="vllm"))
    assert GENERATION_WEIGHTS not in plan.grpo and plan.grpo_total == total_bytes(
        plan_grpo(TINY, FP32)
    )
    assert "vllm_gpu_memory_utilization" in plan.missing[GENERATION_WEIGHTS]
    assert main(["--model", "tiny-random", "--generation_engine", "vllm"]) == 0
    out = capsys.readouterr().out
    assert "not in the totals, vLLM's own weights and KV cache" in out


def test_generation_engine_from_the_config_with_the_runs_generation_dtype(tmp_path: Path, capsys):
    cfg = tmp_path / "run.yaml"
    cfg.write_text("model: tiny-random\ngeneration_engine: static\ndevice: cpu\n")
    params = mem.BUILTIN_SHAPES["tiny-random"].num_params()
    # fp32 on the CPU: the static engine copies fp32 weights.
    out = run_json(capsys, str(cfg), "--json")["grpo"]["components"]
    assert out[GENERATION_WEIGHTS] == 4 * params
    # Generating in bf16 (bf16 autocast, or bf16 generation alone): a bf16 copy.
    for flags in (["--bf16_autocast", "true"], ["--generation_dtype", "bfloat16"]):
        out = run_json(capsys, str(cfg), "--json", *flags)["grpo"]["components"]
        assert out[GENERATION_WEIGHTS] == 2 * params, flags
    # The command line overrides the config's engine, in the plan and in the run --measure runs.
    out = run_json(capsys, str(cfg), "--json", "--generation_engine", "hf")["grpo"]["components"]
    assert GENERATION_WEIGHTS not in out
    args = mem.build_parser().parse_args([str(cfg), "--generation_engine", "hf"])
    mem.options_from_args(args)
    assert args.resolved_config.generation_engine == "hf"
    assert main([str(cfg), "--generation_engine", "sglang"]) == 2
    assert "--generation_engine" in capsys.readouterr().err


def test_bad_generation_engine_options_name_the_option():
    for opts, option in (
        (replace(FP32, generation_engine="sglang"), "--generation_engine"),
        (replace(FP32, generation_engine="static", generation_dtype="int8"), "--generation_dtype"),
    ):
        with pytest.raises(mem.MemoryPlanError, match=option):
            plan_grpo(TINY, opts)


def test_measurement_names_a_static_copy_in_another_dtype():
    opts = replace(FP32, generation_engine="static")
    result = {"dtype": "fp32", "prompt_len": 3, "completion_len": 5, "generation_dtype": "bf16"}
    assert mem.measure.measurement_differences(result, opts) == [
        "the static engine's copy in bf16, planned fp32"
    ]
    assert mem.measure.measurement_differences({**result, "generation_dtype": "fp32"}, opts) == []
    # A run measured for a plan: the engine travels in the run's options.
    assert mem.measure.config_for("tiny-random", opts)["generation_engine"] == "static"


# --- shapes of the real models -------------------------------------------------------------------


def test_num_params_matches_tiny_random():
    from groupwise.runtime.models import tiny_random_model

    with torch.device("meta"):
        model = tiny_random_model()
    actual = sum(p.numel() for p in model.parameters())
    assert mem.BUILTIN_SHAPES["tiny-random"].num_params() == actual
    assert mem.shape_from_hf_config(model.config.to_dict()).num_params() == actual


def test_num_params_matches_smollm2_config():
    from transformers import AutoConfig, AutoModelForCausalLM

    from groupwise.runtime.models import cache_dir

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


def _arithmetic_prompt_tokens(max_prompt_length=None) -> int:
    """The longest default arithmetic training prompt in the SmolLM2 tokenizer's tokens."""
    from groupwise.data.prompts import tokenize_prompts
    from groupwise.runtime.models import smollm2_tokenizer
    from groupwise.tasks.arithmetic import arithmetic_dataset

    rows = arithmetic_dataset(200, "train", seed=42)
    ids = tokenize_prompts([r["prompt"] for r in rows], smollm2_tokenizer(), max_prompt_length)
    return max(len(x) for x in ids)


def test_config_yaml_supplies_defaults_and_flags_override(tmp_path: Path, capsys):
    cfg = tmp_path / "run.yaml"
    cfg.write_text("model: tiny-random\nbeta: 0.0\nper_device_train_batch_size: 4\n"
                   "num_generations: 4\nmax_completion_length: 32\n"
                   "gradient_checkpointing: false\n")  # fmt: skip
    out = run_json(capsys, str(cfg), "--json", "--dtype", "fp32")
    assert REF_WEIGHTS not in out["grpo"]["components"]
    expected = plan_grpo(
        mem.BUILTIN_SHAPES["tiny-random"],
        MemoryOptions(dtype="fp32", batch=4, group_size=4, completion_len=32, beta=0.0,
                      prompt_len=_arithmetic_prompt_tokens()),
    )  # fmt: skip
    assert out["grpo"]["components"] == expected
    out = run_json(capsys, str(cfg), "--json", "--beta", "0.1", "--batch", "8")
    assert REF_WEIGHTS in out["grpo"]["components"]


@pytest.mark.parametrize(
    ("argv", "option"),
    [
        (["--params", "7e9", "--dtype", "fp8"], "--dtype"),
        (["--params", "seven"], "--params"),
        (["--model", "tiny-random", "--batch", "0"], "--batch"),
        (["--model", "tiny-random", "--batch", "6", "--group_size", "4"], "--group_size"),
        (["--model", "tiny-random", "--batch", "6", "--group-size", "4"], "--group_size"),
        (["--model", "tiny-random", "--no_such_option", "4"], "--no_such_option"),
        (["--params", "7e9", "--lora_r", "8"], "--lora_r"),
        (["--model", "tiny-random", "--lora_r", "8", "--lora_targets", "x_proj"], "--lora_targets"),
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


# --- the run's real settings, train's flag style, --measure against the table -------------------

TINY_HF = {
    "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 49152, "head_dim": 16,
    "tie_word_embeddings": True, "attention_bias": False,
}  # fmt: skip


def _run_yaml(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    cfg = folder / "config.yaml"
    cfg.write_text("model: tiny-random\nper_device_train_batch_size: 4\nnum_generations: 4\n"
                   "max_completion_length: 32\ndevice: cpu\n")  # fmt: skip
    return cfg


def test_plan_reads_the_runs_dtype_and_prompt_length(tmp_path: Path, capsys):
    cfg = _run_yaml(tmp_path / "run")
    out = run_json(capsys, str(cfg), "--json")
    grpo = out["grpo"]["components"]
    params = mem.BUILTIN_SHAPES["tiny-random"].num_params()
    # dtype auto on the CPU: the trainer keeps fp32 weights and fp32 AdamW states, no master copy.
    assert grpo[POLICY_WEIGHTS] == 4 * params and grpo[POLICY_OPTIM] == 8 * params
    assert POLICY_MASTER not in grpo or grpo[POLICY_MASTER] == 0
    # KV cache = (2 x layers + 1) x kv_dim x (prompt + completion) x 4 sequences x 4 B, with the
    # real prompt (the longest arithmetic prompt, tokenized), not a 512-token guess.
    prompt = _arithmetic_prompt_tokens()
    assert prompt < 512
    assert grpo[KV_CACHE] == (2 * 2 + 1) * 32 * (prompt + 32) * 4 * 4
    # A run's output_dir (its config.yaml) is read the same way.
    assert run_json(capsys, str(tmp_path / "run"), "--json") == out
    # dtype: bfloat16 in the config: bf16 weights and AdamW states (pure, as the trainer).
    bf16 = run_json(capsys, str(cfg), "--json", "--dtype", "bfloat16")["grpo"]["components"]
    assert bf16[POLICY_WEIGHTS] == 2 * params and bf16[POLICY_OPTIM] == 4 * params
    # max_prompt_length cuts the prompt as the trainer does.
    cut = run_json(capsys, str(cfg), "--json", "--max_prompt_length", "40")["grpo"]["components"]
    assert cut[KV_CACHE] == (2 * 2 + 1) * 32 * (40 + 32) * 4 * 4


def test_flags_are_trains_with_the_earlier_hyphens_as_aliases(tmp_path: Path, capsys):
    cfg = str(_run_yaml(tmp_path / "run"))
    base = run_json(capsys, cfg, "--json", "--completion_len", "16")
    assert run_json(capsys, cfg, "--json", "--completion-len", "16") == base
    assert run_json(capsys, cfg, "--json", "--max_completion_length", "16") == base
    assert run_json(capsys, cfg, "--json", "--max_completion_length=16") == base
    assert run_json(capsys, cfg, "--json", "--completion_len", "8") != base


def test_measure_is_compared_with_the_tables_own_figure(tmp_path: Path, capsys, monkeypatch):
    """--measure's prediction is the very number the table shows, for the same settings; where
    the real run differs (shorter completions), it says so."""
    import subprocess

    from groupwise.memory import measure

    prompt = _arithmetic_prompt_tokens()

    def fake_child(cmd, **kwargs):
        spec = json.loads(cmd[cmd.index("--_child") + 1])
        assert spec["config"]["task"] == "arithmetic" and spec["device"] == "cpu"
        result = {
            "algorithm": spec["algorithm"], "device": "cpu", "dtype": "fp32",
            "baseline_bytes": 1000, "peak_bytes": 151_000_000, "measured_bytes": 150_000_000,
            "prompt_len": prompt, "completion_len": 20, "model_config": TINY_HF, "steps": 1,
        }  # fmt: skip
        line = measure.RESULT_MARK + json.dumps(result)
        return subprocess.CompletedProcess(cmd, 0, stdout=line + "\n", stderr="")

    monkeypatch.setattr(measure.subprocess, "run", fake_child)
    cfg = str(_run_yaml(tmp_path / "run"))
    out = run_json(capsys, cfg, "--json", "--measure")
    for name in ("grpo", "ppo"):
        measured = out["measured"][name]
        assert measured["predicted_bytes"] == out[name]["total_bytes"]
        assert measured["differs"] == [
            "completions stopped at 20 of the planned 32 tokens (the plan is the longest case)"
        ]
    assert main([cfg, "--measure"]) == 0
    text = capsys.readouterr().out
    assert "vs the table's prediction" in text and "completions stopped at 20" in text


def test_planner_output_speaks_about_the_product(capsys):
    assert main(["--params", "7e9", "--dtype", "fp16"]) == 0
    text = capsys.readouterr().out
    assert "often-quoted" in text
    for word in ("mission", "seeds"):
        assert word not in text
