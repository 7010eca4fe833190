"""One generation batch, several optimizer steps (steps_per_generation / generation_batch_size,
TRL's names), GDRO eq. 17's prompt weighting, and the compute accounting in every step's logs.

Hand-computed values for the pure functions; tiny-random runs for the trainer: the default is
bitwise the pre-existing step, spg > 1 makes exactly that many optimizer steps per generation
with pi_old from generation time, the curriculum then sees the paper's non-zero signal, and a
resumed run is exact.
"""

import copy

import pytest
import torch

from conftest import PlainStepTrainer, select_options, tiny_config
from groupwise import GRPOConfig, GRPOTrainer, PPOTrainer
from groupwise.algo.advantages import equal_prompt_factors, informative_groups
from groupwise.algo.grpo import policy_loss
from groupwise.curriculum import CURRICULA, Curriculum, Plan, PromptBatch
from groupwise.curriculum.gdro import PromptGDROCurriculum
from groupwise.errors import ConfigError
from groupwise.policy import update
from groupwise.policy.batches import minibatch_prompts
from groupwise.rollout import Rollout
from groupwise.rollout.base import select_prompts
from groupwise.trainer.metrics import sequence_tokens, verl_throughput

ROWS = [{"prompt": f"Add {i} and {i + 1}.", "answer": str(2 * i + 1)} for i in range(12)]
TIMING_KEYS = ("time/", "tokens_per_second", "generation_tokens_per_second", "perf/throughput")


def _reward(completions, answer, **kwargs):
    return [float(a in c) + 0.1 * len(c) / 20 for c, a in zip(completions, answer, strict=True)]


def _args(tmp_path, **overrides) -> GRPOConfig:
    return tiny_config(tmp_path, **{"beta": 0.04, "max_completion_length": 5, **overrides})


def _without_timing(row: dict) -> dict:
    return {k: v for k, v in row.items() if not k.startswith(TIMING_KEYS)}


# ----------------------------------------------------------------------------------------------
# Options


def test_batch_arithmetic_follows_trl(monkeypatch):
    default = GRPOConfig(per_device_train_batch_size=8, num_generations=4)
    assert default.steps_per_generation is None and default.micro_steps_per_generation == 1
    assert default.optimizer_steps_per_generation == 1 and default.prompts_per_step == 2
    # 8 completions per micro-batch, 2 micro-batches per optimizer step, 8 micro-batches per
    # generation: 64 completions = 16 prompts per generation, 4 optimizer steps of 4 prompts.
    args = GRPOConfig(per_device_train_batch_size=8, gradient_accumulation_steps=2,
                      steps_per_generation=8, num_generations=4)  # fmt: skip
    assert args.optimizer_steps_per_generation == 4 and args.prompts_per_step == 16
    assert args.completions_per_generation == 64 and args.completions_per_step == 16
    # TRL's default: steps_per_generation = gradient_accumulation_steps (one optimizer step).
    accum = GRPOConfig(per_device_train_batch_size=8, gradient_accumulation_steps=2,
                       num_generations=4)  # fmt: skip
    assert accum.micro_steps_per_generation == 2 and accum.optimizer_steps_per_generation == 1
    # generation_batch_size counts every rank's completions: 32 / (8 x 1 rank) = 4 micro-batches;
    # under torchrun with 2 ranks, 32 / (8 x 2) = 2.
    assert GRPOConfig(per_device_train_batch_size=8, generation_batch_size=32,
                      num_generations=4).optimizer_steps_per_generation == 4  # fmt: skip
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert GRPOConfig(per_device_train_batch_size=8, generation_batch_size=32,
                      num_generations=4).optimizer_steps_per_generation == 2  # fmt: skip


@pytest.mark.parametrize(
    "options, match",
    [
        (dict(steps_per_generation=2, generation_batch_size=24), "must be .* = 16"),
        (dict(steps_per_generation=0), "steps_per_generation must be >= 1"),
        (dict(steps_per_generation=3, gradient_accumulation_steps=2), "steps_per_generation=3 "),
        (dict(generation_batch_size=12), "generation_batch_size=12"),
        (dict(generation_batch_size=8, gradient_accumulation_steps=2), "generation_batch_size=8 "),
        (dict(steps_per_generation=2, algorithm="ppo"), "algorithm=ppo"),
        (dict(prompt_weighting="prompt"), "prompt_weighting"),
    ],
)
def test_config_errors_name_the_option(options, match):
    values = dict(per_device_train_batch_size=8, num_generations=4)
    values.update(options)
    with pytest.raises(ConfigError, match=match):
        GRPOConfig(**values)


