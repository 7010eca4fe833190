"""The two adversaries of Multi-Adversary GDRO (Panaganti et al., arXiv 2601.19280;
docs/algorithms.md section 1): Prompt-GDRO's exponential weights over bins (section 3.2,
eqs. 12-16) and Rollout-GDRO's per-bin bandits over rollout counts with a shadow price
(section 3.3, eqs. 17-21), with the exact-budget joint choice of arms (eq. 20).

Plain numpy; the arm draws use a seeded ``torch.Generator``; each adversary holds its state in a
``state_dict``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from ..sections.curriculum import GDROOptions

# ----------------------------------------------------------------------------------------------
# Prompt-GDRO: EMA-debiased exponential weights (section 3.2)


def exp3_weights(scores: np.ndarray, eta: float, gamma: float) -> np.ndarray:
    """``(1 - gamma) softmax(eta * scores) + gamma / len(scores)``: both adversaries' choice
    probabilities (eq. 15 over bins, EXP3P-style over arms), every choice kept >= gamma / K."""
    z = eta * scores
    soft = np.exp(z - z.max())
    soft /= soft.sum()
    return (1 - gamma) * soft + gamma / len(scores)


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
    The attributes are the options ``gdro_eta``, ``gdro_gamma``, ``gdro_ema_beta``, ``gdro_clip``,
    ``gdro_weight_cap`` and ``gdro_share_normalize``, whose defaults are the paper's
    (App. A.2.1): eta 0.65, gamma 0.01, EMA beta 0.12, cap 15. The paper's clip C is unspecified
    there; ``gdro_clip: null`` turns it off.
    """

    def __init__(self, num_bins: int, options: GDROOptions, share_floor: float = 1e-3) -> None:
        # gdro_eta, gdro_gamma, gdro_ema_beta, gdro_clip, gdro_weight_cap, gdro_share_normalize:
        # their ranges are checked by the options (groupwise.sections.curriculum).
        self.num_bins = num_bins
        self.eta, self.gamma = options.gdro_eta, options.gdro_gamma
        self.ema_beta = options.gdro_ema_beta
        self.clip, self.weight_cap = options.gdro_clip, options.gdro_weight_cap
        self.share_normalize, self.share_floor = options.gdro_share_normalize, share_floor
        self.scores: list[float | None] = [None] * num_bins

    def bin_weights(self) -> np.ndarray:
        """q_b of eq. 15 for every bin."""
        s = np.array([0.0 if v is None else v for v in self.scores])
        if self.clip is not None:
            s = np.clip(s, -self.clip, self.clip)
        return exp3_weights(s, self.eta, self.gamma)

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
    The attributes are options: arms ``rollout_min``..``rollout_max``, the mean budget
    ``num_generations``, ``gdro_eta``, ``gdro_gamma``, ``rollout_dual_lr``,
    ``rollout_score_decay``, ``rollout_arm_choice``, ``rollout_mu_update``. The paper's settings
    (App. A.2.2) are arms 2..12, mean budget 4, eta 0.65, gamma 0.01, dual_lr 0.05, score decay
    0.4; the options' defaults are those but for the mean budget.
    """

    def __init__(self, num_bins: int, options: GDROOptions) -> None:
        # Arms rollout_min..rollout_max around the mean budget num_generations, gdro_eta,
        # gdro_gamma and the rollout_* options of the bandits and the dual step, all checked by
        # the options (groupwise.sections.curriculum); seed seeds the arm draws.
        n_min, n_max = options.rollout_min, options.rollout_max
        self.num_bins = num_bins
        self.arms = list(range(n_min, n_max + 1))
        self.n_min, self.n_max, self.mean_budget = n_min, n_max, options.num_generations
        self.eta, self.gamma = options.gdro_eta, options.gdro_gamma
        self.dual_lr, self.score_decay = options.rollout_dual_lr, options.rollout_score_decay
        self.arm_choice, self.mu_update = options.rollout_arm_choice, options.rollout_mu_update
        self.scores = np.zeros((num_bins, len(self.arms)))
        self.j_hat = np.full((num_bins, len(self.arms)), np.nan)
        self.mu = 0.0
        self.generator = torch.Generator().manual_seed(options.seed)

    def arm_probs(self, b: int) -> np.ndarray:
        return exp3_weights(self.scores[b], self.eta, self.gamma)

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
