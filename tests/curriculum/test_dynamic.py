"""DAPO dynamic sampling (groupwise.curriculum.dynamic): the informative-group test by hand,
selection and trimming, the loop on the real trainer (uniform groups never reach the loss, the cap),
default off is the plain step, exact resume, and 2 ranks against one process."""

import json
import math
import textwrap

import pytest
import torch

from conftest import PlainStepTrainer, tiny_config
from groupwise import GRPOConfig, GRPOTrainer
from groupwise.algo.advantages import informative_groups
from groupwise.curriculum import Plan, PromptBatch
from groupwise.curriculum.base import PromptSampler
from groupwise.curriculum.dynamic import Draw, join_groups, select_keys, shares, split_groups
from groupwise.errors import ConfigError
from groupwise.policy import update
from groupwise.rewards.scoring import Scores
from groupwise.rollout import Rollout
from groupwise.trainer.base import PhaseTimer

# ----------------------------------------------------------------------------------------------
# Pure helpers, by hand


def test_informative_groups_by_hand():
    nan = math.nan
    correctness = torch.tensor(
        [1, 1, 1, 1,            # g0: all right -> zero variance
         0, 1, 0, 0,            # g1: informative (std sqrt(3)/4)
         1, 1 + 1e-9, 1, 1,     # g2: float noise -> zero variance under the tolerance
         nan, 1, nan, nan,      # g3: one valid score -> no variance
         nan, 0, 1, nan,        # g4: two valid, different -> informative
         0.5, 0.5, 0.5, 0.5],   # g5: uniform partial credit
        dtype=torch.float64,
    )  # fmt: skip
    ids = torch.arange(6).repeat_interleave(4)
    assert informative_groups(correctness, ids).tolist() == [False, True, False, False, True,
                                                            False]  # fmt: skip
    # The tolerance is on the population std: [0, 0, 0, 1e-3] has std ~4.3e-4.
    small = torch.tensor([0.0, 0.0, 0.0, 1e-3])
    four = torch.zeros(4, dtype=torch.long)
    assert informative_groups(small, four, tol=1e-6).tolist() == [True]
    assert informative_groups(small, four, tol=1e-3).tolist() == [False]
    assert informative_groups(small, four, tol=0.0).tolist() == [True]
    # Unsorted ids, a trailing group without rows, float32 input.
    ids = torch.tensor([1, 0, 1, 0])
    values = torch.tensor([1.0, 2.0, 1.0, 3.0], dtype=torch.float32)
    assert informative_groups(values, ids, num_groups=3).tolist() == [True, False, False]


def test_select_keys_keeps_the_first_informative_in_draw_order():
    flags = [[False, True, False, True], [True, True, False, False]]
    assert select_keys(flags, 3) == [(0, 1), (0, 3), (1, 0)]  # (1, 1) trimmed
    assert select_keys(flags, 10) == [(0, 1), (0, 3), (1, 0), (1, 1)]  # all there is
    # Fewer than min_groups: topped up with the first zero-variance groups, in draw order.
    assert select_keys([[False, False], [False, True]], 4, min_groups=3) == [
        (0, 0), (0, 1), (1, 1)]  # fmt: skip
    assert select_keys([[False, False]], 2, min_groups=1) == [(0, 0)]
    assert shares(5, 2) == [slice(0, 3), slice(3, 5)]
    assert shares(1, 2) == [slice(0, 1), slice(1, 1)]
    assert shares(4, 2) == [slice(0, 2), slice(2, 4)]


def _draw(pad: int = 0) -> Draw:
    """Rank 1 of 2, 2 prompts (global positions 2, 3) with 2 and 3 completions."""
    batch = PromptBatch([10, 11, 12, 13], slice(2, 4), [{"prompt": "a"}, {"prompt": "b"}],
                        [[5, 6], [7]])  # fmt: skip
    plan = Plan(batch, [2, 2, 2, 3], [1.0, 1.0, 0.5, 2.0])
    prompt_ids = torch.tensor([[5, 6], [pad, 7]])
    prompt_mask = torch.tensor([[1, 1], [0, 1]])
    ids = torch.tensor([[1, 2, 3, pad], [4, pad, pad, pad], [8, 9, pad, pad], [3, pad, pad, pad],
                        [2, 2, 2, 2]])  # fmt: skip
    mask = (ids != pad).long()
    rollout = Rollout(prompt_ids, prompt_mask, ids, mask, torch.tensor([0, 0, 0, 0, 1]).bool(),
                      torch.tensor([0, 0, 1, 1, 1]), ["x", "y", "z", "w", "v"],
                      sampling_logprobs=-mask.float())  # fmt: skip
    correctness = torch.tensor([0.0, 1.0, 1.0, 1.0, 1.0])
    scores = Scores(torch.arange(5.0), torch.arange(10.0).view(5, 2), correctness)
    return Draw.weighed(batch, plan, rollout, scores, "rollouts")


