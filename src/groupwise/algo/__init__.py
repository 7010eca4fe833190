"""The math of GRPO, its variants and PPO, as pure functions on tensors, each citing the
equation it implements (docs/algorithms.md):

- :mod:`.advantages`: group-relative advantages and the other group statistics of rewards
  (pass@k, informative groups), over one process or the global batch;
- :mod:`.variants`: the registry of loss variants (per-token term, reduction, share of the global
  batch) and what a loss is given and answers;
- :mod:`.grpo`: the clipped policy loss, its ratio, masks, the k3 KL and the entropy bonus;
- :mod:`.ppo`: PPO's token rewards, GAE, value loss and clipped policy loss.

Their public names are importable from here in one import.
"""

from .advantages import (
    AGGREGATIONS,
    INFORMATIVE_STD_TOL,
    SCALE_MODES,
    batch_normalize,
    equal_prompt_factors,
    global_group_advantages,
    global_normalize_then_sum,
    group_advantages,
    group_reward_std,
    informative_groups,
    normalize_then_sum,
    pass_at_k,
    zero_std_groups_fraction,
)
from .grpo import (
    adapt_entropy_coef,
    entropy_bonus,
    high_entropy_mask,
    importance_ratio,
    kl_k3,
    off_policy_sequence_mask,
    policy_loss,
    sequence_surrogate,
)
from .ppo import (
    explained_variance,
    gae_advantages,
    masked_whiten,
    ppo_policy_loss,
    token_rewards,
    value_loss,
)
from .variants import (
    IMPORTANCE_SAMPLING_LEVELS,
    LOSS_TYPES,
    LOSSES,
    ROLLOUT_CORRECTION_MODES,
    BatchCounts,
    CISPOLoss,
    ConstantNormaliserLoss,
    GammaWeightedLoss,
    GlobalTokenMeanLoss,
    LengthWeightedSequenceLoss,
    LossVariant,
    MicroBatchTokenMeanLoss,
    SequenceMeanLoss,
    SoftGateLoss,
    TokenMeanLoss,
    get_loss,
    masked_mean,
    register_loss,
    rollout_correction_logs,
    rollout_correction_weights,
    vespo_weights,
)

__all__ = [
    "adapt_entropy_coef",
    "entropy_bonus",
    "explained_variance",
    "gae_advantages",
    "global_group_advantages",
    "global_normalize_then_sum",
    "masked_whiten",
    "ppo_policy_loss",
    "token_rewards",
    "value_loss",
    "AGGREGATIONS",
    "IMPORTANCE_SAMPLING_LEVELS",
    "INFORMATIVE_STD_TOL",
    "LOSSES",
    "LOSS_TYPES",
    "ROLLOUT_CORRECTION_MODES",
    "SCALE_MODES",
    "BatchCounts",
    "CISPOLoss",
    "ConstantNormaliserLoss",
    "GammaWeightedLoss",
    "GlobalTokenMeanLoss",
    "LengthWeightedSequenceLoss",
    "LossVariant",
    "MicroBatchTokenMeanLoss",
    "SequenceMeanLoss",
    "SoftGateLoss",
    "TokenMeanLoss",
    "batch_normalize",
    "equal_prompt_factors",
    "get_loss",
    "group_advantages",
    "group_reward_std",
    "high_entropy_mask",
    "importance_ratio",
    "informative_groups",
    "kl_k3",
    "masked_mean",
    "normalize_then_sum",
    "off_policy_sequence_mask",
    "pass_at_k",
    "policy_loss",
    "register_loss",
    "rollout_correction_logs",
    "rollout_correction_weights",
    "sequence_surrogate",
    "vespo_weights",
    "zero_std_groups_fraction",
]
