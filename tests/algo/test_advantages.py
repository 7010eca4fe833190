"""groupwise.algo.advantages against values computed by hand (arithmetic in the comments):
group-relative advantages, the group statistics of rewards, pass@k."""

import math

import pytest
import torch

from groupwise.algo.advantages import (
    group_advantages,
    group_reward_std,
    pass_at_k,
    zero_std_groups_fraction,
)

NAN = float("nan")
LN2 = math.log(2.0)


def close(actual: torch.Tensor, expected: list[float], atol: float = 1e-6) -> None:
    torch.testing.assert_close(
        actual, torch.tensor(expected, dtype=actual.dtype), atol=atol, rtol=0.0
    )


# ---------------------------------------------------------------------------------------------
# group_advantages
# ---------------------------------------------------------------------------------------------

# Unsorted, non-contiguous ids; groups of size 3, 4, 1 and 2:
#   id 7: [0, 2, 4]     mean 2, Bessel var (4 + 0 + 4) / 2 = 4, std 2
#   id 3: [1, 5, 1, 5]  mean 3, Bessel var (4 + 4 + 4 + 4) / 3 = 16/3, std 2.309401076758503
#   id 9: [5]           a single member: advantage 0
#   id 4: [2, 2]        std 0: advantage 0
IDS = torch.tensor([7, 3, 7, 9, 3, 4, 7, 3, 4, 3])
REWARDS = torch.tensor([0.0, 1.0, 2.0, 5.0, 5.0, 2.0, 4.0, 1.0, 2.0, 5.0])


def test_group_scale_variable_sizes_unsorted_ids():
    adv = group_advantages(REWARDS, IDS, scale="group")
    a7 = 0.9999500024998749  # 2 / (2 + 1e-4)
    a3 = 0.865987905408166  # 2 / (2.309401076758503 + 1e-4)
    close(adv, [-a7, -a3, 0.0, 0.0, a3, 0.0, a7, -a3, 0.0, a3])


def test_group_scale_binary_rewards():
    # [1, 0, 0, 1 | 2, 2 | 5]: group 0 has mean 0.5, Bessel var (4 * 0.25) / 3 = 1/3,
    # std 0.5773502691896257, so A = +-0.5 / (0.5773502691896257 + 1e-4) = +-0.8658754297607016.
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 2.0, 2.0, 5.0])
    ids = torch.tensor([0, 0, 0, 0, 1, 1, 2])
    a = 0.8658754297607016
    close(group_advantages(rewards, ids), [a, -a, -a, a, 0.0, 0.0, 0.0])


def test_batch_scale():
    # All ten rewards: sum 27, mean 2.7, sum of squared deviations 32.1,
    # Bessel var 32.1 / 9 = 3.5667, std 1.888562063228706.
    # Centred on group means as before: id 7 -> [-2, 0, 2], id 3 -> [-2, 2, -2, 2], others 0.
    adv = group_advantages(REWARDS, IDS, scale="batch")
    b = 1.0589506926299772  # 2 / (1.888562063228706 + 1e-4)
    close(adv, [-b, -b, 0.0, 0.0, b, 0.0, b, -b, 0.0, b])


def test_none_scale():
    adv = group_advantages(REWARDS, IDS, scale="none")
    # r - group mean: id 7 mean 2, id 3 mean 3, id 9 mean 5, id 4 mean 2.
    close(adv, [-2.0, -2.0, 0.0, 0.0, 2.0, 0.0, 2.0, -2.0, 0.0, 2.0])


def test_nan_rewards_excluded_and_zero():
    # id 0: [1, nan, 3] -> valid [1, 3], mean 2, Bessel var 2, std 1.4142135623730951,
    #       A = +-1 / (1.4142135623730951 + 1e-4) = +-0.7070567847218314.
    # id 5: [nan] -> no valid member -> 0.   id 2: [nan, 7] -> one valid member -> 0.
    rewards = torch.tensor([1.0, NAN, 3.0, NAN, NAN, 7.0])
    ids = torch.tensor([0, 0, 0, 5, 2, 2])
    a = 0.7070567847218314
    close(group_advantages(rewards, ids), [-a, 0.0, a, 0.0, 0.0, 0.0])
    close(group_advantages(rewards, ids, scale="none"), [-1.0, 0.0, 1.0, 0.0, 0.0, 0.0])
    # Batch: valid rewards [1, 3, 7], mean 11/3, squared deviations 64/9 + 4/9 + 100/9 = 168/9,
    # Bessel var 168/18 = 9.3333, std 3.0550504633038935; A = +-1 / (3.05505... + 1e-4).
    b = 0.3273161214189701
    close(group_advantages(rewards, ids, scale="batch"), [-b, 0.0, b, 0.0, 0.0, 0.0])


def test_size_one_groups_and_constant_groups_are_zero():
    rewards = torch.tensor([3.0, -1.0, 0.1, 0.1, 0.1])
    ids = torch.tensor([1, 2, 3, 3, 3])
    for scale in ("group", "batch", "none"):
        adv = group_advantages(rewards, ids, scale=scale)
        assert torch.equal(adv, torch.zeros(5)), scale  # exactly 0, not rounding noise
    # eps = 0 must not turn the rounding noise of a constant group into +-1.
    assert torch.equal(group_advantages(rewards, ids, eps=0.0), torch.zeros(5))


