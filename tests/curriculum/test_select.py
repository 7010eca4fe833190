"""curriculum: select (predictive prompt selection with adaptive group size): the math by hand,
the curriculum's choose/plan/observe by hand, its checkpoint, the sampler hook, the config, the
ground-truth-difficulty simulation's mechanism, and a short training run that resumes exactly."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from conftest import SELECT_ROWS, first_token_parity, select_config, select_options
from groupwise.config.grpo_config import GRPOConfig
from groupwise.curriculum import CURRICULA, GlobalRows, PromptBatch, SelectCurriculum
from groupwise.curriculum.select import (
    best_k,
    beta_moment,
    budget,
    expected_variance,
    first_occurrences,
    informative_probability,
    keep_probability,
    knapsack_allocation,
    pooled_mean,
    posterior,
    retry_probability,
    selection_weights,
    weighted_choice,
)
from groupwise.errors import ConfigError
from groupwise.trainer import checkpoints as ckpt


def selecting(**overrides):
    """A select curriculum for these tests: a mean group size of 4 and seed 0 unless given (the
    values the expectations below were worked out with), else GRPOConfig's defaults."""
    return SelectCurriculum(select_options(**{"num_generations": 4, "seed": 0, **overrides}))


# --- the math, by hand ---------------------------------------------------------------------------


def test_beta_moments_and_informative_probability_by_hand():
    assert beta_moment(1, 1, 4) == pytest.approx(1 / 5)  # integral of p^4
    assert beta_moment(2, 3, 2) == pytest.approx(2 * 3 / (5 * 6))  # 0.2
    # Beta(1, 1), n = 2: 1 - 1/3 - 1/3 = 1/3 (= integral of 2p(1-p)); n = 4: 1 - 2/5.
    assert informative_probability(1, 1, 2) == pytest.approx(1 / 3)
    assert informative_probability(1, 1, 4) == pytest.approx(3 / 5)
    # Beta(2, 3), n = 2: E[p^2] = 0.2, E[(1-p)^2] = 3*4/(5*6) = 0.4 -> 0.4 = 2 E[p(1-p)].
    assert informative_probability(2, 3, 2) == pytest.approx(0.4)
    assert expected_variance(2, 3) == pytest.approx(6 / 30)
    assert informative_probability(3, 2, 1) == 0.0
    # Beta(1, 41), n = 4: E[(1-p)^4] = 41/42*42/43*43/44*44/45 = 41/45; E[p^4] = 24/(42*43*44*45).
    expected = 1 - 41 / 45 - 24 / (42 * 43 * 44 * 45)
    assert informative_probability(1, 41, 4) == pytest.approx(expected, rel=1e-12)
    # A point mass near p: converges to 1 - p^n - (1-p)^n.
    assert informative_probability(3e5, 7e5, 4) == pytest.approx(1 - 0.3**4 - 0.7**4, abs=1e-4)


def test_prior_posterior_and_retry_by_hand():
    assert pooled_mean(0, 0) == 0.5
    assert pooled_mean(3, 1) == pytest.approx(4 / 6)
    assert posterior(0.25, 2.0, 1.0, 3.0) == (1.5, 4.5)
    assert retry_probability(0, 2) == 0.0
    assert retry_probability(2, 2) == pytest.approx(0.5)
    assert retry_probability(4, 2) == pytest.approx(0.75)
    assert retry_probability(1, 2) == pytest.approx(1 - 2**-0.5)


def test_keep_probability_by_hand():
    # GRESO's rule max(keep^z, floor) with keep 0.5, floor 0.01: 1, 1/2, 1/4, 1/8 for z = 0..3;
    # 0.5^7 = 0.0078 < 0.01, so the floor from z = 7 on.
    assert [keep_probability(z, 0.5, 0.01) for z in range(4)] == [1.0, 0.5, 0.25, 0.125]
    assert keep_probability(6, 0.5, 0.01) == 0.015625
    assert keep_probability(7, 0.5, 0.01) == 0.01
    assert keep_probability(50, 0.5, 0.01) == 0.01
    assert keep_probability(3, 0.5, 0.2) == 0.2  # floor above 0.125
    assert keep_probability(2, 0.9, 0.0) == pytest.approx(0.81)
    assert keep_probability(0, 0.0, 0.0) == 1.0  # never all alike: always kept


