"""curriculum: select in a seeded pass-rate simulation (numpy; groupwise's own sampler and
curriculum, no model): informative groups per rollout against uniform GRPO, for the default
``best_k`` rule and the ``legacy`` rule, in two regimes.

World (per seed): prompts in difficulty levels; a prompt's true logit is s[level] + b_i + m_i
(the policy's skill per level, the prompt's fixed offset, its memorisation). A rolled-out group
of n Bernoulli(p) rollouts with k correct that is informative (0 < k < n) carries the
std-normalised GRPO signal g = 2 sqrt(q (1 - q)), q = k / n, which moves its level's skill by
eta_s g / B (tau of that to the other levels), its memorisation by eta_m g, and the skills take
a random step of sd ``rw``. Held-out accuracy: 400 fresh offsets per level.

- ``late``: a late-training pool (55% nearly solved, 25% hopeless, 20% in between; 512 prompts,
  8 prompts x 8 rollouts, 300 steps), where most groups are all alike.
- ``learn``: three levels that get learned in turn (192 prompts, 4 x 4, 300 steps), with the
  rollouts to reach a held-out accuracy of 0.55.

Run as a script for the table over 10 seeds:
``PYTHONPATH=src python tests/curriculum/test_select_sim.py [regime] [seeds]``.
"""

from __future__ import annotations

import math
import sys
import zlib
from dataclasses import dataclass

import numpy as np
import pytest

from groupwise.config.grpo_config import GRPOConfig
from groupwise.curriculum import GlobalRows, PromptBatch, SelectCurriculum, SelectOptions
from groupwise.curriculum.base import PromptSampler


@dataclass(frozen=True)
class Regime:
    levels: tuple[tuple[float, float, float], ...]  # (share, starting skill, sd of offsets)
    pool: int
    prompts: int  # per step
    group: int  # rollouts per prompt (mean)
    steps: int
    eta_s: float
    tau: float
    eta_m: float
    n_max: int = 8
    rw: float = 0.0
    target: float | None = None


REGIMES = {
    "late": Regime(((0.55, 4.0, 1.2), (0.20, 0.0, 1.2), (0.25, -4.5, 1.2)), pool=512,
                   prompts=8, group=8, steps=300, eta_s=0.03, tau=0.25, eta_m=0.05, n_max=16),
    "learn": Regime(((1 / 3, -0.5, 1.2), (1 / 3, -2.5, 1.2), (1 / 3, -5.5, 1.2)), pool=192,
                    prompts=4, group=4, steps=300, eta_s=0.12, tau=0.25, eta_m=0.15, rw=0.03,
                    target=0.55),
}  # fmt: skip


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


@dataclass
class Result:
    informative: int
    rollouts: int
    rollouts_to_target: int | None

    @property
    def per_rollout(self) -> float:
        return self.informative / self.rollouts


def simulate(arm: str, regime: str, seed: int) -> Result:
    """One run: ``arm`` is ``uniform`` or a ``select_rule`` (``best_k``, ``legacy``) with its
    default over-sampling."""
    reg = REGIMES[regime]
    world = np.random.default_rng(1000 + seed)
    shares = np.array([lv[0] for lv in reg.levels])
    shares = shares / shares.sum()
    level = world.choice(len(shares), size=reg.pool, p=shares)
    offset = np.array([reg.levels[lv][2] for lv in level]) * world.normal(size=reg.pool)
    memo = np.zeros(reg.pool)
    skill = np.array([lv[1] for lv in reg.levels], dtype=float)
    heldout = [reg.levels[lv][2] * world.normal(size=400) for lv in range(len(shares))]
    rows = [{"difficulty": int(lv)} for lv in level]

    sampler = PromptSampler(reg.pool, seed)
    cur = None
    if arm != "uniform":
        options = {**GRPOConfig(curriculum="select").to_dict(), "num_generations": reg.group,
                   "rollout_max": reg.n_max, "select_rule": arm, "seed": seed}  # fmt: skip
        cur = SelectCurriculum(SelectOptions.from_config(options))
    rng = np.random.default_rng(zlib.crc32(f"{arm}|{seed}".encode()))
    informative = rollouts = 0
    hit = None
    for _ in range(reg.steps):
        B = reg.prompts
        if cur is None:
            indices, counts = sampler.take(B), [reg.group] * B
        else:
            drawn = sampler.take(cur.candidates(B))
            picked = cur.choose(drawn, [rows[i] for i in drawn], B)
            indices = [drawn[k] for k in picked]
            skipped = [i for k, i in enumerate(drawn) if k not in set(picked)]
            plan = cur.plan(PromptBatch(indices, slice(0, B), [rows[i] for i in indices],
                                        [[0]] * B, skipped))  # fmt: skip
            counts = list(plan.counts)
        assert len(set(indices)) == len(indices)  # no prompt twice in one step
        p = _sigmoid(skill[level] + offset + memo)
        step = np.zeros(len(skill))
        ks = []
        for i, n in zip(indices, counts, strict=True):
            k = int((rng.random(n) < p[i]).sum())
            ks.append(k)
            if 0 < k < n:
                g = 2.0 * math.sqrt(k / n * (1 - k / n))
                step += reg.tau * reg.eta_s * g / B
                step[level[i]] += (1 - reg.tau) * reg.eta_s * g / B
                memo[i] += reg.eta_m * g
                informative += 1
        rollouts += sum(counts)
        skill += step + reg.rw * rng.normal(size=len(skill))
        if cur is not None:
            prompt, correct = [], []
            for j, (n, k) in enumerate(zip(counts, ks, strict=True)):
                prompt += [j] * n
                correct += [1.0] * k + [0.0] * (n - k)
            cur.observe_global(plan, GlobalRows(prompt, correct, [0.0] * len(prompt), correct))
        accuracy = float(np.dot([_sigmoid(skill[lv] + h).mean() for lv, h in
                                 enumerate(heldout)], shares))  # fmt: skip
        if reg.target is not None and hit is None and accuracy >= reg.target:
            hit = rollouts
    return Result(informative, rollouts, hit)