def test_split_and_join_groups_round_trip():
    draw = _draw()
    groups = split_groups(draw, draw_index=3)
    assert [g.key for g in groups] == [(3, 2), (3, 3)]
    assert [(g.index, g.count, g.weight, g.rows, g.tokens) for g in groups] == [
        (12, 2, 0.5, 2, 4), (13, 3, 2.0, 3, 7)]  # fmt: skip
    assert groups[0].completion_ids.shape == (2, 3)  # trimmed to the group's longest
    assert groups[1].prompt.tolist() == [7]  # the prompt's padding is gone
    # The second group first, as rank 0 of a 2-prompt global batch.
    joined = join_groups([groups[1], groups[0]], [13, 12], slice(0, 2), [3, 2], [2.0, 0.5], 0,
                         prompt_weighting="rollouts")  # fmt: skip
    batch, plan, rollout, scores, row_weights = joined
    assert batch.indices == [13, 12] and batch.mine == slice(0, 2)
    assert [r["prompt"] for r in batch.rows] == ["b", "a"] and batch.prompt_ids == [[7], [5, 6]]
    assert plan.local_counts == [3, 2] and plan.weights == [2.0, 0.5]
    assert rollout.prompt_ids.tolist() == [[0, 7], [5, 6]]
    assert rollout.prompt_mask.tolist() == [[0, 1], [1, 1]]
    assert rollout.group_ids.tolist() == [0, 0, 0, 1, 1]
    assert rollout.completion_ids.tolist() == [[8, 9, 0, 0], [3, 0, 0, 0], [2, 2, 2, 2],
                                               [1, 2, 3, 0], [4, 0, 0, 0]]  # fmt: skip
    assert rollout.completion_mask.sum(1).tolist() == [2, 1, 4, 3, 1]
    assert rollout.loss_mask.tolist() == rollout.completion_mask.tolist()
    assert rollout.truncated.tolist() == [False, False, True, False, False]
    assert rollout.texts == ["z", "w", "v", "x", "y"]
    assert rollout.sampling_logprobs.tolist() == (-rollout.completion_mask.float()).tolist()
    assert scores.rewards.tolist() == [2.0, 3.0, 4.0, 0.0, 1.0]
    assert scores.per_func[:, 1].tolist() == [5.0, 7.0, 9.0, 1.0, 3.0]
    assert scores.correctness.tolist() == [1.0, 1.0, 1.0, 0.0, 1.0]
    # The joined draw carries each row's prompt weight, from the joined plan ...
    assert row_weights.tolist() == [2.0, 2.0, 2.0, 0.5, 0.5]
    assert draw.row_weights.tolist() == [0.5, 0.5, 2.0, 2.0, 2.0]  # rank 1's rows of the draw
    # ... times GDRO eq. 17's mean(n) / n_x of the joined counts [3, 2] with "equal".
    equal = join_groups([groups[1], groups[0]], [13, 12], slice(0, 2), [3, 2], [2.0, 0.5], 0,
                        prompt_weighting="equal")  # fmt: skip
    expected = [2.0 * 2.5 / 3] * 3 + [0.5 * 2.5 / 2] * 2
    torch.testing.assert_close(equal.row_weights, torch.tensor(expected), rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match="at least one group"):
        join_groups([], [], slice(0, 0), [], [], 0, prompt_weighting="rollouts")


