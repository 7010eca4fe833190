"""select_top_up (Reinforce-Ada's sequential top-up with curriculum: select): the round allocation
by hand, the rounds of one step on scripted scores, a training run (logged counts, the compute
ledger, the group sizes), exact resume, and the config refusals."""

from __future__ import annotations

import pytest
import torch

from conftest import SELECT_ROWS, first_token_parity, select_config
from groupwise.config.grpo_config import GRPOConfig
from groupwise.curriculum import Plan, PromptBatch
from groupwise.curriculum.topup import TopUp, first_round, next_round
from groupwise.errors import ConfigError
from groupwise.rewards.scoring import Scores
from groupwise.rollout import Rollout

# --- the allocation, by hand ---------------------------------------------------------------------


def test_next_round_by_hand():
    assert first_round([4, 1, 8, 3], 2) == [2, 1, 2, 2]
    # Uniform groups 0, 2, 3; room min(2, 3 - 2) = 1 each; 5 left is enough.
    assert next_round([True, False, True, True], [2, 2, 2, 2], 5, 2, 3) == ([1, 0, 1, 1], None)
    # 4 left over three groups with room 2 each: dealt round-robin, 1 1 1 then 1 more to group 0.
    assert next_round([True, True, True], [2, 2, 2], 4, 2, 8) == ([2, 1, 1], None)
    # A group near its max takes only what fits.
    assert next_round([True, True], [7, 2], 10, 3, 8) == ([1, 3], None)
    # The stop reasons.
    assert next_round([True, True], [2, 2], 0, 2, 8) == ([0, 0], "budget")
    assert next_round([False, False], [2, 2], 6, 2, 8) == ([0, 0], "informative")
    assert next_round([True, False], [8, 2], 6, 2, 8) == ([0, 0], "max")


def test_a_step_of_rounds_by_hand():
    """Planned [4, 4, 4] (budget 12), first 2, n_max 5. Round 1: [1,0] [1,1] [0,0] -> groups 1
    and 2 uniform, 6 left; round 2: +2 each -> g1 [1,1,1,1] still uniform, g2 [0,0,1,0] now
    informative, 2 left; round 3: g1 has room 1 -> +1 ([0]): informative; stop (informative),
    1 unspent."""
    sizes, left = first_round([4, 4, 4], 2), 12 - 6
    assert sizes == [2, 2, 2]
    extra, stop = next_round([False, True, True], sizes, left, 2, 5)
    assert (extra, stop) == ([0, 2, 2], None)
    sizes, left = [s + e for s, e in zip(sizes, extra, strict=True)], left - sum(extra)
    extra, stop = next_round([False, True, False], sizes, left, 2, 5)
    assert (extra, stop, sizes, left) == ([0, 1, 0], None, [2, 4, 4], 2)
    sizes, left = [s + e for s, e in zip(sizes, extra, strict=True)], left - sum(extra)
    assert next_round([False, False, False], sizes, left, 2, 5) == ([0, 0, 0], "informative")
    assert (sizes, left) == ([2, 5, 4], 1)


# --- the rounds of one step, on scripted scores -------------------------------------------------


def _fake_roll(script, calls):
    """An engine + scorer: per call, the correctness of each prompt's new rows from ``script``
    (a list per call of {prompt position: [scores]}), completion token = 100 + prompt position,
    width = 1 + the call number (so the rounds' widths differ)."""

    def roll(prompt_ids, counts, rows):
        k = len(calls)
        calls.append((list(rows), list(counts)))
        positions = [row["p"] for row in rows]
        values = [v for p in positions for v in script[k][p]]
        assert [len(script[k][p]) for p in positions] == counts
        n, width = sum(counts), 1 + k
        ids = torch.tensor([100 + p for p, c in zip(positions, counts, strict=True)
                            for _ in range(c)])  # fmt: skip
        completion = ids[:, None].repeat(1, width)
        rollout = Rollout(
            prompt_ids=torch.tensor([list(p) for p in prompt_ids]),
            prompt_mask=torch.ones(len(prompt_ids), 1, dtype=torch.long),
            completion_ids=completion,
            completion_mask=torch.ones(n, width, dtype=torch.long),
            truncated=torch.zeros(n, dtype=torch.bool),
            group_ids=torch.arange(len(counts)).repeat_interleave(torch.tensor(counts)),
            texts=[
                f"p{p} call{k}" for p, c in zip(positions, counts, strict=True) for _ in range(c)
            ],  # fmt: skip
        )
        c = torch.tensor(values, dtype=torch.float32)
        return rollout, Scores(c.clone(), c[:, None].clone(), c)

    return roll


def _collect(top_up, batch, plan, roll, weigh=None, *, prompt_weighting):
    """The step's loop over the rounds (trainer.grpo.draw's): generate and score each request."""
    rounds = top_up.start(batch, plan, weigh, prompt_weighting=prompt_weighting)
    while rounds.request is not None:
        rounds.add(*roll(*rounds.request))
    return rounds.result()


