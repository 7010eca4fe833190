"""groupwise.algo.grpo against values computed by hand (arithmetic in the comments): the
masked mean, the k3 KL and the clipped policy loss of every loss variant."""

import math

import pytest
import torch

from groupwise.algo.grpo import kl_k3, policy_loss
from groupwise.algo.variants import masked_mean

NAN = float("nan")
LN2 = math.log(2.0)


def close(actual: torch.Tensor, expected: list[float], atol: float = 1e-6) -> None:
    torch.testing.assert_close(
        actual, torch.tensor(expected, dtype=actual.dtype), atol=atol, rtol=0.0
    )


# ---------------------------------------------------------------------------------------------
# masked_mean and kl_k3
# ---------------------------------------------------------------------------------------------


def test_masked_mean():
    x = torch.tensor([[1.0, 2.0, NAN], [4.0, 8.0, 16.0]])
    mask = torch.tensor([[1, 1, 0], [0, 0, 0]])
    assert masked_mean(x, mask).item() == 1.5  # (1 + 2) / 2, NaN padding ignored
    close(masked_mean(x, mask.bool(), dim=1), [1.5, 0.0])  # empty row -> 0, not NaN


def test_kl_k3_hand_values():
    # d = ref - logp; k3 = e^d - d - 1.
    logp = torch.tensor([-1.0, -1.0, -1.0, -2.0])
    ref = logp + torch.tensor([0.0, LN2, -LN2, 1.0])
    # d = 0: 1 - 0 - 1 = 0;  d = ln 2: 2 - 0.693147 - 1 = 0.306853;
    # d = -ln 2: 0.5 + 0.693147 - 1 = 0.193147;  d = 1: e - 2 = 0.718282.
    close(kl_k3(logp, ref), [0.0, 0.3068528194400546, 0.1931471805599454, 0.7182818284590451])


def test_kl_k3_nonnegative_and_zero_when_equal():
    gen = torch.Generator().manual_seed(1)
    logp = -torch.rand(4, 50, generator=gen, dtype=torch.float64) * 5
    ref = -torch.rand(4, 50, generator=gen, dtype=torch.float64) * 5
    kl = kl_k3(logp, ref)
    assert kl.shape == logp.shape
    assert (kl >= 0).all()
    assert torch.equal(kl_k3(logp, logp), torch.zeros_like(logp))


# ---------------------------------------------------------------------------------------------
# policy_loss
# ---------------------------------------------------------------------------------------------

# 2 x 3 off-policy example. eps = 0.2, so the clip range is [0.8, 1.2].
#   seq 0: A = +1, ratios [1.5, 1.0, 0.6], all 3 tokens unmasked
#     1.5: min(1.5, 1.2) = 1.2  -> -1.2   (ratio > 1.2 and A > 0: high-clipped)
#     1.0: min(1.0, 1.0) = 1.0  -> -1.0
#     0.6: min(0.6, 0.8) = 0.6  -> -0.6   (ratio < 0.8 but A > 0: not clipped)
#     sum -2.8, length 3
#   seq 1: A = -1, ratios [0.5, 1.3, (9.0 masked)]
#     0.5: min(-0.5, -0.8) = -0.8 -> 0.8  (ratio < 0.8 and A < 0: low-clipped)
#     1.3: min(-1.3, -1.2) = -1.3 -> 1.3  (ratio > 1.2 but A < 0: not clipped)
#     sum 2.1, length 2
RATIOS = torch.tensor([[1.5, 1.0, 0.6], [0.5, 1.3, 9.0]], dtype=torch.float64)
OLD = torch.tensor([[-1.0, -2.0, -0.5], [-3.0, -1.0, -2.0]], dtype=torch.float64)
ADV = torch.tensor([1.0, -1.0], dtype=torch.float64)
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]], dtype=torch.float64)
# ref - logp per token, chosen so k3 is simple: seq 0 [0, ln2, -ln2] -> k3 sum 0.5,
# seq 1 [1, 0] -> k3 sum e - 2 = 0.7182818284590451.
REF_DELTA = torch.tensor([[0.0, LN2, -LN2], [1.0, 0.0, 0.0]], dtype=torch.float64)


def logprobs_2x3() -> torch.Tensor:
    return (OLD + RATIOS.log()).requires_grad_(True)