def test_ppo_trainer_refuses_several_optimizer_steps_per_generation(tmp_path):
    args = _args(tmp_path, steps_per_generation=2, per_device_train_batch_size=4)
    with pytest.raises(ConfigError, match="steps_per_generation"):
        PPOTrainer("tiny-random", _reward, ROWS, args=args)


# ----------------------------------------------------------------------------------------------
# Pure functions


def _rollout(group_ids: list[int], num_prompts: int) -> Rollout:
    n = len(group_ids)
    ids = torch.arange(n * 3).view(n, 3)
    return Rollout(torch.arange(num_prompts * 2).view(num_prompts, 2),
                   torch.ones(num_prompts, 2), ids, torch.ones(n, 3),
                   torch.tensor([i % 2 == 0 for i in range(n)]), torch.tensor(group_ids),
                   [f"t{i}" for i in range(n)])  # fmt: skip


def test_minibatches_are_consecutive_whole_groups():
    assert [m.tolist() for m in minibatch_prompts(6, 3)] == [[0, 1], [2, 3], [4, 5]]
    assert [m.tolist() for m in minibatch_prompts(4, 1)] == [[0, 1, 2, 3]]
    with pytest.raises(ValueError, match="equal mini-batches"):
        minibatch_prompts(5, 2)
    # Groups of 2, 1, 3 and 2 rows (Rollout-GDRO): mini-batch 2 holds prompts 2 and 3.
    rollout = _rollout([0, 0, 1, 2, 2, 2, 3, 3], 4)
    part, rows = select_prompts(rollout, torch.tensor([2, 3]))
    assert rows.tolist() == [3, 4, 5, 6, 7]
    assert part.group_ids.tolist() == [0, 0, 0, 1, 1]
    assert torch.equal(part.prompt_ids, rollout.prompt_ids[2:4])
    assert torch.equal(part.completion_ids, rollout.completion_ids[3:])
    assert part.texts == ["t3", "t4", "t5", "t6", "t7"]
    assert part.truncated.tolist() == [False, True, False, True, False]
    assert torch.equal(part.loss_mask, rollout.loss_mask[3:])


def test_equal_prompt_weighting_is_eq_17_by_hand():
    # Prompt 0 has 2 rollouts with policy terms -3, -1 (mean -2); prompt 1 has 6 with 0 x 5 and
    # -6 (mean -1). The row mean weighs prompt 1 three times as much: -(3 + 1 + 6) / 8 = -1.25.
    # Eq. 17-18: mean over prompts of each prompt's mean, (-2 + -1) / 2 = -1.5. The factors are
    # nbar / n_x = 4 / 2 and 4 / 6: (2 * 4 + (2/3) * 6) / 8 = 1.5.
    assert equal_prompt_factors([2, 6]) == [2.0, 4 / 6]
    assert equal_prompt_factors([4, 4, 4]) == [1.0, 1.0, 1.0]
    with pytest.raises(ValueError, match="at least one rollout"):
        equal_prompt_factors([0, 4])
    batch = PromptBatch([7, 9], slice(0, 2), [{}, {}], [[1], [1]])
    rollout = _rollout([0, 0, 1, 1, 1, 1, 1, 1], 2)
    plan = Plan(batch, [2, 6], [1.0, 1.0])
    assert plan.row_weights(rollout) is None  # prompt_weighting="rollouts": the plain row mean
    weights = plan.row_weights(rollout, "equal")
    assert weights.tolist() == pytest.approx([2.0] * 2 + [2 / 3] * 6)
    advantages = torch.tensor([3.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 6.0])
    logps = torch.zeros(8, 3, requires_grad=True)  # on-policy: per token -A
    mask = torch.ones(8, 3)
    row_mean, _ = policy_loss(logps, None, None, advantages, mask)
    prompt_mean, _ = policy_loss(logps, None, None, advantages, mask, row_weights=weights)
    assert row_mean.item() == pytest.approx(-1.25)
    assert prompt_mean.item() == pytest.approx(-1.5)
    # It multiplies a curriculum's weights; equal counts leave the row weights untouched.
    assert Plan(batch, [2, 6], [3.0, 1.0]).row_weights(rollout, "equal")[0] == 6.0
    assert Plan(batch, [4, 4], [1.0, 1.0]).row_weights(_rollout([0] * 4 + [1] * 4, 2),
                                                       "equal") is None  # fmt: skip


