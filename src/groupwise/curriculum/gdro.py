"""Difficulty-aware curriculum: online pass@k classifier, Prompt-GDRO and Rollout-GDRO.

Multi-Adversary GDRO (Panaganti et al., arXiv 2601.19280; docs/algorithms.md section 1). This
module follows the paper's equations, not the released verl patch (algorithms.md 1.4 lists its
defects). Two curricula are built on the same observer (:class:`GDROCurriculum`):

- :class:`PromptGDROCurriculum`: every prompt gets G rollouts; its rollouts' policy term is
  weighted by its bin's adversary weight (:meth:`PromptGDRO.sample_weights`, eq. 16);
- :class:`RolloutGDROCurriculum`: weight 1, rollouts per prompt from :meth:`RolloutGDRO.allocate`
  (eqs. 19-21) or the closed form :func:`sqrt_allocation` (eq. 30).

Bins are indexed 0..B-1 with **0 = hardest** (lowest recent pass rate), as in the paper.
Everything here is plain Python / numpy and holds its state in a ``state_dict`` for checkpoints.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import numpy as np

from ..distributed import DistributedContext
from .base import GlobalBatchCurriculum, GlobalRows, Plan, PromptBatch


def default_edges(num_bins: int) -> list[float]:
    """Equal-width bin edges inside (0, 1): 10 bins -> [0.1, 0.2, ..., 0.9] (eq. 11)."""
    if num_bins < 1:
        raise ValueError(f"num_bins must be >= 1, got {num_bins}")
    return [i / num_bins for i in range(1, num_bins)]


def bin_of(accuracy: float, edges: Sequence[float]) -> int:
    """Eq. 11: the first i with accuracy < edges[i], else len(edges) (bin i = [a_{i-1}, a_i))."""
    for i, edge in enumerate(edges):
        if accuracy < edge:
            return i
    return len(edges)


# ----------------------------------------------------------------------------------------------
# Online difficulty classifier (section 3.1)


class DifficultyClassifier:
    """Bins prompts by their recent pass rate, with hysteresis.

    For each prompt id, a window of the last ``window`` outcomes c(x) in {0, 1} ("any rollout of
    this step was correct", eq. 10 with the window counted in appearances of the prompt). Unseen
    prompts have accuracy 0 and start in the hardest bin. Hysteresis: a prompt leaves its
    previous bin only if its accuracy passes the crossed edge of that bin by ``hysteresis``
    (up: acc >= upper edge + delta; down: acc <= lower edge - delta); it then moves to the bin its
    accuracy falls in. A step is classified with the history up to the previous step
    (:meth:`classify`), and the history is updated after the step (:meth:`update`).
    """

    def __init__(
        self,
        num_bins: int = 10,
        edges: Sequence[float] | None = None,
        window: int = 50,
        hysteresis: float = 0.0,
    ) -> None:
        edges = list(edges) if edges is not None else default_edges(num_bins)
        if any(not 0.0 < e < 1.0 for e in edges) or any(
            a >= b for a, b in zip(edges[:-1], edges[1:], strict=True)
        ):
            raise ValueError(f"bin edges must be strictly increasing inside (0, 1), got {edges}")
        if window < 0:
            raise ValueError(f"window must be >= 0 (0 = all history), got {window}")
        if hysteresis < 0:
            raise ValueError(f"hysteresis must be >= 0, got {hysteresis}")
        self.edges = edges
        self.num_bins = len(edges) + 1
        self.window = window
        self.hysteresis = hysteresis
        self.history: dict[Hashable, deque] = {}
        self.last_bin: dict[Hashable, int] = {}

    def accuracy(self, uid: Hashable) -> float:
        outcomes = self.history.get(uid)
        return sum(outcomes) / len(outcomes) if outcomes else 0.0

    def classify(self, uids: Sequence[Hashable]) -> list[int]:
        """Bin of each prompt for this step (uses history up to the previous step)."""
        bins = []
        for uid in uids:
            acc = self.accuracy(uid)
            raw = bin_of(acc, self.edges)
            prev = self.last_bin.get(uid)
            new = raw
            if prev is not None and raw != prev and self.hysteresis > 0:
                if raw > prev and acc < self.edges[prev] + self.hysteresis:
                    new = prev
                elif raw < prev and acc > self.edges[prev - 1] - self.hysteresis:
                    new = prev
            self.last_bin[uid] = new
            bins.append(new)
        return bins

    def update(self, uids: Sequence[Hashable], any_correct: Sequence[bool]) -> None:
        """Append this step's outcome of each prompt (call after the policy update)."""
        for uid, correct in zip(uids, any_correct, strict=True):
            if uid not in self.history:
                self.history[uid] = deque(maxlen=self.window or None)
            self.history[uid].append(1 if correct else 0)

    def state_dict(self) -> dict:
        return {
            "history": {k: list(v) for k, v in self.history.items()},
            "last_bin": dict(self.last_bin),
        }

    def load_state_dict(self, state: dict) -> None:
        self.history = {
            k: deque(v, maxlen=self.window or None) for k, v in state["history"].items()
        }
        self.last_bin = dict(state["last_bin"])


# ----------------------------------------------------------------------------------------------
# Prompt-GDRO: EMA-debiased exponential weights (section 3.2)


class PromptGDRO:
    """Eqs. 12-16: per-bin EMA of the mean loss, exponential weights, advantage multipliers.

    - eq. 13: step mean loss of bin b over its responses, optionally divided by its realised
      share max(q_hat_b, share_floor) (``share_normalize``, the appendix's "loss normalized by
      class share");
    - eq. 12: S_b <- (1 - ema_beta) S_b + ema_beta * step mean (the first observation sets S_b);
    - eq. 14-15: q_b = (1 - gamma) softmax(eta * clip(S, -C, C))_b + gamma / B (bins never seen
      have S_b = 0);
    - eq. 16: each sample's advantage is multiplied by q_{b(i)}, renormalised to mean 1 over the
      batch and capped at ``weight_cap``. Only relative weights matter, so this equals the
      paper's capped omega up to a constant; it changes no rollout count (compute-neutral).
    Defaults are the paper's (App. A.2.1): eta 0.65, gamma 0.01, EMA beta 0.12, cap 15. The
    paper's clip C is unspecified there; ``clip=None`` turns it off.
    """

    def __init__(
        self,
        num_bins: int,
        eta: float = 0.65,
        gamma: float = 0.01,
        ema_beta: float = 0.12,
        clip: float | None = None,
        weight_cap: float = 15.0,
        share_normalize: bool = True,
        share_floor: float = 1e-3,
    ) -> None:
        if not 0 <= gamma <= 1 or not 0 < ema_beta <= 1 or eta < 0 or weight_cap <= 0:
            raise ValueError("need 0 <= gamma <= 1, 0 < ema_beta <= 1, eta >= 0, weight_cap > 0")
        self.num_bins = num_bins
        self.eta, self.gamma, self.ema_beta = eta, gamma, ema_beta
        self.clip, self.weight_cap = clip, weight_cap
        self.share_normalize, self.share_floor = share_normalize, share_floor
        self.scores: list[float | None] = [None] * num_bins

    def bin_weights(self) -> np.ndarray:
        """q_b of eq. 15 for every bin."""
        s = np.array([0.0 if v is None else v for v in self.scores])
        if self.clip is not None:
            s = np.clip(s, -self.clip, self.clip)
        z = self.eta * s
        soft = np.exp(z - z.max())
        soft /= soft.sum()
        return (1 - self.gamma) * soft + self.gamma / self.num_bins

    def sample_weights(self, bin_ids: Sequence[int]) -> np.ndarray:
        """Per-sample advantage multipliers (eq. 16), mean 1 over the batch, capped."""
        q = self.bin_weights()[np.asarray(bin_ids, dtype=int)]
        w = q * len(q) / q.sum()
        return np.minimum(w, self.weight_cap)

    def update(self, bin_ids: Sequence[int], losses: Sequence[float]) -> None:
        """Feed this step's per-response losses (eqs. 12-13); call after the policy update."""
        bins = np.asarray(bin_ids, dtype=int)
        values = np.asarray(losses, dtype=np.float64)
        if bins.shape != values.shape:
            raise ValueError(f"{bins.size} bin ids for {values.size} losses")
        for b in np.unique(bins):
            in_bin = bins == b
            step = float(values[in_bin].mean())
            if self.share_normalize:
                step /= max(in_bin.mean(), self.share_floor)
            old = self.scores[b]
            self.scores[b] = (
                step if old is None else (1 - self.ema_beta) * old + self.ema_beta * step
            )

    def state_dict(self) -> dict:
        return {"scores": list(self.scores)}

    def load_state_dict(self, state: dict) -> None:
        self.scores = list(state["scores"])


# ----------------------------------------------------------------------------------------------
# Rollout-GDRO: shadow-price allocation of rollouts (section 3.3)


def exact_budget_arms(
    bin_counts: dict[int, int],
    log_probs: dict[int, np.ndarray],
    arms: Sequence[int],
    total: int,
) -> dict[int, int]:
    """Eq. 20's joint choice: one arm per present bin maximising sum_b log p_b(arm), subject to
    sum_b count_b * arm_b == total (dynamic programming over bins; state = rollouts so far).

    If no combination hits ``total`` exactly, the closest reachable total is used (then the most
    probable combination for it)."""
    bins = list(bin_counts)
    best: dict[int, tuple[float, list[int]]] = {0: (0.0, [])}
    for b in bins:
        nxt: dict[int, tuple[float, list[int]]] = {}
        for used, (score, chosen) in best.items():
            for k, arm in enumerate(arms):
                key = used + bin_counts[b] * arm
                cand = score + float(log_probs[b][k])
                if key not in nxt or cand > nxt[key][0]:
                    nxt[key] = (cand, chosen + [arm])
        best = nxt
    reachable = min(best, key=lambda t: (abs(t - total), -best[t][0]))
    return dict(zip(bins, best[reachable][1], strict=True))


class RolloutGDRO:
    """Eqs. 17-21: per-bin bandits over integer rollout counts, priced by a shadow price mu.

    - Each bin has a score per arm n in [n_min, n_max]; arm probabilities are
      p_b = (1 - gamma) softmax(eta * score_b) + gamma / |arms| (EXP3P-style exploration).
    - :meth:`allocate` picks one arm per present bin maximising the joint probability with the
      step's total rollouts equal to prompts x mean_budget exactly (:func:`exact_budget_arms`).
    - :meth:`update` scores the played arm with the paper's sign (eq. 20): reward
      -L_b(n) = J_b - mu n, where J_b = -(mean loss of bin b); scores are an EMA with
      ``score_decay`` (the appendix's "arm score EMA decay 0.4"; [recon]: the paper does not
      spell out the estimator).
    - mu moves by dual ascent (eq. 21) on the *pre-rounding* allocation, the mean arm under the
      bandits' own probabilities weighted by the bins' shares: mu += dual_lr (n_hat - mean_budget).
      The exactly-matched allocation always equals the budget, so using it would freeze mu.
    Defaults are the paper's (App. A.2.2): arms 2..12, mean budget 4, eta 0.65, gamma 0.01,
    dual_lr 0.05, score decay 0.4.
    """

    def __init__(
        self,
        num_bins: int,
        n_min: int = 2,
        n_max: int = 12,
        mean_budget: float = 4.0,
        eta: float = 0.65,
        gamma: float = 0.01,
        dual_lr: float = 0.05,
        score_decay: float = 0.4,
    ) -> None:
        if not 1 <= n_min <= mean_budget <= n_max:
            raise ValueError(
                f"need 1 <= n_min <= mean_budget <= n_max, got {n_min}, {mean_budget}, {n_max}"
            )
        self.num_bins = num_bins
        self.arms = list(range(n_min, n_max + 1))
        self.n_min, self.n_max, self.mean_budget = n_min, n_max, mean_budget
        self.eta, self.gamma, self.dual_lr, self.score_decay = eta, gamma, dual_lr, score_decay
        self.scores = np.zeros((num_bins, len(self.arms)))
        self.mu = 0.0

    def arm_probs(self, b: int) -> np.ndarray:
        z = self.eta * self.scores[b]
        soft = np.exp(z - z.max())
        soft /= soft.sum()
        return (1 - self.gamma) * soft + self.gamma / len(self.arms)

    def allocate(self, bin_ids: Sequence[int]) -> list[int]:
        """Rollouts per prompt: the most probable per-bin arms with an exact total budget."""
        counts: dict[int, int] = {}
        for b in bin_ids:
            counts[int(b)] = counts.get(int(b), 0) + 1
        total = round(len(bin_ids) * self.mean_budget)
        log_probs = {b: np.log(self.arm_probs(b)) for b in counts}
        chosen = exact_budget_arms(counts, log_probs, self.arms, total)
        return [chosen[int(b)] for b in bin_ids]

    def expected_mean(self, bin_ids: Sequence[int]) -> float:
        """Pre-rounding allocation: sum_b q_hat_b E_{p_b}[n]."""
        bins = np.asarray(bin_ids, dtype=int)
        arms = np.asarray(self.arms, dtype=np.float64)
        return float(np.mean([self.arm_probs(b) @ arms for b in bins]))

    def update(self, bin_ids: Sequence[int], rollouts: Sequence[int], losses: Sequence[float]):
        """Feed the step: per-prompt bin and rollout count, per-prompt mean loss (eq. 17)."""
        bins = np.asarray(bin_ids, dtype=int)
        n = np.asarray(rollouts, dtype=int)
        values = np.asarray(losses, dtype=np.float64)
        pre_rounding = self.expected_mean(bins)
        for b in np.unique(bins):
            in_bin = bins == b
            j_b = -float(values[in_bin].mean())  # eq. 18
            for arm in np.unique(n[in_bin]):
                k = self.arms.index(int(arm))
                reward = j_b - self.mu * float(arm)  # -L_b(n), eq. 20
                d = self.score_decay
                self.scores[b, k] = (1 - d) * self.scores[b, k] + d * reward
        self.mu += self.dual_lr * (pre_rounding - self.mean_budget)  # eq. 21

    def state_dict(self) -> dict:
        return {"scores": self.scores.tolist(), "mu": self.mu}

    def load_state_dict(self, state: dict) -> None:
        self.scores = np.asarray(state["scores"], dtype=np.float64)
        self.mu = float(state["mu"])


def sqrt_allocation(
    bin_ids: Sequence[int],
    variances: Sequence[float],
    mean_budget: float,
    n_min: int,
    n_max: int,
) -> list[int]:
    """Closed-form Rollout-GDRO (Theorem 4.2, eq. 30): n_b = n_bar sqrt(v_b) / sum_j q_j sqrt(v_j).

    ``bin_ids``: one bin per prompt; ``variances``: v_b per bin index (e.g. p_b (1 - p_b)).
    Bounds are enforced by water-filling (the scale s in n_b = clip(s sqrt(v_b), n_min, n_max) is
    chosen so the real-valued total is exact), then each prompt's real target is floored and the
    remaining units go to the largest fractional parts, so prompts of one bin differ by at most 1
    and the total is exactly ``len(bin_ids) * mean_budget`` (rounded) whenever it is reachable
    within the bounds (otherwise the nearest reachable total). All-zero variances give the
    uniform allocation."""
    if not 1 <= n_min <= n_max:
        raise ValueError(f"need 1 <= n_min <= n_max, got {n_min}, {n_max}")
    count = len(bin_ids)
    if count == 0:
        return []
    total = min(max(round(count * mean_budget), count * n_min), count * n_max)
    roots = np.sqrt(np.maximum(np.asarray(variances, dtype=np.float64), 0.0))
    weight = roots[np.asarray(bin_ids, dtype=int)]
    if weight.sum() == 0:
        weight = np.ones(count)

    def real_total(scale: float) -> float:
        return float(np.clip(scale * weight, n_min, n_max).sum())

    low, high = 0.0, 1.0
    while real_total(high) < total:
        high *= 2
        if high > 1e12:
            break
    for _ in range(200):  # bisection on the monotone total
        mid = (low + high) / 2
        if real_total(mid) < total:
            low = mid
        else:
            high = mid
    target = np.clip(high * weight, n_min, n_max)
    deficit = total - target.sum()
    if deficit > 1e-9:
        # Every prompt with v_b > 0 is at n_max: the rest of the exact budget goes evenly to
        # the zero-variance prompts (no variance to reduce there, but the budget is fixed).
        zero = weight == 0
        target[zero] = np.minimum(target[zero] + deficit / max(zero.sum(), 1), n_max)
    base = np.floor(target + 1e-9).astype(int)
    remaining = total - int(base.sum())
    frac = target - base
    # Stable sort keeps prompt order for ties, so equal targets in one bin differ by at most 1.
    order = sorted(range(count), key=lambda i: -frac[i])
    for i in order:
        if remaining <= 0:
            break
        if base[i] < n_max:
            base[i] += 1
            remaining -= 1
    for i in order[::-1]:  # float slack the other way (only if the bisection overshot)
        if remaining >= 0:
            break
        if base[i] > n_min:
            base[i] -= 1
            remaining += 1
    return base.tolist()


# ----------------------------------------------------------------------------------------------
# Diagnostics (section 4)


def weighted_standard_error(
    shares: Sequence[float], sigmas: Sequence[float], rollouts: Sequence[float]
) -> float:
    """Eq. 33: WSE = sum_b q_b sigma_b / sqrt(n_b) over bins with n_b > 0."""
    total = 0.0
    for q, sigma, n in zip(shares, sigmas, rollouts, strict=True):
        if n > 0:
            total += q * sigma / math.sqrt(n)
    return total


def lead_lag(data_shares: Sequence[float], weights: Sequence[float]) -> tuple[float, float, float]:
    """Eq. 32: mu_data = sum_b b q_b, mu_weight = sum_b b w_hat_b (weights normalised to sum 1),
    and their difference (positive: the adversary leans to easier bins than the data)."""
    q = np.asarray(data_shares, dtype=np.float64)
    w = np.asarray(weights, dtype=np.float64)
    idx = np.arange(len(q))
    mu_data = float((idx * q).sum() / max(q.sum(), 1e-12))
    mu_weight = float((idx * w).sum() / max(w.sum(), 1e-12))
    return mu_data, mu_weight, mu_weight - mu_data


# ----------------------------------------------------------------------------------------------
# The curricula: plan a step, observe its outcome


class GDROCurriculum(GlobalBatchCurriculum):
    """Classifier, both adversaries and the diagnostics of section 4, shared by the two GDRO
    curricula; a subclass decides what the plan acts on (:meth:`rollout_counts`,
    :meth:`prompt_weights`). The adversary a curriculum does not act on still learns, so its
    diagnostics (bin weights, mu) are logged either way.

    Rollout allocation (``allocator``): ``bandit`` is eqs. 19-21 (:class:`RolloutGDRO`);
    ``sqrt`` is the closed form (:func:`sqrt_allocation`) with v_b = p_b (1 - p_b), p_b the bin's
    per-rollout success rate over its last ``window`` observed steps (a bin never observed uses
    the midpoint of its accuracy range). Both keep the step's total at prompts x mean_budget.

    Prompt-GDRO's signal (``prompt_signal``): ``pg_loss``, the paper's per-response clipped
    policy loss (eqs. 5-6, unweighted advantages; the loss variant's
    :func:`~groupwise.core.sequence_surrogate`), or ``failure_rate``, 1 - correct per rollout.
    With one optimisation pass per batch the former is -A_i, whose mean over every group and
    so every bin is exactly 0, which leaves all bin weights equal (algorithms.md 1.1 [obs])."""

    def __init__(
        self,
        *,
        # the classifier (DifficultyClassifier's options)
        num_bins: int = 10, edges: Sequence[float] | None = None, window: int = 50,
        hysteresis: float = 0.0,
        # the rollout budget and its allocation
        mean_budget: int = 4,
        n_min: int = 2,
        n_max: int = 12,
        allocator: str = "bandit",
        prompt_signal: str = "pg_loss",
        correct_threshold: float = 0.5,
        prompt_kwargs: dict | None = None,
        rollout_kwargs: dict | None = None,
        dist: DistributedContext | None = None,
    ) -> None:
        super().__init__(dist)
        if allocator not in ("bandit", "sqrt"):
            raise ValueError(f"allocator must be bandit or sqrt, got {allocator!r}")
        if prompt_signal not in ("pg_loss", "failure_rate"):
            raise ValueError(
                f"prompt_signal must be pg_loss or failure_rate, got {prompt_signal!r}"
            )
        self.prompt_signal, self.allocator = prompt_signal, allocator
        self.correct_threshold = correct_threshold
        self.classifier = DifficultyClassifier(num_bins, edges, window, hysteresis)
        bins = self.classifier.num_bins
        self.prompt_gdro = PromptGDRO(bins, **(prompt_kwargs or {}))
        self.rollout_gdro = RolloutGDRO(
            bins, n_min=n_min, n_max=n_max, mean_budget=mean_budget, **(rollout_kwargs or {})
        )
        self.mean_budget, self.n_min, self.n_max = mean_budget, n_min, n_max
        self.success: list[deque] = [deque(maxlen=max(window, 1)) for _ in range(bins)]

    @classmethod
    def from_options(
        cls, options: Mapping[str, Any], dist: DistributedContext | None = None
    ) -> GDROCurriculum:
        """Built from a run's options (``GRPOConfig.to_dict()``): the ``gdro_*`` and
        ``rollout_*`` fields, and ``num_generations`` as the mean rollout budget."""
        o = options
        exp_weights = {"eta": o["gdro_eta"], "gamma": o["gdro_gamma"]}  # both adversaries'
        return cls(
            num_bins=o["gdro_num_bins"],
            edges=o["gdro_bin_edges"],
            window=o["gdro_window"],
            hysteresis=o["gdro_hysteresis"],
            mean_budget=o["num_generations"],
            n_min=o["rollout_min"],
            n_max=o["rollout_max"],
            allocator=o["rollout_allocator"],
            prompt_signal=o["gdro_signal"],
            correct_threshold=o["gdro_correct_threshold"],
            prompt_kwargs=dict(
                exp_weights,
                ema_beta=o["gdro_ema_beta"],
                clip=o["gdro_clip"],
                weight_cap=o["gdro_weight_cap"],
                share_normalize=o["gdro_share_normalize"],
            ),
            rollout_kwargs=dict(
                exp_weights, dual_lr=o["rollout_dual_lr"], score_decay=o["rollout_score_decay"]
            ),
            dist=dist,
        )

    # -- what a subclass acts on ------------------------------------------------------------
    def rollout_counts(self, bins: Sequence[int]) -> list[int]:
        """Rollouts per prompt of the global batch."""
        return [int(self.mean_budget)] * len(bins)

    def prompt_weights(self, bins: Sequence[int], counts: Sequence[int]) -> list[float]:
        """Per prompt, the multiplier of its rollouts' policy term."""
        return [1.0] * len(bins)

    # -- the protocol ---------------------------------------------------------------------------
    def plan(self, batch: PromptBatch) -> Plan:
        """Bins (from history up to the previous step), rollouts and weights per prompt."""
        bins = self.classifier.classify(batch.indices)
        counts = self.rollout_counts(bins)
        return Plan(batch, counts, self.prompt_weights(bins, counts), bins)

    def _bin_success_rate(self, b: int) -> float:
        seen = self.success[b]
        if seen and sum(n for _, n in seen):
            return sum(s for s, _ in seen) / sum(n for _, n in seen)
        edges = [0.0, *self.classifier.edges, 1.0]
        return (edges[b] + edges[b + 1]) / 2

    def observe_global(self, plan: Plan, rows: GlobalRows) -> dict[str, float]:
        """Feed the step's outcome to every adversary and the classifier; return diagnostics."""
        uids, bins, counts = plan.batch.indices, plan.bins, plan.counts
        assert bins is not None
        row_prompt = np.asarray(rows.prompt, dtype=int)
        scores = np.nan_to_num(np.asarray(rows.correctness, dtype=np.float64), nan=-math.inf)
        correct = scores > self.correct_threshold
        loss = np.asarray(rows.loss, dtype=np.float64)
        reward = np.nan_to_num(np.asarray(rows.reward, dtype=np.float64))
        row_bins = np.asarray([bins[p] for p in row_prompt], dtype=int)
        num_bins = self.classifier.num_bins
        metrics: dict[str, float] = {}

        # Diagnostics first: they describe the allocation and weights this step used.
        shares = np.bincount(np.asarray(bins, dtype=int), minlength=num_bins) / max(len(bins), 1)
        rollouts = np.bincount(row_bins, minlength=num_bins)
        sigmas = np.array(
            [reward[row_bins == b].std() if (row_bins == b).any() else 0.0 for b in range(num_bins)]
        )
        per_prompt_n = np.array(
            [
                np.mean([counts[i] for i in range(len(bins)) if bins[i] == b]) if shares[b] else 0.0
                for b in range(num_bins)
            ]
        )
        q = self.prompt_gdro.bin_weights()
        for b in range(num_bins):
            metrics[f"curriculum/prompts_bin_{b}"] = float(shares[b] * len(bins))
            metrics[f"curriculum/rollouts_bin_{b}"] = float(rollouts[b])
            metrics[f"curriculum/weight_bin_{b}"] = float(q[b])
        metrics["curriculum/wse"] = weighted_standard_error(shares, sigmas, per_prompt_n)
        metrics["curriculum/wse_uniform"] = weighted_standard_error(
            shares, sigmas, [self.mean_budget if s else 0 for s in shares]
        )
        mu_data, mu_weight, delta = lead_lag(shares, q * (shares > 0))
        metrics.update(
            {
                "curriculum/mu_data": mu_data,
                "curriculum/mu_weight": mu_weight,
                "curriculum/lead_lag": delta,
                "curriculum/mu": self.rollout_gdro.mu,
            }
        )

        # Adversaries learn from this step (order of algorithms.md 1.2: after the update).
        # pg_loss is the paper's signal; on-policy its mean over a group (so over a bin) is 0.
        # failure_rate (1 - correct per rollout) keeps the adversary informative in that case.
        signal = loss if self.prompt_signal == "pg_loss" else 1.0 - correct.astype(np.float64)
        self.prompt_gdro.update(row_bins.tolist(), signal.tolist())
        prompt_loss = [float(loss[row_prompt == i].mean()) for i in range(len(bins))]
        self.rollout_gdro.update(bins, counts, prompt_loss)
        for b in np.unique(row_bins):
            in_bin = row_bins == b
            self.success[b].append((int(correct[in_bin].sum()), int(in_bin.sum())))
        any_correct = [bool(correct[row_prompt == i].any()) for i in range(len(bins))]
        self.classifier.update(uids, any_correct)
        return metrics

    def state_dict(self) -> dict:
        return {
            "classifier": self.classifier.state_dict(),
            "prompt_gdro": self.prompt_gdro.state_dict(),
            "rollout_gdro": self.rollout_gdro.state_dict(),
            "success": [list(d) for d in self.success],
        }

    def load_state_dict(self, state: dict) -> None:
        self.classifier.load_state_dict(state["classifier"])
        self.prompt_gdro.load_state_dict(state["prompt_gdro"])
        self.rollout_gdro.load_state_dict(state["rollout_gdro"])
        for d, items in zip(self.success, state["success"], strict=True):
            d.clear()
            d.extend(tuple(x) for x in items)


class PromptGDROCurriculum(GDROCurriculum):
    """Prompt-GDRO (section 3.2): G rollouts per prompt; each prompt's policy term is multiplied
    by its bin's weight q_b (eq. 16), normalised to mean 1 over the global batch's rows and
    capped. A data parallel rank plans the global batch and keeps its own prompts' weights, so
    its rows get exactly the weights one process would give them."""

    def prompt_weights(self, bins: Sequence[int], counts: Sequence[int]) -> list[float]:
        row_bins = np.repeat(np.asarray(bins, dtype=int), np.asarray(counts, dtype=int))
        row_weights = self.prompt_gdro.sample_weights(row_bins.tolist())
        first_row = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(int)
        return np.asarray(row_weights)[first_row].tolist()


class RolloutGDROCurriculum(GDROCurriculum):
    """Rollout-GDRO (section 3.3): weight 1; rollouts per prompt chosen per bin under a fixed
    mean budget, by the bandits with a shadow price (eqs. 19-21) or the square-root law."""

    def rollout_counts(self, bins: Sequence[int]) -> list[int]:
        if self.allocator == "sqrt":
            p = [self._bin_success_rate(b) for b in range(self.classifier.num_bins)]
            variances = [x * (1 - x) for x in p]
            return sqrt_allocation(bins, variances, self.mean_budget, self.n_min, self.n_max)
        return self.rollout_gdro.allocate(bins)
