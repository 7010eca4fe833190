"""Scoring a rollout: the dataset rows and the sampled completions -> every reward function's
score, the weighted total and the correctness score.

It joins the two halves below it: the reward functions (:mod:`groupwise.rewards`, which know
nothing of rollouts) and the rollout engines (:mod:`groupwise.rollout`, which know nothing of
rewards). The trainers, the curricula's filters and evaluation read a rollout's scores from here.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from .data import is_conversational
from .rewards.basic import RewardFunc, correctness_index, reward_func_name
from .rewards.combine import RewardScorer
from .rollout import Rollout


def score_rollout(
    scorer: RewardScorer, rows: Sequence[dict[str, Any]], rollout: Rollout
) -> tuple[torch.Tensor, torch.Tensor]:
    """Score a rollout's completions with TRL's call convention: prompts and completions
    (conversational when the prompts are: for a multi-turn rollout the whole conversation after
    the prompt, assistant turns and tool / environment messages, so the built-in rewards read
    the last message), ``completion_ids``, every dataset column by name (the union of the rows'
    keys; a row without a column passes None) and, for a multi-turn rollout, ``env_state``
    (each conversation's final environment state)."""
    group_ids = rollout.group_ids.tolist()
    prompts = [rows[g]["prompt"] for g in group_ids]
    completions: list[Any]
    if not is_conversational(rows[0]["prompt"]):
        completions = list(rollout.texts)
    elif rollout.conversations is not None:
        completions = [[dict(m) for m in c] for c in rollout.conversations]
    else:
        completions = [[{"role": "assistant", "content": t}] for t in rollout.texts]
    keys = list(dict.fromkeys(k for row in rows for k in row if k != "prompt"))
    columns = {key: [rows[g].get(key) for g in group_ids] for key in keys}
    if rollout.env_states is not None:
        columns["env_state"] = list(rollout.env_states)
        if any("environment" in state for state in rollout.env_states):
            # TRL's environment_factory: each rollout's environment instance (TRL's keyword)
            columns["environments"] = [s.get("environment") for s in rollout.env_states]
    completion_ids = [
        row[: int(n)].tolist()
        for row, n in zip(rollout.completion_ids, rollout.lengths, strict=True)
    ]
    return scorer(prompts, completions, completion_ids, **columns)


@dataclass
class Scores:
    """A rollout's rewards: the weighted total [N] (NaN where every function returned None),
    each function's [N, F] (NaN for None), and the correctness score [N]: the column of the
    reward that declares correctness, or the total when none does."""

    rewards: torch.Tensor
    per_func: torch.Tensor
    correctness: torch.Tensor
    # Columns reward functions logged with TRL's log_extra, one value per completion.
    extra: dict[str, list[Any]] = dataclasses.field(default_factory=dict)


class RolloutScorer:
    """The run's reward functions, called on a rollout with the dataset rows' columns."""

    def __init__(self, funcs: Sequence[RewardFunc], weights: Sequence[float], **kwargs: Any):
        self.funcs = list(funcs)
        self.names = [reward_func_name(f) for f in self.funcs]
        self.combine = RewardScorer(self.funcs, list(weights), **kwargs)
        # The first function that declares itself the correctness signal (``is_correctness``):
        # the curriculum's "correct", the monitor's accuracy.
        self.correctness_index = correctness_index(self.funcs)

    @property
    def correctness_name(self) -> str | None:
        j = self.correctness_index
        return self.names[j] if j is not None else None

    def __call__(self, rows: Sequence[dict[str, Any]], rollout: Rollout) -> Scores:
        rewards, per_func = score_rollout(self.combine, rows, rollout)
        j = self.correctness_index
        correctness = per_func[:, j] if j is not None else rewards
        return Scores(rewards, per_func, correctness, dict(self.combine.last_extra))

    def state_dict(self) -> dict[str, Any]:
        stats = {}
        for name, func in zip(self.names, self.funcs, strict=True):
            value = getattr(func, "stats", None)
            if dataclasses.is_dataclass(value) and not isinstance(value, type):
                stats[name] = dataclasses.asdict(value)
            elif isinstance(value, dict):
                stats[name] = dict(value)
        errors = {k: dict(v) for k, v in self.combine.error_counts.items()}
        return {"reward_errors": errors, "reward_stats": stats}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for name, counts in state.get("reward_errors", {}).items():
            self.combine.error_counts[name] = type(self.combine.error_counts[name])(counts)
        for name, func in zip(self.names, self.funcs, strict=True):
            saved = state.get("reward_stats", {}).get(name)
            current = getattr(func, "stats", None)
            if saved is None or current is None:
                continue
            if isinstance(current, dict):
                current.update(saved)
            else:
                for key, value in saved.items():
                    setattr(current, key, value)

    def logs(self, per_func: torch.Tensor) -> dict[str, float]:
        """Per reward function: mean, std, fraction None, errors and the function's own
        counters (remote failures, sandbox timeouts, ...)."""
        logs: dict[str, float] = {}
        errors = self.combine.error_summary()
        for j, name in enumerate(self.names):
            column = per_func[:, j]
            valid = column[~torch.isnan(column)]
            logs[f"rewards/{name}/mean"] = float(valid.mean()) if valid.numel() else math.nan
            logs[f"rewards/{name}/std"] = float(valid.std()) if valid.numel() > 1 else 0.0
            logs[f"rewards/{name}/frac_none"] = 1.0 - valid.numel() / max(column.numel(), 1)
            logs[f"rewards/{name}/errors"] = errors[name]
            stats = getattr(self.funcs[j], "stats", None)
            if dataclasses.is_dataclass(stats) and not isinstance(stats, type):
                stats = dataclasses.asdict(stats)
            if isinstance(stats, dict):
                for key, value in stats.items():
                    if isinstance(value, (int, float)) and not isinstance(value, bool):
                        logs[f"rewards/{name}/{key}"] = float(value)
        return logs