def test_informative_groups_use_a_tolerance():
    correctness = torch.tensor(
        [1.0, 1.0, 1.0,                       # constant
         0.1 + 0.2, 0.3, 0.3,                 # differ by rounding only (5.6e-17)
         0.0, 1.0, float("nan"),              # informative
         1.0, float("nan")],                  # one valid score: no baseline
        dtype=torch.float64,
    )  # fmt: skip
    groups = torch.tensor([0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3])
    assert (0.1 + 0.2) != 0.3
    assert informative_groups(correctness, groups).tolist() == [False, False, True, False]
    # what "std != 0" would count
    assert informative_groups(correctness, groups, tol=0.0).tolist() == [False, True, True, False]


def test_informative_groups_use_the_population_std():
    # [0, 1]: population std 0.5, sample (Bessel) std 0.707; [0, 0, 1]: 0.471 and 0.577.
    scores = torch.tensor([0.0, 1.0, 0.0, 0.0, 1.0])
    ids = torch.tensor([0, 0, 1, 1, 1])
    assert informative_groups(scores, ids, tol=0.49).tolist() == [True, False]
    assert informative_groups(scores, ids, tol=0.5).tolist() == [False, False]
    assert informative_groups(scores, ids, tol=0.47).tolist() == [True, True]


def test_one_definition_of_informative_serves_metric_dynamic_sampling_and_curricula():
    """The compute metric, DAPO dynamic sampling, select's top-up and select's curriculum all
    count a group as informative by groupwise.algo.informative_groups on the correctness
    score, not the shaped total."""
    from types import SimpleNamespace

    from groupwise import algo as core
    from groupwise.config.grpo_config import GRPOConfig
    from groupwise.curriculum import GlobalRows, PromptBatch, SelectCurriculum, dynamic, topup
    from groupwise.rewards.scoring import Scores
    from groupwise.runtime.distributed import DistributedContext
    from groupwise.trainer import metrics

    assert dynamic.informative_groups is core.informative_groups
    assert topup.informative_groups is core.informative_groups
    assert metrics.informative_groups is core.informative_groups
    # Group 0: all correct, totals differ by a length penalty; group 1: mixed; group 2: the
    # same correctness up to float noise.
    correctness = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.3, 0.1 + 0.2], dtype=torch.float64)
    total = correctness + torch.tensor([0.0, -0.2, 0.0, 0.0, 0.0, 0.0], dtype=torch.float64)
    ids = torch.tensor([0, 0, 1, 1, 2, 2])
    expected = [False, True, False]
    assert core.informative_groups(correctness, ids).tolist() == expected
    rollout = SimpleNamespace(completion_mask=torch.ones(6, 2), completion_ids=torch.zeros(6, 2),
                              group_ids=ids)  # fmt: skip
    scores = Scores(total, total[:, None], correctness)
    batch = GRPOConfig().sections().batch
    spent = metrics.compute_spent(rollout, scores, DistributedContext(), batch)
    assert spent["informative_groups"] == 1
    cur = SelectCurriculum(select_options(num_generations=2, rollout_max=2, seed=0))
    plan = cur.plan(PromptBatch([5, 6, 7], slice(0, 3), [{}] * 3, [[1]] * 3, []))
    logs = cur.observe_global(plan, GlobalRows(ids.tolist(), correctness.tolist(), [0.0] * 6,
                                               total.tolist()))  # fmt: skip
    assert logs["curriculum/select/informative"] == 1
    assert cur.streaks == {5: 1, 6: 0, 7: 1}


def test_verl_throughput_by_hand():
    """verl's perf/throughput: prompt + completion tokens / (step seconds x devices), a prompt
    counted once per completion (verl's batch repeats it with each one), padding never."""
    prompt_mask = torch.tensor([[1] * 10, [0] * 4 + [1] * 6])  # 10 and 6 tokens, left-padded
    lengths = torch.tensor([4, 5, 6, 1, 2, 3])  # 3 completions per prompt
    width = int(lengths.max())
    rollout = Rollout(
        prompt_ids=torch.zeros(2, 10, dtype=torch.long),
        prompt_mask=prompt_mask,
        completion_ids=torch.zeros(6, width, dtype=torch.long),
        completion_mask=(torch.arange(width)[None, :] < lengths[:, None]).long(),
        truncated=torch.zeros(6, dtype=torch.bool),
        group_ids=torch.tensor([0, 0, 0, 1, 1, 1]),
        texts=[""] * 6,
    )
    assert sequence_tokens(rollout) == (3 * 10 + 3 * 6, 21)
    # Two ranks with this rollout each, a 3-second step: (96 + 42) / (3 x 2) = 23 per device.
    logs = verl_throughput(96, 42, step_seconds=3.0, world_size=2)
    assert logs == {"perf/total_num_tokens": 138.0, "perf/throughput": 23.0}
    assert verl_throughput(48, 21, 3.0, 1)["perf/throughput"] == 23.0  # one device: the same