@pytest.mark.parametrize(
    ("loss_type", "kwargs", "expected"),
    [
        ("grpo", {}, 0.058333333333333334),  # (-2.8/3 + 2.1/2) / 2 = 7/120
        ("bnpo", {}, -0.14),  # (-2.8 + 2.1) / 5
        ("dapo", {}, -0.14),  # same as bnpo on one batch
        ("dr_grpo", {}, -0.11666666666666667),  # (-2.8 + 2.1) / (2 * T=3)
        ("dr_grpo", {"max_completion_length": 4}, -0.0875),  # -0.7 / (2 * 4)
    ],
)
def test_policy_loss_aggregations(loss_type, kwargs, expected):
    loss, metrics = policy_loss(logprobs_2x3(), OLD, None, ADV, MASK, loss_type=loss_type, **kwargs)
    assert loss.item() == pytest.approx(expected, abs=1e-12)
    assert metrics["kl"] == 0.0
    assert metrics["clip_ratio/low_mean"] == pytest.approx(0.2)  # 1 of 5 unmasked tokens
    assert metrics["clip_ratio/high_mean"] == pytest.approx(0.2)  # 1 of 5
    assert metrics["clip_ratio/region_mean"] == pytest.approx(0.4)  # 2 of 5
    assert metrics["ratio_mean"] == pytest.approx(0.98)  # (1.5 + 1 + 0.6 + 0.5 + 1.3) / 5
    # 0-d tensors, detached, on the loss's device: the update reads them once per pass.
    assert all(torch.is_tensor(v) and v.ndim == 0 and not v.requires_grad for v in metrics.values())


@pytest.mark.parametrize(
    ("loss_type", "expected"),
    [
        # 7/120 + 0.1 * (0.5/3 + 0.7182818/2) / 2
        ("grpo", 0.0846237123781428),
        # -0.14 + 0.1 * (0.5 + 0.7182818) / 5
        ("bnpo", -0.1156343634308191),
        ("dapo", -0.1156343634308191),
        # -0.7/6 + 0.1 * (0.5 + 0.7182818) / 6
        ("dr_grpo", -0.09636196952568257),
    ],
)
def test_policy_loss_beta_adds_k3_aggregated_the_same_way(loss_type, expected):
    logprobs = logprobs_2x3()
    ref = logprobs.detach() + REF_DELTA
    loss, metrics = policy_loss(logprobs, OLD, ref, ADV, MASK, loss_type=loss_type, beta=0.1)
    assert loss.item() == pytest.approx(expected, abs=1e-12)
    assert metrics["kl"] == pytest.approx(0.243656365691809, abs=1e-12)  # 1.2182818 / 5


def test_policy_loss_reports_kl_without_adding_it_when_beta_zero():
    logprobs = logprobs_2x3()
    ref = logprobs.detach() + REF_DELTA
    loss, metrics = policy_loss(logprobs, OLD, ref, ADV, MASK, beta=0.0)
    assert loss.item() == pytest.approx(7 / 120, abs=1e-12)
    assert metrics["kl"] == pytest.approx(0.243656365691809, abs=1e-12)


def test_policy_loss_separate_clip_bounds():
    # epsilon_high = 0.6 -> range [0.8, 1.6]: seq 0 token 0 (1.5) is no longer clipped,
    # seq 0 sum -1.5 - 1.0 - 0.6 = -3.1. bnpo: (-3.1 + 2.1) / 5 = -0.2.
    loss, metrics = policy_loss(
        logprobs_2x3(), OLD, None, ADV, MASK, loss_type="bnpo", epsilon_high=0.6
    )
    assert loss.item() == pytest.approx(-0.2, abs=1e-12)
    assert metrics["clip_ratio/high_mean"] == 0.0
    assert metrics["clip_ratio/low_mean"] == pytest.approx(0.2)


def test_gspo_sequence_ratio_value_and_gradient():
    # s_0 = (1.5 * 1.0 * 0.6)^(1/3) = 0.9^(1/3) = 0.9654893846056297, in [0.85, 1.2]: not clipped;
    #   every token loses -s_0 * A_0 = -0.96549.
    # s_1 = (0.5 * 1.3)^(1/2) = 0.65^(1/2) = 0.806225774829855 < 1 - 0.15 = 0.85 with A_1 < 0:
    #   clipped, every token loses 0.85.
    # grpo: (-0.9654893846056297 + 0.85) / 2 = -0.05774469230281487
    logprobs = logprobs_2x3()
    loss, metrics = policy_loss(
        logprobs, OLD, None, ADV, MASK, epsilon_low=0.15, importance_sampling_level="sequence"
    )
    assert loss.item() == pytest.approx(-0.05774469230281487, abs=1e-12)
    # Sequence-level metrics are averaged over sequences, as in TRL: 1 of 2 low-clipped.
    assert metrics["clip_ratio/low_mean"] == pytest.approx(0.5)
    assert metrics["clip_ratio/high_mean"] == 0.0
    assert metrics["clip_ratio/region_mean"] == pytest.approx(0.5)
    assert metrics["ratio_mean"] == pytest.approx(0.8858575797177424)  # (s_0 + s_1) / 2
    # d loss / d logp_0t = (1/B) * (-A_0) * s_0 * (1/L_0) = -0.9654893846056297 / 6 for all three
    # tokens (gradient flows through the mean); sequence 1 is clipped, so its gradient is 0.
    loss.backward()
    g = -0.16091489743427162
    close(logprobs.grad, [[g, g, g], [0.0, 0.0, 0.0]], atol=1e-12)


