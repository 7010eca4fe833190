import itertools
import math

import numpy as np
import pytest

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


def test_edges_and_bins():
    assert default_edges(4) == [0.25, 0.5, 0.75]
    # bin i = [a_{i-1}, a_i): 0.25 is already in bin 1, 1.0 in the last bin.
    assert [bin_of(a, [0.25, 0.5, 0.75]) for a in (0.0, 0.249, 0.25, 0.6, 1.0)] == [0, 0, 1, 2, 3]


def test_classifier_window_and_unseen_prompts():
    clf = DifficultyClassifier(num_bins=10, window=3)
    assert clf.classify(["a", "b"]) == [0, 0]  # unseen: accuracy 0, hardest bin
    clf.update(["a"], [True])
    clf.update(["a"], [True])
    clf.update(["a"], [False])
    assert clf.accuracy("a") == pytest.approx(2 / 3)
    assert clf.classify(["a"]) == [6]  # 0.667 in [0.6, 0.7)
    clf.update(["a"], [False])  # window 3: [1, 0, 0] -> 1/3
    assert clf.classify(["a", "b"]) == [3, 0]


def test_classifier_hysteresis_up_and_down():
    clf = DifficultyClassifier(edges=[0.4, 0.75], window=0, hysteresis=0.05)
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
    clf = DifficultyClassifier(num_bins=5, window=2)
    clf.update(["a", "b"], [True, False])
    clf.classify(["a", "b"])
    other = DifficultyClassifier(num_bins=5, window=2)
    other.load_state_dict(clf.state_dict())
    other.update(["a"], [True])
    other.update(["a"], [False])
    assert other.accuracy("a") == 0.5  # window of 2 preserved
    assert other.last_bin == clf.last_bin


def test_per_response_loss_on_policy_is_minus_advantage():
    # The adversary's signal is the loss variant's per-sequence policy term (core.py).
    import torch

    from groupwise.core import sequence_surrogate

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
    gdro = PromptGDRO(num_bins=3, eta=1.0, gamma=0.0, ema_beta=0.5, share_normalize=False)
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
    gdro = PromptGDRO(num_bins=2, eta=1.0, gamma=0.0, ema_beta=1.0)
    gdro.update([0, 0, 1], [1.0, 3.0, 2.0])
    # bin 0: mean 2 / share 2/3 = 3; bin 1: mean 2 / share 1/3 = 6
    assert gdro.scores == [pytest.approx(3.0), pytest.approx(6.0)]
    mixed = PromptGDRO(num_bins=4, eta=0.0, gamma=0.5)
    np.testing.assert_allclose(mixed.bin_weights(), [0.25] * 4)  # eta 0: uniform
    capped = PromptGDRO(num_bins=2, eta=50.0, gamma=0.0, weight_cap=1.5, ema_beta=1.0)
    capped.update([1], [1.0])
    w = capped.sample_weights([1, 0, 0, 0])
    assert w[0] == 1.5 and w[1] < 1e-6  # bin 1 dominates; cap at 1.5
    clipped = PromptGDRO(num_bins=2, eta=1.0, gamma=0.0, clip=1.0, ema_beta=1.0)
    clipped.update([0, 1], [100.0, -100.0])
    # clip(S) = [1, -1] -> softmax = [e, 1/e] / (e + 1/e) = [0.880797, 0.119203]
    np.testing.assert_allclose(clipped.bin_weights(), [0.880797, 0.119203], atol=1e-6)


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


def test_rollout_gdro_allocation_exact_and_mu_direction():
    gdro = RolloutGDRO(num_bins=3, n_min=2, n_max=12, mean_budget=4)
    bins = [0, 0, 1, 2, 2, 2]
    n = gdro.allocate(bins)
    assert sum(n) == 24 and all(2 <= x <= 12 for x in n)
    # Bandits that prefer many rollouts push the pre-rounding mean above the budget: mu rises.
    gdro.scores[:, -1] = 10.0
    assert gdro.expected_mean(bins) > 4
    gdro.update(bins, n, [0.1] * 6)
    assert gdro.mu > 0
    cheap = RolloutGDRO(num_bins=3, n_min=2, n_max=12, mean_budget=4)
    cheap.scores[:, 0] = 10.0  # prefer 2 rollouts: mean below budget, mu falls
    cheap.update(bins, cheap.allocate(bins), [0.1] * 6)
    assert cheap.mu < 0