def test_best_k_takes_exactly_the_top_k_by_predicted_probability():
    rng = np.random.default_rng(4)
    for _ in range(50):
        m = int(rng.integers(2, 12))
        k = int(rng.integers(1, m + 1))
        p = rng.random(m).tolist()
        picked = best_k(p, [True] * m, k, rng.permutation(m).tolist())
        assert picked == sorted(np.argsort(-np.asarray(p), kind="stable")[:k].tolist())
    # Kept candidates first even when worse; the best of the others fill up.
    assert best_k([0.9, 0.1, 0.8, 0.2], [False, True, False, True], 2, [0, 1, 2, 3]) == [1, 3]
    assert best_k([0.9, 0.1, 0.8, 0.2], [False, True, False, False], 2, [0, 1, 2, 3]) == [0, 1]
    # Ties in the order given (a random permutation in the curriculum).
    assert best_k([0.5, 0.5, 0.5], [True] * 3, 1, [2, 0, 1]) == [1]
    assert best_k([0.5, 0.5, 0.5], [True] * 3, 2, [2, 0, 1]) == [1, 2]
    # A repeated candidate comes last, even kept and best.
    assert best_k([0.9, 0.9, 0.1], [True] * 3, 2, [0, 1, 2], [True, False, True]) == [0, 2]
    assert first_occurrences([3, 5, 3, 7, 5]) == [True, True, False, True, False]


def test_choose_best_k_keeps_by_streak_and_takes_the_best():
    cur = selecting(
        num_generations=4, select_oversample=2, select_keep=0.5, select_keep_floor=0.01, seed=1
    )
    cur.evidence = {0: [0.0, 40.0], 1: [40.0, 0.0], 2: [2.0, 2.0], 3: [1.0, 3.0]}
    # No streaks: every candidate is kept, and the best two by P_inf are Beta(3, 3) (0.762) and
    # Beta(2, 4) (P_inf(4) = 1 - 2*3*4*5/(6*7*8*9) - 4*5*6*7/(6*7*8*9) = 0.683).
    for _ in range(20):
        assert cur.choose([0, 1, 2, 3], [{}] * 4, 2) == [2, 3]
    logs = cur._chosen
    assert logs["kept"] == 4
    # Prompt 2 all alike once: kept half the time; when dropped, prompt 3 and the best of the
    # dropped or not-kept fill up (0 and 1 are at 0.089 each, below 2's 0.762).
    cur.streaks = {2: 1}
    picks = [tuple(cur.choose([0, 1, 2, 3], [{}] * 4, 2)) for _ in range(2000)]
    assert set(picks) <= {(2, 3), (0, 3), (1, 3)}
    assert sum(p == (2, 3) for p in picks) == pytest.approx(1000, abs=100)
    # All alike three times in a row: kept 1/8 of the time.
    cur.streaks = {2: 3}
    picks = [tuple(cur.choose([0, 1, 2, 3], [{}] * 4, 2)) for _ in range(4000)]
    assert sum(p == (2, 3) for p in picks) == pytest.approx(500, abs=90)
    # Keep 0, floor 0: a prompt with a streak is only rolled out when too few others are kept.
    cur = selecting(num_generations=4, select_oversample=2, select_keep=0.0, select_keep_floor=0.0)
    cur.evidence = {2: [2.0, 2.0]}
    cur.streaks = {2: 1}
    assert 2 not in [[0, 1, 2, 3][k] for k in cur.choose([0, 1, 2, 3], [{}] * 4, 2)]
    cur.streaks = {i: 1 for i in range(4)}
    assert cur.choose([0, 1, 2, 3], [{}] * 4, 2)[0] == 2  # all dropped: best P_inf first


def test_choose_best_k_never_picks_one_prompt_twice():
    cur = selecting(num_generations=4, select_oversample=2)
    cur.evidence = {7: [2.0, 2.0]}  # the best candidate, drawn twice
    for _ in range(20):
        picked = cur.choose([7, 1, 7, 2], [{}] * 4, 2)
        assert len(picked) == 2 and len({[7, 1, 7, 2][k] for k in picked}) == 2