# ----------------------------------------------------------------------------------------------
# The default is the plain step


@pytest.mark.parametrize(
    "extra",
    [
        dict(),
        dict(num_iterations=2, per_device_train_batch_size=4, gradient_accumulation_steps=2),
        dict(curriculum="rollout_gdro", rollout_min=2, rollout_max=6, steps_per_generation=1),
    ],
)
def test_default_reproduces_the_plain_step_bitwise(tmp_path, extra):
    # two generation batches (max_steps counts optimizer steps: num_iterations per batch)
    extra = {"max_steps": 2 * extra.get("num_iterations", 1), **extra}
    trainer = GRPOTrainer("tiny-random", _reward, ROWS, args=_args(tmp_path / "a", **extra))
    plain = PlainStepTrainer("tiny-random", _reward, ROWS, args=_args(tmp_path / "b", **extra))
    trainer.train(), plain.train()
    logs, plain_logs = trainer.log_history, plain.log_history
    assert [_without_timing(r) for r in logs] == [_without_timing(r) for r in plain_logs]
    params = zip(trainer.model.named_parameters(), plain.model.parameters(), strict=True)
    for (name, p), q in params:
        assert torch.equal(p, q), name
    assert trainer.optimizer.state_dict()["state"][0]["step"] == 2 * trainer.args.num_iterations


@pytest.mark.parametrize("loss_type", ["grpo", "dapo"])
def test_unequal_groups_share_their_prompt_forward_and_train_as_unshared(
    tmp_path, monkeypatch, loss_type
):
    """Rollout-GDRO gives prompts 2 to 6 rollouts: each micro-batch (6 rows, which no group
    size divides) encodes each of its prompts once. Two steps with the shared forward (policy,
    old and reference log-probs: beta > 0) end where two steps without sharing end."""
    from groupwise.policy import policy as policy_module

    extra = dict(curriculum="rollout_gdro", rollout_min=2, rollout_max=6, steps_per_generation=2,
                 per_device_train_batch_size=6, gradient_accumulation_steps=2,
                 num_iterations=2, max_steps=4, loss_type=loss_type)  # fmt: skip
    shared_counts = []
    blocks = policy_module.prompt_blocks

    def recording(row_groups):
        found = blocks(row_groups)
        if found is not None:
            shared_counts.append(found[1])
        return found

    monkeypatch.setattr(policy_module, "prompt_blocks", recording)
    shared = GRPOTrainer("tiny-random", _reward, ROWS, args=_args(tmp_path / "a", **extra))
    shared.train()
    assert any(len(set(c)) > 1 for c in shared_counts)  # unequal counts in one forward
    monkeypatch.setattr(policy_module, "prompt_blocks", lambda row_groups: None)
    unshared = GRPOTrainer("tiny-random", _reward, ROWS, args=_args(tmp_path / "b", **extra))
    unshared.train()
    params = zip(shared.model.named_parameters(), unshared.model.parameters(), strict=True)
    # Four AdamW steps at lr 1e-2: AdamW's normalisation magnifies float rounding in near-zero
    # gradients (measured: at most 1.8e-5 here; the log-probs and their gradients agree within
    # 1e-6 in test_logprobs.py).
    for (name, p), q in params:
        assert float((p - q).abs().max()) < 1e-4, name
    losses = [[r["loss"] for r in t.log_history if "loss" in r] for t in (shared, unshared)]
    assert losses[0] == pytest.approx(losses[1], abs=1e-6)


# ----------------------------------------------------------------------------------------------
# Several optimizer steps per generation


