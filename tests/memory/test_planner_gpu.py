"""The planner for a GPU user: shipped model shapes, QLoRA, 8-bit AdamW, offloading, padding-free
updates, the CUDA overheads and what fits a GPU, against figures computed by hand here."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from groupwise.memory import MemoryOptions, ModelShape, main, plan_grpo, total_bytes
from groupwise.memory import plan as planmod
from groupwise.memory.fit import (
    fit_rows,
    group_options,
    largest_group,
    longest_completion,
    parse_gpu_memory,
)
from groupwise.memory.quant import adam_state_bytes, nf4_bytes
from groupwise.memory.shapes import (
    MemoryPlanError,
    model_config,
    resolve_model_shape,
    shipped_configs,
)
from groupwise.memory.terms import activation_split, lora_activation_bytes

TINY = ModelShape(hidden=8, layers=2, heads=2, kv_heads=1, intermediate=16, vocab=10)
FP32 = MemoryOptions(dtype="fp32", batch=2, group_size=2, prompt_len=3, completion_len=5)

# Qwen3-8B by hand from its config.json: hidden 4096, 36 layers, 32 heads / 8 KV heads of 128,
# MLP 12288, vocab 151936, untied LM head, q/k norms.
H, L, Q, KV, MLP, V = 4096, 36, 32 * 128, 8 * 128, 12288, 151936
LINEARS_PER_LAYER = H * Q + 2 * H * KV + Q * H + 3 * H * MLP  # q, k, v, o, gate, up, down
QWEN3_8B_PARAMS = 2 * V * H + L * (LINEARS_PER_LAYER + 2 * H + 2 * 128) + H
LORA_16 = L * 16 * ((H + Q) + 2 * (H + KV) + (Q + H) + 2 * (H + MLP) + (MLP + H))

# The question asked: QLoRA, 4 prompts x G 8 per step in micro-batches of 8 rows, 256-token
# prompts + 512-token completions, gradient checkpointing, generation counted, a 24 GB card.
QUESTION = [
    "--model", "qwen3-8b", "--load_in_4bit", "--use_bnb_nested_quant", "--lora_r", "16",
    "--batch", "8", "--group_size", "8", "--grad_accum", "4", "--prompt_len", "256",
    "--completion_len", "512", "--gradient_checkpointing", "--gpu_memory", "24",
]  # fmt: skip


def run_json(capsys, *argv: str) -> dict:
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


# --- shipped shapes ------------------------------------------------------------------------------


def test_qwen3_8b_parameter_count_by_hand():
    assert QWEN3_8B_PARAMS == 8_190_735_360  # the count Qwen publishes as 8.2B
    assert resolve_model_shape("qwen3-8b").num_params() == QWEN3_8B_PARAMS
    assert resolve_model_shape("Qwen/Qwen3-8B") == resolve_model_shape("qwen3-8b")
    assert resolve_model_shape("qwen3-8b").lora_params(16) == LORA_16 == 43_646_976


@pytest.mark.parametrize("name", sorted(shipped_configs()))
def test_shipped_shapes_build_the_models_transformers_builds(name):
    """Each shipped shape gives the parameter count of the model transformers builds from its
    config (random-weight-ready, built here on the meta device), and the config states the
    shipped config.json fields."""
    from transformers import AutoModelForCausalLM

    fields = shipped_configs()[name]
    config = model_config(name)
    assert config.model_type == fields["model_type"]
    for key in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "vocab_size", "tie_word_embeddings",
                "max_position_embeddings"):  # fmt: skip
        assert getattr(config, key) == fields[key], key
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    actual = sum(p.numel() for p in model.parameters())
    assert resolve_model_shape(name).num_params() == actual


def test_published_parameter_counts():
    published = {
        "qwen2.5-0.5b": 494_032_768, "qwen2.5-7b": 7_615_616_512, "qwen3-0.6b": 596_049_920,
        "llama-3.2-1b": 1_235_814_400, "llama-3.1-8b": 8_030_261_248,
    }  # fmt: skip
    for name, count in published.items():
        assert resolve_model_shape(name).num_params() == count, name


def test_unknown_shipped_name_names_the_choices():
    with pytest.raises(MemoryPlanError, match="qwen3-8b"):
        model_config("qwen9-1t")


# --- the formulas by hand ------------------------------------------------------------------------


def test_nf4_bytes_by_hand():
    n = H * MLP  # one MLP projection of Qwen3-8B
    # 4-bit codes + uint8 absmax per 64 + fp32 scale per 256 absmax + fp32 offset
    assert nf4_bytes(n) == n // 2 + n // 64 + 4 * (n // 64 // 256) + 4
    assert nf4_bytes(n, double_quant=False) == n // 2 + 4 * (n // 64)
    assert nf4_bytes(65) == 33 + 2 + 4 + 4  # ceilings: 33 bytes of codes, 2 blocks, 1 scale


def test_qlora_weights_by_hand():
    shape = resolve_model_shape("qwen3-8b")
    linears = L * LINEARS_PER_LAYER
    per_linear = [H * Q, H * KV, H * KV, Q * H, H * MLP, H * MLP, MLP * H]
    packed = L * sum(n // 2 + n // 64 + 4 * (n // 64 // 256) + 4 for n in per_linear)
    base = packed + (QWEN3_8B_PARAMS - linears) * 2  # embeddings, norms, LM head in bf16
    opts = MemoryOptions(
        lora_r=16, load_in_4bit=True, double_quant=True, adapter_dtype="fp32", precision="pure"
    )
    rows = plan_grpo(shape, opts)
    assert rows[planmod.POLICY_WEIGHTS] == base + 4 * LORA_16
    assert rows[planmod.DEQUANT] == H * MLP * 2  # the largest linear in bf16
    assert rows[planmod.POLICY_GRADS] == 4 * LORA_16
    assert rows[planmod.POLICY_OPTIM] == 8 * LORA_16
    assert rows[planmod.REF_WEIGHTS] == 0
    # About 0.52 B per quantised parameter: 6.07 GB for the 8.19B model (bf16: 16.4 GB).
    assert 6.0e9 < base < 6.1e9


def test_adam_8bit_states_by_hand():
    assert adam_state_bytes([5000], "adamw8bit") == 2 * 5000 + 2 * 4 * 20  # 20 blocks of 256
    assert adam_state_bytes([4095], "adamw8bit") == 8 * 4095  # under min_8bit_size: fp32
    assert adam_state_bytes([5000], "paged_adamw8bit") == adam_state_bytes([5000], "adamw8bit")
    assert adam_state_bytes([5000], "adamw") == 8 * 5000
    assert adam_state_bytes([5000], "adamw", state_width=2) == 4 * 5000
    # LoRA on Qwen3-8B: every A and B has >= 4096 elements; TRL's names count the same.
    shape = resolve_model_shape("qwen3-8b")
    blocks = sum(-(-n // 256) for n in shape.lora_numels(16))
    for optim in ("adamw_8bit", "adamw_bnb_8bit", "adamw8bit"):
        opts = MemoryOptions(lora_r=16, optimizer=optim)
        assert plan_grpo(shape, opts)[planmod.POLICY_OPTIM] == 2 * LORA_16 + 8 * blocks


def test_kv_cache_and_sampler_logits_of_qwen3_8b_by_hand():
    shape = resolve_model_shape("qwen3-8b")
    opts = MemoryOptions(batch=8, group_size=8, grad_accum=4, prompt_len=256, completion_len=512)
    rows = plan_grpo(shape, opts)
    # The HF engine (the options' default): K and V x 36 layers, and one layer's K in flight
    # while the cache grows, x 8 KV heads x 128 x (256 + 512) tokens x 32 sequences x 2 B
    assert rows[planmod.KV_CACHE] == (2 * 36 + 1) * 8 * 128 * 768 * 32 * 2 == 3_674_210_304
    # bf16 logits + fp32 scaled logits, probabilities, CDF for 32 sequences
    assert rows[planmod.GENERATION_LOGITS] == 32 * V * (2 + 12)


def test_lora_activations_by_hand():
    # TINY, r=2: A's output 2 values per adapter x 7; dropout: each adapter's input (h = 8 for
    # q, k, v, gate, up; q_dim 8 for o; i = 16 for down) + a 1-byte mask per element.
    assert lora_activation_bytes(TINY, 2, None, 0.0, 4) == 7 * 2 * 4
    assert lora_activation_bytes(TINY, 2, None, 0.05, 4) == 7 * 2 * 4 + (6 * 8 + 16) * 5
    assert lora_activation_bytes(TINY, 0, None, 0.05, 4) == 0


def test_offloading_moves_saved_activations_to_host_by_hand():
    tiny4 = replace(TINY, layers=4)
    tokens = 2 * 8  # 2 rows x (3 + 5), no prompt sharing
    layer = 136 * tokens * 4  # 6h + 2q + 2kv + 4i = 136 values per token, fp32
    # the final norm's input, normalised values and output (3h), and the backward's own
    # buffers (2h + i)
    final = (3 * 8 + 2 * 8 + 16) * tokens * 4
    layer_input = 8 * tokens * 4
    split = activation_split(tiny4, 2, 3, 5, 4, False, offload=False)
    assert split == (4 * layer + final, 0)
    assert activation_split(tiny4, 2, 3, 5, 4, False, offload=True) == (
        layer + final, 4 * layer,
    )  # fmt: skip
    assert activation_split(tiny4, 2, 3, 5, 4, True, offload=False) == (
        4 * layer_input + layer + final, 0,
    )  # fmt: skip
    assert activation_split(tiny4, 2, 3, 5, 4, True, offload=True) == (
        layer_input + layer + final, 4 * layer_input,
    )  # fmt: skip
    # In the plan the host bytes are a row of their own, outside the GPU's total.
    on = plan_grpo(tiny4, replace(FP32, activation_offloading=True, share_prompt=False))
    off = plan_grpo(tiny4, replace(FP32, share_prompt=False))
    assert on[planmod.HOST_ACTS] == 4 * layer
    assert on[planmod.POLICY_ACTS] == layer + final
    assert total_bytes(off) - total_bytes(on) == 3 * layer


def test_padding_free_counts_the_real_tokens():
    opts = replace(FP32, share_prompt=False, mean_completion_len=2)
    padded = plan_grpo(TINY, opts)  # without padding_free every row is padded to the longest
    packed = plan_grpo(TINY, replace(opts, padding_free=True))
    # Packed sequences carry their own prompts: no sharing, whatever share_prompt says.
    assert plan_grpo(TINY, replace(opts, padding_free=True, share_prompt=True)) == packed
    assert (
        padded[planmod.POLICY_ACTS]
        == plan_grpo(TINY, replace(FP32, share_prompt=False))[planmod.POLICY_ACTS]
    )
    # 2 rows x (3 + 2) tokens: 2 layers x 136 values + final norm 3 x 8 + backward 2 x 8 + 16
    assert packed[planmod.POLICY_ACTS] == (2 * 136 + 24 + 32) * 10 * 4
    assert packed[planmod.LOGITS] == 2 * (2 * 2) * 10 * 4  # one chunk of 4 completion tokens
    assert packed[planmod.KV_CACHE] == padded[planmod.KV_CACHE]  # generation is not packed


def test_bad_new_options_name_the_option(capsys):
    for argv, option in (
        (["--model", "tiny-random", "--optim", "lion"], "--optim"),
        (["--model", "tiny-random", "--load_in_4bit", "--lora_r", "0"], "--load_in_4bit"),
        (["--model", "tiny-random", "--gpu_memory", "lots"], "--gpu_memory"),
        (["--model", "tiny-random", "--lora_r", "4", "--lora_dropout", "1.5"], "--lora_dropout"),
        (["--model", "qwen3-8b", "--measure"], "--measure"),
        (["--model", "tiny-random", "--padding_free", "--mean_completion_len", "9999"],
         "--mean_completion_len"),
    ):  # fmt: skip
        assert main(argv) == 2, argv
        assert option in capsys.readouterr().err, argv


def test_accounting_seeds_is_refused_with_its_new_name(capsys):
    for argv in (["--accounting", "seeds"], ["--accounting=seeds"]):
        assert main(["--params", "7e9", *argv]) == 2
        err = capsys.readouterr().err
        assert "--accounting quoted" in err and err.startswith("groupwise memory: error:")
    out = run_json(capsys, "--params", "7e9", "--dtype", "fp16", "--accounting", "quoted")
    assert out["grpo"]["total_bytes"] == 56_000_000_000


def test_gpu_memory_sizes():
    assert parse_gpu_memory("24") == parse_gpu_memory("24GiB") == 24 * 2**30
    assert parse_gpu_memory("80GB") == 80_000_000_000
    with pytest.raises(MemoryPlanError, match="--gpu_memory"):
        parse_gpu_memory("0")


# --- the question: Qwen3-8B QLoRA on a 24 GB card -------------------------------------------------


def test_qwen3_8b_qlora_plan_by_hand(capsys):
    out = run_json(capsys, *QUESTION)
    grpo = out["grpo"]["components"]
    tokens = 8 * (256 + 512)  # one micro-batch; checkpointing: no prompt sharing
    lora_token = 7 * 16 * 2 + (6 * H + MLP) * 3  # A outputs; dropped-out inputs + masks, bf16
    # One recomputed layer, bf16: each frozen RMSNorm keeps an fp32 copy of its input (4 B per
    # value: both block norms and the q/k head norms); q, attention output, k, v and SiLU's
    # input, output and up (2 B each); the frozen base linears keep no input (the adapters keep
    # their dropped-out copies).
    layer = 2 * 4 * H + 4 * (Q + KV) + (2 * Q + 2 * KV + 3 * MLP) * 2 + lora_token
    final = (4 + 2) * H + (2 * H + MLP) * 2  # final norm + the backward's own buffers
    acts = (L * H * 2 + layer + final) * tokens
    logits = 512 * V * (2 + 4 + 4)  # one chunk: bf16 head outputs, fp32 copy, fp32 exponentials
    # auto on CUDA gives QLoRA the static engine: no weight copy; a prompt cache (4 prompts) and
    # a row cache (32 rows) of 768 slots (a multiple of 64 already), bf16.
    kv = 2 * L * KV * 768 * (4 + 32) * 2
    sampler = 32 * V * (2 + 12)
    assert planmod.GENERATION_WEIGHTS not in grpo and planmod.STATIC_LOAD not in grpo
    weights = grpo[planmod.POLICY_WEIGHTS]  # NF4 + bf16 + fp32 adapter (test_qlora_weights_by_hand)
    resident = weights + H * MLP * 2 + 8 * LORA_16  # + dequantised linear + fp32 AdamW m, v
    update = 4 * LORA_16 + acts + logits  # fp32 adapter gradients
    assert grpo[planmod.POLICY_ACTS] == acts and grpo[planmod.LOGITS] == logits
    assert grpo[planmod.KV_CACHE] == kv
    tensors = resident + max(update, kv + sampler)
    assert tensors == resident + update  # the update outweighs generation here
    # allocator slack 15% and a CUDA context of 0.8 GB, both assumed
    expected = tensors + round(0.15 * tensors) + 800_000_000
    assert out["grpo"]["total_bytes"] == expected
    assert expected <= 20e9  # the target: at most 20 GB (it is about 14.0 GB)
    assert 13.8e9 < expected < 14.2e9
    # Gradient checkpointing is the config's default, so the plan has it without the flag, and
    # --gradient_checkpointing false turns it off.
    bare = [a for a in QUESTION if a != "--gradient_checkpointing"]
    assert run_json(capsys, *bare)["grpo"]["total_bytes"] == expected
    off = run_json(capsys, *bare, "--gradient_checkpointing", "false")
    assert off["grpo"]["total_bytes"] > 40e9


def test_qwen3_8b_what_fits_24gb(capsys):
    out = run_json(capsys, *QUESTION)
    fits = out["fits"]
    assert fits["gpu_bytes"] == 24 * 2**30
    rows = {(r["method"], r["optim"], r["offload"], r["checkpointing"]): r
            for r in fits["combinations"]}  # fmt: skip
    assert len(rows) == 24
    asked = rows[("qlora", "adamw_torch", False, True)]
    assert asked["fits"] and asked["peak"] == out["grpo"]["total_bytes"]
    # Full fine-tuning of 8.2B parameters needs far more than 24 GiB (16.4 GB of bf16 weights
    # alone before gradients and AdamW), with any optimizer, offloading or checkpointing.
    assert not any(r["fits"] for key, r in rows.items() if key[0] == "full")
    assert rows[("qlora", "adamw_8bit", True, True)]["fits"]
    # Without checkpointing or offloading every layer's activations stay: 41 GB here.
    assert not rows[("qlora", "adamw_torch", False, False)]["fits"]
    assert main(QUESTION) == 0
    text = capsys.readouterr().out
    assert "What fits a 24 GiB GPU" in text and "QLoRA" in text


def test_the_searches_stop_at_the_boundary():
    shape = resolve_model_shape("qwen3-8b")
    budget = 24 * 2**30
    opts = MemoryOptions(
        batch=8, group_size=8, grad_accum=4, prompt_len=256, completion_len=512, lora_r=16,
        load_in_4bit=True, double_quant=True, gradient_checkpointing=True,
        cuda_context_bytes=500_000_000, allocator_slack=0.05,
    )  # fmt: skip
    longest = longest_completion(shape, opts, budget)
    assert total_bytes(plan_grpo(shape, replace(opts, completion_len=longest))) <= budget
    assert total_bytes(plan_grpo(shape, replace(opts, completion_len=longest + 1))) > budget
    group = largest_group(shape, opts, budget)
    assert total_bytes(plan_grpo(shape, group_options(opts, group))) <= budget
    assert total_bytes(plan_grpo(shape, group_options(opts, 2 * group))) > budget
    # G changes the completions generated together (4 prompts x G), not the micro-batch.
    assert (group_options(opts, 16).batch, group_options(opts, 16).grad_accum) == (8, 8)
    assert (group_options(opts, 2).batch, group_options(opts, 2).grad_accum) == (8, 1)
    # A combination that does not fit gets no search.
    full = [r for r in fit_rows(shape, opts, budget) if r.method == "full"]
    assert all(r.longest_completion is None and r.largest_group is None for r in full)


def test_measure_runs_the_planned_qlora_or_refuses(monkeypatch, capsys):
    """--measure runs the setting the plan counts: QLoRA goes into the run's options where
    GRPOConfig has load_in_4bit, and is refused where it has not."""
    from groupwise.config.grpo_config import GRPOConfig
    from groupwise.memory import cli

    seen = {}

    def fake_measurement(model, opts, **kwargs):
        seen.update(kwargs, opts=opts)
        return []

    monkeypatch.setattr(cli, "run_measurement", fake_measurement)
    code = main(["--model", "tiny-random", "--lora_r", "4", "--load_in_4bit", "--measure"])
    err = capsys.readouterr().err
    if "load_in_4bit" in GRPOConfig.field_names():
        assert code == 0 and seen["config"]["load_in_4bit"] is True
        assert seen["opts"].load_in_4bit
    else:
        assert code == 2 and "--measure cannot run --load_in_4bit True" in err


def test_gpu_memory_needs_layer_shapes(capsys):
    assert main(["--params", "7e9", "--gpu_memory", "24"]) == 2
    assert "--gpu_memory needs the model's layer shapes" in capsys.readouterr().err
    assert main(["--model", "tiny-random", "--gpu_memory", "24"]) == 0
    assert "What fits a 24 GiB GPU" in capsys.readouterr().out


def test_run_options_are_read_from_the_config_where_it_has_them(monkeypatch):
    """load_in_4bit, optim, activation_offloading and padding_free come from the run's config
    when it has those options (TRL's names), the command line overriding them."""
    from groupwise.memory import cli

    real = cli.load_run_config

    class WithOptions:
        def __init__(self, cfg, **extra):
            self._cfg, self._extra = cfg, extra

        def __getattr__(self, name):
            return self._extra[name] if name in self._extra else getattr(self._cfg, name)

    extra = {"load_in_4bit": True, "optim": "paged_adamw_8bit", "activation_offloading": True,
             "padding_free": True, "use_peft": True, "lora_r": 8,
             "generation_engine": "hf"}  # fmt: skip
    monkeypatch.setattr(cli, "load_run_config", lambda *a: WithOptions(real(*a), **extra))
    args = cli.build_parser().parse_args(["--model", "qwen3-0.6b", "--prompt_len", "64"])
    _, opts, _ = cli.options_from_args(args)
    assert (opts.load_in_4bit, opts.optimizer_kind, opts.lora_r) == (True, "paged_adamw8bit", 8)
    assert opts.activation_offloading and opts.padding_free
    args = cli.build_parser().parse_args(
        ["--model", "qwen3-0.6b", "--prompt_len", "64", "--optim", "adamw_torch"]
    )
    assert cli.options_from_args(args)[1].optimizer_kind == "adamw"