def ratios(regime: str, seeds: range) -> dict[str, float]:
    """Informative groups per rollout over the seeds, as a ratio to uniform's (ratio of means),
    per arm; with a target, also each arm's geometric-mean speed-up in rollouts to it
    (``<arm> speed-up``; a run that misses counts 1.5x the budget)."""
    reg = REGIMES[regime]
    runs = {arm: [simulate(arm, regime, s) for s in seeds] for arm in ("uniform", "best_k",
                                                                        "legacy")}  # fmt: skip
    base = np.mean([r.per_rollout for r in runs["uniform"]])
    out = {arm: float(np.mean([r.per_rollout for r in rs]) / base) for arm, rs in runs.items()}
    if reg.target is not None:
        miss = 1.5 * reg.steps * reg.prompts * reg.group

        def to_target(rs: list[Result]) -> np.ndarray:
            return np.array([r.rollouts_to_target or miss for r in rs], dtype=float)

        for arm in ("best_k", "legacy"):
            log_ratio = np.log(to_target(runs["uniform"]) / to_target(runs[arm]))
            out[f"{arm} speed-up"] = float(np.exp(log_ratio.mean()))
    return out


# Margins, from the measured seed-to-seed spread over seeds 0-9 (the runs are seeded, so these
# tests are deterministic; the margins say how far a change may move them):
# - late: best_k 1.75 (per-seed sd 0.05, standard error 0.017), legacy 1.25 (sd 0.03, se 0.010).
#   ">= 1.5" is 15 se below best_k, "best_k - legacy >= 0.3" 10 se below the measured 0.50.
# - learn: best_k 1.28 (sd 0.16, se 0.05), legacy 1.07; best_k - legacy 0.21 (paired se 0.05,
#   4 se above 0); speed-up to the target 1.44x (log sd 0.15, se 0.048), legacy 1.19x.
#   ">= 1.1" is 3.4 se below best_k, ">= 1.25x" 3.0 se below its speed-up; best_k's speed-up
#   over legacy's is 1.22x (paired log se 0.04, 4.8 se above 1).


def test_late_pool_best_k_gets_well_over_uniform_and_legacy():
    r = ratios("late", range(10))
    assert r["best_k"] >= 1.5, r
    assert r["best_k"] - r["legacy"] >= 0.3, r
    assert 1.1 <= r["legacy"] <= 1.4, r


def test_learning_regime_best_k_reaches_the_target_sooner_than_legacy():
    r = ratios("learn", range(10))
    assert r["best_k"] >= 1.1 and r["best_k"] > r["legacy"], r
    assert r["best_k speed-up"] >= 1.25 and r["best_k speed-up"] > r["legacy speed-up"], r


@pytest.mark.parametrize("arm", ["best_k", "legacy"])
def test_the_simulation_is_seeded(arm):
    assert simulate(arm, "learn", 3) == simulate(arm, "learn", 3)


if __name__ == "__main__":
    regimes = sys.argv[1:2] or list(REGIMES)
    seeds = int(sys.argv[2]) if len(sys.argv) > 2 else 10
    for name in regimes:
        print(name, {k: round(v, 3) for k, v in ratios(name, range(seeds)).items()})