class Recorder(Curriculum):
    """Uniform GRPO that records what it observed: per row, the group and the policy term."""

    def __init__(self, num_generations=4):
        self.num_generations, self.seen = num_generations, []

    @classmethod
    def from_options(cls, options, dist=None):
        return cls(options["num_generations"])

    def plan(self, batch):
        return Plan(batch, [self.num_generations] * len(batch.indices), [1.0] * len(batch.indices))

    def observe(self, plan, outcome):
        self.seen.append((outcome.rollout.group_ids.cpu().clone(), outcome.sequence_loss.clone()))
        return {}


def _group_means(group_ids, values):
    return [float(values[group_ids == g].mean()) for g in group_ids.unique()]


@pytest.mark.parametrize("iterations", [1, 2])
def test_spg_makes_that_many_optimizer_steps_per_generation(tmp_path, monkeypatch, iterations):
    monkeypatch.setitem(CURRICULA, "recorder", Recorder)
    # 4 prompts x 4 rollouts per generation; micro-batches of 4 completions, 2 per optimizer
    # step (8 completions = 2 prompts): 4 micro-batches per generation = 2 optimizer steps.
    # max_steps counts optimizer steps: two generation batches of 2 x mu each.
    args = _args(tmp_path, curriculum="recorder", per_device_train_batch_size=4,
                 gradient_accumulation_steps=2, steps_per_generation=4,
                 num_iterations=iterations, lr_scheduler_type="linear",
                 max_steps=2 * 2 * iterations, logging_steps=1)  # fmt: skip
    trainer = GRPOTrainer("tiny-random", _reward, ROWS, args=args)
    generations, updates = [], []
    generate, real_update = trainer.engine.generate, update.update
    monkeypatch.setattr(trainer.engine, "generate",
                        lambda *a, **k: generations.append(1) or generate(*a, **k))  # fmt: skip

    def recording_update(policy, inputs, loss, also=()):
        updates.append((len(generations), inputs.rollout.prompt_ids.shape[0], id(inputs)))
        return real_update(policy, inputs, loss, also)

    monkeypatch.setattr(update, "update", recording_update)
    trainer.train()
    logs = trainer.log_history
    steps = 2 * iterations  # optimizer steps per generation
    assert len(generations) == 2 and len(updates) == 2 * steps
    assert all(prompts == 2 for _, prompts, _ in updates)  # mini-batches of whole groups
    # TRL's order: every pass runs over the mini-batches, [a, b, a, b] with mu = 2.
    first = [i for g, _, i in updates if g == 1]
    assert first == [first[0], first[1]] * iterations and first[0] != first[1]
    assert trainer.optimizer.state_dict()["state"][0]["step"] == 2 * steps
    assert trainer.scheduler.last_epoch == 2 * steps
    # The linear schedule decays over max_steps = T optimizer steps; the logged rate
    # is the one the step's last optimizer step ran at (transformers': peak * (T - s) / T for
    # s = T - 1, i.e. peak / T), the next one being 0.
    total = 2 * steps
    assert logs[-1]["learning_rate"] == pytest.approx(args.learning_rate / total, rel=1e-9)
    assert trainer.scheduler.get_last_lr()[0] == pytest.approx(0.0, abs=1e-12)
    assert [r["compute/optimizer_steps_total"] for r in logs] == [steps, 2 * steps]
    assert [r["step"] for r in logs] == [steps, 2 * steps]  # global_step: optimizer steps
    # The curriculum sees each row's policy term from the mini-batch it was trained in: the
    # first mini-batch was on-policy in the first pass (group means of -A are 0), the second
    # was sampled one optimizer step ago, so its ratio is not 1 and the paper's signal is not 0.
    group_ids, loss = trainer.curriculum.seen[0]
    means = _group_means(group_ids, loss)
    if iterations == 1:
        assert max(abs(m) for m in means[:2]) < 1e-5, means
    assert max(abs(m) for m in means[2:]) > 1e-4, means


def test_one_step_per_generation_gives_the_paper_signal_zero_and_counts_compute(
    tmp_path, monkeypatch
):
    monkeypatch.setitem(CURRICULA, "recorder", Recorder)
    trainer = GRPOTrainer("tiny-random", _reward, ROWS,
                          args=_args(tmp_path, curriculum="recorder", max_steps=3))  # fmt: skip
    trainer.train()
    logs = trainer.log_history
    for group_ids, loss in trainer.curriculum.seen:
        assert max(abs(m) for m in _group_means(group_ids, loss)) < 1e-5
    running = 0
    for row in logs:
        running += row["compute/generated_tokens"]
        assert row["compute/generated_tokens_total"] == running
        # completions/mean_length is over the same 8 completions' tokens.
        assert row["compute/generated_tokens"] == pytest.approx(
            8 * row["completions/mean_length"]
        )
        assert row["compute/rollouts"] == 8.0  # 2 prompts x 4
        per_rollout = row["compute/informative_groups"] / 8
        assert row["compute/informative_groups_per_rollout"] == per_rollout
        assert row["compute/optimizer_steps"] == 1.0
    assert logs[-1]["compute/rollouts_total"] == 24.0
    informative = sum(r["compute/informative_groups"] for r in logs)
    assert logs[-1]["compute/informative_groups_per_rollout_total"] == informative / 24


