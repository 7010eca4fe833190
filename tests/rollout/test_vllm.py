"""The colocated vLLM engine (groupwise.rollout.vllm) on the fake vllm module (tests/fake_vllm.py):
how it builds the LLM, the requests it makes, sleep mode, the per-layer weight push (LoRA merged
out of place in fp32), the options and their refusals, and a GRPOTrainer run on it. The engine
contract itself (rows, masks, log-probs, sync) is tests/rollout/test_engine_contract.py."""

from __future__ import annotations

import sys

import pytest
import torch

import fake_vllm
import groupwise.rollout.vllm as vllm_engine
from conftest import TargetToken, tiny_config
from groupwise import GRPOConfig, GRPOTrainer
from groupwise.errors import ConfigError
from groupwise.rollout import SamplingParams, eos_token_ids


@pytest.fixture()
def fake(monkeypatch):
    module = fake_vllm.install(monkeypatch)
    monkeypatch.setattr(vllm_engine, "require_cuda", lambda device: None)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("RANK", raising=False)
    return module


def build(model, tokenizer, params=None, **options):
    return vllm_engine.build_vllm_engine(
        model,
        tokenizer,
        params or SamplingParams(6),
        eos_token_ids(model, tokenizer),
        device=torch.device("cpu"),
        weights_dtype=torch.float32,
        seed=7,
        **options,
    )


# ----------------------------------------------------------------------------------------------
# Construction and requests


def test_the_llm_is_built_as_colocated_vllm(fake, tokenizer, tiny_model):
    engine = build(tiny_model, tokenizer, max_model_len=64, gpu_memory_utilization=0.25)
    options = engine.llm.kwargs
    assert options["logprobs_mode"] == "processed_logprobs"
    assert options["load_format"] == "dummy" and options["tensor_parallel_size"] == 1
    assert (options["seed"], options["max_model_len"]) == (7, 64)
    assert options["gpu_memory_utilization"] == 0.25 and options["enable_prefix_caching"]
    assert options["dtype"] == "float32"  # CPU: the weights' dtype (bf16 on a bf16 GPU)
    assert "distributed_executor_backend" not in options  # one process
    # The policy's weights were pushed at construction (the LLM starts from dummy weights).
    private = dict(engine.llm.model.lm.named_parameters())
    for name, param in tiny_model.named_parameters():
        assert torch.equal(private[name], param), name
    assert engine.syncs == 1


def test_under_torchrun_each_rank_has_its_own_seed_and_the_external_launcher(
    fake, tokenizer, tiny_model, monkeypatch
):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    options = build(tiny_model, tokenizer).llm.kwargs
    assert options["distributed_executor_backend"] == "external_launcher"
    assert options["seed"] == 8


def test_one_request_per_prompt_from_token_ids(fake, tokenizer, tiny_model, monkeypatch):
    params = SamplingParams(5, temperature=0.9, top_p=0.95, top_k=0)
    engine = build(tiny_model, tokenizer, params)
    seen = {}
    original = engine.llm.generate

    def spy(prompts, sampling_params=None, use_tqdm=True):
        seen["prompts"], seen["params"] = prompts, sampling_params
        return original(prompts, sampling_params, use_tqdm)

    monkeypatch.setattr(engine.llm, "generate", spy)
    engine.generate([[5, 6, 7], [8]], [2, 3])
    assert seen["prompts"] == [{"prompt_token_ids": [5, 6, 7]}, {"prompt_token_ids": [8]}]
    first, second = seen["params"]
    assert (first.n, second.n) == (2, 3)
    assert (first.temperature, first.top_p, first.top_k) == (0.9, 0.95, -1)  # -1: no top-k
    assert (first.max_tokens, first.logprobs) == (5, 0)
    assert first.stop_token_ids == eos_token_ids(tiny_model, tokenizer)
    assert first.seed is None  # training: vLLM's own random state
    engine.generate([[5]], 1, SamplingParams(5, temperature=0.0, top_k=4))
    assert (seen["params"][0].temperature, seen["params"][0].top_k) == (0.0, 4)
    # An explicit generator (evaluation) seeds each request: reproducible.
    a = engine.generate([[5], [6]], 2, generator=torch.Generator().manual_seed(3))
    b = engine.generate([[5], [6]], 2, generator=torch.Generator().manual_seed(3))
    assert seen["params"][0].seed is not None and torch.equal(a.completion_ids, b.completion_ids)


def test_sleep_mode_sleeps_between_generations(fake, tokenizer, tiny_model):
    engine = build(tiny_model, tokenizer, enable_sleep_mode=True)
    llm = engine.llm
    assert llm.kwargs["enable_sleep_mode"] and llm.sleeping == {"weights", "kv_cache"}
    llm.events.clear()
    engine.generate([[5, 6]], 2)
    assert llm.events == ["wake_up(['kv_cache', 'weights'])", "generate", "sleep(1)"]
    llm.events.clear()
    engine.sync(tiny_model)  # weights woken to be written; the KV cache stays released
    assert llm.events == ["wake_up(['weights'])", "reset_prefix_cache"]
    llm.events.clear()
    engine.generate([[5, 6]], 2)
    assert llm.events == ["wake_up(['kv_cache'])", "generate", "sleep(1)"]


def test_weights_are_pushed_layer_by_layer_under_checkpoint_names(fake, tokenizer, tiny_model):
    engine = build(tiny_model, tokenizer)
    calls = engine.llm.model.loaded
    names = [n for call in calls for n in call]
    assert names == [n for n, _ in tiny_model.named_parameters()]  # tied lm_head sent once
    assert "lm_head.weight" not in names
    for call in calls:  # one decoder layer (or one other tensor) per load_weights call
        layers = {n.split(".")[2] for n in call if n.startswith("model.layers.")}
        assert len(layers) <= 1 and (layers or len(call) == 1), call
    assert len(calls) == 2 + 2  # embedding, two layers, final norm