def test_rollout_gdro_update_uses_paper_sign():
    gdro = RolloutGDRO(num_bins=1, n_min=2, n_max=4, mean_budget=3, score_decay=1.0, dual_lr=0.0)
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


@pytest.mark.parametrize(
    "mode, allocator",
    [("prompt_gdro", "bandit"), ("rollout_gdro", "bandit"), ("rollout_gdro", "sqrt")],
)
def test_short_training_run_with_each_curriculum(tmp_path, mode, allocator):
    from groupwise import GRPOConfig, GRPOTrainer

    rows = [{"prompt": f"Say something number {i}"} for i in range(4)]
    args = GRPOConfig(
        model="tiny-random",
        max_steps=5,
        beta=0.0,
        learning_rate=1e-3,
        num_generations=4,
        per_device_train_batch_size=6,
        gradient_accumulation_steps=2,  # 3 prompts x 4 rollouts = 12 per step
        max_completion_length=3,
        curriculum=mode,
        rollout_allocator=allocator,
        gdro_num_bins=4,
        rollout_min=2,
        rollout_max=8,
        output_dir=str(tmp_path / "run"),
        disable_tqdm=True,
        seed=0,
    )
    trainer = GRPOTrainer("tiny-random", _parity, rows, args=args)
    logs = trainer.train()
    for log in logs:
        rollouts = sum(log[f"curriculum/rollouts_bin_{b}"] for b in range(4))
        prompts = sum(log[f"curriculum/prompts_bin_{b}"] for b in range(4))
        assert rollouts == 12 and prompts == 3  # the budget is exact every step
        for key in (
            "curriculum/wse",
            "curriculum/wse_uniform",
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
                for b in range(4)
                if log[f"curriculum/prompts_bin_{b}"]
            )
            for log in logs
        ]
        assert any(s != [4.0] * len(s) for s in sizes), sizes
    else:
        assert any(log["curriculum/weight_bin_0"] != 0.25 for log in logs[1:])


def _plan(bins, counts):
    from groupwise.curriculum import Plan, PromptBatch

    batch = PromptBatch(["a", "b"], slice(0, 2), [{}, {}], [[1], [1]])
    return Plan(batch, counts, [1.0] * len(counts), bins)


def test_prompt_signal_pg_loss_is_flat_on_policy_and_failure_rate_is_not():
    from groupwise.curriculum import GlobalRows, PromptGDROCurriculum

    # Two prompts in bins 0 and 2, two rollouts each; prompt 0 fails, prompt 1 succeeds.
    row_prompt, correct = [0, 0, 1, 1], [0.0, 0.0, 1.0, 1.0]
    advantages = [0.7, -0.7, 0.7, -0.7]  # on-policy: the pg signal is -A, summing to 0 per group
    flat = PromptGDROCurriculum(num_bins=3, prompt_kwargs={"eta": 1.0, "gamma": 0.0})
    rows = GlobalRows(row_prompt, correct, [-a for a in advantages], [0.0, 0.0, 1.0, 1.0])
    flat.observe_global(_plan([0, 2], [2, 2]), rows)
    assert flat.prompt_gdro.scores == [0.0, None, 0.0]
    assert flat.prompt_weights([0, 2], [2, 2]) == [1.0, 1.0]
    hard = PromptGDROCurriculum(
        num_bins=3, prompt_signal="failure_rate", prompt_kwargs={"eta": 1.0, "gamma": 0.0}
    )
    hard.observe_global(_plan([0, 2], [2, 2]), GlobalRows(row_prompt, correct, [0.0] * 4,
                                                          [0.0, 0.0, 1.0, 1.0]))  # fmt: skip
    # bin 0: failure 1 / share 0.5 = 2; bin 2: 0. softmax([2, 0, 0]) -> bin 0 gets e^2 / (e^2 + 2)
    assert hard.prompt_gdro.scores == [2.0, None, 0.0]
    w = np.repeat(hard.prompt_weights([0, 2], [2, 2]), 2)
    # per-sample q = [0.7870, 0.7870, 0.1065, 0.1065] -> mean-1 weights [1.762, 1.762, 0.238, 0.238]
    np.testing.assert_allclose(w, [1.761594, 1.761594, 0.238406, 0.238406], atol=1e-5)