def test_observe_counts_all_alike_groups_in_a_row():
    cur = selecting(num_generations=2, rollout_min=2, rollout_max=2, select_allocator="uniform")

    def step(indices, correct):
        plan = cur.plan(_batch(indices))
        prompt = np.repeat(np.arange(len(indices)), 2).tolist()
        cur.observe_global(plan, GlobalRows(prompt, correct, [0.0] * len(prompt), correct))

    step([0, 1], [1.0, 1.0, 0.0, 1.0])  # 0 all correct, 1 mixed
    assert cur.streaks == {0: 1, 1: 0}
    step([0, 1], [0.0, 0.0, 0.0, 0.0])  # all wrong counts as all alike too
    assert cur.streaks == {0: 2, 1: 1}
    step([0], [1.0, 0.0])
    assert cur.streaks == {0: 0, 1: 1}  # an informative group resets; unseen ones keep theirs
    # Correctness that differs by float noise only is all alike (the one tolerance, 1e-6).
    step([1], [0.3, 0.1 + 0.2])
    assert cur.streaks[1] == 2


def test_selection_weights_by_hand():
    # scores: 0.6, 0 + 1 * 0.5, 0.2 -> sum 1.3; (1 - 0.25) * s / 1.3 + 0.25 / 3
    w = selection_weights([0.6, 0.0, 0.2], [0.0, 0.5, 0.0], 0.25)
    np.testing.assert_allclose(
        w, [0.75 * 0.6 / 1.3 + 1 / 12, 0.75 * 0.5 / 1.3 + 1 / 12, 0.75 * 0.2 / 1.3 + 1 / 12]
    )
    assert w.sum() == pytest.approx(1.0)
    np.testing.assert_allclose(selection_weights([0.0, 0.0], [0.0, 0.0], 0.0), [0.5, 0.5])


def test_weighted_choice_by_hand_and_in_distribution():
    # keys log(u)/w: log(.5)/1 = -0.693, log(.2)/2 = -0.805, log(.9)/0.5 = -0.211 -> 2 and 0
    assert weighted_choice([1.0, 2.0, 0.5], 2, [0.5, 0.2, 0.9]) == [0, 2]
    assert weighted_choice([0.0, 1.0], 1, [0.99, 0.01]) == [1]  # weight 0 comes last
    rng = np.random.default_rng(0)
    first = [weighted_choice([1.0, 3.0], 1, rng.random(2))[0] for _ in range(20000)]
    assert np.mean(first) == pytest.approx(0.75, abs=0.015)  # P(draw i first) = w_i / sum w


def test_knapsack_by_hand_and_against_brute_force():
    # Beta(1,1): P_inf(2) = 1/3, P_inf(3) = 1/2 (gain 1/6); Beta(1,3): P_inf(2) = 1 - .1 - .6 = .3,
    # P_inf(3) = 1 - .05 - .5 = .45 (gain .15 < 1/6): the fifth rollout goes to prompt 0.
    assert knapsack_allocation([1, 1], [1, 3], 5, 2, 3) == [3, 2]
    assert knapsack_allocation([1, 1], [1, 1], 8, 2, 12) == [4, 4]  # symmetric -> uniform
    assert budget(3, 4, 2, 12) == 12 and budget(3, 4, 5, 12) == 15 and budget(3, 4, 1, 3) == 9
    rng = np.random.default_rng(1)
    for _ in range(20):
        a, b = rng.uniform(0.2, 6, 4), rng.uniform(0.2, 6, 4)
        total, n_min, n_max = 16, 2, 7
        got = knapsack_allocation(a.tolist(), b.tolist(), total, n_min, n_max)
        assert sum(got) == total and all(n_min <= n <= n_max for n in got)

        def value(ns, a=a, b=b):
            return sum(informative_probability(x, y, n) for x, y, n in zip(a, b, ns, strict=True))

        best = max(
            value(ns)
            for ns in itertools.product(range(n_min, n_max + 1), repeat=4)
            if sum(ns) == total
        )
        assert value(got) == pytest.approx(best, abs=1e-12)


