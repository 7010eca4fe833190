"""Predictive prompt selection with adaptive group size (``curriculum: select``).

Why: simulations of the curriculum find that *which* prompts are rolled out has far more
leverage than how rollouts are spread over them. Peers: GRESO (Zheng et al. 2025, "Act Only When
It Pays", arXiv 2506.02177) skips prompts whose recent groups had zero variance *before*
rollout, keeping each with a probability that falls geometrically with the number of such groups
in a row; Knapsack RL (arXiv 2509.25849) sizes groups by their value.

The method, per step (every rank runs it on the same global draw with the same state and RNG):

1. :meth:`SelectCurriculum.choose`: the prompt sampler draws ``oversample`` candidates per slot of
   the global batch (4 by default; never the same prompt twice in one draw). Each candidate has
   a Beta posterior of its pass rate p (:func:`posterior`: a prior from its ``difficulty``
   level's pooled pass rate, else the global pool, plus its own recency-weighted rollout
   outcomes), which predicts the probability that a group of G = ``num_generations`` rollouts
   is informative (not all alike), ``P_inf = E[1 - p^G - (1 - p)^G]``
   (:func:`informative_probability`). ``rule``:

   - ``best_k`` (default): GRESO's keep rule first. A candidate whose last z groups were all
     alike (:func:`groupwise.algo.advantages.informative_groups` false) stays a candidate with
     probability ``max(keep^z, keep_floor)`` (:func:`keep_probability`; 1 at z = 0). That random
     keep is the exploration: a prompt is never skipped for good, and a prompt whose groups turned
     informative again is back at z = 0. Of the candidates kept, the ``count`` with the largest
     ``P_inf`` are rolled out (:func:`best_k`); when too few were kept, the best of the others
     fill up. Ties are broken by a seeded random order.
   - ``legacy``: the earlier rule, kept for comparison. The score ``P_inf`` is raised towards 1 by
     a retry chance that grows with the times a prompt was skipped in a row
     (:func:`retry_probability`) and mixed with a ``uniform_mix`` floor
     (:func:`selection_weights`); ``count`` candidates are drawn without replacement with
     probability ∝ weight (:func:`weighted_choice`, Efraimidis-Spirakis).

   The rest are skipped: no rollout, and the sampler moves past them for this epoch.
2. :meth:`SelectCurriculum.plan`: group sizes n_i in [n_min, n_max] with sum n_i = count * G
   exactly: ``knapsack`` (:func:`knapsack_allocation`, greedy on the concave expected
   informative-group value, optimal for unit costs), ``sqrt`` (the square-root law on the posterior
   E[p(1 - p)], :func:`groupwise.curriculum.allocation.sqrt_allocation`) or ``uniform``. With
   ``equal_prompt_weight`` each prompt's policy term is weighted G / n_i, so a prompt's weight in
   the loss does not grow with its group size (a row mean weights prompts ∝ n).
3. :meth:`SelectCurriculum.observe_global`: every rank's rows; each prompt's evidence is
   discounted by ``discount`` and its new correct/incorrect counts added (correct = correctness
   score > ``correct_threshold``, as GDRO); its level's pool likewise; its count z of all-alike
   groups in a row is reset by an informative group and raised by one otherwise.

Why over-sampling rather than ``counts = 0`` for skipped prompts: the batch keeps
``prompts_per_step`` distinct prompts, no engine, advantage, loss or data-parallel rank ever sees
an empty group or an empty share, and the rollout budget per step is exactly that of uniform
GRPO. The price is a sampler hook (:meth:`groupwise.curriculum.base.Curriculum.choose`) and an
epoch that passes ``oversample`` times faster. Sequential top-up within a step (Reinforce-Ada,
``select_top_up``) is :mod:`groupwise.curriculum.topup`: it spends the same budget in rounds, on
groups still uniform.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from ..algo.advantages import informative_groups
from ..runtime.distributed import DistributedContext
from ..sections.curriculum import SelectOptions
from .allocation import sqrt_allocation
from .base import GlobalBatchCurriculum, GlobalRows, Plan, PromptBatch

# Candidates per prompt slot when ``oversample`` is not given: best_k gains up to about 4 (its
# keep rule keeps it exploring); legacy's proportional draw was run at 2.
DEFAULT_OVERSAMPLE = {"best_k": 4, "legacy": 2}

# ----------------------------------------------------------------------------------------------
# The posterior and its predictions (pure functions)


def beta_moment(alpha: float, beta: float, n: int) -> float:
    """E[p^n] for p ~ Beta(alpha, beta): prod_{k<n} (alpha + k) / (alpha + beta + k)."""
    value = 1.0
    for k in range(n):
        value *= (alpha + k) / (alpha + beta + k)
    return value


def informative_probability(alpha: float, beta: float, n: int) -> float:
    """Predicted probability that n Bernoulli(p) rollouts are not all the same, p ~ Beta:
    E[1 - p^n - (1 - p)^n] = 1 - E[p^n] - E[(1 - p)^n]. 0 for n <= 1."""
    if n <= 1:
        return 0.0
    return max(0.0, 1.0 - beta_moment(alpha, beta, n) - beta_moment(beta, alpha, n))


def expected_variance(alpha: float, beta: float) -> float:
    """E[p (1 - p)] for p ~ Beta(alpha, beta) = alpha beta / ((alpha + beta)(alpha + beta + 1))."""
    total = alpha + beta
    return alpha * beta / (total * (total + 1.0))


def pooled_mean(successes: float, failures: float) -> float:
    """A level's pass rate, Laplace-smoothed: (S + 1) / (S + F + 2) (0.5 with no evidence)."""
    return (successes + 1.0) / (successes + failures + 2.0)


