"""The rollout-engine contract, checked for every engine in :data:`ENGINES` (the HF engine, the
static engine, and the vLLM engine over the fake vllm module, tests/fake_vllm.py): row order and
group ids, masks and padding, EOS and truncation, sampling log-probs equal to the trainer's,
greedy completions equal to the HF engine's, and, after an optimizer step and ``engine.sync``,
generation from the new weights. A new engine is one more ``(name, factory)`` line in
:data:`ENGINES`."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch

import fake_vllm
from conftest import sampling, static_engine_options, vllm_engine_options
from groupwise.policy.logprobs import completion_logprobs
from groupwise.rollout import (
    Engine,
    HFEngine,
    Request,
    RolloutEngine,
    eos_token_ids,
)
from groupwise.runtime.models import tiny_random_model

VOCAB = 16  # a small vocabulary: EOS is drawn often enough that rows both end and truncate
MAX_NEW = 10
PROMPTS = [[5, 7, 9, 11], [3], [4, 6, 8]]
COUNTS = [3, 1, 4]


@dataclass
class Case:
    """An engine under test, and what the test can see of its own copy of the weights (None for
    an engine on the policy's own parameters)."""

    engine: RolloutEngine
    weights: Callable[[], dict[str, torch.Tensor]] | None = None
    resets: Callable[[], int] | None = None


def hf_engine(model, tokenizer, params, monkeypatch) -> Case:
    generator = torch.Generator().manual_seed(0)
    return Case(HFEngine(model, tokenizer, params, generator, records_logprobs=True))


def fake_vllm_engine(model, tokenizer, params, monkeypatch) -> Case:
    import groupwise.rollout.vllm as vllm_engine

    fake_vllm.install(monkeypatch, platform="cpu")  # vLLM's CPU build: the policy is on the CPU
    engine = vllm_engine.build_vllm_engine(
        model,
        tokenizer,
        params,
        eos_token_ids(model, tokenizer),
        device=torch.device("cpu"),
        weights_dtype=torch.float32,
        seed=0,
        **vllm_engine_options(),
    )
    private = engine.llm.model.lm
    return Case(
        engine,
        weights=lambda: {n: p.detach().clone() for n, p in private.named_parameters()},
        resets=lambda: engine.llm.resets,
    )


def static_engine(model, tokenizer, params, monkeypatch) -> Case:
    from groupwise.rollout.static import StaticEngine

    generator = torch.Generator().manual_seed(0)
    engine = StaticEngine(
        model, tokenizer, params, generator, **static_engine_options(dtype=torch.float32)
    )
    return Case(
        engine, weights=lambda: {n: t.clone() for n, t in engine.decoder.hf_state().items()}
    )


ENGINES: list[tuple[str, Callable[..., Case]]] = [
    ("hf", hf_engine),
    ("static", static_engine),
    ("vllm", fake_vllm_engine),
]


@pytest.fixture()
def model():
    return tiny_random_model(seed=3, vocab_size=VOCAB)


@pytest.fixture(params=ENGINES, ids=[name for name, _ in ENGINES])
def make(request, monkeypatch, tokenizer):
    factory = request.param[1]
    return lambda model, params: factory(model, tokenizer, params, monkeypatch)


def trainer_logprobs(model, rollout, temperature: float) -> torch.Tensor:
    index = rollout.group_ids
    with torch.no_grad():
        logps, _ = completion_logprobs(
            model,
            rollout.prompt_ids[index],
            rollout.prompt_mask[index],
            rollout.completion_ids,
            rollout.completion_mask,
            temperature=temperature,
        )
    return logps


def test_rows_groups_masks_padding_and_truncation(make, model, tokenizer):
    params = sampling(MAX_NEW, temperature=1.0)
    rollout = make(model, params).engine.generate(PROMPTS, COUNTS)
    assert rollout.group_ids.tolist() == [0, 0, 0, 1, 2, 2, 2, 2]
    # Prompts left-padded, once each.
    assert rollout.prompt_ids.shape == (3, 4)
    assert rollout.prompt_mask.tolist() == [[1, 1, 1, 1], [0, 0, 0, 1], [0, 1, 1, 1]]
    for p, ids in enumerate(PROMPTS):
        assert rollout.prompt_ids[p, -len(ids) :].tolist() == ids
    eos = set(eos_token_ids(model, tokenizer))
    pad = tokenizer.pad_token_id
    lengths = rollout.completion_mask.sum(1).tolist()
    assert rollout.completion_ids.shape[1] == max(lengths)
    ended = truncated = 0
    for i, n in enumerate(lengths):
        row, mask = rollout.completion_ids[i].tolist(), rollout.completion_mask[i].tolist()
        assert mask == [1] * n + [0] * (len(mask) - n)  # right-padded
        assert all(t == pad for t in row[n:])
        if rollout.truncated[i]:
            truncated += 1
            assert n == MAX_NEW and not eos & set(row[:n])
        else:
            ended += 1
            assert row[n - 1] in eos and not eos & set(row[: n - 1])  # EOS kept in the mask
        assert rollout.texts[i] == tokenizer.decode(row[:n], skip_special_tokens=True)
    assert ended and truncated  # both kinds of rows are exercised
    assert torch.equal(rollout.loss_mask, rollout.completion_mask)
    assert rollout.sampling_logprobs.dtype == torch.float32
    assert (rollout.sampling_logprobs[rollout.completion_mask == 0] == 0).all()


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampling_logprobs_equal_the_trainers(make, model, temperature):
    """Same fp32 numerics: the rollout correction weight pi_old / pi_rollout is 1."""
    params = sampling(MAX_NEW, temperature=temperature)
    rollout = make(model, params).engine.generate(PROMPTS, COUNTS)
    logps = trainer_logprobs(model, rollout, temperature)
    mask = rollout.completion_mask.bool()
    torch.testing.assert_close(rollout.sampling_logprobs[mask], logps[mask], atol=1e-5, rtol=0)


def test_sampling_logprobs_are_of_the_truncated_distribution(make, model):
    """With top-k / top-p, each recorded log-prob is log softmax(logits / T) over the kept set,
    renormalised (vLLM's processed_logprobs), computed here from the full logits."""
    params = sampling(MAX_NEW, temperature=0.8, top_k=6, top_p=0.8)
    rollout = make(model, params).engine.generate(PROMPTS, COUNTS)
    for i in range(rollout.completion_ids.shape[0]):
        prompt = PROMPTS[int(rollout.group_ids[i])]
        n = int(rollout.completion_mask[i].sum())
        tokens = rollout.completion_ids[i, :n].tolist()
        with torch.no_grad():
            logits = model(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1 : -1]
        for t, token in enumerate(tokens):
            probs = torch.softmax(logits[t].double() / 0.8, -1)
            order = probs.argsort(descending=True)[:6]  # top-k
            kept = probs[order] / probs[order].sum()
            before = kept.cumsum(0) - kept
            order, kept = order[before < 0.8], kept[before < 0.8]  # top-p
            assert token in order.tolist()
            expected = math.log(kept[order.tolist().index(token)] / kept.sum())
            assert abs(float(rollout.sampling_logprobs[i, t]) - expected) < 1e-5


def test_min_p_and_repetition_penalty_apply_in_every_engine(make, model):
    """TRL's min_p and repetition_penalty: each recorded log-prob is that of the distribution
    HF's processors give, computed here from the full logits: every logit of a token already in
    the prompt or the completion divided by the penalty if positive (multiplied if negative),
    then / T, then the tokens below min_p times the top probability dropped, renormalised."""
    penalty, min_p, temperature = 1.5, 0.3, 0.9
    params = sampling(MAX_NEW, temperature=temperature, min_p=min_p, repetition_penalty=penalty)
    rollout = make(model, params).engine.generate(PROMPTS, COUNTS)
    checked = 0
    for i in range(rollout.completion_ids.shape[0]):
        prompt = PROMPTS[int(rollout.group_ids[i])]
        n = int(rollout.completion_mask[i].sum())
        tokens = rollout.completion_ids[i, :n].tolist()
        with torch.no_grad():
            logits = model(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1 : -1]
        for t, token in enumerate(tokens):
            z = logits[t].double().clone()
            for seen in set(prompt + tokens[:t]):
                z[seen] = z[seen] / penalty if z[seen] > 0 else z[seen] * penalty
            probs = torch.softmax(z / temperature, -1)
            kept = probs >= min_p * probs.max()
            assert bool(kept[token]), f"row {i} token {t}: {token} is below min_p"
            expected = math.log(probs[token] / probs[kept].sum())
            assert abs(float(rollout.sampling_logprobs[i, t]) - expected) < 1e-5
            checked += 1
    assert checked > 10


def test_greedy_with_repetition_penalty_equals_the_hf_engines(make, model, tokenizer):
    params = sampling(MAX_NEW, temperature=0.0, repetition_penalty=3.0)
    reference = HFEngine(model, tokenizer, params).generate(PROMPTS, COUNTS)
    plain = HFEngine(model, tokenizer, sampling(MAX_NEW, temperature=0.0))
    rollout = make(model, params).engine.generate(PROMPTS, COUNTS)
    assert torch.equal(rollout.completion_ids, reference.completion_ids)
    # The penalty changed the greedy text (else this test would not see it).
    assert not torch.equal(plain.generate(PROMPTS, COUNTS).completion_ids, reference.completion_ids)


def test_greedy_completions_equal_the_hf_engines(make, model, tokenizer):
    params = sampling(MAX_NEW, temperature=0.0)
    reference = HFEngine(model, tokenizer, params).generate(PROMPTS, COUNTS)
    rollout = make(model, params).engine.generate(PROMPTS, COUNTS)
    assert torch.equal(rollout.completion_ids, reference.completion_ids)
    assert torch.equal(rollout.completion_mask, reference.completion_mask)
    assert torch.equal(rollout.truncated, reference.truncated)


def test_after_an_optimizer_step_and_sync_generation_follows_the_new_policy(make, model, tokenizer):
    params = sampling(MAX_NEW, temperature=0.0)
    case = make(model, params)
    engine = case.engine
    before = engine.generate(PROMPTS, COUNTS).completion_ids  # fills a prefix cache, if any
    resets = case.resets() if case.resets else None
    # Optimizer steps that move every prompt's greedy first token elsewhere.
    target = (before[[0, 3, 4], 0] + 5) % VOCAB  # rows 0, 3, 4 open the three groups
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    for _ in range(10):
        logits = torch.stack([model(torch.tensor([ids])).logits[0, -1] for ids in PROMPTS])
        torch.nn.functional.cross_entropy(logits, target).backward()
        optimizer.step()
        optimizer.zero_grad()
    engine.sync(model)
    after = engine.generate(PROMPTS, COUNTS).completion_ids
    reference = HFEngine(model, tokenizer, params).generate(PROMPTS, COUNTS).completion_ids
    assert torch.equal(after, reference)
    assert after[[0, 3, 4], 0].tolist() == target.tolist()
    assert not torch.equal(after[:, 0], before[:, 0])
    if case.weights is not None:
        pushed = case.weights()
        for name, param in model.named_parameters():
            assert torch.equal(pushed[name], param.detach()), name
    if case.resets is not None:
        assert case.resets() == resets + 1


@pytest.mark.parametrize(
    ("prompts", "counts", "message"),
    [
        (PROMPTS, [3, 1], r"need one count >= 1 per prompt, got \[3, 1\]"),
        (PROMPTS, [3, 0, 4], r"need one count >= 1 per prompt, got \[3, 0, 4\]"),
        (PROMPTS, 0, "need one count >= 1 per prompt, got 0"),
        ([[5, 7], []], 2, "empty prompt: every prompt must have at least one token"),
    ],
)
def test_every_engine_refuses_a_missing_count_or_an_empty_prompt_alike(
    make, model, prompts, counts, message
):
    engine = make(model, sampling(max_completion_length=MAX_NEW)).engine
    with pytest.raises(ValueError, match=message):
        engine.generate(prompts, counts)


def test_every_engine_is_a_rollout_engine(make, model):
    engine = make(model, sampling(max_completion_length=MAX_NEW)).engine
    assert isinstance(engine, Engine) and isinstance(engine, RolloutEngine)


class Echo(Engine):
    """A user's engine: it writes only ``sample`` and keeps every request it gets."""

    def __init__(self, params, generator=None):
        self.params, self.generator, self.requests = params, generator, []

    def sample(self, request):
        self.requests.append(request)
        return "sampled"


def test_a_derived_engine_gets_checked_requests_with_its_own_defaults():
    own, given = sampling(8), sampling(4, temperature=0.0)
    own_generator, given_generator = torch.Generator(), torch.Generator()
    engine = Echo(own, own_generator)
    rows = [{"prompt": "a"}, {"prompt": "b"}]
    assert engine.generate([(5, 7), torch.tensor([3])], 2, rows=rows) == "sampled"
    first = engine.requests[-1]
    assert first == Request([[5, 7], [3]], [2, 2], own, own_generator, rows)
    assert first.count == 2  # uniform groups: one count
    engine.generate([[5, 7], [3]], [2, 1], given, given_generator)
    second = engine.requests[-1]
    assert (second.counts, second.params, second.generator, second.rows) == (
        [2, 1], given, given_generator, None
    )  # fmt: skip
    assert second.count == [2, 1]
    with pytest.raises(ValueError, match="need one count >= 1 per prompt"):
        engine.generate([[5, 7], [3]], [2])
    with pytest.raises(ValueError, match="empty prompt"):
        engine.generate([[5, 7], []], 1)
    assert len(engine.requests) == 2  # a refused call never reaches sample


def test_hand_written_engines_still_satisfy_the_protocol():
    class HandWritten:  # no base class: the protocol is structural
        def generate(self, prompt_ids, counts, params=None, generator=None, rows=None):
            return None

        def sync(self, policy):
            pass

    class Declared(RolloutEngine):  # names the protocol but defines no generate
        pass

    assert isinstance(HandWritten(), RolloutEngine)
    assert not isinstance(object(), RolloutEngine)
    with pytest.raises(NotImplementedError, match="Declared is a rollout engine: define generate"):
        Declared().generate([[1]], 1)