def test_on_policy_gradient_grpo_and_dr_grpo():
    # On-policy the ratio is 1 (no clipping) and d ratio / d logp = 1, so the token loss -A_i
    # gives d loss / d logp_it = -A_i / (B * L_i) for grpo and -A_i / (B * max_len) for dr_grpo.
    gen = torch.Generator().manual_seed(2)
    logprobs = (-torch.rand(3, 4, generator=gen, dtype=torch.float64)).requires_grad_(True)
    adv = torch.tensor([0.5, -2.0, 1.5], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 0, 0]], dtype=torch.bool)
    lengths = torch.tensor([3.0, 1.0, 2.0], dtype=torch.float64)

    loss, _ = policy_loss(logprobs, None, None, adv, mask, loss_type="grpo")
    assert loss.item() == pytest.approx(0.0, abs=1e-12)  # -(0.5 - 2 + 1.5) / 3
    (grad,) = torch.autograd.grad(loss, logprobs)
    expected = (-adv / (lengths * 3)).unsqueeze(1) * mask
    torch.testing.assert_close(grad, expected, rtol=0, atol=1e-12)
    # Written out: -0.5/9 = -0.0555556, 2/3 = 0.6666667, -1.5/6 = -0.25.
    close(grad[:, 0], [-0.05555555555555555, 0.6666666666666666, -0.25], atol=1e-12)

    loss, _ = policy_loss(
        logprobs, None, None, adv, mask, loss_type="dr_grpo", max_completion_length=8
    )
    (grad,) = torch.autograd.grad(loss, logprobs)
    torch.testing.assert_close(grad, (-adv / (3 * 8)).unsqueeze(1) * mask, rtol=0, atol=1e-12)

    # k3 has zero gradient where ref == logp, so beta does not change it on-policy.
    loss, _ = policy_loss(logprobs, None, logprobs.detach(), adv, mask, beta=0.5)
    (grad,) = torch.autograd.grad(loss, logprobs)
    torch.testing.assert_close(grad, (-adv / (lengths * 3)).unsqueeze(1) * mask, rtol=0, atol=1e-12)


def test_old_none_equals_detached_logprobs():
    logprobs = logprobs_2x3()
    a, ma = policy_loss(logprobs, None, None, ADV, MASK)
    b, mb = policy_loss(logprobs, logprobs.detach(), None, ADV, MASK)
    assert a.item() == b.item()
    assert ma == mb
    assert ma["ratio_mean"] == 1.0


def test_masked_padding_cannot_leak_into_loss_or_grad():
    logprobs = logprobs_2x3()
    garbage = logprobs.detach().clone()
    garbage[1, 2] = NAN
    old = OLD.clone()
    old[1, 2] = float("inf")
    ref = logprobs.detach() + REF_DELTA
    ref[1, 2] = NAN
    clean, _ = policy_loss(logprobs, OLD, logprobs.detach() + REF_DELTA, ADV, MASK, beta=0.1)
    lp = garbage.requires_grad_(True)
    loss, metrics = policy_loss(lp, old, ref, ADV, MASK.bool(), beta=0.1)
    assert loss.item() == pytest.approx(clean.item(), abs=1e-12)
    assert all(math.isfinite(v) for v in metrics.values())
    loss.backward()
    assert torch.isfinite(lp.grad).all()
    assert lp.grad[1, 2] == 0.0


def test_policy_loss_errors():
    lp = logprobs_2x3()
    with pytest.raises(ValueError, match="ref_logprobs"):
        policy_loss(lp, OLD, None, ADV, MASK, beta=0.04)
    with pytest.raises(ValueError, match="grpo.*bnpo.*dapo.*dr_grpo"):
        policy_loss(lp, OLD, None, ADV, MASK, loss_type="ppo")
    with pytest.raises(ValueError, match="token.*sequence"):
        policy_loss(lp, OLD, None, ADV, MASK, importance_sampling_level="sentence")
    with pytest.raises(ValueError, match="mask"):
        policy_loss(lp, OLD, None, ADV, MASK[:, :2])
    with pytest.raises(ValueError, match="advantages"):
        policy_loss(lp, OLD, None, ADV.unsqueeze(1), MASK)
    with pytest.raises(ValueError, match="beta"):
        policy_loss(lp, OLD, None, ADV, MASK, beta=-1.0)