# --- the curriculum, by hand ---------------------------------------------------------------------


def _batch(indices, rows=None, skipped=()):
    rows = rows if rows is not None else [{} for _ in indices]
    return PromptBatch(list(indices), slice(0, len(indices)), rows, [[1]] * len(indices),
                       list(skipped))  # fmt: skip


def test_observe_updates_evidence_pools_and_logs_by_hand():
    cur = selecting(
        num_generations=2,
        rollout_min=2,
        rollout_max=3,
        select_discount=0.5,
        select_allocator="uniform",
    )
    plan = cur.plan(_batch([10, 11], skipped=[12, 13, 14]))
    plan.counts = [2, 3]  # groups of 2 and 3 rollouts
    # prompt 0: both correct; prompt 1: 1 of 3 (NaN counts as incorrect), threshold 0.5
    rows = GlobalRows([0, 0, 1, 1, 1], [1.0, 0.9, 0.0, math.nan, 1.0], [0.0] * 5, [0.0] * 5)
    logs = cur.observe_global(plan, rows)
    assert cur.evidence == {10: [2.0, 0.0], 11: [1.0, 2.0]}
    assert cur.pools == {"": [3.0, 2.0]} and cur.step == 1
    assert logs["curriculum/select/skipped"] == 3
    # Both groups are informative: prompt 1 is mixed, and prompt 0's correctness scores (1.0,
    # 0.9) vary (population std 0.05 > 1e-6), though both rollouts count as correct for the
    # posterior.
    assert logs["curriculum/select/informative"] == 2
    assert logs["curriculum/select/informative_per_rollout"] == pytest.approx(2 / 5)
    assert cur.streaks == {10: 0, 11: 0}
    # Predicted at plan time: Beta(1, 1) (pool 0.5, strength 2) with 2 rollouts each: 2 * 1/3.
    assert logs["curriculum/select/informative_predicted"] == pytest.approx(2 / 3)
    assert (logs["curriculum/select/group_size_min"], logs["curriculum/select/group_size_max"]) == (
        2,
        3,
    )
    plan = cur.plan(_batch([10]))
    logs = cur.observe_global(plan, GlobalRows([0, 0], [1.0, 0.0], [0.0] * 2, [0.0] * 2))
    assert cur.evidence[10] == [0.5 * 2 + 1, 0.5 * 0 + 1]  # discounted, then added
    assert cur.pools[""] == [0.5 * 3 + 1, 0.5 * 2 + 1]
    # The posterior of prompt 10 now: pool mean (2.5 + 1) / (4.5 + 2) with strength 2, + (2, 1).
    m = 3.5 / 6.5
    assert cur.beta_of(10) == pytest.approx((2 * m + 2, 2 * (1 - m) + 1))


def test_difficulty_levels_have_their_own_prior():
    cur = selecting(num_generations=2, rollout_min=2, rollout_max=2, select_discount=1.0)
    rows = [{"difficulty": 1}, {"difficulty": 3}]
    cur.choose([0, 1], rows, 2)
    plan = cur.plan(_batch([0, 1], rows))
    cur.observe_global(plan, GlobalRows([0, 0, 1, 1], [1.0, 1.0, 0.0, 0.0], [0.0] * 4, [0.0] * 4))
    assert cur.pools == {"1": [2.0, 0.0], "3": [0.0, 2.0]}
    cur.choose([5, 6], [{"difficulty": 1}, {"difficulty": 3}], 2)
    # unseen prompts 5 and 6: priors 2 * (3/4, 1/4) and 2 * (1/4, 3/4)
    assert cur.beta_of(5) == pytest.approx((1.5, 0.5))
    assert cur.beta_of(6) == pytest.approx((0.5, 1.5))


def _choose_often(cur, times):
    picks = []
    for _ in range(times):
        cur.skips = {}  # just rolled out: no retry
        picks.append(tuple(cur.choose([0, 1, 2, 3], [{}] * 4, 2)))
    return picks


