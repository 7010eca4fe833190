"""The online difficulty classifier of Multi-Adversary GDRO (Panaganti et al., arXiv 2601.19280,
section 3.1; docs/algorithms.md section 1): bin edges (eq. 11) and :class:`DifficultyClassifier`.

Bins are indexed 0..B-1 with **0 = hardest** (lowest recent success rate), as in the paper; with
``unseen="unseen"`` prompts never observed have their own group, index B.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Hashable, Sequence
from typing import Any

from ..sections.curriculum import GDROOptions


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


class DifficultyClassifier:
    """Bins prompts by their recent success rate, with hysteresis.

    For each prompt id, a window of its last ``gdro_window`` appearances (0: all history), each kept
    as (successes, rollouts). The accuracy is the pooled rate sum(successes) / sum(rollouts) over
    the window. What an appearance records is the caller's choice (:class:`GDROCurriculum`'s
    ``gdro_classifier_signal``): ``(correct rollouts, rollouts)``, the per-rollout success
    fraction, which does not depend on how many rollouts a prompt got, or ``(any correct, 1)``,
    the paper's c(x) of eq. 10 (pass@n_b under Rollout-GDRO, so prompts given more rollouts look
    easier).

    Unseen prompts (no appearance yet, ``gdro_unseen``): ``hardest`` gives them accuracy 0 and the
    hardest bin (the paper's released code); ``unseen`` gives them their own state, index
    ``num_bins`` (after the easiest bin), so they no longer mix with the truly hard prompts;
    ``difficulty`` bins an unseen prompt by the prior accuracy the caller passes to
    :meth:`classify` (its difficulty level's rate, :class:`GDROCurriculum`), and uses the unseen
    state where there is none.

    Hysteresis: a prompt leaves its previous bin only if its accuracy passes the crossed edge of
    that bin by ``gdro_hysteresis`` (up: acc >= upper edge + delta; down: acc <= lower edge -
    delta); it then moves to the bin its accuracy falls in. A step is classified with the history
    up to the previous step (:meth:`classify`), and the history is updated after the step
    (:meth:`update`).
    """

    def __init__(self, options: GDROOptions) -> None:
        # The run's gdro_num_bins, gdro_bin_edges, gdro_window, gdro_hysteresis and gdro_unseen,
        # checked by the options (groupwise.sections.curriculum).
        edges = options.gdro_bin_edges
        self.edges = list(edges) if edges is not None else default_edges(options.gdro_num_bins)
        self.num_bins = len(self.edges) + 1
        self.window = options.gdro_window
        self.hysteresis = options.gdro_hysteresis
        self.unseen = unseen = options.gdro_unseen
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


def level_key(value: Any) -> str | None:
    """A dataset row's ``difficulty`` as a level key: None when absent (or NaN), else str."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return str(value)
