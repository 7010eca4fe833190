"""A step's credit to each completion, reached through this one module: the group-relative
advantages over the global batch (DeepSeekMath Sec. 4.1.2 with ``scale_rewards``; TRL's
``normalize_then_sum`` with several reward functions) and the curriculum's weight of each row
(GDRO eqs. 16-17, ``prompt_weighting``)."""

from __future__ import annotations

import torch

from .curriculum import Plan
from .distributed import DistributedContext, global_group_advantages, global_normalize_then_sum
from .rollout import Rollout
from .scoring import Scores
from .sections import AdvantageOptions


def advantages(
    scores: Scores,
    group_ids: torch.Tensor,
    options: AdvantageOptions,
    func_weights: torch.Tensor,
    dist: DistributedContext,
) -> torch.Tensor:
    """A_i = (r_i - mean(group)) / (std + eps) with ``scale_rewards``; with
    ``multi_objective_aggregation: normalize_then_sum`` each reward function (weighted by
    ``func_weights``) is normalised in its group before the weighted sum, then the sum over the
    batch (TRL). Group statistics are over every rank's rows of a group."""
    if options.multi_objective_aggregation == "normalize_then_sum":
        return global_normalize_then_sum(scores.per_func, group_ids.cpu(), func_weights, dist)
    return global_group_advantages(scores.rewards, group_ids.cpu(), options.scale_rewards, dist)


def row_weights(plan: Plan, rollout: Rollout, options: AdvantageOptions) -> torch.Tensor | None:
    """Per row of this rank's rollout, its prompt's curriculum weight w_q (None: all 1), times
    GDRO eq. 17's ``mean(n) / n_x`` with ``prompt_weighting: equal``."""
    return plan.row_weights(rollout, options.prompt_weighting)
