"""Difficulty-aware curriculum: online difficulty classifier, Prompt-GDRO and Rollout-GDRO.

Multi-Adversary GDRO (Panaganti et al., arXiv 2601.19280; docs/algorithms.md section 1). This
module follows the paper's equations, not the released verl patch (algorithms.md 1.4 lists its
defects). Two curricula are built on the same observer (:class:`GDROCurriculum`):

- :class:`PromptGDROCurriculum`: every prompt gets G rollouts; its rollouts' policy term is
  weighted by its bin's adversary weight (:meth:`PromptGDRO.sample_weights`, eq. 16);
- :class:`RolloutGDROCurriculum`: weight 1, rollouts per prompt from the closed form
  :func:`sqrt_allocation` (eq. 30, per prompt by default) or :meth:`RolloutGDRO.allocate`
  (eqs. 19-21).

Bins are indexed 0..B-1 with **0 = hardest** (lowest recent success rate), as in the paper; with
``unseen="unseen"`` prompts never observed have their own group, index B. The defaults differ from
the paper where simulations show the paper's choice uninformative (the
per-rollout classifier, the unseen group, the per-prompt square-root law, sampled arms, mu on
the best response); each paper choice stays one option away. Everything here is plain Python /
numpy (the arm draws use a ``torch.Generator``) and holds its state in a ``state_dict``.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from ..distributed import DistributedContext, concat_over_ranks
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

CLASSIFIER_SIGNALS = ("rollout_fraction", "any_correct")
UNSEEN_MODES = ("unseen", "hardest", "difficulty")


class DifficultyClassifier:
    """Bins prompts by their recent success rate, with hysteresis.

    For each prompt id, a window of its last ``window`` appearances (0: all history), each kept as
    (successes, rollouts). The accuracy is the pooled rate sum(successes) / sum(rollouts) over the
    window. What an appearance records is the caller's choice (:class:`GDROCurriculum`'s
    ``classifier_signal``): ``(correct rollouts, rollouts)``, the per-rollout success fraction,
    which does not depend on how many rollouts a prompt got, or
    ``(any correct, 1)``, the paper's c(x) of eq. 10 (pass@n_b under Rollout-GDRO, so prompts given
    more rollouts look easier).

    Unseen prompts (no appearance yet): ``unseen="hardest"`` gives them accuracy 0 and the hardest
    bin (the paper's released code); ``unseen="unseen"`` gives them their own state, index
    ``num_bins`` (after the easiest bin), so they no longer mix with the truly hard prompts;
    ``unseen="difficulty"`` bins an unseen prompt by the prior accuracy the caller passes to
    :meth:`classify` (its difficulty level's rate, :class:`GDROCurriculum`), and uses the unseen
    state where there is none.

    Hysteresis: a prompt leaves its previous bin only if its accuracy passes the crossed edge of
    that bin by ``hysteresis`` (up: acc >= upper edge + delta; down: acc <= lower edge - delta); it
    then moves to the bin its accuracy falls in. A step is classified with the history up to the
    previous step (:meth:`classify`), and the history is updated after the step (:meth:`update`).
    """

    def __init__(
        self,
        num_bins: int = 10,
        edges: Sequence[float] | None = None,
        window: int = 50,
        hysteresis: float = 0.0,
        unseen: str = "hardest",
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
        if unseen not in UNSEEN_MODES:
            raise ValueError(f"unseen must be one of {list(UNSEEN_MODES)}, got {unseen!r}")
        self.edges = edges
        self.num_bins = len(edges) + 1
        self.window = window
        self.hysteresis = hysteresis
        self.unseen = unseen
        # Bins plus the unseen state when it has one: the adversaries' number of groups.
        self.num_states = self.num_bins + (unseen != "hardest")
        self.unseen_state: int | None = self.num_bins if unseen != "hardest" else None
        self.history: dict[Hashable, deque[tuple[int, int]]] = {}
        self.last_bin: dict[Hashable, int] = {}

    def counts(self, uid: Hashable) -> tuple[int, int]:
        """(successes, rollouts) of the prompt over its window; (0, 0) when unseen."""
        outcomes = self.history.get(uid)
        if not outcomes:
            return 0, 0
        return sum(s for s, _ in outcomes), sum(n for _, n in outcomes)

    def accuracy(self, uid: Hashable) -> float:
        successes, trials = self.counts(uid)
        return successes / trials if trials else 0.0

    def classify(
        self, uids: Sequence[Hashable], priors: Sequence[float | None] | None = None
    ) -> list[int]:
        """Bin (or the unseen state) of each prompt for this step (history up to the previous
        step). ``priors``: per prompt, the accuracy an unseen prompt is binned by under
        ``unseen="difficulty"`` (None: the unseen state)."""
        bins = []
        priors = [None] * len(uids) if priors is None else priors
        for uid, prior in zip(uids, priors, strict=True):
            if self.unseen_state is not None and not self.counts(uid)[1]:
                # No last_bin: hysteresis starts at the first bin the prompt's own history gives.
                if self.unseen == "difficulty" and prior is not None:
                    bins.append(bin_of(prior, self.edges))
                else:
                    bins.append(self.unseen_state)
                continue
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

    def update(
        self,
        uids: Sequence[Hashable],
        successes: Sequence[int | bool],
        trials: Sequence[int] | None = None,
    ) -> None:
        """Append this step's outcome of each prompt (call after the policy update):
        ``successes[i]`` out of ``trials[i]`` (default 1: ``successes`` are the eq. 10 c(x))."""
        trials = [1] * len(uids) if trials is None else trials
        for uid, s, n in zip(uids, successes, trials, strict=True):
            if not 0 <= int(s) <= int(n):
                raise ValueError(f"{s} successes out of {n} rollouts for prompt {uid!r}")
            if uid not in self.history:
                self.history[uid] = deque(maxlen=self.window or None)
            self.history[uid].append((int(s), int(n)))

    def state_dict(self) -> dict:
        return {
            "history": {k: [list(x) for x in v] for k, v in self.history.items()},
            "last_bin": dict(self.last_bin),
        }

    def load_state_dict(self, state: dict) -> None:
        # Checkpoints before the (successes, rollouts) pairs stored one c(x) in {0, 1} each.
        self.history = {
            k: deque(
                ((x, 1) if isinstance(x, int) else (int(x[0]), int(x[1])) for x in v),
                maxlen=self.window or None,
            )
            for k, v in state["history"].items()
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
                step /= max(float(in_bin.mean()), self.share_floor)
            old = self.scores[b]
            self.scores[b] = float(
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


def sample_exact_budget_arms(
    bin_counts: dict[int, int],
    log_probs: dict[int, np.ndarray],
    arms: Sequence[int],
    total: int,
    uniforms: Sequence[float],
) -> dict[int, int]:
    """EXP3P's draw under eq. 20's exact budget: one arm per present bin, sampled from the product
    of the bins' arm distributions conditioned on sum_b count_b * arm_b == total (the closest
    reachable total if none hits it, as :func:`exact_budget_arms`).

    Forward pass: Z_i(s) = sum over arms a of Z_{i-1}(s - count_i a) p_i(a) (log space). Backward
    pass, last bin first: bin i takes arm a with probability Z_{i-1}(s - count_i a) p_i(a) / Z_i(s),
    by inverse CDF over ``arms`` in order with ``uniforms[i]`` in [0, 1) (one per present bin, so
    the caller's generator advances by the same amount every step)."""
    bins = list(bin_counts)
    if len(uniforms) < len(bins):
        raise ValueError(f"{len(uniforms)} uniforms for {len(bins)} bins")
    layers: list[dict[int, float]] = [{0: 0.0}]
    for b in bins:
        nxt: dict[int, float] = {}
        for used, log_z in layers[-1].items():
            for k, arm in enumerate(arms):
                key = used + bin_counts[b] * arm
                cand = log_z + float(log_probs[b][k])
                nxt[key] = cand if key not in nxt else float(np.logaddexp(nxt[key], cand))
        layers.append(nxt)
    last = layers[-1]
    state = min(last, key=lambda t: (abs(t - total), -last[t]))
    chosen: dict[int, int] = {}
    for i in range(len(bins) - 1, -1, -1):
        b, before = bins[i], layers[i]
        logits = np.array(
            [
                before.get(state - bin_counts[b] * arm, -math.inf) + float(log_probs[b][k])
                for k, arm in enumerate(arms)
            ]
        )
        probs = np.exp(logits - logits.max())
        cdf = np.cumsum(probs / probs.sum())
        k = min(int(np.searchsorted(cdf, float(uniforms[i]), side="right")), len(arms) - 1)
        while probs[k] == 0:  # float round-off at the top of the CDF: the last possible arm
            k -= 1
        chosen[b] = arms[k]
        state -= bin_counts[b] * arms[k]
    return {b: chosen[b] for b in bins}


ARM_CHOICES = ("sample", "greedy")
MU_UPDATES = ("best_response", "expected", "realized")


def best_response_arm(
    j_hat: Sequence[float], arms: Sequence[int], mu: float, mean_budget: float
) -> int:
    """The unconstrained best response of one bin at shadow price mu: argmin over arms n of
    L_b(n) = -J_b(n) + mu n (eq. 20), with J_b(n) the arm's estimate (NaN: never played, then the
    mean of the played arms, or 0 if none: no evidence that n matters). Ties go to the arm nearest
    the mean budget, then the smaller: with no information and mu = 0 that is the budget itself, so
    the dual step (eq. 21) does not move mu."""
    j = np.asarray(j_hat, dtype=np.float64)
    played = ~np.isnan(j)
    fill = float(j[played].mean()) if played.any() else 0.0
    j = np.where(played, j, fill)
    loss = -j + mu * np.asarray(arms, dtype=np.float64)
    best = loss.min()
    tied = [a for a, value in zip(arms, loss, strict=True) if value <= best + 1e-12]
    return min(tied, key=lambda a: (abs(a - mean_budget), a))


class RolloutGDRO:
    """Eqs. 17-21: per-bin bandits over integer rollout counts, priced by a shadow price mu.

    - Each bin has a score per arm n in [n_min, n_max]; arm probabilities are
      p_b = (1 - gamma) softmax(eta * score_b) + gamma / |arms| (EXP3P-style exploration).
    - :meth:`allocate` keeps the step's total rollouts at prompts x mean_budget exactly.
      ``arm_choice="sample"`` draws the arms from the joint distribution conditioned on that
      budget (:func:`sample_exact_budget_arms`, a seeded ``torch.Generator`` whose state is in the
      ``state_dict``, so a resumed run draws the same arms), as EXP3P prescribes;
      ``arm_choice="greedy"`` takes the most probable joint choice (:func:`exact_budget_arms`,
      the released code's and this library's earlier behaviour: follow-the-leader, gamma then
      has no effect).
    - :meth:`update` scores the played arm with the paper's sign (eq. 20): reward
      -L_b(n) = J_b - mu n, where J_b = -(mean loss of bin b); scores are an EMA with
      ``score_decay`` (the appendix's "arm score EMA decay 0.4"; [recon]: the paper does not
      spell out the estimator; no importance weighting). ``j_hat`` keeps the same EMA of J_b
      alone per arm (NaN until played), for the best response below.
    - mu moves by dual ascent (eq. 21): mu += dual_lr (n_hat - mean_budget), where n_hat is
      (``mu_update``)
      ``best_response``: the share-weighted unconstrained best response at the current mu,
      :func:`best_response_arm` (default; with arms that carry no information it is the budget
      and mu stays where it is; otherwise it oscillates in a band of width dual_lr (n_max - n_min)
      around the price that clears the budget);
      ``expected``: the mean arm under the bandits' own probabilities (this library's earlier
      rule: with flat probabilities it is the arm midpoint, above the budget, so mu drifts up
      with no information);
      ``realized``: the step's realised mean rollouts, eq. 21 as written (always the budget under
      the exact allocation, so mu stays at 0: the paper's algorithm, kept for exactness).
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
        arm_choice: str = "sample",
        mu_update: str = "best_response",
        seed: int = 0,
    ) -> None:
        if not 1 <= n_min <= mean_budget <= n_max:
            raise ValueError(
                f"need 1 <= n_min <= mean_budget <= n_max, got {n_min}, {mean_budget}, {n_max}"
            )
        if arm_choice not in ARM_CHOICES:
            raise ValueError(f"arm_choice must be one of {list(ARM_CHOICES)}, got {arm_choice!r}")
        if mu_update not in MU_UPDATES:
            raise ValueError(f"mu_update must be one of {list(MU_UPDATES)}, got {mu_update!r}")
        self.num_bins = num_bins
        self.arms = list(range(n_min, n_max + 1))
        self.n_min, self.n_max, self.mean_budget = n_min, n_max, mean_budget
        self.eta, self.gamma, self.dual_lr, self.score_decay = eta, gamma, dual_lr, score_decay
        self.arm_choice, self.mu_update = arm_choice, mu_update
        self.scores = np.zeros((num_bins, len(self.arms)))
        self.j_hat = np.full((num_bins, len(self.arms)), np.nan)
        self.mu = 0.0
        self.generator = torch.Generator().manual_seed(seed)

    def arm_probs(self, b: int) -> np.ndarray:
        z = self.eta * self.scores[b]
        soft = np.exp(z - z.max())
        soft /= soft.sum()
        return (1 - self.gamma) * soft + self.gamma / len(self.arms)

    def allocate(self, bin_ids: Sequence[int]) -> list[int]:
        """Rollouts per prompt: per-bin arms (sampled or most probable) with an exact total."""
        counts: dict[int, int] = {}
        for b in bin_ids:
            counts[int(b)] = counts.get(int(b), 0) + 1
        total = round(len(bin_ids) * self.mean_budget)
        log_probs = {b: np.log(self.arm_probs(b)) for b in counts}
        if self.arm_choice == "greedy":
            chosen = exact_budget_arms(counts, log_probs, self.arms, total)
        else:
            uniforms = torch.rand(len(counts), generator=self.generator, dtype=torch.float64)
            chosen = sample_exact_budget_arms(
                counts, log_probs, self.arms, total, uniforms.tolist()
            )
        return [chosen[int(b)] for b in bin_ids]

    def expected_mean(self, bin_ids: Sequence[int]) -> float:
        """Pre-rounding allocation: sum_b q_hat_b E_{p_b}[n]."""
        bins = np.asarray(bin_ids, dtype=int)
        arms = np.asarray(self.arms, dtype=np.float64)
        return float(np.mean([self.arm_probs(b) @ arms for b in bins]))

    def best_response_mean(self, bin_ids: Sequence[int]) -> float:
        """sum_b q_hat_b n_b*(mu): the unconstrained best responses, weighted by the shares."""
        return float(
            np.mean(
                [best_response_arm(self.j_hat[b], self.arms, self.mu, self.mean_budget)
                 for b in bin_ids]
            )
        )  # fmt: skip

    def update(self, bin_ids: Sequence[int], rollouts: Sequence[int], losses: Sequence[float]):
        """Feed the step: per-prompt bin and rollout count, per-prompt mean loss (eq. 17)."""
        bins = np.asarray(bin_ids, dtype=int)
        n = np.asarray(rollouts, dtype=int)
        values = np.asarray(losses, dtype=np.float64)
        pre_rounding = self.expected_mean(bins) if self.mu_update == "expected" else 0.0
        d = self.score_decay
        for b in np.unique(bins):
            in_bin = bins == b
            j_b = -float(values[in_bin].mean())  # eq. 18
            for arm in np.unique(n[in_bin]):
                k = self.arms.index(int(arm))
                reward = j_b - self.mu * float(arm)  # -L_b(n), eq. 20
                self.scores[b, k] = (1 - d) * self.scores[b, k] + d * reward
                old = self.j_hat[b, k]
                self.j_hat[b, k] = j_b if np.isnan(old) else (1 - d) * old + d * j_b
        if self.mu_update == "expected":
            n_hat = pre_rounding
        elif self.mu_update == "realized":
            n_hat = float(n.mean())
        else:
            n_hat = self.best_response_mean(bins)
        self.mu = float(self.mu + self.dual_lr * (n_hat - self.mean_budget))  # eq. 21

    def state_dict(self) -> dict:
        return {
            "scores": self.scores.tolist(),
            "mu": self.mu,
            "j_hat": [[None if np.isnan(x) else float(x) for x in row] for row in self.j_hat],
            # The arm draws' generator state as bytes (JSON- and weights_only-friendly).
            "generator": self.generator.get_state().tolist(),
        }

    def load_state_dict(self, state: dict) -> None:
        self.scores = np.asarray(state["scores"], dtype=np.float64)
        self.mu = float(state["mu"])
        if "j_hat" in state:  # absent in checkpoints before the best-response dual step
            self.j_hat = np.array(
                [[np.nan if x is None else x for x in row] for row in state["j_hat"]],
                dtype=np.float64,
            )
        if "generator" in state:
            self.generator.set_state(torch.as_tensor(state["generator"], dtype=torch.uint8))


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


def variance_proxy(
    shares: Sequence[float], variances: Sequence[float], rollouts: Sequence[float]
) -> float:
    """Eq. 28: VarProxy = sum_b q_b v_b / n_b over groups with n_b > 0, the quantity the square-root
    law minimises (Theorem 4.2; WSE above is minimised by n proportional to sigma^(2/3)
    instead)."""
    total = 0.0
    for q, v, n in zip(shares, variances, rollouts, strict=True):
        if n > 0:
            total += q * v / n
    return total


def shrunk_rate(successes: float, trials: float, prior_rate: float, prior_strength: float) -> float:
    """Posterior-mean success rate (s + k p0) / (n + k): ``prior_strength`` k pseudo-rollouts at
    ``prior_rate`` p0 (a Beta(k p0, k (1 - p0)) prior); p0 when n + k = 0."""
    if trials + prior_strength <= 0:
        return prior_rate
    return (successes + prior_strength * prior_rate) / (trials + prior_strength)


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


def level_key(value: Any) -> str | None:
    """A dataset row's ``difficulty`` as a level key: None when absent (or NaN), else str."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return str(value)


ALLOCATORS = ("sqrt", "bandit")
VARIANCE_MODES = ("prompt", "bin")
PROMPT_SIGNALS = ("pg_loss", "failure_rate")


class GDROCurriculum(GlobalBatchCurriculum):
    """Classifier, both adversaries and the diagnostics of section 4, shared by the two GDRO
    curricula; a subclass decides what the plan acts on (:meth:`rollout_counts`,
    :meth:`prompt_weights`). The adversary a curriculum does not act on still learns, so its
    diagnostics (bin weights, mu) are logged either way.

    The classifier (``classifier_signal``, ``unseen``: :class:`DifficultyClassifier`) records
    ``rollout_fraction`` (correct rollouts, rollouts) or ``any_correct`` (the paper's eq. 10 c(x))
    per appearance; with ``unseen="unseen"`` prompts never observed form their own group (index
    ``num_bins``, logged as ``..._bin_unseen``), with ``"hardest"`` they join bin 0, and with
    ``"difficulty"`` they are binned by the pooled per-rollout success rate of the prompts with the
    same ``difficulty`` value (the dataset rows' column) observed so far (over the last
    ``window`` steps that had that level), a level prior learned online; rows without the column
    and levels not observed yet use the unseen group. The levels of the global batch are gathered
    from every rank, so every rank bins the same way. With that mode a prompt's shrinkage target
    in the per-prompt variance is its level's rate where known.

    Rollout allocation (``allocator``): ``sqrt`` is the closed form (:func:`sqrt_allocation`,
    Theorem 4.2) and ``bandit`` is eqs. 19-21 (:class:`RolloutGDRO`). Both keep the step's total
    at prompts x mean_budget. The square-root law's variance (``variance``): ``prompt``, per prompt
    v_x = p_x (1 - p_x) with p_x its per-rollout success rate over its window shrunk towards its
    group's pooled rate by ``variance_prior`` pseudo-rollouts (:func:`shrunk_rate`; a group never
    observed uses the pooled rate of every group, 0.5 before any outcome); ``bin``, this library's
    earlier per-bin v_b = p_b (1 - p_b), p_b the bin's pooled per-rollout rate over its last
    ``window`` observed steps (an unobserved bin: the midpoint of its accuracy range). p (1 - p)
    is the per-rollout reward variance of a 0/1 reward, the right v for ``scale_rewards=none``.

    Prompt-GDRO's signal (``prompt_signal``): ``pg_loss``, the paper's per-response clipped
    policy loss (eqs. 5-6, unweighted advantages; the loss variant's
    :func:`~groupwise.core.sequence_surrogate`), or ``failure_rate``, 1 - correct per rollout.
    With one optimisation pass per batch the former is -A_i, whose mean over every group and
    so every bin is exactly 0, which leaves all bin weights equal (algorithms.md 1.1 [obs]).
    ``failure_rate`` with share normalisation is refused: dividing a mean by the bin's share
    ranks bins by rarity, not difficulty (the weights rise with p)."""

    def __init__(
        self,
        *,
        # the classifier (DifficultyClassifier's options)
        num_bins: int = 10,
        edges: Sequence[float] | None = None,
        window: int = 50,
        hysteresis: float = 0.0,
        classifier_signal: str = "rollout_fraction",
        unseen: str = "unseen",
        # the rollout budget and its allocation
        mean_budget: int = 4,
        n_min: int = 2,
        n_max: int = 12,
        allocator: str = "sqrt",
        variance: str = "prompt",
        variance_prior: float = 2.0,
        prompt_signal: str = "pg_loss",
        correct_threshold: float = 0.5,
        prompt_kwargs: dict | None = None,
        rollout_kwargs: dict | None = None,
        dist: DistributedContext | None = None,
    ) -> None:
        super().__init__(dist)
        for name, value, valid in (
            ("allocator", allocator, ALLOCATORS),
            ("prompt_signal", prompt_signal, PROMPT_SIGNALS),
            ("classifier_signal", classifier_signal, CLASSIFIER_SIGNALS),
            ("variance", variance, VARIANCE_MODES),
        ):
            if value not in valid:
                raise ValueError(f"{name} must be one of {list(valid)}, got {value!r}")
        if variance_prior < 0:
            raise ValueError(f"variance_prior must be >= 0, got {variance_prior}")
        self.prompt_signal, self.allocator = prompt_signal, allocator
        self.classifier_signal, self.variance, self.variance_prior = (
            classifier_signal, variance, variance_prior,
        )  # fmt: skip
        self.correct_threshold = correct_threshold
        self.classifier = DifficultyClassifier(num_bins, edges, window, hysteresis, unseen)
        states = self.classifier.num_states
        self.prompt_gdro = PromptGDRO(states, **(prompt_kwargs or {}))
        if prompt_signal == "failure_rate" and self.prompt_gdro.share_normalize:
            raise ValueError(
                "prompt_signal=failure_rate with share_normalize=True ranks bins by rarity, not "
                "difficulty (a mean divided by the bin's share); turn share_normalize off "
                "(gdro_share_normalize: false) or use prompt_signal=pg_loss"
            )
        self.rollout_gdro = RolloutGDRO(
            states, n_min=n_min, n_max=n_max, mean_budget=mean_budget, **(rollout_kwargs or {})
        )
        self.mean_budget, self.n_min, self.n_max = mean_budget, n_min, n_max
        # Per group, (correct rollouts, rollouts) of its last `window` observed steps (0: all).
        self.success: list[deque] = [deque(maxlen=window or None) for _ in range(states)]
        # unseen="difficulty": the same per difficulty level, and the levels of the step planned.
        self.window = window
        self.level_success: dict[str, deque] = {}
        self._levels: list[str | None] | None = None

    @classmethod
    def from_options(
        cls, options: Mapping[str, Any], dist: DistributedContext | None = None
    ) -> GDROCurriculum:
        """Built from a run's options (``GRPOConfig.to_dict()``): the ``gdro_*`` and
        ``rollout_*`` fields, ``num_generations`` as the mean rollout budget and ``seed`` for the
        arm draws."""
        o = options
        exp_weights = {"eta": o["gdro_eta"], "gamma": o["gdro_gamma"]}  # both adversaries'
        return cls(
            num_bins=o["gdro_num_bins"],
            edges=o["gdro_bin_edges"],
            window=o["gdro_window"],
            hysteresis=o["gdro_hysteresis"],
            classifier_signal=o["gdro_classifier_signal"],
            unseen=o["gdro_unseen"],
            mean_budget=o["num_generations"],
            n_min=o["rollout_min"],
            n_max=o["rollout_max"],
            allocator=o["rollout_allocator"],
            variance=o["rollout_variance"],
            variance_prior=o["rollout_variance_prior"],
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
                exp_weights,
                dual_lr=o["rollout_dual_lr"],
                score_decay=o["rollout_score_decay"],
                arm_choice=o["rollout_arm_choice"],
                mu_update=o["rollout_mu_update"],
                seed=o["seed"],
            ),
            dist=dist,
        )

    # -- what a subclass acts on ------------------------------------------------------------
    def rollout_counts(self, uids: Sequence[Hashable], bins: Sequence[int]) -> list[int]:
        """Rollouts per prompt of the global batch."""
        return [int(self.mean_budget)] * len(bins)

    def prompt_weights(self, bins: Sequence[int], counts: Sequence[int]) -> list[float]:
        """Per prompt, the multiplier of its rollouts' policy term."""
        return [1.0] * len(bins)

    # -- the protocol ---------------------------------------------------------------------------
    def plan(self, batch: PromptBatch) -> Plan:
        """Bins (from history up to the previous step), rollouts and weights per prompt."""
        self._levels = self._batch_levels(batch)
        priors = None if self._levels is None else [self._level_rate(x) for x in self._levels]
        bins = self.classifier.classify(batch.indices, priors)
        counts = self.rollout_counts(batch.indices, bins)
        return Plan(batch, counts, self.prompt_weights(bins, counts), bins)

    def _batch_levels(self, batch: PromptBatch) -> list[str | None] | None:
        """``unseen="difficulty"``: the ``difficulty`` value of every prompt of the global batch
        (gathered from every rank, which holds its own rows), as strings; None otherwise."""
        if self.classifier.unseen != "difficulty":
            return None
        mine = [level_key(row.get("difficulty")) for row in batch.rows]
        (levels,) = concat_over_ranks((mine,), self.dist)
        if len(levels) != len(batch.indices):
            raise ValueError(f"{len(levels)} rows for {len(batch.indices)} prompts")
        return list(levels)

    def _level_rate(self, level: str | None) -> float | None:
        """Pooled per-rollout success rate of the level's observed steps; None if none."""
        seen = self.level_success.get(level) if level is not None else None
        trials = sum(n for _, n in seen) if seen else 0
        return sum(s for s, _ in seen) / trials if trials else None

    def _pooled_rate(self, groups: Sequence[int]) -> float | None:
        """Per-rollout success rate pooled over the groups' windows; None without rollouts."""
        pairs = [pair for b in groups for pair in self.success[b]]
        trials = sum(n for _, n in pairs)
        return sum(s for s, _ in pairs) / trials if trials else None

    def _bin_success_rate(self, b: int) -> float:
        """``variance="bin"``: the bin's pooled rate, else the midpoint of its accuracy range
        (0.5 for the unseen state)."""
        rate = self._pooled_rate([b])
        if rate is not None:
            return rate
        if b >= self.classifier.num_bins:
            return 0.5
        edges = [0.0, *self.classifier.edges, 1.0]
        return (edges[b] + edges[b + 1]) / 2

    def prompt_variances(self, uids: Sequence[Hashable], bins: Sequence[int]) -> list[float]:
        """Held-out (history up to the previous step) per-prompt v_x = p_x (1 - p_x), p_x =
        :func:`shrunk_rate` of its window towards its group's pooled rate (else every group's,
        else 0.5), with ``variance_prior`` pseudo-rollouts."""
        overall = self._pooled_rate(range(len(self.success)))
        overall = 0.5 if overall is None else overall
        group_rate = {}
        for b in set(bins):
            rate = self._pooled_rate([b])
            group_rate[b] = overall if rate is None else rate
        levels = self._levels if self._levels is not None else [None] * len(uids)
        if len(levels) != len(uids):
            levels = [None] * len(uids)
        variances = []
        for uid, b, level in zip(uids, bins, levels, strict=True):
            successes, trials = self.classifier.counts(uid)
            target = self._level_rate(level)
            target = group_rate[b] if target is None else target
            p = shrunk_rate(successes, trials, target, self.variance_prior)
            variances.append(p * (1 - p))
        return variances

    def _state_name(self, b: int) -> str:
        return "unseen" if b == self.classifier.unseen_state else str(b)

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
        num_bins, states = self.classifier.num_bins, self.classifier.num_states
        metrics: dict[str, float] = {}

        # Diagnostics first: they describe the allocation and weights this step used.
        shares = np.bincount(np.asarray(bins, dtype=int), minlength=states) / max(len(bins), 1)
        rollouts = np.bincount(row_bins, minlength=states)
        sigmas = np.array(
            [reward[row_bins == b].std() if (row_bins == b).any() else 0.0 for b in range(states)]
        )
        per_prompt_n = np.array(
            [
                np.mean([counts[i] for i in range(len(bins)) if bins[i] == b]) if shares[b] else 0.0
                for b in range(states)
            ]
        )
        q = self.prompt_gdro.bin_weights()
        for b in range(states):
            name = self._state_name(b)
            metrics[f"curriculum/prompts_bin_{name}"] = float(shares[b] * len(bins))
            metrics[f"curriculum/rollouts_bin_{name}"] = float(rollouts[b])
            metrics[f"curriculum/weight_bin_{name}"] = float(q[b])
        # Eq. 33 with this step's in-sample sigma (the earlier diagnostic, kept comparable) ...
        metrics["curriculum/wse"] = weighted_standard_error(shares, sigmas, per_prompt_n)
        metrics["curriculum/wse_uniform"] = weighted_standard_error(
            shares, sigmas, [self.mean_budget if s else 0 for s in shares]
        )
        # ... and from held-out per-prompt estimates (history before this step), with the
        # quantity the square-root law minimises, eq. 28: every prompt
        # is its own stratum of share 1/N.
        held_out = self.prompt_variances(uids, bins)
        each = [1.0 / max(len(bins), 1)] * len(bins)
        uniform = [self.mean_budget] * len(bins)
        sigma_x = np.sqrt(held_out)
        metrics["curriculum/var_proxy"] = variance_proxy(each, held_out, counts)
        metrics["curriculum/var_proxy_uniform"] = variance_proxy(each, held_out, uniform)
        metrics["curriculum/wse_heldout"] = weighted_standard_error(each, sigma_x, counts)
        metrics["curriculum/wse_heldout_uniform"] = weighted_standard_error(each, sigma_x, uniform)
        # Lead-lag over the difficulty bins only (the unseen state has no place in their order).
        present = shares[:num_bins] > 0
        mu_data, mu_weight, delta = lead_lag(shares[:num_bins], q[:num_bins] * present)
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
        hits = np.bincount(row_prompt, weights=correct, minlength=len(bins)).astype(int)
        trials = np.bincount(row_prompt, minlength=len(bins))
        if self._levels is not None and len(self._levels) == len(bins):
            by_level: dict[str, list[int]] = {}
            for i, level in enumerate(self._levels):
                if level is not None and trials[i]:
                    pair = by_level.setdefault(level, [0, 0])
                    pair[0] += int(hits[i])
                    pair[1] += int(trials[i])
            for level, (s, n) in by_level.items():
                self.level_success.setdefault(level, deque(maxlen=self.window or None))
                self.level_success[level].append((s, n))
        if self.classifier_signal == "any_correct":  # eq. 10: c(x) = any of this step's rollouts
            self.classifier.update(uids, (hits > 0).tolist())
        else:  # per-rollout success fraction; a prompt without rows learns nothing
            seen = [i for i in range(len(bins)) if trials[i]]
            self.classifier.update(
                [uids[i] for i in seen],
                [int(hits[i]) for i in seen],
                [int(trials[i]) for i in seen],
            )
        return metrics

    def state_dict(self) -> dict:
        return {
            "classifier": self.classifier.state_dict(),
            "prompt_gdro": self.prompt_gdro.state_dict(),
            "rollout_gdro": self.rollout_gdro.state_dict(),
            "success": [[list(x) for x in d] for d in self.success],
            "levels": {k: [list(x) for x in d] for k, d in self.level_success.items()},
        }

    def load_state_dict(self, state: dict) -> None:
        if len(state["success"]) != len(self.success):  # before anything is loaded
            raise ValueError(
                f"the checkpoint's curriculum has {len(state['success'])} groups, this run "
                f"{len(self.success)}: gdro_num_bins or gdro_unseen differ (a checkpoint from "
                "before gdro_unseen existed needs gdro_unseen: hardest)"
            )
        self.classifier.load_state_dict(state["classifier"])
        self.prompt_gdro.load_state_dict(state["prompt_gdro"])
        self.rollout_gdro.load_state_dict(state["rollout_gdro"])
        for d, items in zip(self.success, state["success"], strict=True):
            d.clear()
            d.extend(tuple(x) for x in items)
        self.level_success = {
            k: deque((tuple(x) for x in items), maxlen=self.window or None)
            for k, items in state.get("levels", {}).items()
        }


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
    """Rollout-GDRO (section 3.3): weight 1; rollouts per prompt under a fixed mean budget, by the
    square-root law (eq. 30, per prompt or per bin) or the bandits with a shadow price
    (eqs. 19-21)."""

    def rollout_counts(self, uids: Sequence[Hashable], bins: Sequence[int]) -> list[int]:
        if self.allocator == "bandit":
            return self.rollout_gdro.allocate(bins)
        if self.variance == "bin":
            p = [self._bin_success_rate(b) for b in range(self.classifier.num_states)]
            variances = [x * (1 - x) for x in p]
            return sqrt_allocation(bins, variances, self.mean_budget, self.n_min, self.n_max)
        # Per prompt: every prompt is its own stratum of eq. 30.
        variances = self.prompt_variances(uids, bins)
        return sqrt_allocation(
            list(range(len(bins))), variances, self.mean_budget, self.n_min, self.n_max
        )