def test_matches_loop_reference_on_random_data():
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 40, (300,), generator=gen) * 13 - 100  # sparse, negative ids too
    rewards = torch.randn(300, generator=gen, dtype=torch.float64)
    rewards[torch.rand(300, generator=gen) < 0.1] = NAN
    valid = ~rewards.isnan()
    batch_std = rewards[valid].std()
    for scale in ("group", "batch", "none"):
        adv = group_advantages(rewards, ids, scale=scale)
        expected = torch.zeros_like(rewards)
        for g in ids.unique():
            members = (ids == g) & valid
            vals = rewards[members]
            if vals.numel() < 2:
                continue
            centred = vals - vals.mean()
            denom = {"group": vals.std() + 1e-4, "batch": batch_std + 1e-4, "none": 1.0}[scale]
            expected[members] = centred / denom
        torch.testing.assert_close(adv, expected, rtol=1e-12, atol=1e-12)


def test_group_advantages_errors():
    with pytest.raises(ValueError, match="group.*batch.*none"):
        group_advantages(REWARDS, IDS, scale="std")
    with pytest.raises(ValueError, match="shape"):
        group_advantages(REWARDS, IDS[:-1])
    with pytest.raises(ValueError, match="1-D"):
        group_advantages(REWARDS.view(2, 5), IDS.view(2, 5))


def test_integer_rewards_and_empty_batch():
    close(
        group_advantages(torch.tensor([0, 2, 4]), torch.tensor([1, 1, 1]), scale="none"),
        [-2.0, 0.0, 2.0],
    )
    empty = group_advantages(torch.zeros(0), torch.zeros(0, dtype=torch.long))
    assert empty.shape == (0,)


def test_group_reward_std():
    # id 7 std 2, id 3 std sqrt(16/3) = 2.309401076758503, id 9 size one -> 0, id 4 [2, 2] -> 0.
    s3 = 2.309401076758503
    close(group_reward_std(REWARDS, IDS), [2.0, s3, 2.0, 0.0, s3, 0.0, 2.0, s3, 0.0, s3])
    # NaN members keep their group's std; std comes from the valid members only.
    rewards = torch.tensor([1.0, NAN, 3.0, NAN, NAN, 7.0])
    ids = torch.tensor([0, 0, 0, 5, 2, 2])
    r2 = 1.4142135623730951  # sqrt(((1-2)^2 + (3-2)^2) / 1)
    close(group_reward_std(rewards, ids), [r2, r2, r2, 0.0, 0.0, 0.0])


def test_zero_std_groups_fraction():
    # ids 9 (size one) and 4 ([2, 2]) are zero-std; 7 and 3 are not: 2 of 4 groups.
    assert zero_std_groups_fraction(REWARDS, IDS) == 0.5
    # id 0 has spread; id 5 (no valid member) and id 2 (one valid member) count as zero-std.
    rewards = torch.tensor([1.0, NAN, 3.0, NAN, NAN, 7.0])
    assert zero_std_groups_fraction(rewards, torch.tensor([0, 0, 0, 5, 2, 2])) == 2 / 3
    # 0.1 + 0.1 + 0.1 rounds, but the group is still exactly constant.
    assert zero_std_groups_fraction(torch.tensor([0.1, 0.1, 0.1]), torch.tensor([4, 4, 4])) == 1.0
    assert zero_std_groups_fraction(torch.zeros(0), torch.zeros(0, dtype=torch.long)) == 0.0


# ---------------------------------------------------------------------------------------------
# pass_at_k
# ---------------------------------------------------------------------------------------------


def test_pass_at_k_hand_values():
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7)  # 1 - C(3,2)/C(5,2) = 1 - 3/10
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)  # 1 - C(7,1)/C(10,1) = c/n
    assert pass_at_k(10, 5, 3) == pytest.approx(0.9166666666666666)  # 1 - C(5,3)/C(10,3)=1-10/120
    assert pass_at_k(8, 0, 8) == 0.0  # no correct sample
    assert pass_at_k(8, 0, 1) == 0.0
    assert pass_at_k(4, 1, 4) == 1.0  # n - c = 3 < k = 4: every k-subset has a correct one
    assert pass_at_k(8, 8, 1) == 1.0


def test_pass_at_k_matches_comb_formula():
    for n in range(1, 21):
        for c in range(n + 1):
            for k in range(1, n + 1):
                exact = 1 - math.comb(n - c, k) / math.comb(n, k)
                assert pass_at_k(n, c, k) == pytest.approx(exact, abs=1e-12), (n, c, k)


def test_pass_at_k_errors():
    for n, c, k in [(5, 6, 1), (5, -1, 1), (5, 2, 0), (5, 2, 6)]:
        with pytest.raises(ValueError):
            pass_at_k(n, c, k)
    with pytest.raises(TypeError):
        pass_at_k(5.0, 2, 2)
