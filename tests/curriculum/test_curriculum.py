import itertools
import math

import numpy as np
import pytest

from conftest import gdro_options
from groupwise.curriculum import (
    DifficultyClassifier,
    PromptGDRO,
    RolloutGDRO,
    bin_of,
    default_edges,
    exact_budget_arms,
    lead_lag,
    sqrt_allocation,
    weighted_standard_error,
)
from groupwise.errors import ConfigError


def opts(**overrides):
    """The GDRO options of these tests: a mean budget of 4 and seed 0 unless given (the values
    the expectations below were worked out with), else GRPOConfig's defaults."""
    return gdro_options(**{"num_generations": 4, "seed": 0, **overrides})


def test_edges_and_bins():
    assert default_edges(4) == [0.25, 0.5, 0.75]
    # bin i = [a_{i-1}, a_i): 0.25 is already in bin 1, 1.0 in the last bin.
    assert [bin_of(a, [0.25, 0.5, 0.75]) for a in (0.0, 0.249, 0.25, 0.6, 1.0)] == [0, 0, 1, 2, 3]


def test_classifier_window_and_unseen_prompts():
    clf = DifficultyClassifier(opts(gdro_num_bins=10, gdro_window=3, gdro_unseen="hardest"))
    assert clf.classify(["a", "b"]) == [0, 0]  # unseen: accuracy 0, hardest bin
    clf.update(["a"], [True])
    clf.update(["a"], [True])
    clf.update(["a"], [False])
    assert clf.accuracy("a") == pytest.approx(2 / 3)
    assert clf.classify(["a"]) == [6]  # 0.667 in [0.6, 0.7)
    clf.update(["a"], [False])  # window 3: [1, 0, 0] -> 1/3
    assert clf.classify(["a", "b"]) == [3, 0]


def test_classifier_hysteresis_up_and_down():
    clf = DifficultyClassifier(
        opts(gdro_bin_edges=[0.4, 0.75], gdro_window=0, gdro_hysteresis=0.05, gdro_unseen="hardest")
    )
    history = {"x": []}

    def step(outcomes):
        clf.history.pop("x", None)
        history["x"] = outcomes
        clf.update(["x"] * len(outcomes), outcomes)
        return clf.classify(["x"])[0]

    assert step([0, 0, 0, 0, 0]) == 0  # acc 0
    # acc 0.42: raw bin 1, but 0.42 < 0.4 + 0.05 -> stays in bin 0
    assert step([1] * 21 + [0] * 29) == 0
    assert step([1] * 25 + [0] * 25) == 1  # acc 0.5 >= 0.45 -> moves up
    # acc 0.38: raw bin 0, but 0.38 > 0.4 - 0.05 -> stays in bin 1
    assert step([1] * 19 + [0] * 31) == 1
    assert step([1] * 3 + [0] * 7) == 0  # acc 0.3 <= 0.35 -> moves down
    assert step([1] * 8 + [0] * 2) == 2  # acc 0.8: up two bins past 0.4 + 0.05


def test_classifier_state_round_trip():
    options = opts(gdro_num_bins=5, gdro_window=2, gdro_unseen="hardest")
    clf = DifficultyClassifier(options)
    clf.update(["a", "b"], [True, False])
    clf.classify(["a", "b"])
    other = DifficultyClassifier(options)
    other.load_state_dict(clf.state_dict())
    other.update(["a"], [True])
    other.update(["a"], [False])
    assert other.accuracy("a") == 0.5  # window of 2 preserved
    assert other.last_bin == clf.last_bin