def test_a_joined_batch_trains_like_the_batch_it_came_from(tmp_path):
    """Split a generated batch into groups and join them again (re-padded): the gradient of one
    update on it is the original batch's."""
    args = _args(tmp_path, per_device_train_batch_size=4, max_grad_norm=1e9)
    trainer = GRPOTrainer("tiny-random", [correct, shaped], ROWS, args=args)
    draw = trainer.draw(PhaseTimer())
    batch = draw.batch
    joined = join_groups(split_groups(draw), batch.indices, batch.mine, draw.plan.counts,
                         draw.plan.weights, trainer.tokenizer.pad_token_id,
                         prompt_weighting="rollouts")  # fmt: skip
    assert joined.batch.rows == batch.rows and joined.rollout.texts == draw.rollout.texts
    grads = []
    for rollout in (draw.rollout, joined.rollout):
        advantages = torch.linspace(-1.0, 1.0, rollout.completion_ids.shape[0])
        inputs = update.prepare(trainer.policy, rollout, advantages)
        seen = {}
        trainer.policy.network.step = lambda seen=seen: seen.update(
            {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None})
        update.update(trainer.policy, inputs, trainer.loss)
        grads.append(seen)
    assert grads[0].keys() == grads[1].keys() and grads[0]
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], rtol=1e-5, atol=1e-7)


def test_phase_timer_adds_up_a_phase_marked_twice():
    timer = PhaseTimer()
    timer.mark("generation")
    first = timer.phases["generation"]
    timer.mark("scoring")
    timer.mark("generation")
    assert timer.phases["generation"] >= first
    assert sum(timer.phases.values()) == pytest.approx(timer.total)


# ----------------------------------------------------------------------------------------------
# Options


def test_options_are_validated_and_name_the_option():
    assert GRPOConfig().dynamic_sampling is False and GRPOConfig().max_num_gen_batches == 10
    with pytest.raises(ConfigError, match="max_num_gen_batches"):
        GRPOConfig(dynamic_sampling=True, max_num_gen_batches=-1)
    with pytest.raises(ConfigError, match="dynamic_sampling_std_tol"):
        GRPOConfig(dynamic_sampling=True, dynamic_sampling_std_tol=-1e-3)
    with pytest.raises(ConfigError, match="dynamic_sampling.*curriculum=prompt_gdro"):
        GRPOConfig(dynamic_sampling=True, curriculum="prompt_gdro")
    with pytest.raises(ConfigError, match="dynamic_sampling.*algorithm=grpo only"):
        GRPOConfig(dynamic_sampling=True, algorithm="ppo")
    assert GRPOConfig(dynamic_sampling=True, max_num_gen_batches=0).max_num_gen_batches == 0
    assert GRPOConfig.from_dict({"dynamic_sampling": "true"}).dynamic_sampling is True


# ----------------------------------------------------------------------------------------------
# The trainer

# Prompts whose index is a multiple of 3 are "solved" by every completion (correctness 1); the
# others alternate 0, 1, 0, 1 over their completions. A shaped reward varies everywhere, so the
# uniform groups' *total* reward still has variance: only the correctness filter drops them.
ROWS = [{"prompt": f"Add {i} and {i + 1}.", "answer": str(i)} for i in range(12)]
UNIFORM = {str(i) for i in range(12) if i % 3 == 0}


def correct(completions, answer, **kwargs):
    return [1.0 if a in UNIFORM else float(i % 2) for i, a in enumerate(answer)]


correct.is_correctness = True


def shaped(completions, completion_ids, **kwargs):
    return [0.01 * len(ids) + 0.001 * (sum(ids) % 7) for ids in completion_ids]


def _args(tmp_path, **overrides) -> GRPOConfig:
    run = {"beta": 0.04, "max_completion_length": 5, "dynamic_sampling": True}
    return tiny_config(tmp_path, **{**run, **overrides})


def _recording(trainer, monkeypatch):
    """Record every prepared rollout's prompts (this is what reaches the loss) and every
    micro-batch's rows."""
    prepared, rows_seen = [], []
    prepare, loss = update.prepare, trainer.loss

    def recording_prepare(policy, rollout, *args, **kwargs):
        prepared.append(rollout)
        return prepare(policy, rollout, *args, **kwargs)

    def recording_loss(logps, mb):
        rows_seen.append(mb.rows.tolist())
        return loss(logps, mb)

    monkeypatch.setattr(update, "prepare", recording_prepare)
    trainer.loss = recording_loss
    return prepared, rows_seen


