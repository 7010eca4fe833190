"""The seams (loss, curriculum, engine, the update), each exercised the way a user
would extend it: a loss variant registered in algo.LOSSES, a curriculum added to CURRICULA, an
engine that wraps the trainer's engine and inserts tokens the policy did not write. PPO stands
beside GRPO, built from the same pieces. (The package's layout and dependency rules:
tests/system/test_layout.py.)
"""


import pytest
import torch

from conftest import TargetToken
from conftest import tiny_config as _config
from groupwise import GRPOConfig, GRPOTrainer, PPOTrainer
from groupwise.algo.grpo import policy_loss
from groupwise.algo.variants import LOSSES, LossVariant, register_loss
from groupwise.curriculum import CURRICULA, Curriculum, Plan
from groupwise.errors import ConfigError
from groupwise.policy import update
from groupwise.rollout import Rollout

ROWS = [{"prompt": f"Say something number {i}"} for i in range(8)]


# ----------------------------------------------------------------------------------------------
# (a) a loss variant is one registered entry


def test_cispo_by_hand():
    # rho = [e^0.5, 1]; the weight is capped at epsilon_high = 1.2 and detached: [1.2, 1.0].
    # Per token -w A logp = [-1.2 * 2 * -1, -1 * 2 * -2] = [2.4, 4.0]; token mean 3.2. The
    # gradient is -w A / 2 tokens = [-1.2, -1.0]; the masked third token gets none (its NaN
    # log-prob included).
    logp = torch.tensor([[-1.0, -2.0, float("nan")]], requires_grad=True)
    old = torch.tensor([[-1.5, -2.0, 0.0]])
    mask = torch.tensor([[1, 1, 0]])
    loss, metrics = policy_loss(logp, old, None, torch.tensor([2.0]), mask, loss_type="cispo",
                                epsilon_high=1.2)  # fmt: skip
    loss.backward()
    assert loss.item() == pytest.approx(3.2)
    torch.testing.assert_close(logp.grad, torch.tensor([[-1.2, -1.0, 0.0]]))
    assert metrics["clip_ratio/high_mean"] == pytest.approx(0.5)  # the first token is capped
    assert metrics["clip_ratio/low_mean"] == 0.0


def test_cispo_needs_a_cap_of_at_least_one():
    with pytest.raises(ConfigError, match="epsilon_high"):
        GRPOConfig(loss_type="cispo", epsilon_high=0.2)
    assert GRPOConfig(loss_type="cispo", epsilon_high=5.0).loss_type == "cispo"


def test_cispo_learns(tmp_path):
    args = _config(tmp_path, loss_type="cispo", epsilon_high=5.0, max_steps=12,
                   num_generations=8, per_device_train_batch_size=16, max_completion_length=8,
                   temperature=0.1)  # fmt: skip
    trainer = GRPOTrainer("tiny-random", TargetToken(), [{"prompt": "Say something"}] * 4,
                          args=args)  # fmt: skip
    trainer.train()
    rewards = [log["reward"] for log in trainer.log_history if "reward" in log]
    assert rewards[0] < 0.2 and sum(rewards[-4:]) / 4 > 0.8, rewards


def test_a_registered_loss_variant_is_used_by_config_loss_and_trainer(tmp_path):
    @register_loss("half_grpo")
    class HalfGRPO(type(LOSSES["grpo"])):
        def token_loss(self, logprobs, ratio, advantages, epsilon_low, epsilon_high):
            return 0.5 * super().token_loss(logprobs, ratio, advantages, epsilon_low, epsilon_high)

    try:
        logp = torch.tensor([[-1.0, -2.0], [-0.5, -0.1]])
        old = torch.tensor([[-1.2, -1.9], [-0.4, -0.3]])
        mask, adv = torch.ones(2, 2), torch.tensor([1.0, -1.0])
        full, _ = policy_loss(logp, old, None, adv, mask, loss_type="grpo")
        half, _ = policy_loss(logp, old, None, adv, mask, loss_type="half_grpo")
        assert half.item() == pytest.approx(0.5 * full.item())
        args = _config(tmp_path, loss_type="half_grpo", max_steps=1)
        trainer = GRPOTrainer("tiny-random", TargetToken(), ROWS, args=args)
        trainer.train()
        logs = trainer.log_history
        assert logs[-1]["step"] == 1 and logs[-1]["grad_norm"] > 0
    finally:
        LOSSES.pop("half_grpo")
    with pytest.raises(ConfigError, match="half_grpo"):
        GRPOConfig(loss_type="half_grpo")