def test_collect_joins_every_round_per_group_and_reports_counts():
    script = [
        {0: [1.0, 0.0], 1: [1.0, 1.0], 2: [0.0, 0.0]},
        {1: [1.0, 1.0], 2: [0.0, 1.0]},
        {1: [0.0]},
    ]
    calls: list = []
    rows = [{"prompt": f"q{p}", "p": p} for p in range(3)]
    batch = PromptBatch([10, 11, 12], slice(0, 3), rows, [[5], [6], [7]], skipped=[99])
    plan = Plan(batch, [4, 4, 4], [1.0, 1.0, 1.0])
    top_up = TopUp(True, first=2, n_max=5, pad_token_id=0)
    draw = _collect(top_up, batch, plan, _fake_roll(script, calls), lambda n: [4 / x for x in n],
                   prompt_weighting="rollouts")  # fmt: skip
    assert [c[1] for c in calls] == [[2, 2, 2], [2, 2], [1]]
    assert [[r["p"] for r in c[0]] for c in calls] == [[0, 1, 2], [1, 2], [1]]
    assert draw.plan.counts == [2, 5, 4] and draw.plan.weights == [2.0, 0.8, 1.0]
    # Each row carries its prompt's weight for the realised group sizes.
    assert draw.row_weights.tolist() == pytest.approx([2.0] * 2 + [0.8] * 5 + [1.0] * 4)
    assert draw.batch is batch and draw.batch.skipped == [99]  # the selector logs the skips
    assert draw.rollout.group_ids.tolist() == [0, 0, 1, 1, 1, 1, 1, 2, 2, 2, 2]
    assert draw.scores.correctness.tolist() == [1, 0, 1, 1, 1, 1, 0, 0, 0, 0, 1]
    # Each row kept its own completion; shorter rounds right-padded with the pad token.
    assert draw.rollout.completion_mask.sum(dim=1).tolist() == [1, 1, 1, 1, 2, 2, 3, 1, 1, 2, 2]
    assert (draw.rollout.completion_ids[:, 0] - 100).tolist() == draw.rollout.group_ids.tolist()
    assert draw.rollout.texts[2:7] == ["p1 call0"] * 2 + ["p1 call1"] * 2 + ["p1 call2"]
    assert top_up.stop == "informative"
    assert top_up.logs == {
        "curriculum/select/top_up_rounds": 2.0,
        "curriculum/select/top_up_rollouts": 5.0,
        "curriculum/select/top_up_unspent": 1.0,
        "curriculum/select/informative_before_top_up": 1.0,
        "curriculum/select/informative_after_top_up": 3.0,
    }


def test_collect_stops_at_the_budget_and_at_the_max():
    rows = [{"prompt": "a", "p": 0}, {"prompt": "b", "p": 1}]
    batch = PromptBatch([0, 1], slice(0, 2), rows, [[5], [6]])
    # Budget 5 (planned [3, 2]): round 1 [2, 2], 1 left -> group 0 (uniform) takes it; stop.
    calls: list = []
    script = [{0: [1.0, 1.0], 1: [0.0, 0.0]}, {0: [1.0]}]
    top_up = TopUp(True, first=2, n_max=8, pad_token_id=0)
    draw = _collect(top_up, batch, Plan(batch, [3, 2], [1.0, 1.0]), _fake_roll(script, calls),
                   prompt_weighting="rollouts")  # fmt: skip
    assert draw.plan.counts == [3, 2] and draw.plan.weights == [1.0, 1.0]
    assert draw.row_weights is None  # every weight 1
    assert top_up.stop == "budget" and top_up.logs["curriculum/select/top_up_unspent"] == 0
    # n_max 3: after round 2 both groups are at 3 and still uniform; 4 of the budget unspent.
    calls = []
    script = [{0: [1.0, 1.0], 1: [0.0, 0.0]}, {0: [1.0], 1: [0.0]}]
    top_up = TopUp(True, first=2, n_max=3, pad_token_id=0)
    draw = _collect(top_up, batch, Plan(batch, [5, 5], [1.0, 1.0]), _fake_roll(script, calls),
                   prompt_weighting="rollouts")  # fmt: skip
    assert draw.plan.counts == [3, 3] and top_up.stop == "max"
    assert top_up.logs["curriculum/select/top_up_unspent"] == 4
    assert top_up.logs["curriculum/select/informative_after_top_up"] == 0


# --- end to end ---------------------------------------------------------------------------------

def _args(tmp_path, **overrides):
    """The select curriculum's end-to-end options (conftest.select_config), top-up on."""
    return select_config(tmp_path, **{"select_top_up": True, **overrides})


class _Recording(TopUp):
    """Records each step's rounds: (prompt texts, counts, correctness) per round."""

    def start(self, batch, plan, weigh=None, *, prompt_weighting):
        rounds = super().start(batch, plan, weigh, prompt_weighting=prompt_weighting)
        seen, add, result = [], rounds.add, rounds.result

        def recorded_add(rollout, scores):
            _, counts, rows = rounds.request
            seen.append(([r["prompt"] for r in rows], list(counts),
                         scores.correctness.tolist()))  # fmt: skip
            return add(rollout, scores)

        def recorded_result():
            draw = result()
            self.steps.append((list(plan.counts), seen, draw))
            return draw

        rounds.add, rounds.result = recorded_add, recorded_result
        return rounds