def test_legacy_choose_skips_prompts_predicted_uninformative_and_retries_them_later():
    cur = selecting(select_oversample=2, select_uniform_mix=0.0, select_retry_half_life=2,
                    select_rule="legacy")  # fmt: skip
    cur.evidence = {0: [0.0, 40.0], 1: [40.0, 0.0], 2: [2.0, 2.0], 3: [2.0, 2.0]}
    # weights: P_inf(Beta(1, 41), 4) = 0.0889 for 0 and 1 (p ~ 0, p ~ 1); P_inf(Beta(3, 3), 4)
    # = 1 - 2 * 360/3024 = 0.762 for 2 and 3. Drawn without replacement, P({2, 3}) =
    # 2 * (0.762/1.702) * (0.762/0.940) = 0.726.
    picks = _choose_often(cur, 300)
    assert 190 < sum(p == (2, 3) for p in picks) < 245
    cur.skips = {}
    picked = cur.choose([0, 1, 2, 3], [{}] * 4, 2)
    assert cur.skips == {i: 1 for i in range(4) if i not in picked}  # a skip is counted
    # Skipped 40 times in a row: retry -> 1, every candidate equally likely (P({2, 3}) = 1/6).
    picks = []
    for _ in range(600):
        cur.skips = {i: 40 for i in range(4)}
        picks.append(tuple(cur.choose([0, 1, 2, 3], [{}] * 4, 2)))
    assert 65 < sum(p == (2, 3) for p in picks) < 135
    # A rollout resets the count.
    plan = cur.plan(_batch([0]))
    cur.observe_global(plan, GlobalRows([0] * 4, [0.0] * 4, [0.0] * 4, [0.0] * 4))
    assert 0 not in cur.skips


# The earlier rule's choices and group sizes for this drive (seed 3, 12 steps of 4 of 8 drawn),
# recorded from the implementation before select_rule existed: ``legacy`` reproduces them.
LEGACY_DRIVE = [
    ([13, 1, 7, 32], [4, 4, 4, 4]), ([34, 15, 20, 12], [4, 5, 3, 4]),
    ([26, 30, 18, 10], [3, 5, 4, 4]), ([5, 25, 3, 13], [5, 4, 4, 3]),
    ([20, 7, 16, 36], [4, 4, 4, 4]), ([21, 19, 22, 15], [4, 5, 5, 2]),
    ([32, 25, 36, 16], [5, 4, 2, 5]), ([19, 14, 28, 35], [3, 4, 5, 4]),
    ([14, 18, 25, 9], [6, 2, 4, 4]), ([31, 24, 36, 39], [4, 5, 3, 4]),
    ([15, 28, 6, 17], [3, 5, 5, 3]), ([2, 31, 16, 4], [3, 3, 5, 5]),
]  # fmt: skip


def _drive(cur, steps=12):
    rng = np.random.default_rng(0)
    p = rng.uniform(0, 1, 40) ** 2
    out = []
    for _ in range(steps):
        drawn = rng.permutation(40)[:8].tolist()
        picked = cur.choose(drawn, [{"difficulty": d % 3} for d in drawn], 4)
        indices = [drawn[k] for k in picked]
        plan = cur.plan(_batch(indices))
        prompt = np.repeat(np.arange(4), plan.counts).tolist()
        correct = (rng.random(len(prompt)) < p[np.repeat(indices, plan.counts)]).astype(float)
        cur.observe_global(plan, GlobalRows(prompt, correct.tolist(), [0.0] * len(prompt),
                                            [0.0] * len(prompt)))  # fmt: skip
        out.append((indices, list(plan.counts)))
    return out


def test_legacy_rule_reproduces_the_earlier_choices():
    assert _drive(selecting(num_generations=4, seed=3, select_rule="legacy")) == LEGACY_DRIVE
    assert _drive(selecting(num_generations=4, seed=3)) != LEGACY_DRIVE