def posterior(
    prior_mean: float, strength: float, successes: float, failures: float
) -> tuple[float, float]:
    """Beta(strength * m + s, strength * (1 - m) + f): the level prior (mean m, ``strength``
    pseudo-rollouts) plus the prompt's own recency-weighted counts."""
    return strength * prior_mean + successes, strength * (1.0 - prior_mean) + failures


def discounted(old: float, new: float, discount: float) -> float:
    """Recency weighting: old evidence x discount + the new observation."""
    return discount * old + new


def keep_probability(zero_variance_streak: int, keep: float, floor: float) -> float:
    """GRESO's keep rule (Zheng et al. 2025, arXiv 2506.02177, its probabilistic pre-rollout
    filter): a prompt whose last z groups all had zero variance stays a candidate with
    probability max(keep^z, floor), so 1 at z = 0, ``keep`` after one all-alike group, and never
    below ``floor`` (the chance to find that a prompt has become informative again)."""
    return max(keep ** max(zero_variance_streak, 0), floor)


def best_k(
    informative: Sequence[float],
    kept: Sequence[bool],
    count: int,
    tie_order: Sequence[int],
    eligible: Sequence[bool] | None = None,
) -> list[int]:
    """The positions of the ``count`` candidates to roll out, in increasing order: the kept ones
    with the largest predicted informative-group probability, then (when fewer than ``count``
    were kept) the best of the others; ``eligible`` false (a repeat of an earlier candidate)
    comes last. Equal probabilities are ordered by ``tie_order`` (a random permutation: lower
    first), so ties are broken at random but reproducibly."""
    m = len(informative)
    ok = [True] * m if eligible is None else list(eligible)
    order = sorted(
        range(m),
        key=lambda i: (not ok[i], not (ok[i] and kept[i]), -informative[i], tie_order[i]),
    )
    return sorted(order[:count])


def first_occurrences(indices: Sequence[int]) -> list[bool]:
    """Per position, whether it is the first of its index in ``indices`` (a later repeat would
    roll the same prompt out twice in one step)."""
    seen: set[int] = set()
    first = []
    for index in indices:
        first.append(index not in seen)
        seen.add(index)
    return first


def retry_probability(skips: float, half_life: float) -> float:
    """``legacy`` rule: chance that a prompt predicted uninformative is retried anyway, growing
    with the times it was skipped in a row since its last rollout: 1 - 2^(-skips/half_life), so
    0 after a rollout, 1/2 after ``half_life`` skips, -> 1. (Added to the score, it pulls every
    candidate towards a uniform draw as skips pile up; GRESO's rule is :func:`keep_probability`.)"""
    return 1.0 - 2.0 ** (-max(skips, 0.0) / half_life)


def selection_weights(
    informative: Sequence[float], retry: Sequence[float], uniform_mix: float
) -> np.ndarray:
    """``legacy`` rule: per candidate, its share of the draw: score s = P_inf + (1 - P_inf) *
    retry (the retry lifts a predicted-uninformative prompt), normalised, mixed with a uniform
    floor:
    (1 - mix) s / sum(s) + mix / M. Sums to 1."""
    p = np.asarray(informative, dtype=np.float64)
    score = p + (1.0 - p) * np.asarray(retry, dtype=np.float64)
    m = len(score)
    if m == 0:
        return score
    total = score.sum()
    share = score / total if total > 0 else np.full(m, 1.0 / m)
    return (1.0 - uniform_mix) * share + uniform_mix / m


