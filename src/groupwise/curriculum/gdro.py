"""Difficulty-aware curricula: Prompt-GDRO and Rollout-GDRO.

Multi-Adversary GDRO (Panaganti et al., arXiv 2601.19280; docs/algorithms.md section 1). This
package follows the paper's equations, not the released verl patch (algorithms.md 1.4 lists its
defects). Two curricula are built on the same observer (:class:`GDROCurriculum`):

- :class:`PromptGDROCurriculum`: every prompt gets G rollouts; its rollouts' policy term is
  weighted by its bin's adversary weight (:meth:`~.adversary.PromptGDRO.sample_weights`, eq. 16);
- :class:`RolloutGDROCurriculum`: weight 1, rollouts per prompt from the closed form
  :func:`~.allocation.sqrt_allocation` (eq. 30, per prompt by default) or
  :meth:`~.adversary.RolloutGDRO.allocate` (eqs. 19-21).

Their parts: the difficulty classifier (:mod:`.bins`), the two adversaries (:mod:`.adversary`),
the square-root law (:mod:`.allocation`) and the section 4 diagnostics (:mod:`.diagnostics`); each
is built from the run's typed options (:class:`~groupwise.sections.curriculum.GDROOptions`). The
options' defaults (``groupwise.config.grpo_config``) differ from the paper where simulations show
the paper's choice uninformative (the per-rollout classifier, the unseen group, the per-prompt
square-root law, sampled arms, mu on the best response); each paper choice stays one option away.
Everything is plain Python / numpy (the arm draws use a ``torch.Generator``) and holds its state
in a ``state_dict``.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Hashable, Sequence
from typing import Any

import numpy as np

from ..runtime.distributed import DistributedContext, concat_over_ranks
from ..sections.curriculum import GDROOptions
from .adversary import PromptGDRO, RolloutGDRO
from .allocation import shrunk_rate, sqrt_allocation
from .base import GlobalBatchCurriculum, GlobalRows, Plan, PromptBatch
from .bins import DifficultyClassifier, level_key
from .diagnostics import step_metrics


class GDROCurriculum(GlobalBatchCurriculum):
    """Classifier, both adversaries and the diagnostics of section 4, shared by the two GDRO
    curricula; a subclass decides what the plan acts on (:meth:`rollout_counts`,
    :meth:`prompt_weights`). The adversary a curriculum does not act on still learns, so its
    diagnostics (bin weights, mu) are logged either way.

    The classifier (``gdro_classifier_signal``, ``gdro_unseen``: :class:`DifficultyClassifier`)
    records ``rollout_fraction`` (correct rollouts, rollouts) or ``any_correct`` (the paper's
    eq. 10 c(x)) per appearance; with ``unseen`` prompts never observed form their own group
    (index ``num_bins``, logged as ``..._bin_unseen``), with ``hardest`` they join bin 0, and
    with ``difficulty`` they are binned by the pooled per-rollout success rate of the prompts with
    the same ``difficulty`` value (the dataset rows' column) observed so far (over the last
    ``gdro_window`` steps that had that level), a level prior learned online; rows without the
    column and levels not observed yet use the unseen group. The levels of the global batch are
    gathered from every rank, so every rank bins the same way. With that mode a prompt's
    shrinkage target in the per-prompt variance is its level's rate where known.

    Rollout allocation (``rollout_allocator``): ``sqrt`` is the closed form
    (:func:`sqrt_allocation`, Theorem 4.2) and ``bandit`` is eqs. 19-21 (:class:`RolloutGDRO`).
    Both keep the step's total at prompts x mean_budget (``num_generations``). The square-root
    law's variance (``rollout_variance``): ``prompt``, per prompt v_x = p_x (1 - p_x) with p_x its
    per-rollout success rate over its window shrunk towards its group's pooled rate by
    ``rollout_variance_prior`` pseudo-rollouts (:func:`shrunk_rate`; a group never observed uses
    the pooled rate of every group, 0.5 before any outcome); ``bin``, this library's earlier
    per-bin v_b = p_b (1 - p_b), p_b the bin's pooled per-rollout rate over its last
    ``gdro_window`` observed steps (an unobserved bin: the midpoint of its accuracy range).
    p (1 - p) is the per-rollout reward variance of a 0/1 reward, the right v for
    ``scale_rewards=none``.

    Prompt-GDRO's signal (``gdro_signal``): ``pg_loss``, the paper's per-response clipped
    policy loss (eqs. 5-6, unweighted advantages; the loss variant's
    :func:`~groupwise.algo.grpo.sequence_surrogate`), or ``failure_rate``, 1 - correct per rollout.
    With one optimisation pass per batch the former is -A_i, whose mean over every group and
    so every bin is exactly 0, which leaves all bin weights equal (algorithms.md 1.1 [obs]).
    The options refuse ``failure_rate`` with share normalisation: dividing a mean by the bin's
    share ranks bins by rarity, not difficulty (the weights rise with p)."""

    options_type = GDROOptions

    def __init__(self, options: GDROOptions, dist: DistributedContext | None = None) -> None:
        super().__init__(dist)
        # Every option was checked when ``options`` was made (groupwise.sections.curriculum).
        self.options = options
        self.prompt_signal, self.allocator = options.gdro_signal, options.rollout_allocator
        self.classifier_signal = options.gdro_classifier_signal
        self.variance = options.rollout_variance
        self.variance_prior = options.rollout_variance_prior
        self.correct_threshold = options.gdro_correct_threshold
        self.classifier = DifficultyClassifier(options)
        states = self.classifier.num_states
        self.prompt_gdro = PromptGDRO(states, options)
        self.rollout_gdro = RolloutGDRO(states, options)
        self.mean_budget = options.num_generations
        self.n_min, self.n_max = options.rollout_min, options.rollout_max
        # Per group, (correct rollouts, rollouts) of its last `window` observed steps (0: all).
        self.window = window = options.gdro_window
        self.success: list[deque] = [deque(maxlen=window or None) for _ in range(states)]
        # unseen="difficulty": the same per difficulty level, and the levels of the step planned.
        self.level_success: dict[str, deque] = {}
        self._levels: list[str | None] | None = None

    @classmethod
    def from_options(
        cls, options: GDROOptions | Any, dist: DistributedContext | None = None
    ) -> GDROCurriculum:
        """Built from a run's options: a :class:`~groupwise.sections.curriculum.GDROOptions`, or
        a ``GRPOConfig`` (or its ``to_dict()``) read into one (checked, errors naming the
        option)."""
        o = options if isinstance(options, GDROOptions) else GDROOptions.from_config(options)
        return cls(o, dist)

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

        # Diagnostics first: they describe the allocation and weights this step used.
        metrics = step_metrics(
            bins=bins,
            counts=counts,
            row_bins=row_bins,
            reward=reward,
            bin_weights=self.prompt_gdro.bin_weights(),
            held_out=self.prompt_variances(uids, bins),
            mean_budget=self.mean_budget,
            num_bins=self.classifier.num_bins,
            state_names=[self._state_name(b) for b in range(self.classifier.num_states)],
            mu=self.rollout_gdro.mu,
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