def test_loss_variant_base_is_abstract():
    with pytest.raises(NotImplementedError):
        LossVariant().reduce(torch.zeros(1, 1), torch.ones(1, 1), None)


# ----------------------------------------------------------------------------------------------
# (b) a curriculum is one class plus one registry line


class AlternatingCounts(Curriculum):
    """Test curriculum: prompt i of the global batch gets 2 rollouts if i is even, else 6 (mean
    4), weight 2 on the first prompt; it records what it observed."""

    def __init__(self) -> None:
        self.observed = []

    @classmethod
    def from_options(cls, options, dist=None):
        return cls()

    def plan(self, batch) -> Plan:
        counts = [2 if i % 2 == 0 else 6 for i in range(len(batch.indices))]
        return Plan(batch, counts, [2.0] + [1.0] * (len(counts) - 1))

    def observe(self, plan, outcome):
        self.observed.append((plan.counts, outcome.sequence_loss.shape[0], outcome.skipped))
        return {"curriculum/test_rows": float(outcome.sequence_loss.shape[0])}

    def state_dict(self):
        return {"observed": len(self.observed)}

    def load_state_dict(self, state):
        return None


def test_a_registered_curriculum_plans_counts_and_weights(tmp_path, monkeypatch):
    monkeypatch.setitem(CURRICULA, "alternating", AlternatingCounts)
    args = _config(tmp_path, curriculum="alternating", max_steps=2)
    trainer = GRPOTrainer("tiny-random", TargetToken(), ROWS, args=args)
    seen = []
    inner = trainer.engine.generate

    def recording(prompt_ids, counts, *a, **kw):
        seen.append(list(counts))
        return inner(prompt_ids, counts, *a, **kw)

    monkeypatch.setattr(trainer.engine, "generate", recording)
    trainer.train()
    logs = trainer.log_history
    assert seen == [[2, 6], [2, 6]]
    assert trainer.curriculum.observed == [([2, 6], 8, False), ([2, 6], 8, False)]
    assert [log["curriculum/test_rows"] for log in logs] == [8.0, 8.0]


def test_plan_row_weights_follow_group_ids():
    from groupwise.curriculum import PromptBatch

    batch = PromptBatch([5, 6, 7, 8], slice(2, 4), [{}, {}], [[1], [1]])  # rank 1 of 2
    plan = Plan(batch, [4, 4, 2, 6], [1.0, 1.0, 3.0, 0.5])
    rollout = Rollout(torch.zeros(2, 1), torch.ones(2, 1), torch.zeros(8, 1), torch.ones(8, 1),
                      torch.zeros(8, dtype=torch.bool), torch.tensor([0, 0, 1, 1, 1, 1, 1, 1]),
                      [""] * 8)  # fmt: skip
    assert plan.local_counts == [2, 6]
    assert plan.row_weights(rollout).tolist() == [3.0, 3.0] + [0.5] * 6
    assert Plan(batch, [4] * 4, [1.0] * 4).row_weights(rollout) is None


# ----------------------------------------------------------------------------------------------
# (c)-(d) an engine is one class; one that wraps another and masks what it inserted


class AppendingEngine:
    """Wraps an engine and appends ``extra`` tokens after every completion, as a tool result
    would be inserted: the model attends to them but did not write them (loss_mask 0)."""

    def __init__(self, inner, extra=(7, 8)):
        self.inner, self.extra = inner, list(extra)

    def generate(self, prompt_ids, counts, params=None, generator=None, rows=None):
        return append_tokens(self.inner.generate(prompt_ids, counts, params, generator),
                             self.extra)  # fmt: skip

    def sync(self, policy):
        self.inner.sync(policy)