def weighted_choice(weights: Sequence[float], count: int, uniforms: Sequence[float]) -> list[int]:
    """``legacy`` rule: ``count`` positions drawn without replacement with probability ∝ weight
    (Efraimidis-Spirakis: the ``count`` largest keys u_i^(1/w_i), compared as log(u_i) / w_i),
    returned in increasing order. Weight 0 is never drawn before a positive weight."""
    w = np.asarray(weights, dtype=np.float64)
    u = np.clip(np.asarray(uniforms, dtype=np.float64), 1e-300, 1.0)
    with np.errstate(divide="ignore"):
        keys = np.where(w > 0, np.log(u) / np.where(w > 0, w, 1.0), -np.inf)
    order = sorted(range(len(w)), key=lambda i: (-keys[i], i))  # ties: lower position first
    return sorted(order[:count])


def budget(count: int, mean: int, n_min: int, n_max: int) -> int:
    """The step's rollouts: count x mean, clipped to what the bounds can reach."""
    return min(max(count * mean, count * n_min), count * n_max)


def knapsack_allocation(
    alphas: Sequence[float], betas: Sequence[float], total: int, n_min: int, n_max: int
) -> list[int]:
    """Group sizes maximising the expected number of informative groups,
    sum_i P_inf(alpha_i, beta_i, n_i), with n_min <= n_i <= n_max and sum n_i = ``total``
    (Knapsack RL's value with unit costs). P_inf is concave in n for every p (its gain from n to
    n + 1, p^n (1 - p) + (1 - p)^n p, falls with n), so an expectation of it is too, and adding
    one rollout at a time where the gain is largest is optimal. Ties: lowest position."""
    m = len(alphas)
    if m == 0:
        return []
    total = min(max(total, m * n_min), m * n_max)
    n = [n_min] * m
    value = [informative_probability(a, b, n_min) for a, b in zip(alphas, betas, strict=True)]
    gain = [
        informative_probability(a, b, n_min + 1) - v if n_min < n_max else -math.inf
        for a, b, v in zip(alphas, betas, value, strict=True)
    ]
    for _ in range(total - m * n_min):
        i = max(range(m), key=lambda j: (gain[j], -j))
        n[i] += 1
        value[i] += gain[i]
        gain[i] = (
            informative_probability(alphas[i], betas[i], n[i] + 1) - value[i]
            if n[i] < n_max
            else -math.inf
        )
    return n


# ----------------------------------------------------------------------------------------------
# The curriculum