def test_plan_conserves_the_budget_and_weights_prompts_equally():
    cur = selecting(num_generations=4, rollout_min=2, rollout_max=8, select_allocator="knapsack")
    cur.evidence = {0: [0.0, 30.0], 1: [6.0, 6.0], 2: [30.0, 0.0], 3: [1.0, 1.0]}
    plan = cur.plan(_batch([0, 1, 2, 3]))
    assert sum(plan.counts) == 16 and all(2 <= n <= 8 for n in plan.counts)
    assert plan.counts[0] == plan.counts[2] == 2  # near-certain outcomes get the minimum
    assert plan.weights == [4 / n for n in plan.counts]
    cur.allocator = "sqrt"
    counts = cur.plan(_batch([0, 1, 2, 3])).counts
    assert sum(counts) == 16 and counts[1] > counts[0]


def test_state_round_trip_through_a_checkpoint_is_exact(tmp_path):
    def drive(cur, steps, rng):
        out = []
        for _ in range(steps):
            drawn = rng.integers(0, 30, 8).tolist()
            picked = cur.choose(drawn, [{"difficulty": d % 3} for d in drawn], 4)
            indices = [drawn[k] for k in picked]
            plan = cur.plan(_batch(indices))
            prompt = np.repeat(np.arange(4), plan.counts).tolist()
            correct = (rng.random(len(prompt)) < 0.4).astype(float).tolist()
            cur.observe_global(plan, GlobalRows(prompt, correct, [0.0] * len(prompt),
                                                [0.0] * len(prompt)))  # fmt: skip
            out.append((indices, plan.counts))
        return out

    a = selecting(num_generations=4, seed=3)
    drive(a, 5, np.random.default_rng(0))
    torch.save(ckpt.plain(a.state_dict()), tmp_path / "s.pt")
    b = selecting(num_generations=4, seed=99)
    b.load_state_dict(torch.load(tmp_path / "s.pt", weights_only=True))
    assert b.state_dict() == a.state_dict()
    assert drive(a, 5, np.random.default_rng(1)) == drive(b, 5, np.random.default_rng(1))
    assert b.state_dict() == a.state_dict()


def test_sampler_draws_candidates_and_the_curriculum_chooses(tokenizer):
    from groupwise.curriculum.base import PromptBatches
    from groupwise.runtime.distributed import DistributedContext

    rows = [{"prompt": f"question {i}", "difficulty": i % 2} for i in range(12)]
    cur = selecting(num_generations=4, select_oversample=3)
    batches = PromptBatches(rows, tokenizer, 2, 32, 0, DistributedContext())
    batch = batches.next(cur)
    assert len(batch.indices) == 2 and len(batch.skipped) == 4 and len(batch.prompt_ids) == 2
    assert not set(batch.indices) & set(batch.skipped)
    assert len(batches.sampler.order) == 12 - 6  # six candidates consumed
    assert [r["prompt"] for r in batch.rows] == [f"question {i}" for i in batch.indices]
    plain = PromptBatches(rows, tokenizer, 2, 32, 0, DistributedContext()).next()
    assert plain.skipped == [] and len(plain.indices) == 2