def test_old_logprobs_are_the_sampling_policys(tmp_path):
    args = _args(tmp_path, per_device_train_batch_size=8, steps_per_generation=2)
    trainer = GRPOTrainer("tiny-random", _reward, ROWS, args=args)
    batch = trainer.prompts.next()
    rollout = trainer.engine.generate(batch.prompt_ids, 4)
    scores = trainer.scorer(batch.rows, rollout)
    advantages = trainer.advantages(scores, rollout.group_ids)
    sampler = copy.deepcopy(trainer.model)
    generation = update.prepare_generation(trainer.policy, rollout, advantages)
    assert len(generation.inputs) == 2
    assert [r.tolist() for r in generation.rows] == [list(range(8)), list(range(8, 16))]
    update.train_generation(trainer.policy, generation, trainer.loss)
    assert trainer.optimizer.state_dict()["state"][0]["step"] == 2
    for inputs in generation.inputs:
        for rows, old in zip(inputs.micro_batches, inputs.old_logprobs, strict=True):
            at_sampling = trainer.policy.logprobs(inputs.rollout, rows, sampler)[0]
            torch.testing.assert_close(old, at_sampling, rtol=0, atol=1e-6)
            now = trainer.policy.logprobs(inputs.rollout, rows)[0].detach()
            assert (now - old).abs().max() > 1e-4  # the policy moved; old stayed the sampler's


class UnevenPromptGDRO(PromptGDROCurriculum):
    """Prompt-GDRO (its state, the paper's pg_loss signal) with 2, 2, 6, 6 rollouts per 4
    prompts: the first mini-batch holds 4 rows, the second 12."""

    def rollout_counts(self, uids, bins):
        return [(2, 2, 6, 6)[i % 4] for i in range(len(bins))]


def test_resume_with_several_steps_per_generation_is_exact(tmp_path, monkeypatch):
    monkeypatch.setitem(CURRICULA, "uneven", UnevenPromptGDRO)
    extra = dict(curriculum="uneven", gdro_signal="pg_loss", gdro_num_bins=2,
                 prompt_weighting="equal", per_device_train_batch_size=8,
                 steps_per_generation=2, max_steps=6, save_steps=4)  # fmt: skip
    # three generation batches of two optimizer steps; a checkpoint after the second
    full = GRPOTrainer("tiny-random", _reward, ROWS, args=_args(tmp_path / "a", **extra))
    full.train()
    half = dict(extra, max_steps=4)
    GRPOTrainer("tiny-random", _reward, ROWS, args=_args(tmp_path / "b", **half)).train()
    resumed = _args(tmp_path / "b", resume_from_checkpoint="auto", **extra)
    rest = GRPOTrainer("tiny-random", _reward, ROWS, args=resumed)
    rest.train()
    assert rest.curriculum.state_dict() == full.curriculum.state_dict()
    for (name, p), q in zip(full.model.named_parameters(), rest.model.parameters(), strict=True):
        assert torch.equal(p, q), name
    a = [_without_timing(r) for r in full.log_history]
    assert a == [_without_timing(r) for r in rest.log_history]
    assert [r["compute/optimizer_steps_total"] for r in a] == [2, 4, 6]
    assert [r["step"] for r in a] == [2, 4, 6]  # global_step: optimizer steps
    assert a[-1]["compute/rollouts_total"] == 3 * 16  # 4 prompts x mean 4 rollouts per step
    bins = ("0", "1", "unseen")  # two bins and the never-seen prompts' own group
    assert all(sum(r[f"curriculum/rollouts_bin_{b}"] for b in bins) == 16 for r in a)
    tokens = [r["compute/generated_tokens"] for r in a]
    assert a[-1]["compute/generated_tokens_total"] == sum(tokens)
    assert rest.compute.state_dict() == full.compute.state_dict()