def test_uniform_groups_never_reach_the_loss(tmp_path, monkeypatch):
    trainer = GRPOTrainer("tiny-random", [correct, shaped], ROWS, args=_args(tmp_path))
    prepared, rows_seen = _recording(trainer, monkeypatch)
    drawn = []
    inner = trainer.prompts.next

    def next_batch(curriculum=None):
        batch = inner(curriculum)
        drawn.append(batch.indices)
        return batch

    trainer.prompts.next = next_batch
    logs = trainer.train_step()
    answers = [str(i) for batch in drawn for i in batch]
    informative = [a for a in answers if a not in UNIFORM]
    assert len(informative) >= 2 and len(drawn) >= 2 or len(drawn) == 1
    kept = [row["answer"] for row in trainer.records.last_batch[0]]
    assert kept == informative[:2]  # the first two informative groups, in draw order
    assert prepared[-1].completion_ids.shape[0] == 8  # 2 groups x 4
    assert sorted(r for mb in rows_seen for r in mb) == list(range(8))
    # The update saw only informative groups: every group's correctness varies.
    correctness = trainer.records.last_batch[3][:, 0]
    assert informative_groups(correctness, trainer.records.last_batch[5]).all()
    zero = sum(a in UNIFORM for a in answers)
    assert logs["dynamic/gen_batches"] == len(drawn)
    assert logs["dynamic/zero_variance_groups"] == zero
    assert logs["dynamic/kept_groups"] == 2 and logs["dynamic/filler_groups"] == 0
    assert logs["dynamic/trimmed_groups"] == len(informative) - 2
    assert logs["dynamic/dropped_groups"] == len(answers) - 2
    assert logs["dynamic/dropped_rollouts"] == 4 * (len(answers) - 2)
    assert logs["dynamic/dropped_groups_total"] == logs["dynamic/dropped_groups"]
    assert logs["dynamic/capped"] == 0.0 and logs["frac_reward_zero_std"] == 0.0
    # The sampler advanced by every batch drawn.
    assert len(trainer.prompts.sampler.order) == 12 - 2 * len(drawn)


def test_the_cap_is_respected_and_logged(tmp_path, monkeypatch):
    def all_right(completions, **kwargs):
        return [1.0] * len(completions)

    all_right.is_correctness = True
    args = _args(tmp_path, max_num_gen_batches=3, max_steps=2)
    trainer = GRPOTrainer("tiny-random", [all_right, shaped], ROWS, args=args)
    prepared, _ = _recording(trainer, monkeypatch)
    trainer.train()
    logs = trainer.log_history
    for step, log in enumerate(logs, 1):
        assert log["dynamic/gen_batches"] == 3 and log["dynamic/capped"] == 1.0
        assert log["dynamic/kept_groups"] == 0 and log["dynamic/filler_groups"] == 1
        assert log["dynamic/dropped_groups"] == 3 * 2 - 1
        assert log["dynamic/dropped_rollouts"] == 5 * 4
        assert log["dynamic/gen_batches_total"] == 3 * step
        assert log["dynamic/dropped_tokens"] > 0
        # The compute ledger counts what was generated, dropped groups included.
        assert log["compute/rollouts"] == 3 * 2 * 4
        assert log["compute/generated_tokens"] == log["dynamic/dropped_tokens"] + log[
            "completions/mean_length"] * 4  # fmt: skip
    assert logs[1]["dynamic/dropped_tokens_total"] == (
        logs[0]["dynamic/dropped_tokens"] + logs[1]["dynamic/dropped_tokens"])  # fmt: skip
    # Trained on one zero-variance group (as plain GRPO would: no correctness signal).
    assert [r.completion_ids.shape[0] for r in prepared] == [4, 4]
    assert trainer.prompts.sampler.epoch == 1 and len(trainer.prompts.sampler.order) == 0


def test_a_capped_step_trains_on_the_informative_groups_it_found(tmp_path, monkeypatch):
    # Only prompts 1 and 2 (of 12) are informative; with a cap of 1 batch, a step keeps the
    # informative groups of its one batch (0, 1 or 2 of them).
    def rare(completions, answer, **kwargs):
        return [float(i % 2) if a in ("1", "2") else 0.0 for i, a in enumerate(answer)]

    rare.is_correctness = True
    trainer = GRPOTrainer("tiny-random", [rare], ROWS,
                          args=_args(tmp_path, max_num_gen_batches=1, max_steps=6))  # fmt: skip
    prepared, _ = _recording(trainer, monkeypatch)
    trainer.train()
    logs = trainer.log_history
    kept = [log["dynamic/kept_groups"] for log in logs]
    assert sum(kept) == 2 and all(log["dynamic/gen_batches"] == 1 for log in logs)
    for log, rollout in zip(logs, prepared, strict=True):
        groups = int(log["dynamic/kept_groups"] + log["dynamic/filler_groups"])
        assert rollout.completion_ids.shape[0] == 4 * groups
        assert log["dynamic/capped"] == 1.0 and groups == max(log["dynamic/kept_groups"], 1)