def append_tokens(rollout: Rollout, extra: list[int]) -> Rollout:
    n, width = rollout.completion_ids.shape
    lengths = rollout.lengths
    ids = torch.zeros(n, width + len(extra), dtype=torch.long)
    mask = torch.zeros_like(ids)
    loss_mask = torch.zeros_like(ids)
    for i in range(n):
        length = int(lengths[i])
        ids[i, :length] = rollout.completion_ids[i, :length]
        ids[i, length : length + len(extra)] = torch.tensor(extra)
        mask[i, : length + len(extra)] = 1
        loss_mask[i, :length] = 1
    return Rollout(rollout.prompt_ids, rollout.prompt_mask, ids, mask, rollout.truncated,
                   rollout.group_ids, rollout.texts, loss_mask=loss_mask)  # fmt: skip


def _gradients(trainer, rollout, advantages):
    inputs = update.prepare(trainer.policy, rollout, advantages)
    grads = {}

    def step():  # record the accumulated gradient instead of stepping
        grads.update({n: p.grad.clone() for n, p in trainer.model.named_parameters()
                      if p.grad is not None})  # fmt: skip

    trainer.policy.network.step = step
    stats = update.update(trainer.policy, inputs, trainer.loss)
    return grads, stats


def test_inserted_tokens_get_no_gradient_and_leave_the_loss_unchanged(tmp_path):
    args = _config(tmp_path, per_device_train_batch_size=4, max_grad_norm=1e9)
    trainer = GRPOTrainer("tiny-random", TargetToken(), ROWS, args=args)
    batch = trainer.prompts.next()
    rollout = trainer.engine.generate(batch.prompt_ids, 4)
    advantages = torch.linspace(-1.0, 1.0, rollout.completion_ids.shape[0])
    plain, plain_stats = _gradients(trainer, rollout, advantages)
    appended, appended_stats = _gradients(trainer, append_tokens(rollout, [7, 8]), advantages)
    assert plain.keys() == appended.keys() and plain
    for name in plain:
        torch.testing.assert_close(appended[name], plain[name], atol=1e-6, rtol=1e-5)
    assert appended_stats.sums["loss"] == pytest.approx(plain_stats.sums["loss"], abs=1e-6)
    assert appended_stats.entropy_sum == pytest.approx(plain_stats.entropy_sum, rel=1e-5)


class RecordingEngine:
    """Wraps an engine and keeps every rollout it returns."""

    def __init__(self, inner):
        self.inner, self.rollouts = inner, []

    def generate(self, *args, **kwargs):
        self.rollouts.append(self.inner.generate(*args, **kwargs))
        return self.rollouts[-1]

    def sync(self, policy):
        self.inner.sync(policy)


def test_a_wrapping_engine_needs_no_trainer_change(tmp_path):
    target, scored = TargetToken(), []

    def reward(prompts, completions, completion_ids, **kwargs):
        scored.append(completion_ids)
        return target(prompts, completions, completion_ids, **kwargs)

    trainer = GRPOTrainer("tiny-random", reward, ROWS, args=_config(tmp_path))
    written = RecordingEngine(trainer.engine)  # what the policy wrote
    served = RecordingEngine(AppendingEngine(written))  # what the trainer received
    trainer.engine = served
    trainer.train()
    logs = trainer.log_history
    assert len(logs) == 2 and all(torch.isfinite(torch.tensor(log["loss"])) for log in logs)
    assert len(written.rollouts) == len(served.rollouts) == len(scored) == 2
    # The completion is 2 tokens longer than what the policy wrote, in every row, and the
    # run's services read the wrapped rollout: the reward sees the inserted tokens at the end
    # of every completion, the logged lengths count them, the loss mask leaves them out.
    steps = zip(written.rollouts, served.rollouts, scored, logs, strict=True)
    for policy, wrapped, ids, log in steps:
        lengths = policy.lengths.tolist()
        assert len(lengths) == len(ids) == 8
        assert wrapped.lengths.tolist() == [n + 2 for n in lengths]
        assert wrapped.loss_mask.sum(dim=1).tolist() == lengths
        for row, n in zip(ids, lengths, strict=True):
            assert len(row) == n + 2 and list(row[n:]) == [7, 8]
        assert log["completions/mean_length"] == pytest.approx(sum(lengths) / 8 + 2)
    records = trainer.completion_records()
    assert sum(len(r["completions"]) for r in records) == 8


# ----------------------------------------------------------------------------------------------
# PPO is built from the same pieces, beside GRPO


def test_ppo_is_a_sibling_of_grpo():
    assert not issubclass(PPOTrainer, GRPOTrainer)