def test_sampler_never_draws_a_prompt_twice_across_an_epoch_boundary():
    from groupwise.curriculum.base import PromptSampler, defer

    assert defer([4, 0, 3, 1, 2], [3, 2]) == [4, 0, 1, 3, 2]
    for size, count in ((5, 3), (7, 4), (18, 16), (6, 6)):
        sampler = PromptSampler(size, seed=0)
        draws = [sampler.take(count) for _ in range(60)]
        for draw in draws:
            assert len(set(draw)) == count, (size, count, draw)
        # Every epoch still visits every prompt exactly once.
        flat = [i for draw in draws for i in draw]
        for e in range(len(flat) // size):
            assert sorted(flat[e * size : (e + 1) * size]) == list(range(size))


def test_batches_cap_the_candidates_at_the_dataset_size(tokenizer):
    from groupwise.curriculum.base import PromptBatches
    from groupwise.runtime.distributed import DistributedContext

    rows = [{"prompt": f"question {i}"} for i in range(6)]
    cur = selecting(num_generations=4)  # best_k: 4 candidates per slot, 8 > 6 rows
    batches = PromptBatches(rows, tokenizer, 2, 32, 0, DistributedContext())
    for _ in range(10):
        batch = batches.next(cur)
        drawn = batch.indices + batch.skipped
        assert len(batch.indices) == 2 and len(drawn) == 6 and len(set(drawn)) == 6


@pytest.mark.parametrize(
    "option, value",
    [
        ("select_oversample", 0),
        ("select_rule", "sample"),
        ("select_keep", 1.5),
        ("select_keep_floor", -0.1),
        ("select_discount", 0.0),
        ("select_prior_strength", 0.0),
        ("select_retry_half_life", -1.0),
        ("select_uniform_mix", 1.5),
        ("select_allocator", "greedy"),
    ],
)
def test_config_errors_name_the_option(option, value):
    with pytest.raises(ConfigError, match=option):
        GRPOConfig(curriculum="select", **{option: value})
    with pytest.raises(ConfigError, match=option):  # the options a curriculum is built from
        select_options(**{option: value})


def test_registered_and_bounds_checked():
    assert CURRICULA["select"] is SelectCurriculum
    with pytest.raises(ConfigError, match="rollout_min"):
        GRPOConfig(curriculum="select", num_generations=4, rollout_min=5)
    cur = SelectCurriculum.from_options(GRPOConfig(curriculum="select", seed=7).to_dict())
    assert (cur.mean, cur.n_min, cur.n_max, cur.allocator) == (8, 2, 12, "knapsack")
    assert (cur.rule, cur.oversample, cur.keep, cur.keep_floor) == ("best_k", 4, 0.5, 0.01)
    legacy = GRPOConfig(curriculum="select", select_rule="legacy").to_dict()
    assert SelectCurriculum.from_options(legacy).oversample == 2
    options = GRPOConfig(curriculum="select", select_rule="legacy", select_oversample=3)
    assert SelectCurriculum.from_options(options.to_dict()).oversample == 3


# --- the ground-truth-difficulty simulation -------------------------------------------------


def _simulation():
    import importlib.util
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "curriculum_sim.py"
    spec = importlib.util.spec_from_file_location("curriculum_sim", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["curriculum_sim"] = module  # its dataclass looks its module up
    spec.loader.exec_module(module)
    return module


def test_simulation_select_beats_uniform_on_informative_groups_per_rollout():
    sim = _simulation()
    ratios = []
    for seed in (0, 1):
        uniform = sim.run_arm("uniform", seed, steps=80, regime="hard")
        select = sim.run_arm("select", seed, steps=80, regime="hard")
        for result in (uniform, select):
            # the budget, exactly, every step
            assert result.max_step_rollouts == result.min_step_rollouts == result.rollouts_per_step
        ratios.append(select.informative_per_rollout / uniform.informative_per_rollout)
    assert min(ratios) > 1.2, ratios


# --- end to end ---------------------------------------------------------------------------------


def test_training_run_with_select_trains_and_resumes_exactly(tmp_path):
    from groupwise import GRPOTrainer

    args = select_config(tmp_path / "a")
    full = GRPOTrainer("tiny-random", first_token_parity, SELECT_ROWS, args=args)
    full.train()
    logs = full.log_history
    for log in logs:  # 3 prompts x 4 rollouts every step, 3 candidates skipped
        assert log["curriculum/select/rollouts"] == 12 and log["curriculum/select/skipped"] == 3
        assert log["curriculum/select/group_size_mean"] == 4
        # best_k: the chosen are the best candidates by predicted informativeness
        assert (log["curriculum/select/predicted_informative_chosen"]
                >= log["curriculum/select/predicted_informative_skipped"])  # fmt: skip
    assert len(full.curriculum.evidence) >= 6 and full.curriculum.step == 3
    # Resume from the full run's checkpoint-2 (written mid-run) into a new folder.
    start = str(tmp_path / "a" / "run" / "checkpoint-2")
    args = select_config(tmp_path / "b", resume_from_checkpoint=start)
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


# curriculum/select/* of the run above with select_rule legacy, recorded from the implementation
# before select_rule existed (group_size_min, _max, informative_predicted, predicted chosen and
# skipped, per step).
LEGACY_RUN = [
    (4.0, 4.0, 1.8000000000000003, 0.6000000000000001, 0.6000000000000001),
    (2.0, 5.0, 1.313415637860082, 0.4299329492455419, 0.4732800000000001),
    (2.0, 5.0, 1.7446120631519324, 0.5566159307640354, 0.436121680464676),
]


def test_training_run_with_the_legacy_rule_reproduces_the_earlier_run(tmp_path):
    from groupwise import GRPOTrainer

    args = select_config(tmp_path, select_rule="legacy", save_steps=100)
    trainer = GRPOTrainer("tiny-random", first_token_parity, SELECT_ROWS, args=args)
    keys = ("group_size_min", "group_size_max", "informative_predicted",
            "predicted_informative_chosen", "predicted_informative_skipped")  # fmt: skip
    trainer.train()
    got = [tuple(log[f"curriculum/select/{k}"] for k in keys) for log in trainer.log_history]
    assert got == LEGACY_RUN
    assert sorted(trainer.curriculum.evidence.items()) == [
        (1, [2.4, 1.0]), (2, [3.4, 5.1]), (4, [4.0, 0.0]), (7, [4.0, 0.0]), (8, [1.0, 3.0]),
        (11, [5.1, 3.4]),
    ]  # fmt: skip


def test_report_plots_what_select_skipped_and_how_it_sized_groups(tmp_path):
    from groupwise.report import RunData, plot_groups, render_group

    keys = ("skipped", "informative_predicted", "informative", "group_size_max",
            "group_size_mean", "group_size_min")  # fmt: skip
    rows = [
        {
            "step": s,
            "reward": 0.5,
            **{f"curriculum/select/{k}": float(s + j) for j, k in enumerate(keys)},
        }  # fmt: skip
        for s in range(1, 6)
    ]
    groups = {g.id: g for g in plot_groups(RunData(tmp_path, rows, []))}
    select = groups["curriculum_select"]
    assert [len(p.lines) for p in select.panels] == [3, 3]
    assert render_group(RunData(tmp_path, rows, []), select).startswith(b"\x89PNG")
    plain = [{"step": s, "reward": 0.5} for s in range(1, 6)]
    assert "curriculum_select" not in {g.id for g in plot_groups(RunData(tmp_path, plain, []))}


def test_two_ranks_choose_plan_and_learn_identically(tokenizer):
    """Each rank draws the same candidates, chooses and plans the same global batch from the
    same state, keeps its own share, and observes the same global rows."""
    from groupwise.curriculum.base import PromptBatches
    from groupwise.runtime.distributed import DistributedContext

    rows = [{"prompt": f"question {i}", "difficulty": i % 3} for i in range(40)]
    ranks = [DistributedContext(rank=r, world_size=2) for r in (0, 1)]
    curricula = [selecting(num_generations=4, seed=5) for _ in ranks]
    samplers = [PromptBatches(rows, tokenizer, 3, 32, 0, d) for d in ranks]
    rng = np.random.default_rng(0)
    for _ in range(6):
        batches = [s.next(c) for s, c in zip(samplers, curricula, strict=True)]
        plans = [c.plan(b) for c, b in zip(curricula, batches, strict=True)]
        assert batches[0].indices == batches[1].indices and len(batches[0].indices) == 6
        assert batches[0].skipped == batches[1].skipped
        assert batches[0].mine != batches[1].mine
        assert plans[0].counts == plans[1].counts and sum(plans[0].counts) == 24
        prompt = np.repeat(np.arange(6), plans[0].counts).tolist()
        correct = (rng.random(len(prompt)) < 0.3).astype(float).tolist()
        global_rows = GlobalRows(prompt, correct, [0.0] * len(prompt), [0.0] * len(prompt))
        logs = [c.observe_global(p, global_rows) for c, p in zip(curricula, plans, strict=True)]
        assert logs[0] == logs[1]
    assert curricula[0].state_dict() == curricula[1].state_dict()


def test_equal_prompt_weighting_is_not_applied_twice():
    from groupwise.config.grpo_config import GRPOConfig
    from groupwise.errors import ConfigError

    with pytest.raises(ConfigError, match="prompt_weighting=equal with curriculum=select"):
        GRPOConfig(curriculum="select", prompt_weighting="equal")
    assert GRPOConfig(curriculum="select", prompt_weighting="equal",
                      select_equal_prompt_weight=False).prompt_weighting == "equal"  # fmt: skip
