"""The entropy bonus (TRL's entropy_coef) and its adaptive coefficient (Skywork-OR1): the
entropy's gradient in every log-prob implementation, the bonus's share of the global batch,
the controller by hand, and training runs that log and apply it."""

from __future__ import annotations

import math

import pytest
import torch

from conftest import TargetToken
from conftest import tiny_config as _config
from groupwise import GRPOConfig, GRPOTrainer
from groupwise.algo.grpo import adapt_entropy_coef, entropy_bonus
from groupwise.algo.variants import BatchCounts, MicroBatch
from groupwise.errors import ConfigError
from groupwise.policy.logprobs import ChunkedLMHeadLogprob, completion_logprobs
from groupwise.policy.loss import EntropyControl, GRPOLoss
from groupwise.runtime.distributed import DistributedContext
from groupwise.runtime.models import load_model_and_tokenizer

ROWS = [{"prompt": f"Say something number {i}"} for i in range(8)]
SINGLE = DistributedContext()


def _reference_entropy(hidden, weight, bias, temperature, softcap):
    logits = hidden @ weight.T + bias
    if softcap is not None:
        logits = softcap * torch.tanh(logits / softcap)
    log_p = torch.log_softmax(logits / temperature, dim=-1)
    return -(log_p.exp() * log_p).sum(-1)


# ----------------------------------------------------------------------------------------------
# the entropy's gradient