def test_no_cap_draws_until_the_target_is_reached(tmp_path, monkeypatch):
    # max_num_gen_batches = 0 (verl: no limit): only prompts 1 and 2 of 12 are informative, so
    # the step draws until it has met both, crossing into the next epoch if it must.
    def rare(completions, answer, **kwargs):
        return [float(i % 2) if a in ("1", "2") else 0.0 for i, a in enumerate(answer)]

    rare.is_correctness = True
    trainer = GRPOTrainer("tiny-random", [rare], ROWS,
                          args=_args(tmp_path, max_num_gen_batches=0, max_steps=1))  # fmt: skip
    prepared, _ = _recording(trainer, monkeypatch)
    log = trainer.train_step()
    assert log["dynamic/kept_groups"] == 2 and log["dynamic/capped"] == 0.0
    assert sorted(row["answer"] for row in trainer.records.last_batch[0]) == ["1", "2"]
    assert log["dynamic/gen_batches"] >= 1 and prepared[0].completion_ids.shape[0] == 8
    drawn = 12 * (trainer.prompts.sampler.epoch - 1) + 12 - len(trainer.prompts.sampler.order)
    assert drawn == 2 * log["dynamic/gen_batches"]


TIMING = ("time/", "tokens_per_second", "generation_tokens_per_second", "perf/throughput")


def _untimed(logs):
    return [{k: v for k, v in row.items() if not k.startswith(TIMING)} for row in logs]


def _same_weights(a, b):
    for (name, p), q in zip(a.model.named_parameters(), b.model.parameters(), strict=True):
        assert torch.equal(p, q), name


def test_off_is_the_plain_step_bitwise(tmp_path):
    plain = PlainStepTrainer("tiny-random", [correct, shaped], ROWS,
                             args=_args(tmp_path / "a", dynamic_sampling=False))  # fmt: skip
    trainer = GRPOTrainer("tiny-random", [correct, shaped], ROWS,
                          args=_args(tmp_path / "b", dynamic_sampling=False))  # fmt: skip
    plain.train(), trainer.train()
    a, b = plain.log_history, trainer.log_history
    _same_weights(plain, trainer)
    assert _untimed(a) == _untimed(b) and not any(k.startswith("dynamic/") for k in b[0])


def test_on_with_every_group_informative_trains_like_off(tmp_path):
    def parity(completions, **kwargs):
        return [float(i % 2) for i in range(len(completions))]

    parity.is_correctness = True
    off = GRPOTrainer("tiny-random", [parity, shaped], ROWS,
                      args=_args(tmp_path / "a", dynamic_sampling=False))  # fmt: skip
    on = GRPOTrainer("tiny-random", [parity, shaped], ROWS, args=_args(tmp_path / "b"))
    off.train(), on.train()
    a, b = off.log_history, on.log_history
    _same_weights(off, on)
    for row in b:
        assert row["dynamic/gen_batches"] == 1 and row["dynamic/dropped_groups"] == 0
    assert [{k: v for k, v in r.items() if not k.startswith("dynamic/")} for r in _untimed(b)] \
        == _untimed(a)


def test_resume_with_dynamic_sampling_is_exact(tmp_path):
    full = GRPOTrainer("tiny-random", [correct, shaped], ROWS,
                       args=_args(tmp_path / "a", max_steps=4, save_steps=2))  # fmt: skip
    full.train()
    half = GRPOTrainer("tiny-random", [correct, shaped], ROWS,
                       args=_args(tmp_path / "b", max_steps=2, save_steps=2))  # fmt: skip
    half.train()
    rest = GRPOTrainer("tiny-random", [correct, shaped], ROWS,
                       args=_args(tmp_path / "b", max_steps=4, save_steps=2,
                                  resume_from_checkpoint="auto"))  # fmt: skip
    rest.train()
    _same_weights(full, rest)
    a, b = _untimed(full.log_history), _untimed(rest.log_history)
    assert a == b
    assert sum(r["dynamic/gen_batches"] for r in a) > 4  # some steps drew several batches
    assert b[-1]["dynamic/gen_batches_total"] == sum(r["dynamic/gen_batches"] for r in a)
    state = torch.load(tmp_path / "b" / "run" / "checkpoint-4" / "training_state.pt",
                       weights_only=True)  # fmt: skip
    assert state["dynamic_sampling"]["gen_batches"] == b[-1]["dynamic/gen_batches_total"]
    other = torch.load(tmp_path / "a" / "run" / "checkpoint-4" / "training_state.pt",
                       weights_only=True)["sampler"]  # fmt: skip
    assert state["sampler"]["order"] == other["order"]
    assert state["sampler"]["epoch"] == other["epoch"]
    assert torch.equal(state["sampler"]["generator"], other["generator"])