def test_checkpoint_names_strip_peft_and_skip_adapters():
    from groupwise.rollout.weight_sync import checkpoint_name as name

    assert name("base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight") == (
        "model.layers.0.self_attn.q_proj.weight"
    )
    assert name("base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight") is None
    assert name("base_model.model.lm_head.modules_to_save.default.weight") == "lm_head.weight"
    assert name("base_model.model.lm_head.original_module.weight") is None
    assert name("model.norm.weight") == "model.norm.weight"


def test_lora_sync_pushes_merged_weights_and_leaves_the_base_alone(fake, tokenizer, tiny_model):
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    policy = get_peft_model(tiny_model, config)
    with torch.no_grad():  # peft starts B at 0 (no update); give the adapters a real one
        for name, param in policy.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.5)
    base = {n: p.detach().clone() for n, p in policy.named_parameters() if "lora_" not in n}
    engine = build(policy, tokenizer)
    for _ in range(3):
        engine.sync(policy)
    for name, param in policy.named_parameters():  # bit-identical: nothing merged in place
        if "lora_" not in name:
            assert torch.equal(param, base[name]), name
    pushed = dict(engine.llm.model.lm.named_parameters())
    scale = 8 / 4
    for layer in range(2):
        for proj in ("q_proj", "v_proj"):
            module = policy.base_model.model.model.layers[layer].self_attn.get_submodule(proj)
            a = module.lora_A["default"].weight.double()
            b = module.lora_B["default"].weight.double()
            expected = module.base_layer.weight.double() + scale * b @ a
            got = pushed[f"model.layers.{layer}.self_attn.{proj}.weight"].double()
            torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
        untouched = f"model.layers.{layer}.mlp.up_proj.weight"
        assert torch.equal(pushed[untouched], base[f"base_model.model.{untouched}"])


def test_without_vllm_the_engine_says_what_to_install(monkeypatch, tokenizer, tiny_model):
    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm raises ImportError
    with pytest.raises(ConfigError, match=r'pip install "groupwise\[vllm\]".*CUDA GPU'):
        build(tiny_model, tokenizer)


def test_a_non_cuda_device_is_refused(monkeypatch, tokenizer, tiny_model):
    fake_vllm.install(monkeypatch)
    with pytest.raises(ConfigError, match="needs a CUDA GPU"):
        build(tiny_model, tokenizer)


# ----------------------------------------------------------------------------------------------
# Options


def test_use_vllm_means_the_vllm_engine():
    config = GRPOConfig(use_vllm=True, vllm_gpu_memory_utilization=0.5, vllm_mode="colocate")
    assert config.generation_engine == "vllm" and config.vllm_gpu_memory_utilization == 0.5
    assert config.trl_ignored == {}
    assert GRPOConfig(use_vllm=False).generation_engine == "hf"
    assert GRPOConfig.from_dict({"use_vllm": "true"}).generation_engine == "vllm"
    assert GRPOConfig().vllm_gpu_memory_utilization == 0.3  # TRL's default
    with pytest.raises(ConfigError, match="use_vllm=True means generation_engine='vllm'"):
        GRPOConfig(use_vllm=True, generation_engine="hf")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"vllm_mode": "server"}, "vllm_mode=server is not supported"),
        ({"vllm_tensor_parallel_size": 2}, "vllm_tensor_parallel_size=2 is not supported"),
        ({"tools": ["calculator"]}, "does not run tools or environments"),
        ({"environment": "guess_number"}, "does not run tools or environments"),
        ({"vllm_gpu_memory_utilization": 1.5}, r"must be in \(0, 1\]"),
        ({"vllm_max_model_length": 0}, "vllm_max_model_length must be >= 1"),
    ],
)
def test_vllm_options_are_checked(options, message):
    with pytest.raises(ConfigError, match=message):
        GRPOConfig(generation_engine="vllm", **options)


def test_generation_engine_is_validated():
    with pytest.raises(ConfigError, match=r"generation_engine='sglang' is not one of \['hf'"):
        GRPOConfig(generation_engine="sglang")
    assert GRPOConfig(vllm_mode="server").vllm_mode == "server"  # no effect with the hf engine


# ----------------------------------------------------------------------------------------------
# A run


def test_a_grpo_run_on_the_vllm_engine_trains_with_rollout_correction(fake, tmp_path):
    config = tiny_config(tmp_path, generation_engine="vllm", max_steps=2, logging_steps=1)
    rows = [{"prompt": f"Say something number {i}"} for i in range(16)]
    trainer = GRPOTrainer("tiny-random", TargetToken(), rows, args=config)
    assert isinstance(trainer.engine, vllm_engine.VLLMEngine)
    before = {n: p.detach().clone() for n, p in trainer.policy.model.named_parameters()}
    trainer.train()
    engine = trainer.engine
    assert engine.syncs == 1 + 2  # at construction, then after each step
    assert engine.llm.resets == 3
    logs = [
        entry for entry in trainer.log_history if "sampling/importance_sampling_ratio/mean" in entry
    ]
    assert len(logs) == 2
    for entry in logs:  # same fp32 numerics on CPU: the weights are 1
        assert abs(entry["sampling/importance_sampling_ratio/mean"] - 1.0) < 1e-4
        assert entry["sampling/sampling_logp_difference/max"] < 1e-4
    moved = any(not torch.equal(p, before[n]) for n, p in trainer.policy.model.named_parameters())
    assert moved
    pushed = dict(engine.llm.model.lm.named_parameters())
    for name, param in trainer.policy.model.named_parameters():
        assert torch.equal(pushed[name], param.detach()), name