class SelectCurriculum(GlobalBatchCurriculum):
    """Predictive prompt selection with adaptive group size (see the module docstring).

    State (checkpointed, identical on every rank): per prompt (dataset index) its discounted
    correct and incorrect rollout counts, its all-alike groups in a row (``best_k``) and the
    times it was skipped since its last rollout (``legacy``); per difficulty level the pooled
    discounted counts; each candidate's level; the step count and the RNG.

    Its options (:class:`~groupwise.sections.curriculum.SelectOptions`) are the module
    docstring's names with the ``select_`` prefix (``select_oversample``, ``select_rule``, ...),
    ``rollout_min`` and ``rollout_max`` (n_min, n_max), ``num_generations`` (G),
    ``gdro_correct_threshold`` and ``seed``."""

    options_type = SelectOptions

    def __init__(
        self,
        options: SelectOptions,
        dist: DistributedContext | None = None,
        difficulty_column: str = "difficulty",
    ) -> None:
        super().__init__(dist)
        # Every option was checked when ``options`` was made (groupwise.sections.curriculum).
        self.options = options
        rule = options.select_rule
        oversample = options.select_oversample
        self.mean = options.num_generations  # G, the mean group size
        self.n_min, self.n_max = options.rollout_min, options.rollout_max
        self.rule, self.discount = rule, options.select_discount
        self.oversample = DEFAULT_OVERSAMPLE[rule] if oversample is None else oversample
        self.keep, self.keep_floor = options.select_keep, options.select_keep_floor
        self.prior_strength = options.select_prior_strength
        self.retry_half_life = options.select_retry_half_life
        self.uniform_mix, self.allocator = options.select_uniform_mix, options.select_allocator
        self.equal_prompt_weight = options.select_equal_prompt_weight
        self.correct_threshold = options.gdro_correct_threshold
        self.difficulty_column = difficulty_column
        self.rng = np.random.Generator(np.random.PCG64(options.seed))
        self.step = 0
        self.evidence: dict[int, list[float]] = {}  # index -> [successes, failures]
        self.streaks: dict[int, int] = {}  # index -> all-alike groups in a row (best_k)
        self.skips: dict[int, int] = {}  # index -> times skipped since its last rollout (legacy)
        self.pools: dict[str, list[float]] = {}  # level -> [successes, failures]
        self.level_of: dict[int, str] = {}  # index -> level ("" without a difficulty column)
        # This step's decisions, for its log (not state: a checkpoint falls between steps).
        self._chosen: dict[str, float] = {}
        self._predicted: list[float] = []

    @classmethod
    def from_options(
        cls, options: SelectOptions | Any, dist: DistributedContext | None = None
    ) -> SelectCurriculum:
        """From a run's options: a :class:`~groupwise.sections.curriculum.SelectOptions`, or a
        ``GRPOConfig`` (or its ``to_dict()``) read into one (checked, errors naming the option)."""
        o = options if isinstance(options, SelectOptions) else SelectOptions.from_config(options)
        return cls(o, dist)

    # -- the posterior of a prompt ------------------------------------------------------------
    def level(self, row: Mapping[str, Any] | None) -> str:
        value = None if row is None else row.get(self.difficulty_column)
        return "" if value is None else str(value)

    def beta_of(self, index: int) -> tuple[float, float]:
        """The Beta posterior of a prompt's pass rate (its level's prior plus its evidence)."""
        pool = self.pools.get(self.level_of.get(index, ""), [0.0, 0.0])
        s, f = self.evidence.get(index, [0.0, 0.0])
        return posterior(pooled_mean(*pool), self.prior_strength, s, f)

    # -- before rollout: which prompts -----------------------------------------------------------
    def candidates(self, count: int) -> int:
        return count * self.oversample

    def choose(self, indices: list[int], rows: list[dict[str, Any]], count: int) -> list[int]:
        """Positions in ``indices`` (the global draw) of the ``count`` prompts to roll out."""
        for index, row in zip(indices, rows, strict=True):
            self.level_of[index] = self.level(row)
        if len(indices) <= count:
            self._chosen = {}
            return list(range(len(indices)))
        informative = [informative_probability(*self.beta_of(i), self.mean) for i in indices]
        if self.rule == "legacy":
            picked = self._choose_legacy(indices, informative, count)
            kept = len(indices)
        else:
            keep = [
                keep_probability(self.streaks.get(i, 0), self.keep, self.keep_floor)
                for i in indices
            ]
            survived = (self.rng.random(len(indices)) < np.asarray(keep)).tolist()
            tie_order = self.rng.permutation(len(indices)).tolist()
            picked = best_k(informative, survived, count, tie_order, first_occurrences(indices))
            kept = sum(survived)
        chosen = set(picked)
        skipped = [k for k in range(len(indices)) if k not in chosen]
        self._chosen = {
            "predicted_informative_chosen": float(np.mean([informative[k] for k in picked])),
            "predicted_informative_skipped": float(np.mean([informative[k] for k in skipped])),
            "kept": float(kept),
        }
        return picked

    def _choose_legacy(self, indices: list[int], informative: list[float], count: int) -> list[int]:
        retry = [retry_probability(self.skips.get(i, 0), self.retry_half_life) for i in indices]
        weights = selection_weights(informative, retry, self.uniform_mix)
        picked = weighted_choice(weights, count, self.rng.random(len(indices)))
        chosen = set(picked)
        for k in range(len(indices)):
            if k not in chosen:
                self.skips[indices[k]] = self.skips.get(indices[k], 0) + 1
        return picked

    # -- the plan: how many rollouts each ----------------------------------------------------
    def group_sizes(self, indices: Sequence[int]) -> list[int]:
        total = budget(len(indices), self.mean, self.n_min, self.n_max)
        if self.allocator == "uniform" or not indices:
            return [self.mean] * len(indices)
        betas = [self.beta_of(i) for i in indices]
        if self.allocator == "knapsack":
            return knapsack_allocation(
                [a for a, _ in betas], [b for _, b in betas], total, self.n_min, self.n_max
            )
        variances = [expected_variance(a, b) for a, b in betas]
        return sqrt_allocation(
            list(range(len(indices))), variances, total / len(indices), self.n_min, self.n_max
        )

    def plan(self, batch: PromptBatch) -> Plan:
        if len(batch.rows) == len(batch.indices):  # one process: the rows are all here
            for index, row in zip(batch.indices, batch.rows, strict=True):
                self.level_of.setdefault(index, self.level(row))
        counts = self.group_sizes(batch.indices)
        self._predicted = [
            informative_probability(*self.beta_of(i), n)
            for i, n in zip(batch.indices, counts, strict=True)
        ]
        return Plan(batch, counts, self.weights_for(counts))

    def weights_for(self, counts: Sequence[int]) -> list[float]:
        """Each prompt's weight for groups of ``counts``: num_generations / n_i with
        ``equal_prompt_weight``, else 1 (also for the realised sizes after a top-up)."""
        if self.equal_prompt_weight:
            return [self.mean / n for n in counts]
        return [1.0] * len(counts)

    # -- after the update: learn -------------------------------------------------------------
    def observe_global(self, plan: Plan, rows: GlobalRows) -> dict[str, float]:
        indices, counts = plan.batch.indices, plan.counts
        prompt = np.asarray(rows.prompt, dtype=int)
        scores = np.nan_to_num(np.asarray(rows.correctness, dtype=np.float64), nan=-math.inf)
        correct = scores > self.correct_threshold
        n = np.bincount(prompt, minlength=len(indices))
        c = np.bincount(prompt, weights=correct.astype(np.float64), minlength=len(indices))
        informative = informative_groups(
            torch.as_tensor(rows.correctness, dtype=torch.float64),
            torch.as_tensor(prompt, dtype=torch.long),
            num_groups=len(indices),
        ).numpy()
        self.step += 1
        level_counts: dict[str, list[float]] = {}
        for i, index in enumerate(indices):
            s, f = self.evidence.get(index, [0.0, 0.0])
            successes, failures = float(c[i]), float(n[i] - c[i])
            self.evidence[index] = [
                discounted(s, successes, self.discount),
                discounted(f, failures, self.discount),
            ]
            self.skips.pop(index, None)
            self.streaks[index] = 0 if informative[i] else self.streaks.get(index, 0) + 1
            pool = level_counts.setdefault(self.level_of.get(index, ""), [0.0, 0.0])
            pool[0] += successes
            pool[1] += failures
        for key, (successes, failures) in level_counts.items():
            old = self.pools.get(key, [0.0, 0.0])
            self.pools[key] = [
                discounted(old[0], successes, self.discount),
                discounted(old[1], failures, self.discount),
            ]
        rollouts = int(n.sum())
        metrics = {
            "curriculum/select/skipped": float(len(getattr(plan.batch, "skipped", []))),
            "curriculum/select/group_size_mean": float(np.mean(counts)) if counts else 0.0,
            "curriculum/select/group_size_min": float(min(counts, default=0)),
            "curriculum/select/group_size_max": float(max(counts, default=0)),
            "curriculum/select/rollouts": float(rollouts),
            "curriculum/select/informative_predicted": float(sum(self._predicted)),
            "curriculum/select/informative": float(informative.sum()),
            "curriculum/select/informative_per_rollout": float(informative.sum())
            / max(rollouts, 1),
        }
        for key in ("predicted_informative_chosen", "predicted_informative_skipped", "kept"):
            if key in self._chosen:
                metrics[f"curriculum/select/{key}"] = self._chosen[key]
        self._chosen = {}
        return metrics

    # -- checkpoints ---------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {
            "step": self.step,
            "evidence": {int(k): list(v) for k, v in self.evidence.items()},
            "skips": {int(k): int(v) for k, v in self.skips.items()},
            "streaks": {int(k): int(v) for k, v in self.streaks.items()},
            "pools": {k: list(v) for k, v in self.pools.items()},
            "level_of": {int(k): v for k, v in self.level_of.items()},
            "rng": _rng_state(self.rng),
        }

    def load_state_dict(self, state: dict) -> None:
        self.step = int(state["step"])
        self.evidence = {int(k): [float(x) for x in v] for k, v in state["evidence"].items()}
        self.skips = {int(k): int(v) for k, v in state["skips"].items()}
        self.streaks = {int(k): int(v) for k, v in state.get("streaks", {}).items()}
        self.pools = {str(k): [float(x) for x in v] for k, v in state["pools"].items()}
        self.level_of = {int(k): str(v) for k, v in state["level_of"].items()}
        self.rng.bit_generator.state = _rng_from_plain(state["rng"])


def _rng_state(rng: np.random.Generator) -> dict:
    """PCG64 state as strings (its 128-bit integers do not survive every serialiser)."""
    s = rng.bit_generator.state
    return {
        "state": str(s["state"]["state"]),
        "inc": str(s["state"]["inc"]),
        "has_uint32": int(s["has_uint32"]),
        "uinteger": int(s["uinteger"]),
    }


def _rng_from_plain(plain: dict) -> dict:
    return {
        "bit_generator": "PCG64",
        "state": {"state": int(plain["state"]), "inc": int(plain["inc"])},
        "has_uint32": int(plain["has_uint32"]),
        "uinteger": int(plain["uinteger"]),
    }