# ----------------------------------------------------------------------------------------------
# 2 ranks (torchrun, gloo) against one process on the same global batches

# Generation is a deterministic function of the prompt (as in test_distributed.py), so one
# process and the two ranks train on identical completions. Correctness: prompts whose number
# is in ``uniform`` are always right; the others alternate over their completions.
SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    import torch
    import groupwise.rollout.hf as engine
    from groupwise import GRPOConfig, GRPOTrainer
    from groupwise.rollout import Rollout

    def fake_generate(model, tokenizer, prompt_token_ids, counts, params, generator=None, **kw):
        counts = [counts] * len(prompt_token_ids) if isinstance(counts, int) else list(counts)
        width, pad = 6, tokenizer.pad_token_id
        lp = max(len(p) for p in prompt_token_ids)
        prompt_ids = torch.full((len(prompt_token_ids), lp), pad)
        prompt_mask = torch.zeros_like(prompt_ids)
        comps, masks = [], []
        for i, (p, G) in enumerate(zip(prompt_token_ids, counts)):
            prompt_ids[i, lp - len(p):] = torch.tensor(p)
            prompt_mask[i, lp - len(p):] = 1
            g = torch.Generator().manual_seed(sum(p) * 1009 + len(p))
            ids = torch.randint(5, 200, (G, width), generator=g)
            lengths = torch.randint(1, width + 1, (G,), generator=g)
            m = (torch.arange(width)[None] < lengths[:, None]).long()
            comps.append(ids * m + pad * (1 - m))
            masks.append(m)
        comp, mask = torch.cat(comps), torch.cat(masks)
        return Rollout(prompt_ids, prompt_mask, comp, mask, mask.sum(1) == width,
                       torch.arange(len(prompt_token_ids)).repeat_interleave(torch.tensor(counts)),
                       tokenizer.batch_decode(comp, skip_special_tokens=True))

    engine.generate = fake_generate

    def run(out, overrides):
        steps, uniform = overrides.pop("steps"), set(overrides.pop("uniform"))

        def correct(completions, answer, **kw):
            return [1.0 if a in uniform else float(i % 2) for i, a in enumerate(answer)]
        correct.is_correctness = True

        def low_tokens(completions, completion_ids, **kw):
            return [sum(t < 100 for t in ids) / max(len(ids), 1) for ids in completion_ids]

        rows = [{"prompt": f"Problem number {i}: add {i} and {2 * i}.", "answer": str(i)}
                for i in range(8)]
        args = GRPOConfig(model="tiny-random", max_steps=steps, learning_rate=1e-3, beta=0.04,
                          num_generations=4, max_completion_length=6, seed=0, disable_tqdm=True,
                          output_dir=out, dynamic_sampling=True, **overrides)
        trainer = GRPOTrainer("tiny-random", [correct, low_tokens], rows, args=args)
        rank = int(os.environ.get("RANK", "0"))

        def full(t):  # FSDP: gather a shard into the full tensor (a collective: every rank)
            return t.full_tensor() if hasattr(t, "full_tensor") else t.detach().clone()

        # Every optimizer step's gradients, as the optimizer sees them.
        grads, real_step = [], trainer.optimizer.step
        def step(*a, **k):
            grads.append({n: full(p.grad) for n, p in trainer.model.named_parameters()
                          if p.grad is not None})
            return real_step(*a, **k)
        trainer.optimizer.step = step
        history = []
        for _ in range(steps):
            history.append(trainer.train_step())
            history[-1]["kept"] = [r["answer"] for r in trainer.records.last_batch[0]]
        params = {n: full(p) for n, p in trainer.model.named_parameters()}
        if rank == 0:
            torch.save(params, os.path.join(out, "params.pt"))
            torch.save(grads, os.path.join(out, "grads.pt"))
        with open(os.path.join(out, f"logs-{rank}.json"), "w") as f:
            json.dump(history, f)

    # argv[1]: the jobs, [output folder, overrides] pairs, one after another.
    for out, overrides in json.loads(sys.argv[1]):
        run(out, overrides)
    """
)


# Step 1 draws two global batches of 4 prompts (rank 0 holds the first two of each, rank 1 the
# last two). Only the 4th prompt of the first batch and the last two of the second are
# informative, all three on rank 1: the cap stops at 3 groups, rank 0 gets two of them from
# rank 1, rank 1 keeps one.
ORDER = PromptSampler(8, seed=0).take(8)
TWO_RANK_CASES = {
    dp: {"steps": 2, "uniform": [str(i) for i in ORDER[:3] + ORDER[4:6]], "data_parallel": dp,
         "max_num_gen_batches": 2}
    for dp in ("ddp", "fsdp")
}  # fmt: skip


@pytest.fixture(scope="session")  # as test_distributed.step_runs
def two_rank_runs(request, tmp_path_factory):
    """Every selected TWO_RANK_CASES case in one single process and in one torchrun job (two
    launches in all); returns a function of the case that gives its two output folders."""
    from test_distributed import _selected_cases, single_and_two_ranks

    names = _selected_cases(request, TWO_RANK_CASES, __name__)
    root = tmp_path_factory.mktemp("two_ranks")
    return single_and_two_ranks(SCRIPT, TWO_RANK_CASES, names, root, "logs-0.json")


@pytest.mark.parametrize("case", list(TWO_RANK_CASES))
def test_two_ranks_match_one_process(two_rank_runs, case):
    """Unequal informative groups per rank: the kept groups are dealt out (some travel between
    ranks), ranks hold 1 or 2 groups, and the update equals one process's."""
    single, ranks = two_rank_runs(case)
    # The gradient of every step is one process's: that is what dealing the kept groups out
    # must preserve (summation order aside).
    a, b = torch.load(single / "grads.pt"), torch.load(ranks / "grads.pt")
    assert len(a) == len(b) == 2
    for step, (ga, gb) in enumerate(zip(a, b, strict=True)):
        assert ga.keys() == gb.keys()
        assert max(float(g.abs().max()) for g in ga.values()) > 1e-3  # a real update
        for key in ga:
            torch.testing.assert_close(gb[key], ga[key], rtol=0, atol=1e-6, msg=f"{step} {key}")
    # The weights after AdamW's two steps agree less tightly: its second step divides by
    # sqrt(v), so where a gradient is near zero the summation order's rounding is amplified
    # (measured on an AVX2 CPU: 1.2e-6, at an element whose two-step update is 1.35e-4 of the
    # possible 2e-3). 1e-5 is 1% of one step's largest change (lr 1e-3); a group dealt to the
    # wrong rank or weighted twice moves weights by the whole step.
    a, b = torch.load(single / "params.pt"), torch.load(ranks / "params.pt")
    for key in a:
        torch.testing.assert_close(b[key], a[key], rtol=0, atol=1e-5, msg=key)
    logs = [json.loads((single / "logs-0.json").read_text())]
    logs += [json.loads((ranks / f"logs-{r}.json").read_text()) for r in (0, 1)]
    for step in range(2):
        one_step, r0, r1 = (run[step] for run in logs)
        assert r0["kept"] + r1["kept"] == one_step["kept"]
        assert abs(len(r0["kept"]) - len(r1["kept"])) <= 1
        # Not "kl" or "reward": they are means per micro-batch / per rank, which depend on how
        # the rows are split when ranks hold unequal rows (the update itself does not).
        for key in ("loss", "dynamic/gen_batches", "dynamic/dropped_groups",
                    "dynamic/dropped_tokens", "dynamic/kept_groups"):  # fmt: skip
            assert r0[key] == pytest.approx(one_step[key], abs=1e-5), (step, key)
            assert r1[key] == r0[key]
    assert logs[0][0]["dynamic/gen_batches"] == 2 and logs[0][0]["dynamic/capped"] == 1.0
    assert logs[0][0]["kept"] == [str(i) for i in (ORDER[3], ORDER[6], ORDER[7])]
    assert [len(logs[1][0]["kept"]), len(logs[2][0]["kept"])] == [2, 1]
