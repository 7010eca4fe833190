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


# --- rollout correction's step metrics: the share of weights masked or truncated --------------

# Five completions of 4 tokens, log-ratios old - sampling per token (sampling = 0), chosen so
# each mode's outcome is known by hand (ln 3 = 1.0986, ln 0.5 = -0.693, ln 0.25 = -1.386):
# 0: 0.3 x 4, sum 1.2 > ln 3: no token beyond a bound, the sequence above 3
# 1: 0.2 x 4, sum 0.8: inside everywhere
# 2: 1.5 (e^1.5 = 4.48 > 3), -1.0 (e^-1 = 0.37 < 0.5), 0, 0; sum 0.5: two tokens out, the
#    sequence in
# 3: 0.5, 0.5, then 5.0 and 0.0 at untrained positions (mask 0): sum 1.0 < ln 3; the 5.0 must
#    not count
# 4: -0.6 x 3 (e^-0.6 = 0.55 > 0.5), 0; sum -1.8 (e^-1.8 = 0.165 < 0.25): the sequence below a
#    bound of 0.25, no token below 0.5
MC_DIFF = torch.tensor(
    [
        [0.3, 0.3, 0.3, 0.3],
        [0.2, 0.2, 0.2, 0.2],
        [1.5, -1.0, 0.0, 0.0],
        [0.5, 0.5, 5.0, 0.0],
        [-0.6, -0.6, -0.6, 0.0],
    ]
)
MC_MASK = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 1]])


def _changed_share(mode: str, clip_min: float | None, clip_max: float | None) -> dict:
    """The metric as the update records it: the weights at the trained tokens (token modes) or
    one per completion (sequence modes)."""
    from groupwise.algo.variants import rollout_correction_logs

    w = rollout_correction_weights(
        MC_DIFF,
        torch.zeros_like(MC_DIFF),
        MC_MASK,
        mode=mode,
        clip_min=clip_min,
        clip_max=clip_max,
    )
    trained = w.flatten() if w.shape[1] == 1 else w[MC_MASK.bool()]
    return rollout_correction_logs(trained, mode=mode, clip_min=clip_min, clip_max=clip_max)


MASKED = "sampling/importance_sampling_ratio/masked_frac"
TRUNCATED = "sampling/importance_sampling_ratio/truncated_frac"


@pytest.mark.parametrize(
    ("mode", "clip_min", "expected"),
    [
        # sequences: only completion 0 is above 3; with a lower bound of 0.25 completion 4 too
        ("sequence_mask", None, {MASKED: 1 / 5}),
        ("sequence_mask", 0.25, {MASKED: 2 / 5}),
        ("sequence_truncate", None, {TRUNCATED: 1 / 5}),
        ("sequence_truncate", 0.25, {TRUNCATED: 2 / 5}),
        # 18 trained tokens: only completion 2's first is above 3; with a lower bound of 0.5 its
        # second too (completion 4's -0.6 stays inside; completion 3's 5.0 is not trained)
        ("token_mask", None, {MASKED: 1 / 18}),
        ("token_mask", 0.5, {MASKED: 2 / 18}),
        ("token_truncate", None, {TRUNCATED: 1 / 18}),
        ("token_truncate", 0.5, {TRUNCATED: 2 / 18}),
    ],
)
def test_rollout_correction_logs_by_hand(mode, clip_min, expected):
    logs = _changed_share(mode, clip_min, 3.0)
    assert logs.keys() == expected.keys()
    for key, value in expected.items():
        assert logs[key] == pytest.approx(value)


def test_rollout_correction_logs_open_bounds_and_no_weights():
    from groupwise.algo.variants import rollout_correction_logs

    # No upper bound: nothing is above it; completion 4 is still below 0.25.
    assert _changed_share("sequence_mask", 0.25, None) == {MASKED: pytest.approx(1 / 5)}
    assert _changed_share("sequence_truncate", None, None) == {TRUNCATED: 0.0}
    assert rollout_correction_logs(
        torch.zeros(0), mode="sequence_mask", clip_min=None, clip_max=3.0
    ) == {MASKED: 0.0}
    with pytest.raises(ValueError, match="mode must be one of"):
        rollout_correction_logs(torch.ones(2), mode="token", clip_min=None, clip_max=3.0)


def test_the_step_metrics_log_the_masked_share_under_the_runs_mode():
    # The step's weights arrive as the update records them, one entry per micro-batch
    # (UpdateStats.mismatch: |diff| at the trained tokens, the weights); the step's sampling/*
    # metrics read the share under the run's mode and bounds (GRPO's and PPO's alike).
    from conftest import options
    from groupwise.policy.batches import UpdateStats
    from groupwise.trainer.metrics import rollout_mismatch_logs

    def step_logs(**overrides) -> dict:
        loss = options(**overrides).loss
        stats = UpdateStats()
        for rows in (slice(0, 2), slice(2, 5)):  # two micro-batches
            diff, mask = MC_DIFF[rows], MC_MASK[rows]
            w = rollout_correction_weights(
                diff,
                torch.zeros_like(diff),
                mask,
                mode=loss.rollout_correction_mode,
                clip_min=loss.rollout_correction_clip_min,
                clip_max=loss.rollout_correction_clip_max,
            )
            keep = mask.bool()
            selected = w.flatten() if w.shape[1] == 1 else w[keep]
            stats.mismatch.append((diff.abs()[keep], selected))
        return rollout_mismatch_logs(stats.mismatch, loss)

    assert step_logs(rollout_correction_mode="sequence_mask")[MASKED] == pytest.approx(1 / 5)
    assert step_logs(rollout_correction_mode="sequence_mask", rollout_correction_clip_min=0.25)[
        MASKED
    ] == pytest.approx(2 / 5)
    assert step_logs(rollout_correction_mode="token_truncate")[TRUNCATED] == pytest.approx(1 / 18)