def test_training_run_tops_up_uniform_groups_within_the_budget(tmp_path):
    from groupwise import GRPOTrainer

    trainer = GRPOTrainer("tiny-random", first_token_parity, SELECT_ROWS, args=_args(tmp_path))
    recording = _Recording(True, 2, 8, trainer.top_up.pad_token_id)
    recording.steps = []
    trainer.top_up = recording
    trainer.train()
    logs = trainer.log_history
    assert len(logs) == 3 and all(torch.isfinite(torch.tensor(log["loss"])) for log in logs)
    topped = 0
    for log, (planned, rounds, draw) in zip(logs, recording.steps, strict=True):
        assert sum(planned) == 12  # 3 prompts x num_generations 4
        prompts, counts, correctness = rounds[0]
        assert counts == [2, 2, 2]
        seen = {p: list(c) for p, c in zip(prompts, _split(correctness, counts), strict=True)}
        for names, extra, values in rounds[1:]:  # later rounds: only groups still uniform
            for p, new in zip(names, _split(values, extra), strict=True):
                assert len(set(seen[p])) == 1, (p, seen[p])
                seen[p] += new
                topped += 1
        sizes = [len(seen[p]) for p in prompts]
        assert draw.plan.counts == sizes and all(2 <= n <= 8 for n in sizes)
        realised = sum(sizes)
        assert realised <= 12
        assert log["curriculum/select/top_up_rollouts"] == realised - 6
        assert log["curriculum/select/top_up_unspent"] == 12 - realised
        assert log["curriculum/select/top_up_rounds"] == len(rounds) - 1
        assert log["curriculum/select/rollouts"] == realised
        assert log["compute/rollouts"] == realised == draw.rollout.completion_ids.shape[0]
        assert log["compute/generated_tokens"] == int(draw.rollout.completion_mask.sum())
        assert log["curriculum/select/group_size_mean"] == pytest.approx(realised / 3)
        informative = sum(len(set(v)) > 1 for v in seen.values())
        assert log["curriculum/select/informative_after_top_up"] == informative
        assert log["curriculum/select/informative"] == informative
        if log["curriculum/select/top_up_unspent"] > 0:  # stopped early: nothing left to top up
            assert all(len(set(v)) > 1 or len(v) == 8 for v in seen.values())
    assert topped > 0  # some group was topped up in this run
    assert trainer.compute.totals["rollouts"] == sum(log["compute/rollouts"] for log in logs)


def _split(values, counts):
    out, start = [], 0
    for c in counts:
        out.append(values[start : start + c])
        start += c
    return out


def test_resume_with_top_up_is_exact(tmp_path):
    from groupwise import GRPOTrainer

    args = _args(tmp_path / "a", max_steps=4)
    full = GRPOTrainer("tiny-random", first_token_parity, SELECT_ROWS, args=args)
    full.train()
    start = str(tmp_path / "a" / "run" / "checkpoint-2")
    args = _args(tmp_path / "b", max_steps=4, resume_from_checkpoint=start)
    rest = GRPOTrainer("tiny-random", first_token_parity, SELECT_ROWS, args=args)
    rest.train()
    assert rest.curriculum.state_dict() == full.curriculum.state_dict()
    for (name, p), q in zip(full.model.named_parameters(), rest.model.parameters(), strict=True):
        assert torch.equal(p, q), name
    timing = ("time/", "tokens_per_second", "generation_tokens_per_second", "perf/throughput")
    strip = [{k: v for k, v in r.items() if not k.startswith(timing)} for r in full.log_history]
    assert strip == [
        {k: v for k, v in r.items() if not k.startswith(timing)} for r in rest.log_history
    ]
    assert any(r.get("curriculum/select/top_up_rollouts", 0) > 0 for r in full.log_history)


# --- the config ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "overrides",
    [
        dict(curriculum="none"),
        dict(curriculum="prompt_gdro"),
        dict(curriculum="select", dynamic_sampling=True),
        dict(curriculum="select", algorithm="ppo"),
        dict(curriculum="select", select_top_up_first=1),
    ],
)
def test_config_refusals_name_the_option(overrides):
    name = "select_top_up_first" if "select_top_up_first" in overrides else "select_top_up"
    with pytest.raises(ConfigError, match=name):
        GRPOConfig(select_top_up=True, **overrides)
    assert GRPOConfig(curriculum="select", select_top_up=True).select_top_up_first == 2


def test_refused_under_data_parallel():
    from groupwise.runtime.distributed import DistributedContext

    args, two = GRPOConfig(curriculum="select", select_top_up=True), DistributedContext(0, 2)
    section = args.sections().curriculum
    with pytest.raises(ConfigError, match="select_top_up.*world_size=2"):
        TopUp.from_section(section, two, 0)
    plain = GRPOConfig(curriculum="select").sections().curriculum
    assert not TopUp.from_section(plain, two, 0).enabled
    assert TopUp.from_section(section, DistributedContext(), 0).enabled