def test_per_response_loss_on_policy_is_minus_advantage():
    # The adversary's signal is the loss variant's per-sequence policy term (groupwise.algo).
    import torch

    from groupwise.algo.grpo import sequence_surrogate

    logp = torch.tensor([[-1.0, -2.0, 0.0], [-0.5, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    loss = sequence_surrogate(logp, logp, torch.tensor([0.5, -2.0]), mask)
    assert loss.tolist() == [-0.5, 2.0]
    # ratio e^0.5 = 1.6487 > 1.2 with A = 1: max(-1.6487, -1.2) = -1.2 per token.
    one = torch.tensor([[1]])
    clipped = sequence_surrogate(torch.tensor([[0.5]]), torch.tensor([[0.0]]), torch.ones(1), one)
    assert float(clipped[0]) == pytest.approx(-1.2)
    # DAPO clip-higher: the upper bound is 1 + epsilon_high.
    higher = sequence_surrogate(
        torch.tensor([[0.5]]), torch.tensor([[0.0]]), torch.ones(1), one, epsilon_high=0.28
    )
    assert float(higher[0]) == pytest.approx(-1.28)


def test_prompt_gdro_ema_and_weights_by_hand():
    options = opts(gdro_eta=1.0, gdro_gamma=0.0, gdro_ema_beta=0.5, gdro_share_normalize=False)
    gdro = PromptGDRO(3, options)
    gdro.update([0, 0, 1], [1.0, 3.0, 2.0])
    assert gdro.scores == [2.0, 2.0, None]  # first observation sets S
    gdro.update([0], [4.0])
    assert gdro.scores[0] == 3.0  # 0.5 * 2 + 0.5 * 4
    # softmax([3, 2, 0]) = [e^3, e^2, 1] / 28.4746 = [0.70538, 0.25950, 0.03512]
    np.testing.assert_allclose(gdro.bin_weights(), [0.705385, 0.259496, 0.035119], atol=1e-6)
    # two samples in bins 0 and 1, renormalised to mean 1: 2 * q / (q0 + q1)
    np.testing.assert_allclose(gdro.sample_weights([0, 1]), [1.462117, 0.537883], atol=1e-5)
    assert gdro.sample_weights([2, 2, 2]).tolist() == [1.0, 1.0, 1.0]


def test_prompt_gdro_share_normalisation_gamma_and_cap():
    gdro = PromptGDRO(2, opts(gdro_eta=1.0, gdro_gamma=0.0, gdro_ema_beta=1.0))
    gdro.update([0, 0, 1], [1.0, 3.0, 2.0])
    # bin 0: mean 2 / share 2/3 = 3; bin 1: mean 2 / share 1/3 = 6
    assert gdro.scores == [pytest.approx(3.0), pytest.approx(6.0)]
    mixed = PromptGDRO(4, opts(gdro_eta=0.0, gdro_gamma=0.5))
    np.testing.assert_allclose(mixed.bin_weights(), [0.25] * 4)  # eta 0: uniform
    capped = PromptGDRO(
        2, opts(gdro_eta=50.0, gdro_gamma=0.0, gdro_weight_cap=1.5, gdro_ema_beta=1.0)
    )
    capped.update([1], [1.0])
    w = capped.sample_weights([1, 0, 0, 0])
    assert w[0] == 1.5 and w[1] < 1e-6  # bin 1 dominates; cap at 1.5
    clipped = PromptGDRO(2, opts(gdro_eta=1.0, gdro_gamma=0.0, gdro_clip=1.0, gdro_ema_beta=1.0))
    clipped.update([0, 1], [100.0, -100.0])
    # clip(S) = [1, -1] -> softmax = [e, 1/e] / (e + 1/e) = [0.880797, 0.119203]
    np.testing.assert_allclose(clipped.bin_weights(), [0.880797, 0.119203], atol=1e-6)


def test_both_adversaries_mix_the_same_exponential_weights_with_gamma():
    # softmax([0, ln 2]) = [1/3, 2/3]; with gamma 0.1: 0.9 * [1/3, 2/3] + 0.1 / 2 = [0.35, 0.65]
    options = opts(gdro_eta=1.0, gdro_gamma=0.1, gdro_ema_beta=1.0, gdro_share_normalize=False)
    prompts = PromptGDRO(2, options)
    prompts.update([0, 1], [0.0, math.log(2.0)])
    np.testing.assert_allclose(prompts.bin_weights(), [0.35, 0.65], atol=1e-12)
    arms = RolloutGDRO(1, opts(gdro_eta=1.0, gdro_gamma=0.1, rollout_max=3, num_generations=2.5))
    arms.scores[0] = [0.0, math.log(2.0)]
    np.testing.assert_allclose(arms.arm_probs(0), [0.35, 0.65], atol=1e-12)


def test_sqrt_allocation_matches_closed_form():
    # v = [0.25, 0.0625] -> sqrt [0.5, 0.25]; q = [0.5, 0.5]; sum q sqrt v = 0.375
    # n_0 = 3 * 0.5 / 0.375 = 4, n_1 = 3 * 0.25 / 0.375 = 2
    assert sqrt_allocation([0, 0, 1, 1], [0.25, 0.0625], 3, 1, 12) == [4, 4, 2, 2]
    # sqrt v = [0.3, 0.1], q = [1/3, 2/3]: n_0 = 4 * 0.3 / (0.5 / 3) = 7.2, n_1 = 2.4;
    # floors 7 + 2 + 2 = 11, the one spare unit goes to the largest fraction (0.4, first prompt).
    assert sqrt_allocation([0, 1, 1], [0.09, 0.01], 4, 1, 12) == [7, 3, 2]


def test_sqrt_allocation_bounds_and_exact_total():
    # n_min 3 binds bin 1 (closed form 2); the rest of the budget goes to bin 0.
    assert sqrt_allocation([0, 0, 1, 1], [0.25, 0.0625], 3, 3, 12) == [3, 3, 3, 3]
    assert sqrt_allocation([0, 0, 1, 1], [0.25, 0.0], 4, 2, 5) == [5, 5, 3, 3]
    assert sqrt_allocation([0, 1, 2], [0.0, 0.0, 0.0], 4, 2, 12) == [4, 4, 4]  # uniform
    # bin 1 saturates at n_max = 5; the zero-variance bin takes the rest: 16 - 10 = 6 -> 3 + 3
    assert sqrt_allocation([0, 0, 1, 1], [0.0, 0.25], 4, 2, 5) == [3, 3, 5, 5]
    rng = np.random.default_rng(0)
    for _ in range(200):
        bins = rng.integers(0, 5, size=int(rng.integers(1, 30))).tolist()
        variances = (rng.random(5) * rng.integers(0, 2, size=5)).tolist()
        budget = float(rng.integers(2, 9))
        n = sqrt_allocation(bins, variances, budget, 2, 12)
        assert sum(n) == round(len(bins) * budget)
        assert min(n) >= 2 and max(n) <= 12
        for b in set(bins):
            members = [n[i] for i in range(len(bins)) if bins[i] == b]
            assert max(members) - min(members) <= 1


def test_exact_budget_dp_matches_brute_force():
    rng = np.random.default_rng(1)
    arms = [2, 3, 4, 5, 6]
    for _ in range(30):
        counts = {0: int(rng.integers(1, 4)), 3: int(rng.integers(1, 4)), 7: 1}
        log_p = {b: np.log(rng.dirichlet(np.ones(len(arms)))) for b in counts}
        total = 4 * sum(counts.values())
        best, best_score = None, -math.inf
        for combo in itertools.product(range(len(arms)), repeat=3):
            chosen = dict(zip(counts, (arms[k] for k in combo), strict=True))
            if sum(counts[b] * chosen[b] for b in counts) != total:
                continue
            score = sum(log_p[b][k] for b, k in zip(counts, combo, strict=True))
            if score > best_score:
                best, best_score = chosen, score
        assert exact_budget_arms(counts, log_p, arms, total) == best


def test_rollout_gdro_allocation_exact_and_mu_direction_expected_rule():
    gdro = RolloutGDRO(3, opts(rollout_mu_update="expected"))
    bins = [0, 0, 1, 2, 2, 2]
    n = gdro.allocate(bins)
    assert sum(n) == 24 and all(2 <= x <= 12 for x in n)
    # Bandits that prefer many rollouts push the pre-rounding mean above the budget: mu rises.
    gdro.scores[:, -1] = 10.0
    assert gdro.expected_mean(bins) > 4
    gdro.update(bins, n, [0.1] * 6)
    assert gdro.mu > 0
    cheap = RolloutGDRO(3, opts(rollout_mu_update="expected"))
    cheap.scores[:, 0] = 10.0  # prefer 2 rollouts: mean below budget, mu falls
    cheap.update(bins, cheap.allocate(bins), [0.1] * 6)
    assert cheap.mu < 0


def test_rollout_gdro_update_uses_paper_sign():
    options = opts(rollout_max=4, num_generations=3, rollout_score_decay=1.0, rollout_dual_lr=0.0)
    gdro = RolloutGDRO(1, options)
    gdro.mu = 0.5
    gdro.update([0, 0], [2, 2], [1.0, 3.0])
    # J = -mean loss = -2; reward of arm 2 = J - mu * 2 = -3 (eq. 20: higher loss, lower score)
    assert gdro.scores[0].tolist() == [-3.0, 0.0, 0.0]


def test_diagnostics_by_hand():
    # WSE = 0.5 * 0.4 / sqrt(4) + 0.5 * 0.2 / sqrt(1) = 0.1 + 0.1
    assert weighted_standard_error([0.5, 0.5], [0.4, 0.2], [4, 1]) == pytest.approx(0.2)
    mu_data, mu_weight, delta = lead_lag([0.5, 0.5, 0.0], [0.0, 1.0, 1.0])
    assert (mu_data, mu_weight, delta) == (0.5, 1.5, 1.0)


def _parity(prompts, completions, completion_ids, **kwargs):
    # Deterministic, prompt-dependent signal: about half the sampled first tokens are even.
    return [1.0 if ids[0] % 2 == 0 else 0.0 for ids in completion_ids]


def _parity_but_prompt_0(prompts, completions, completion_ids, **kwargs):
    # Prompt 0 is always solved (p = 1, no variance), the others as _parity.
    parity = _parity(prompts, completions, completion_ids)
    return [1.0 if "number 0" in str(p) else r for p, r in zip(prompts, parity, strict=True)]


@pytest.mark.parametrize(
    "mode, allocator, variance_prior",
    [("prompt_gdro", "sqrt", 2.0), ("rollout_gdro", "bandit", 2.0), ("rollout_gdro", "sqrt", 0.0)],
)
def test_short_training_run_with_each_curriculum(tmp_path, mode, allocator, variance_prior):
    from groupwise import GRPOConfig, GRPOTrainer

    rows = [{"prompt": f"Say something number {i}"} for i in range(4)]
    args = GRPOConfig(
        model="tiny-random",
        max_steps=5,
        logging_steps=1,  # every step's budget is checked
        beta=0.0,
        loss_type="grpo",
        lr_scheduler_type="constant",
        gradient_checkpointing=False,
        learning_rate=1e-3,
        num_generations=4,
        per_device_train_batch_size=6,
        gradient_accumulation_steps=2,  # 3 prompts x 4 rollouts = 12 per step
        max_completion_length=3,
        curriculum=mode,
        rollout_allocator=allocator,
        # No shrinkage, so the always-solved prompt 0 gets v = 0 and n_min (3 prompts x 4
        # rollouts of parity rewards alone give variances too close to move a rollout).
        rollout_variance_prior=variance_prior,
        gdro_num_bins=4,
        rollout_min=2,
        rollout_max=8,
        output_dir=str(tmp_path / "run"),
        disable_tqdm=True,
        seed=0,
    )
    reward = _parity_but_prompt_0 if allocator == "sqrt" else _parity
    trainer = GRPOTrainer("tiny-random", reward, rows, args=args)
    trainer.train()
    logs = trainer.log_history
    groups = [*range(4), "unseen"]  # four bins and the unseen state (gdro_unseen's default)
    assert logs[0]["curriculum/prompts_bin_unseen"] == 3  # step 1: every prompt is new
    for log in logs:
        rollouts = sum(log[f"curriculum/rollouts_bin_{b}"] for b in groups)
        prompts = sum(log[f"curriculum/prompts_bin_{b}"] for b in groups)
        assert rollouts == 12 and prompts == 3  # the budget is exact every step
        for key in (
            "curriculum/wse",
            "curriculum/wse_uniform",
            "curriculum/wse_heldout",
            "curriculum/var_proxy",
            "curriculum/var_proxy_uniform",
            "curriculum/mu",
            "curriculum/lead_lag",
        ):
            assert math.isfinite(log[key]), key
    assert trainer.curriculum.classifier.history  # outcomes were recorded
    if mode == "rollout_gdro":
        # Prompts seen before leave the hardest bin, so allocations differ from uniform at
        # some step (groups of different sizes went through generation and the loss).
        sizes = [
            sorted(
                log[f"curriculum/rollouts_bin_{b}"] / max(log[f"curriculum/prompts_bin_{b}"], 1)
                for b in groups
                if log[f"curriculum/prompts_bin_{b}"]
            )
            for log in logs
        ]
        assert any(s != [4.0] * len(s) for s in sizes), sizes
    else:
        assert any(log["curriculum/weight_bin_0"] != 0.2 for log in logs[1:])


def _plan(bins, counts):
    from groupwise.curriculum import Plan, PromptBatch

    batch = PromptBatch(["a", "b"], slice(0, 2), [{}, {}], [[1], [1]])
    return Plan(batch, counts, [1.0] * len(counts), bins)


def test_prompt_signal_pg_loss_is_flat_on_policy_and_failure_rate_is_not():
    from groupwise.curriculum import GlobalRows, PromptGDROCurriculum

    # Two prompts in bins 0 and 2, two rollouts each; prompt 0 fails, prompt 1 succeeds.
    row_prompt, correct = [0, 0, 1, 1], [0.0, 0.0, 1.0, 1.0]
    advantages = [0.7, -0.7, 0.7, -0.7]  # on-policy: the pg signal is -A, summing to 0 per group
    kwargs = {"curriculum": "prompt_gdro", "gdro_eta": 1.0, "gdro_gamma": 0.0}
    flat = PromptGDROCurriculum(opts(gdro_num_bins=3, gdro_unseen="hardest", **kwargs))
    rows = GlobalRows(row_prompt, correct, [-a for a in advantages], [0.0, 0.0, 1.0, 1.0])
    flat.observe_global(_plan([0, 2], [2, 2]), rows)
    assert flat.prompt_gdro.scores == [0.0, None, 0.0]
    assert flat.prompt_weights([0, 2], [2, 2]) == [1.0, 1.0]
    hard = PromptGDROCurriculum(
        opts(
            gdro_num_bins=3,
            gdro_unseen="hardest",
            gdro_signal="failure_rate",
            gdro_share_normalize=False,
            **kwargs,
        )
    )
    hard.observe_global(_plan([0, 2], [2, 2]), GlobalRows(row_prompt, correct, [0.0] * 4,
                                                          [0.0, 0.0, 1.0, 1.0]))  # fmt: skip
    # bin 0: failure rate 1; bin 2: 0. softmax([1, 0, 0]) -> q = [e, 1, 1] / (e + 2)
    assert hard.prompt_gdro.scores == [1.0, None, 0.0]
    w = np.repeat(hard.prompt_weights([0, 2], [2, 2]), 2)
    # per-sample q = [0.5761, 0.5761, 0.2119, 0.2119] -> mean-1 weights 2 q / (q_0 + q_2):
    # 2 e / (e + 1) = 1.462117 and 2 / (e + 1) = 0.537883
    np.testing.assert_allclose(w, [1.462117, 1.462117, 0.537883, 0.537883], atol=1e-5)
    # With share normalisation the same signal is refused by the options (rarity, not
    # difficulty); the message names both options.
    with pytest.raises(ConfigError, match="gdro_share_normalize: false.*gdro_signal: pg_loss"):
        opts(gdro_num_bins=3, gdro_signal="failure_rate", **kwargs)


# ----------------------------------------------------------------------------------------------
# The classifier, the unseen state, the rollout allocators, mu and the diagnostics


def _rows(per_prompt):
    """GlobalRows from [(rollouts, correct), ...] per prompt (loss 0, reward = correct)."""
    from groupwise.curriculum import GlobalRows

    prompt, correct = [], []
    for i, (n, c) in enumerate(per_prompt):
        prompt += [i] * n
        correct += [1.0] * c + [0.0] * (n - c)
    return GlobalRows(prompt, correct, [0.0] * len(prompt), list(correct))


def _plan_for(uids, bins, counts):
    from groupwise.curriculum import Plan, PromptBatch

    n = len(uids)
    batch = PromptBatch(list(uids), slice(0, n), [{}] * n, [[1]] * n)
    return Plan(batch, list(counts), [1.0] * n, list(bins))


def _step(cur, uids, per_prompt):
    """One step of a curriculum: plan, then observe with the given (rollouts, correct) per prompt
    (the rollout counts of the rows, not the plan's, so a test controls them)."""
    plan = cur.plan(_plan_for(uids, [0] * len(uids), [1] * len(uids)).batch)
    plan.counts = [n for n, _ in per_prompt]
    return plan, cur.observe_global(plan, _rows(per_prompt))


def test_classifier_uses_per_rollout_fraction_not_pass_at_n():
    from groupwise.curriculum import RolloutGDROCurriculum

    # Three prompts with per-rollout success 0.25, 0.25 and 1/12, given 8, 4 and 12 rollouts.
    outcome = [(8, 2), (4, 1), (12, 1)]
    new = RolloutGDROCurriculum(opts(gdro_num_bins=10))
    _step(new, ["a", "b", "c"], outcome)
    # 0.25 -> bin 2 ([0.2, 0.3)) for both, whatever their rollout count; 0.0833 -> bin 0.
    assert new.classifier.classify(["a", "b", "c"]) == [2, 2, 0]
    assert new.classifier.counts("a") == (2, 8)
    # The paper's c(x) (pass@n_b): every prompt had a success, so all look easiest (bin 9),
    # including the 1-in-12 prompt that got the most rollouts.
    old = RolloutGDROCurriculum(opts(gdro_num_bins=10, gdro_classifier_signal="any_correct"))
    _step(old, ["a", "b", "c"], outcome)
    assert old.classifier.classify(["a", "b", "c"]) == [9, 9, 9]


def test_classifier_unseen_state_and_hardest_mode():
    clf = DifficultyClassifier(opts(gdro_num_bins=4, gdro_unseen="unseen", gdro_hysteresis=0.1))
    assert clf.num_states == 5 and clf.unseen_state == 4
    assert clf.classify(["a", "b"]) == [4, 4]  # never observed: their own state
    assert clf.last_bin == {}  # hysteresis starts at the first real bin
    clf.update(["a"], [3], [4])  # 0.75 -> bin 3, no hysteresis against the unseen state
    assert clf.classify(["a", "b"]) == [3, 4]
    paper = DifficultyClassifier(opts(gdro_num_bins=4, gdro_unseen="hardest"))
    assert paper.num_states == 4 and paper.classify(["a"]) == [0]  # accuracy 0: bin 0
    with pytest.raises(ConfigError, match="gdro_unseen='prior' is not one of"):
        opts(gdro_unseen="prior")
    with pytest.raises(ValueError, match="3 successes out of 2"):
        clf.update(["a"], [3], [2])


def test_classifier_window_zero_is_all_history_and_old_checkpoints_load():
    clf = DifficultyClassifier(opts(gdro_num_bins=10, gdro_window=0, gdro_unseen="hardest"))
    for i in range(100):  # 100 appearances: a window would forget the first ones
        clf.update(["a"], [1 if i < 30 else 0], [1])
    assert clf.accuracy("a") == pytest.approx(0.3)
    windowed = DifficultyClassifier(opts(gdro_num_bins=10, gdro_window=50, gdro_unseen="hardest"))
    for i in range(100):
        windowed.update(["a"], [1 if i < 30 else 0], [1])
    assert windowed.accuracy("a") == 0.0  # the last 50 appearances all failed
    # Checkpoints before the (successes, rollouts) pairs kept one c(x) per appearance.
    legacy = DifficultyClassifier(opts(gdro_num_bins=10, gdro_window=3, gdro_unseen="hardest"))
    legacy.load_state_dict({"history": {"a": [1, 0, 1, 1]}, "last_bin": {"a": 6}})
    assert legacy.counts("a") == (2, 3) and legacy.last_bin == {"a": 6}


def test_window_zero_keeps_all_history_for_the_bin_rates():
    from groupwise.curriculum import RolloutGDROCurriculum

    def bin_zero_rate(window):
        cur = RolloutGDROCurriculum(
            opts(
                gdro_num_bins=4,
                gdro_window=window,
                gdro_unseen="hardest",
                rollout_variance="bin",
                rollout_allocator="sqrt",
            )
        )
        # New prompts every step, so every prompt is in bin 0 (unseen -> hardest).
        for uid, correct in (("a", 4), ("b", 0), ("c", 0)):
            _step(cur, [uid], [(4, correct)])
        return cur._bin_success_rate(0)

    assert bin_zero_rate(0) == pytest.approx(4 / 12)  # all history (was: the last step only)
    assert bin_zero_rate(1) == 0.0  # window 1: the last step
    assert bin_zero_rate(2) == 0.0


def test_shrunk_rate_variance_proxy_and_best_response_by_hand():
    from groupwise.curriculum import best_response_arm, shrunk_rate, variance_proxy

    assert shrunk_rate(1, 4, 0.5, 2) == pytest.approx(2 / 6)  # (1 + 2 * 0.5) / (4 + 2)
    assert shrunk_rate(0, 0, 0.3, 0) == 0.3  # nothing observed, no prior weight: the prior
    assert shrunk_rate(3, 4, 0.5, 0) == 0.75
    # VarProxy = 0.5 * 0.25 / 4 + 0.5 * 0.09 / 1 = 0.03125 + 0.045
    assert variance_proxy([0.5, 0.5], [0.25, 0.09], [4, 1]) == pytest.approx(0.07625)
    # The square-root law minimises it: v = [0.25, 0.0625], q = 1/2, n_bar = 3 -> n = [4, 2]:
    # 0.5 * 0.25 / 4 + 0.5 * 0.0625 / 2 = 0.046875 < uniform 0.5 * 0.3125 / 3 = 0.0520833
    n = sqrt_allocation([0, 1], [0.25, 0.0625], 3, 1, 12)
    assert n == [4, 2]
    assert variance_proxy([0.5, 0.5], [0.25, 0.0625], n) == pytest.approx(0.046875)
    assert variance_proxy([0.5, 0.5], [0.25, 0.0625], [3, 3]) == pytest.approx(0.3125 / 6)
    # Best response: J = [unplayed -> mean -0.75, -1, -0.5] on arms [2, 3, 4].
    # mu 0.1: L = 0.75 + 0.2, 1 + 0.3, 0.5 + 0.4 = [0.95, 1.3, 0.9] -> 4
    # mu 0.3: L = [1.35, 1.9, 1.7] -> 2
    j = [math.nan, -1.0, -0.5]
    assert best_response_arm(j, [2, 3, 4], 0.1, 3) == 4
    assert best_response_arm(j, [2, 3, 4], 0.3, 3) == 2
    # No information: every arm ties; the budget wins, then the smaller of two equally near.
    assert best_response_arm([math.nan] * 3, [2, 3, 4], 0.0, 3) == 3
    assert best_response_arm([0.0] * 4, [2, 3, 4, 5], 0.0, 3.5) == 3
    assert best_response_arm([0.0] * 3, [2, 3, 4], 0.2, 3) == 2  # priced: the cheapest


def test_sample_exact_budget_arms_by_hand_and_against_brute_force():
    from groupwise.curriculum import sample_exact_budget_arms

    # Two bins of one prompt, arms [1, 2, 3], total 4: (1, 3), (2, 2), (3, 1) with weights
    # 0.2 * 0.2 = 0.04, 0.3 * 0.3 = 0.09, 0.5 * 0.5 = 0.25 (sum 0.38). Bin 1 is drawn first, by
    # inverse CDF over its arms [1, 2, 3]: [0.25, 0.09, 0.04] / 0.38 -> CDF [0.658, 0.895, 1].
    counts = {0: 1, 1: 1}
    log_p = {0: np.log([0.2, 0.3, 0.5]), 1: np.log([0.5, 0.3, 0.2])}
    assert sample_exact_budget_arms(counts, log_p, [1, 2, 3], 4, [0.0, 0.5]) == {0: 3, 1: 1}
    assert sample_exact_budget_arms(counts, log_p, [1, 2, 3], 4, [0.0, 0.7]) == {0: 2, 1: 2}
    assert sample_exact_budget_arms(counts, log_p, [1, 2, 3], 4, [0.0, 0.95]) == {0: 1, 1: 3}
    # Frequencies match the conditional distribution of the brute force.
    rng = np.random.default_rng(3)
    arms = [2, 3, 4, 5]
    counts = {0: 2, 4: 1, 7: 1}
    log_p = {b: np.log(rng.dirichlet(np.ones(len(arms)))) for b in counts}
    total = 4 * sum(counts.values())
    exact = {}
    for combo in itertools.product(range(len(arms)), repeat=3):
        chosen = tuple(arms[k] for k in combo)
        if sum(c * a for c, a in zip(counts.values(), chosen, strict=True)) == total:
            exact[chosen] = math.exp(sum(log_p[b][k] for b, k in zip(counts, combo, strict=True)))
    norm = sum(exact.values())
    draws = 4000
    seen: dict[tuple, int] = {}
    for u in rng.random((draws, 3)):
        key = tuple(sample_exact_budget_arms(counts, log_p, arms, total, u.tolist()).values())
        assert key in exact  # always exactly on budget
        seen[key] = seen.get(key, 0) + 1
    for key, weight in exact.items():
        assert seen.get(key, 0) / draws == pytest.approx(weight / norm, abs=0.03), key


def test_rollout_gdro_mu_does_not_drift_without_information():
    bins = [0, 0, 1, 2, 2, 2]

    def run(mu_update, steps=200, mu=0.0, loss=0.0):
        gdro = RolloutGDRO(3, opts(rollout_mu_update=mu_update))
        gdro.mu = mu
        path = []
        for _ in range(steps):  # the same loss for every arm: the arms carry no information
            gdro.update(bins, gdro.allocate(bins), [loss] * len(bins))
            path.append(gdro.mu)
        return np.asarray(path)

    assert (run("best_response") == 0.0).all()  # the best response is the budget: mu stays
    assert (run("best_response", loss=0.3) == 0.0).all()  # identical non-zero signals too
    assert (run("realized") == 0.0).all()  # eq. 21 under the exact budget: frozen at 0
    # The earlier rule steps on the flat bandits' mean arm, 7 > 4: +0.15 at the first step, and
    # it keeps rising.
    drift = run("expected")
    assert drift[0] == pytest.approx(0.05 * (7 - 4)) and drift[-1] > 2.0
    # Started away from 0, the best response walks mu back (n_min = 2 at mu > 0: -0.1 a step)
    # and then stays in the band the constant step allows, here [-0.05 * 2, 0.05 * 8].
    back = run("best_response", mu=1.0)
    assert back[0] == pytest.approx(0.9) and back[4] == pytest.approx(0.5)
    assert (back[20:] >= -0.1 - 1e-9).all() and (back[20:] <= 0.4 + 1e-9).all()


def test_rollout_gdro_best_response_clears_the_budget_with_information():
    # Bin 0's J rises with n (more rollouts help), bin 1's is flat: the best response puts bin 0
    # high and mu settles where the budget clears, instead of drifting.
    gdro = RolloutGDRO(2, opts(rollout_max=6, rollout_dual_lr=0.01))
    gdro.j_hat[0] = [-1.0, -0.6, -0.4, -0.3, -0.25]  # arms 2..6
    gdro.j_hat[1] = [-0.5] * 5
    bins = [0, 1]
    for _ in range(400):
        n_hat = gdro.best_response_mean(bins)
        gdro.mu += gdro.dual_lr * (n_hat - gdro.mean_budget)
    # At mu in (0.1, 0.2): bin 0's best arm is 4 (L = 0.4 + 4 mu vs 0.6 + 3 mu and 0.3 + 5 mu),
    # bin 1's is 2 (flat J, priced): mean 3 < 4, so mu falls below 0.1, where bin 0 takes 5
    # (mean 3.5) and at mu < 0.05, 6 (mean 4): mu hovers around 0.05.
    assert 0.0 < gdro.mu < 0.1


def test_rollout_gdro_sampling_is_seeded_and_resumes_exactly():
    import io

    import torch

    from groupwise.trainer.checkpoints import plain

    bins = [0, 0, 1, 2, 2, 2]

    def make(**kwargs):
        return RolloutGDRO(3, opts(rollout_max=8, seed=5, **kwargs))

    def advance(gdro, steps, losses=(0.3, -0.1, 0.2, 0.0, 0.5, -0.2)):
        out = []
        for _ in range(steps):
            n = gdro.allocate(bins)
            assert sum(n) == 24 and min(n) >= 2 and max(n) <= 8
            gdro.update(bins, n, list(losses))
            out.append(n)
        return out

    straight = make()
    full = advance(straight, 8)
    first = make()
    head = advance(first, 3)
    buffer = io.BytesIO()
    torch.save(plain(first.state_dict()), buffer)  # as Trainer.state_dict saves it
    buffer.seek(0)
    resumed = make()
    resumed.generator.manual_seed(123)  # overwritten by the checkpoint
    resumed.load_state_dict(torch.load(buffer, weights_only=True))
    assert head + advance(resumed, 5) == full  # the same draws after a resume
    assert np.array_equal(resumed.j_hat, straight.j_hat, equal_nan=True)
    assert resumed.mu == straight.mu
    assert len({tuple(n) for n in full}) > 1  # sampled: not the same arms every step
    greedy = make(rollout_arm_choice="greedy", rollout_mu_update="realized")
    flat = advance(greedy, 1, losses=(0.0,) * 6)
    # Flat probabilities: the DP keeps the first path found, the smallest arm for bins 0 and 1
    # and for bin 2 (3 prompts) the arm that closes the budget: (24 - 2 * 2 - 2) / 3 = 6.
    assert flat == [[2, 2, 2, 6, 6, 6]]
    with pytest.raises(ConfigError, match="rollout_arm_choice='argmax' is not one of"):
        make(rollout_arm_choice="argmax")


def test_sqrt_allocation_per_prompt_variance_by_hand():
    from groupwise.curriculum import RolloutGDROCurriculum

    cur = RolloutGDROCurriculum(opts(gdro_num_bins=10, rollout_variance_prior=2))
    uids = ["a", "b", "c", "d"]
    plan, logs = _step(cur, uids, [(4, 4), (4, 0), (4, 2), (4, 1)])
    assert plan.bins == [10] * 4 and plan.counts == [4] * 4  # all unseen, all equal
    assert logs["curriculum/prompts_bin_unseen"] == 4
    # Step 2: bins by fraction 1, 0, 0.5, 0.25 -> 9, 0, 5, 2; those bins have no pooled rate yet,
    # so each prompt shrinks towards every group's pooled rate 7/16 with 2 pseudo-rollouts:
    # p = (4 + 0.875) / 6 = 0.8125, 0.875 / 6 = 0.14583, 2.875 / 6 = 0.47917, 1.875 / 6 = 0.3125
    # v = p (1 - p) = 0.152344, 0.124566, 0.249566, 0.214844
    # n = 16 sqrt(v) / sum sqrt(v) = 3.660, 3.309, 4.684, 4.346: floors 3, 3, 4, 4 (14), the two
    # spare units to the largest fractions (0.684 c, 0.660 a).
    p = np.array([4.875, 0.875, 2.875, 1.875]) / 6
    np.testing.assert_allclose(cur.prompt_variances(uids, [9, 0, 5, 2]), p * (1 - p))
    plan = cur.plan(_plan_for(uids, [0] * 4, [1] * 4).batch)
    assert plan.bins == [9, 0, 5, 2]
    assert plan.counts == [4, 3, 5, 4]
    # The held-out diagnostics of that step: VarProxy = mean_x v_x / n_x (eq. 28, each prompt a
    # stratum of share 1/4) = 0.045808, against 0.046332 with 4 each.
    logs = cur.observe_global(plan, _rows([(4, 4), (3, 0), (5, 2), (4, 1)]))
    assert logs["curriculum/var_proxy"] == pytest.approx(0.0458080150)
    assert logs["curriculum/var_proxy_uniform"] == pytest.approx(0.0463324653)
    expected_wse = np.mean(np.sqrt(p * (1 - p)) / np.sqrt([4, 3, 5, 4]))
    assert logs["curriculum/wse_heldout"] == pytest.approx(expected_wse)
    # The earlier per-bin variance: unobserved bins use their range midpoints 0.95, 0.05, 0.55,
    # 0.25 -> v = 0.0475, 0.0475, 0.2475, 0.1875: a different allocation.
    per_bin = RolloutGDROCurriculum(opts(gdro_num_bins=10, rollout_variance="bin"))
    _step(per_bin, uids, [(4, 4), (4, 0), (4, 2), (4, 1)])
    v = [0.0475, 0.0475, 0.2475, 0.1875]
    assert per_bin.plan(_plan_for(uids, [0] * 4, [1] * 4).batch).counts == sqrt_allocation(
        [0, 1, 2, 3], v, 4, 2, 12
    )


def test_curriculum_state_round_trip_and_identical_ranks():
    import io

    import torch

    from groupwise.curriculum import RolloutGDROCurriculum
    from groupwise.trainer.checkpoints import plain

    uids = ["a", "b", "c", "d", "e", "f"]
    outcomes = [
        [(4, 1), (4, 0), (4, 4), (4, 2), (4, 3), (4, 0)],
        [(4, 2), (4, 0), (4, 3), (4, 2), (4, 4), (4, 1)],
    ]

    def run(cur, steps, start=0):
        plans = []
        for t in range(start, start + steps):
            plan = cur.plan(_plan_for(uids, [0] * 6, [1] * 6).batch)
            rng = np.random.default_rng(t)
            per_prompt = [(n, int(rng.integers(0, n + 1))) for n in plan.counts]
            cur.observe_global(plan, _rows(per_prompt))
            plans.append((plan.bins, plan.counts))
        return plans

    for allocator in ("bandit", "sqrt"):
        options = opts(gdro_num_bins=4, gdro_window=3, rollout_max=8, rollout_allocator=allocator)
        rank0, rank1 = RolloutGDROCurriculum(options), RolloutGDROCurriculum(options)
        for per_prompt in outcomes:
            for cur in (rank0, rank1):
                plan = cur.plan(_plan_for(uids, [0] * 6, [1] * 6).batch)
                plan.counts = [4] * 6
                cur.observe_global(plan, _rows(per_prompt))
        # Two ranks that observe the same global rows hold the same state.
        assert repr(rank0.state_dict()) == repr(rank1.state_dict())
        straight = run(rank0, 6)
        head = run(rank1, 2)
        buffer = io.BytesIO()
        torch.save(plain(rank1.state_dict()), buffer)  # as Trainer.state_dict saves it
        buffer.seek(0)
        resumed = RolloutGDROCurriculum(options)
        resumed.load_state_dict(torch.load(buffer, weights_only=True))
        assert head + run(resumed, 4, start=2) == straight, allocator
        assert repr(resumed.state_dict()) == repr(rank0.state_dict())


def test_config_options_of_the_rollout_allocator():
    from groupwise.config.grpo_config import GRPOConfig
    from groupwise.curriculum import RolloutGDROCurriculum
    from groupwise.errors import ConfigError

    defaults = GRPOConfig()
    assert defaults.rollout_allocator == "sqrt" and defaults.rollout_variance == "prompt"
    assert defaults.gdro_classifier_signal == "rollout_fraction"
    assert defaults.gdro_unseen == "unseen"
    assert defaults.rollout_arm_choice == "sample" and defaults.rollout_mu_update == "best_response"
    with pytest.raises(ConfigError, match="gdro_share_normalize: false.*gdro_signal: pg_loss"):
        GRPOConfig(curriculum="prompt_gdro", gdro_signal="failure_rate")
    GRPOConfig(curriculum="prompt_gdro", gdro_signal="failure_rate", gdro_share_normalize=False)
    GRPOConfig(gdro_signal="failure_rate")  # no curriculum: nothing to refuse
    GRPOConfig(curriculum="rollout_gdro", gdro_unseen="difficulty")
    for name, bad in (
        ("rollout_allocator", "neyman"),
        ("rollout_variance", "pooled"),
        ("rollout_arm_choice", "argmax"),
        ("rollout_mu_update", "frozen"),
        ("gdro_classifier_signal", "pass_at_k"),
        ("gdro_unseen", "prior"),
    ):
        with pytest.raises(ConfigError, match=rf"{name}='{bad}' is not one of \['"):
            GRPOConfig(**{name: bad})
    with pytest.raises(ConfigError, match="gdro_window must be >= 0"):
        GRPOConfig(gdro_window=-1)
    with pytest.raises(ConfigError, match="rollout_variance_prior must be >= 0"):
        GRPOConfig(rollout_variance_prior=-0.5)
    # Every earlier behaviour is still one option away.
    old = GRPOConfig(
        curriculum="rollout_gdro",
        rollout_allocator="bandit",
        rollout_variance="bin",
        rollout_arm_choice="greedy",
        rollout_mu_update="expected",
        gdro_classifier_signal="any_correct",
        gdro_unseen="hardest",
        gdro_window=0,
        seed=7,
    )
    cur = RolloutGDROCurriculum.from_options(old.to_dict())
    assert cur.allocator == "bandit" and cur.variance == "bin"
    assert cur.classifier_signal == "any_correct" and cur.classifier.unseen == "hardest"
    assert cur.rollout_gdro.arm_choice == "greedy" and cur.rollout_gdro.mu_update == "expected"
    assert cur.classifier.num_states == 10 and cur.classifier.window == 0
    assert cur.rollout_gdro.generator.initial_seed() == 7


def test_a_checkpoint_with_another_number_of_groups_is_refused():
    from groupwise.curriculum import PromptGDROCurriculum

    hardest = opts(curriculum="prompt_gdro", gdro_num_bins=4, gdro_unseen="hardest")
    old = PromptGDROCurriculum(hardest).state_dict()  # the earlier state shape
    with pytest.raises(ValueError, match="4 groups, this run 5.*gdro_unseen: hardest"):
        PromptGDROCurriculum(opts(curriculum="prompt_gdro", gdro_num_bins=4)).load_state_dict(old)
    PromptGDROCurriculum(hardest).load_state_dict(old)


def test_unseen_prompts_binned_by_their_difficulty_level():
    import json

    from groupwise.curriculum import PromptBatch, RolloutGDROCurriculum

    def batch(uids, levels):
        rows = [{} if lv is None else {"difficulty": lv} for lv in levels]
        return PromptBatch(uids, slice(0, len(uids)), rows, [[1]] * len(uids))

    options = opts(gdro_num_bins=10, gdro_unseen="difficulty", rollout_variance_prior=2)
    cur = RolloutGDROCurriculum(options)
    plan = cur.plan(batch(["a", "b", "e"], [1, 2, None]))
    assert plan.bins == [10, 10, 10]  # no level observed yet: the unseen group
    cur.observe_global(plan, _rows([(4, 3), (4, 0), (4, 2)]))
    assert cur._level_rate("1") == 0.75 and cur._level_rate("2") == 0.0
    # New prompts c (level 1) and f (level 2) take their level's rate, 0.75 -> bin 7 and 0 ->
    # bin 0; d's level 3 was never observed: the unseen group; a has its own history (3/4).
    plan = cur.plan(batch(["c", "d", "f", "a"], [1, 3, 2, 1]))
    assert plan.bins == [7, 10, 0, 7]
    # Variances: c shrinks to its level's 0.75 (v = 0.1875), a (3 + 2 * 0.75) / 6 = 0.75 too,
    # f to 0 (v = 0: n_min = 2), d to the unseen group's pooled 5/12 (v = 35/144 = 0.24306).
    # The other 14 rollouts go as sqrt(v): 0.4330, 0.4930, 0.4330 -> 4.461, 5.079, 4.461:
    # floors 4 + 5 + 4 + 2 = 15, the spare unit to c (tied with a, first in order).
    np.testing.assert_allclose(
        cur.prompt_variances(["c", "d", "f", "a"], plan.bins), [0.1875, 35 / 144, 0.0, 0.1875]
    )
    assert plan.counts == [5, 5, 2, 4]
    cur.observe_global(plan, _rows([(5, 5), (5, 1), (2, 0), (4, 2)]))
    assert cur.level_success["1"][-1] == (7, 9)  # c and a, pooled in one entry for the step
    state = json.loads(json.dumps(cur.state_dict()))  # JSON-friendly, as the torchrun test dumps
    other = RolloutGDROCurriculum(options)
    other.load_state_dict(state)
    assert other._level_rate("1") == pytest.approx(10 / 13)
    assert json.dumps(other.state_dict()) == json.dumps(cur.state_dict())
