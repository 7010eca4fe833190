"""groupwise.algo.variants against values computed by hand (arithmetic in the comments): the
rollout-correction weights and how the policy loss applies them."""

import math

import pytest
import torch

from groupwise.algo.grpo import policy_loss
from groupwise.algo.variants import rollout_correction_weights

NAN = float("nan")
LN2 = math.log(2.0)


def close(actual: torch.Tensor, expected: list[float], atol: float = 1e-6) -> None:
    torch.testing.assert_close(
        actual, torch.tensor(expected, dtype=actual.dtype), atol=atol, rtol=0.0
    )


# --- rollout correction (sampler vs trainer mismatch) ----------------------------------------

RC_OLD = torch.tensor([[-1.0, -2.0, -0.5]])
RC_SAMPLING = torch.tensor([[-1.5, -1.0, float("nan")]])  # NaN at a masked position
RC_MASK = torch.tensor([[1, 1, 0]])


def test_rollout_correction_token_modes_by_hand():
    # log-ratios old - sampling: 0.5, -1.0, (masked) 0 -> rho = e^0.5, e^-1, 1.
    e_half, e_minus1 = math.exp(0.5), math.exp(-1.0)
    truncated = rollout_correction_weights(
        RC_OLD, RC_SAMPLING, RC_MASK, mode="token_truncate", clip_max=1.5
    )
    assert truncated.flatten().tolist() == pytest.approx([1.5, e_minus1, 1.0])
    both = rollout_correction_weights(
        RC_OLD, RC_SAMPLING, RC_MASK, mode="token_truncate", clip_min=0.5, clip_max=None
    )
    assert both.flatten().tolist() == pytest.approx([e_half, 0.5, 1.0])
    masked = rollout_correction_weights(
        RC_OLD, RC_SAMPLING, RC_MASK, mode="token_mask", clip_min=0.5, clip_max=1.5
    )
    assert masked.flatten().tolist() == pytest.approx([0.0, 0.0, 1.0])


def test_rollout_correction_sequence_modes_by_hand():
    # Sequence log-ratio: 0.5 - 1.0 = -0.5 -> rho = e^-0.5 = 0.6065, one weight per sequence.
    rho = math.exp(-0.5)
    plain = rollout_correction_weights(RC_OLD, RC_SAMPLING, RC_MASK, mode="sequence_truncate")
    assert plain.shape == (1, 1) and plain.item() == pytest.approx(rho)
    clipped = rollout_correction_weights(
        RC_OLD, RC_SAMPLING, RC_MASK, mode="sequence_truncate", clip_min=0.7
    )
    assert clipped.item() == pytest.approx(0.7)
    dropped = rollout_correction_weights(
        RC_OLD, RC_SAMPLING, RC_MASK, mode="sequence_mask", clip_min=0.7
    )
    assert dropped.item() == 0.0
    kept = rollout_correction_weights(
        RC_OLD, RC_SAMPLING, RC_MASK, mode="sequence_mask", clip_max=3.0
    )
    assert kept.item() == pytest.approx(rho)
    with pytest.raises(ValueError, match="mode must be one of"):
        rollout_correction_weights(RC_OLD, RC_SAMPLING, RC_MASK, mode="token")


def test_policy_loss_rollout_weights_scale_surrogate_not_kl():
    # On-policy (ratio 1), A = 1, two tokens with weights 2 and 0.5; reference 0.5 nats below the
    # policy on token 1: k3 = e^-0.5 + 0.5 - 1. grpo loss = mean_t(-w_t A + beta k3_t).
    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    ref = torch.tensor([[-1.5, -2.0]])
    weights = torch.tensor([[2.0, 0.5]])
    k3 = math.exp(-0.5) + 0.5 - 1.0
    loss, _ = policy_loss(
        logp, None, ref, torch.tensor([1.0]), torch.ones(1, 2), beta=0.04, rollout_weights=weights
    )
    assert loss.item() == pytest.approx((-2.0 - 0.5 + 0.04 * k3) / 2)
    loss.backward()
    # d/dlogp_t: -w_t A / 2 from the surrogate; beta (1 - e^(ref - logp)) / 2 from k3.
    expected = [(-2.0 + 0.04 * (1 - math.exp(-0.5))) / 2, -0.5 / 2]
    assert logp.grad.flatten().tolist() == pytest.approx(expected)
    with pytest.raises(ValueError, match="rollout_weights must be"):
        policy_loss(
            logp, None, None, torch.tensor([1.0]), torch.ones(1, 2), rollout_weights=torch.ones(2)
        )