@pytest.mark.parametrize("temperature, softcap", [(1.0, None), (0.7, 3.0)])
def test_chunked_entropy_gradient_matches_autograd_of_the_full_softmax(temperature, softcap):
    # Eq. 7 of logprobs (dH/dz = -p (log p + H)), chained through the temperature and the cap,
    # against autograd through a full log-softmax; 7 rows in chunks of 3 (a ragged last chunk).
    torch.manual_seed(0)
    hidden = torch.randn(7, 5, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(11, 5, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(11, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 11, (7,))
    upstream_logp, upstream_entropy = torch.randn(7, dtype=torch.float64), torch.randn(7)
    logp, entropy = ChunkedLMHeadLogprob.apply(
        hidden, targets, weight, bias, temperature, softcap, 3, True
    )
    ((logp * upstream_logp).sum() + (entropy * upstream_entropy).sum()).backward()
    got = [t.grad.clone() for t in (hidden, weight, bias)]
    for t in (hidden, weight, bias):
        t.grad = None
    ref_entropy = _reference_entropy(hidden, weight, bias, temperature, softcap)
    logits = hidden @ weight.T + bias
    if softcap is not None:
        logits = softcap * torch.tanh(logits / softcap)
    ref_logp = torch.log_softmax(logits / temperature, -1).gather(-1, targets[:, None])[:, 0]
    ((ref_logp * upstream_logp).sum() + (ref_entropy * upstream_entropy).sum()).backward()
    torch.testing.assert_close(entropy, ref_entropy)
    for mine, ref in zip(got, (hidden.grad, weight.grad, bias.grad), strict=True):
        torch.testing.assert_close(mine, ref)
    assert torch.autograd.gradcheck(
        lambda h, w, b: ChunkedLMHeadLogprob.apply(h, targets, w, b, temperature, softcap, 3, True),
        (hidden, weight, bias),
    )


@pytest.fixture(scope="module")
def tiny_model():
    model, _ = load_model_and_tokenizer("tiny-random")
    return model


@pytest.mark.parametrize("impl", ["chunked", "checkpoint", "naive"])
def test_entropies_carry_a_gradient_only_when_asked(tiny_model, impl):
    prompt = torch.tensor([[5, 6, 7]])
    completion = torch.tensor([[8, 9, 10, 0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    kwargs = dict(impl=impl, chunk_size=2)
    _, detached = completion_logprobs(tiny_model, prompt, torch.ones_like(prompt), completion,
                                      mask, **kwargs)  # fmt: skip
    assert not detached.requires_grad
    tiny_model.zero_grad()
    _, entropies = completion_logprobs(tiny_model, prompt, torch.ones_like(prompt), completion,
                                       mask, entropy_grad=True, **kwargs)  # fmt: skip
    assert entropies.requires_grad
    torch.testing.assert_close(entropies.detach(), detached)
    (entropies * mask).sum().backward()
    grads = [p.grad for p in tiny_model.parameters() if p.grad is not None]
    assert grads and any(g.abs().sum() > 0 for g in grads)
    tiny_model.zero_grad()


def test_the_three_implementations_give_the_same_entropy_gradient(tiny_model):
    prompt = torch.tensor([[5, 6, 7]])
    completion = torch.tensor([[8, 9, 10, 0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    head = tiny_model.get_output_embeddings().weight
    grads = {}
    for impl in ("chunked", "checkpoint", "naive"):
        tiny_model.zero_grad()
        _, entropies = completion_logprobs(tiny_model, prompt, torch.ones_like(prompt),
                                           completion, mask, impl=impl, chunk_size=2,
                                           entropy_grad=True)  # fmt: skip
        (entropies * mask).sum().backward()
        grads[impl] = head.grad.clone()
    tiny_model.zero_grad()
    torch.testing.assert_close(grads["chunked"], grads["naive"], rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(grads["checkpoint"], grads["naive"], rtol=1e-4, atol=1e-6)


# ----------------------------------------------------------------------------------------------
# the controller (Eqs. 2-3 of groupwise.policy.loss)


def test_adapt_entropy_coef_by_hand():
    bounds = dict(target=0.2, delta=0.005, coef_min=0.0, coef_max=0.02)
    assert adapt_entropy_coef(0.01, 0.1, **bounds) == pytest.approx(0.015)  # below: raise
    assert adapt_entropy_coef(0.01, 0.2, **bounds) == pytest.approx(0.015)  # at: raise
    assert adapt_entropy_coef(0.01, 0.3, **bounds) == pytest.approx(0.005)  # above: lower
    assert adapt_entropy_coef(0.018, 0.1, **bounds) == pytest.approx(0.02)  # capped at max
    assert adapt_entropy_coef(0.003, 0.3, **bounds) == 0.0  # floored at min


def _loss(**options):
    """The loss section of a config with ``options``."""
    return GRPOConfig(**options).sections().loss


def test_adaptive_control_applies_the_coefficient_only_at_or_below_target():
    control = EntropyControl(_loss(entropy_coef=0.01, use_adaptive_entropy=True,
                                    entropy_target=0.5, entropy_coef_delta=0.01))
    assert control.applied == 0.0  # nothing measured yet (TRL)
    # Two micro-batches in one optimizer step: entropies 0.2, 0.4 (2 tokens) and 0.3 (1 token;
    # the second token is padding): token mean 0.3 <= 0.5, so c = 0.02 and it applies.
    control.observe(torch.tensor([[0.2, 0.4]]), torch.tensor([[1, 1]]))
    control.observe(torch.tensor([[0.3, 9.0]]), torch.tensor([[1, 0]]))
    control.step(SINGLE)
    assert control.coef == pytest.approx(0.02)
    assert control.last_entropy == pytest.approx(0.3)
    assert control.applied == pytest.approx(0.02)
    control.observe(torch.tensor([[0.9]]), torch.tensor([[1]]))  # above the target
    control.step(SINGLE)
    assert control.coef == pytest.approx(0.01)
    assert control.applied == 0.0
    # A step without observations (nothing to measure) keeps everything.
    control.step(SINGLE)
    assert (control.coef, control.last_entropy) == (pytest.approx(0.01), pytest.approx(0.9))
    clone = EntropyControl(_loss(entropy_coef=0.5, use_adaptive_entropy=True, entropy_target=0.5))
    clone.load_state_dict(control.state_dict())
    assert (clone.coef, clone.applied) == (pytest.approx(0.01), 0.0)


def test_a_static_coefficient_always_applies():
    control = EntropyControl(_loss(entropy_coef=0.1))
    control.observe(torch.tensor([[5.0]]), torch.tensor([[1]]))
    control.step(SINGLE)
    assert (control.coef, control.applied) == (0.1, 0.1)


# ----------------------------------------------------------------------------------------------
# the bonus in the loss


def _micro_batch(rows, mask, entropy, counts):
    n = len(rows)
    return MicroBatch(
        rows=torch.tensor(rows), mask=mask, advantages=torch.zeros(n), old_logprobs=None,
        ref_logprobs=None, correction=None, row_weights=None, counts=counts, entropy=entropy,
    )  # fmt: skip


@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo", "dapo", "bnpo"])
def test_the_bonus_is_the_global_token_mean_entropy_whatever_the_loss_type(loss_type):
    # Three completions with 2, 1 and 3 tokens: entropies 1, 2 | 4 | 3, 3, 6. Token mean over the
    # global batch = (1 + 2 + 4 + 3 + 3 + 6) / 6 = 19 / 6. Split in two micro-batches (rows 0-1,
    # row 2), the bonuses must add up to -c * 19 / 6 for every loss type; d bonus / d H_t =
    # -c / 6 per token.
    coef = 0.5
    args = GRPOConfig(loss_type=loss_type, beta=0.0, entropy_coef=coef, max_completion_length=3)
    loss = GRPOLoss.from_config(args)
    entropy = torch.tensor([[1.0, 2.0, 0.0], [4.0, 0.0, 0.0], [3.0, 3.0, 6.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    counts = BatchCounts(rows=3, tokens=torch.tensor(6.0), micro_batches=2)
    logps = torch.zeros(3, 3, requires_grad=True)
    total = 0.0
    for rows in ([0, 1], [2]):
        index = torch.tensor(rows)
        terms = loss(logps[index], _micro_batch(rows, mask[index], entropy[index], counts))
        total = total + terms.bonus
    assert total.item() == pytest.approx(-coef * 19 / 6)
    total.backward()
    torch.testing.assert_close(entropy.grad, -coef / 6 * mask)


def test_the_bonus_follows_the_top_entropy_tokens():
    # top_entropy_quantile 0.5 over entropies [0.1, 0.9]: only the second token is trained on,
    # so the bonus is -c * 0.9 (its one token's mean; the micro-batch holds all the tokens).
    args = GRPOConfig(beta=0.0, entropy_coef=0.2, top_entropy_quantile=0.5)
    counts = BatchCounts(rows=1, tokens=torch.tensor(2.0), micro_batches=1)
    mb = _micro_batch([0], torch.ones(1, 2), torch.tensor([[0.1, 0.9]]), counts)
    terms = GRPOLoss.from_config(args)(torch.zeros(1, 2, requires_grad=True), mb)
    assert terms.bonus.item() == pytest.approx(-0.2 * 0.9)


def test_entropy_bonus_share_by_hand():
    entropies = torch.tensor([[1.0, 3.0, 100.0]])
    keep = torch.tensor([[1, 1, 0]])
    assert entropy_bonus(entropies, keep, 0.25).item() == pytest.approx(0.5)  # mean 2 x 0.25


def test_without_a_bonus_the_loss_has_none():
    args = GRPOConfig(beta=0.0)
    counts = BatchCounts(rows=1, tokens=torch.tensor(2.0), micro_batches=1)
    mb = _micro_batch([0], torch.ones(1, 2), torch.tensor([[0.1, 0.9]]), counts)
    loss = GRPOLoss.from_config(args)
    assert loss.entropy is None and not loss.entropy_grad
    assert loss(torch.zeros(1, 2, requires_grad=True), mb).bonus is None


def test_a_gradient_step_on_the_bonus_raises_the_entropy():
    # The sign: minimising L = -c * H must make a peaked distribution flatter.
    logits = torch.tensor([[4.0, 0.0, -1.0]], requires_grad=True)
    args = GRPOConfig(beta=0.0, entropy_coef=1.0)
    counts = BatchCounts(rows=1, tokens=torch.tensor(1.0), micro_batches=1)

    def entropy_of(z):
        log_p = torch.log_softmax(z, -1)
        return -(log_p.exp() * log_p).sum(-1, keepdim=True)

    before = entropy_of(logits).item()
    mb = _micro_batch([0], torch.ones(1, 1), entropy_of(logits), counts)
    GRPOLoss.from_config(args)(torch.zeros(1, 1, requires_grad=True), mb).bonus.backward()
    with torch.no_grad():
        logits -= 0.5 * logits.grad
    assert entropy_of(logits).item() > before + 0.005  # 0.129 -> 0.137


# ----------------------------------------------------------------------------------------------
# options


def test_entropy_options_are_checked():
    with pytest.raises(ConfigError, match="entropy_coef_min <= entropy_coef <= entropy_coef_max"):
        GRPOConfig(use_adaptive_entropy=True, entropy_coef=2.0)
    with pytest.raises(ConfigError, match="entropy_coef_delta must be >= 0"):
        GRPOConfig(use_adaptive_entropy=True, entropy_coef_delta=-0.1)
    with pytest.raises(ConfigError, match="entropy_target"):
        GRPOConfig(use_adaptive_entropy=True, entropy_target=-1.0)
    with pytest.raises(ConfigError, match="entropy_coef"):
        GRPOConfig(entropy_coef=math.nan)


# ----------------------------------------------------------------------------------------------
# training


def test_training_logs_loss_as_policy_loss_minus_coef_times_entropy(tmp_path):
    # One pass (num_iterations 1): logged loss = policy_loss - c * entropy exactly, with the
    # logged entropy the batch's token mean.
    args = _config(tmp_path, entropy_coef=0.5, max_steps=2, logging_steps=1)
    trainer = GRPOTrainer("tiny-random", TargetToken(), ROWS, args=args)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    rows = [r for r in trainer.log_history if "policy_loss" in r]
    assert len(rows) == 2
    for row in rows:
        assert row["policy_loss"] - row["loss"] == pytest.approx(0.5 * row["entropy"], rel=1e-5)
        assert row["entropy_coef"] == 0.5
    assert trainer.state.log_history[-1]["entropy_coef"] == 0.5
    assert trainer.entropy_coef == 0.5
    assert any(not torch.equal(before[n], p) for n, p in trainer.model.named_parameters())


def test_the_bonus_changes_the_update(tmp_path):
    # Same seed, same data: the bonus's gradient makes the weights differ from a run without it.
    weights = []
    for coef in (0.0, 0.5):
        args = _config(tmp_path / str(coef), entropy_coef=coef, max_steps=1)
        trainer = GRPOTrainer("tiny-random", TargetToken(), ROWS, args=args)
        trainer.train()
        weights.append(trainer.model.get_output_embeddings().weight.detach().clone())
    assert not torch.equal(*weights)


def test_adaptive_coefficient_moves_once_per_optimizer_step(tmp_path):
    # TRL's check: a target above any entropy raises c by delta after every optimizer step,
    # also with gradient accumulation (one update per step, not per micro-batch).
    args = _config(tmp_path, entropy_coef=0.01, use_adaptive_entropy=True, entropy_target=15.0,
                   entropy_coef_delta=0.005, gradient_accumulation_steps=2,
                   per_device_train_batch_size=4, max_steps=3)  # fmt: skip
    trainer = GRPOTrainer("tiny-random", TargetToken(), ROWS, args=args)
    trainer.train()
    assert trainer.state.global_step == 3
    assert trainer.entropy_coef == pytest.approx(0.01 + 0.005 * 3)
    assert [r["entropy_coef"] for r in trainer.log_history] == pytest.approx([0.015, 0.02, 0.025])


def test_the_adapted_coefficient_survives_a_checkpoint(tmp_path):
    args = _config(tmp_path, entropy_coef=0.01, use_adaptive_entropy=True, entropy_target=15.0,
                   max_steps=2)  # fmt: skip
    trainer = GRPOTrainer("tiny-random", TargetToken(), ROWS, args=args)
    trainer.train()
    path = trainer.save_checkpoint()
    again = GRPOTrainer("tiny-random", TargetToken(), ROWS, args=args)
    assert again.entropy_coef == pytest.approx(0.01)
    again.load_checkpoint(path)
    assert again.entropy_coef == pytest.approx(0.02)
    assert again.loss.entropy.applied == pytest.approx(0.02)
