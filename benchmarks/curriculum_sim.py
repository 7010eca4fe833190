"""Ground-truth-difficulty simulation of the curricula: informative groups per rollout.

Every prompt has a known pass rate p = sigmoid(theta). Levels (the ``difficulty`` column):
easy (40%, theta ~ N(1.5, 0.7), p ~ 0.8), medium (35%, N(-1, 0.7), p ~ 0.27) and hard (25%,
N(-4, 0.7), p ~ 0.02). Each step a curriculum's real code runs on the global batch: the sampler
draws candidates (``Curriculum.candidates`` / ``choose``, as
``groupwise.curriculum.base.PromptBatches`` does), ``plan`` sizes the groups, the rollouts are
Bernoulli(p) draws, and ``observe_global`` gets GlobalRows with the on-policy policy term (-A, GRPO
advantages) and the correctness. The "policy" then learns: a prompt whose group was informative
gains ``LEARN_SELF`` logits and every prompt of its level ``LEARN_LEVEL`` / prompts-per-step
(generalisation): a cheap stand-in for a softmax policy learned with Adam.

Printed per arm: informative groups (not all rollouts alike) per rollout,
averaged over the random seeds, with its ratio to uniform GRPO (mean and standard error over them),
the largest rollouts of any step (the budget is prompts x num_generations) and the final mean
pass rate of the pool. ``select_oracle`` is ``select`` told the true p (its ceiling at this
over-sampling); ``select_fixed_g`` selects prompts but keeps every group at G. Prompt-GDRO only
reweights the loss, which this simulation's learning rule does not read, so it equals uniform
by construction here. The final mean p is not an independent outcome: this learning rule
rewards informative groups directly. Run: ``python benchmarks/curriculum_sim.py [steps] [seeds]``
(about 10 s for the defaults on one CPU core).
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from groupwise.config.grpo_config import GRPOConfig
from groupwise.curriculum import (
    GDROOptions,
    GlobalRows,
    NoCurriculum,
    PromptBatch,
    PromptGDROCurriculum,
    RolloutGDROCurriculum,
    SelectCurriculum,
    SelectOptions,
)
from groupwise.curriculum.base import PromptSampler

# Per regime, (share, mean initial logit) of the easy, medium and hard levels.
REGIMES = {
    # p ~ 0.8 / 0.27 / 0.02: about half the uniform groups of 4 are all-alike at the start
    "medium": ((0.40, 1.5), (0.35, -1.0), (0.25, -4.0)),
    # p ~ 0.95 / 0.38 / 0.01: about 70% all-alike at the start
    "hard": ((0.35, 3.0), (0.30, -0.5), (0.35, -4.5)),
}
LEARN_SELF, LEARN_LEVEL = 0.1, 0.02
PROMPTS, NUM_GENERATIONS, POOL = 8, 4, 256


class OracleSelect(SelectCurriculum):
    """``select`` told the true pass rates (a near point-mass posterior): its ceiling here."""

    def __init__(self, theta: np.ndarray, options: SelectOptions) -> None:
        super().__init__(options)
        self.theta = theta  # the world's logits, updated in place as the policy learns

    def beta_of(self, index: int) -> tuple[float, float]:
        p = 1.0 / (1.0 + math.exp(-self.theta[index]))
        return 1e6 * p + 1e-9, 1e6 * (1.0 - p) + 1e-9


def arm_options(kind: type, curriculum: str, **values):
    """A curriculum's options (``kind``: GDROOptions, SelectOptions) as a run with GRPOConfig's
    defaults and ``values`` (the arm's mean group size, seed and choices) has them."""
    config = GRPOConfig().to_dict()
    config.update(curriculum=curriculum, num_generations=NUM_GENERATIONS, **values)
    return kind.from_config(config)


def make_arm(name: str, seed: int, theta: np.ndarray):
    """The curriculum of an arm, as ``groupwise`` builds it (group sizes 2..12 where variable;
    the GDRO arms' bandits draw with seed 0)."""
    g = NUM_GENERATIONS
    if name == "uniform":
        return NoCurriculum(g)
    if name == "select_oracle":
        return OracleSelect(theta, arm_options(SelectOptions, "select", seed=seed))
    if name.startswith("select"):
        allocator = {"select": "knapsack", "select_sqrt": "sqrt", "select_fixed_g": "uniform"}
        return SelectCurriculum(
            arm_options(SelectOptions, "select", select_allocator=allocator[name], seed=seed)
        )
    if name == "prompt_gdro":
        return PromptGDROCurriculum(
            arm_options(GDROOptions, "prompt_gdro", gdro_signal="failure_rate",
                    gdro_share_normalize=False, seed=0)
        )  # fmt: skip
    if name == "rollout_gdro_sqrt":
        return RolloutGDROCurriculum(
            arm_options(GDROOptions, "rollout_gdro", rollout_allocator="sqrt", seed=0)
        )
    if name == "rollout_gdro":
        return RolloutGDROCurriculum(
            arm_options(GDROOptions, "rollout_gdro", rollout_allocator="bandit", seed=0)
        )
    raise ValueError(f"unknown arm {name!r}")


ARMS = (
    "uniform", "select", "select_sqrt", "select_fixed_g", "select_oracle", "prompt_gdro",
    "rollout_gdro_sqrt", "rollout_gdro",
)  # fmt: skip


@dataclass
class ArmResult:
    informative: int
    rollouts: int
    max_step_rollouts: int
    min_step_rollouts: int
    rollouts_per_step: int
    final_mean_p: float

    @property
    def informative_per_rollout(self) -> float:
        return self.informative / self.rollouts


def grpo_advantages(rewards: np.ndarray) -> np.ndarray:
    if rewards.max() == rewards.min():
        return np.zeros_like(rewards)
    return (rewards - rewards.mean()) / (rewards.std(ddof=1) + 1e-4)


def run_arm(name: str, seed: int, steps: int = 200, regime: str = "medium") -> ArmResult:
    """One arm on one seed's world (the world and the sampler's seed are shared by the arms)."""
    levels = REGIMES[regime]
    world = np.random.default_rng(1000 + seed)
    level = world.choice(len(levels), size=POOL, p=[s for s, _ in levels])
    theta = np.array([levels[lv][1] for lv in level]) + 0.7 * world.normal(size=POOL)
    rows = [{"prompt": str(i), "difficulty": int(level[i])} for i in range(POOL)]
    rng = np.random.default_rng(seed)  # the rollouts' Bernoulli draws
    curriculum = make_arm(name, seed, theta)
    sampler = PromptSampler(POOL, seed)
    informative = rollouts = max_step = 0
    min_step = 10**9
    for _ in range(steps):
        drawn = curriculum.candidates(PROMPTS)
        indices, skipped = sampler.take(drawn), []
        if drawn > PROMPTS:  # as PromptBatches.next does
            picked = curriculum.choose(indices, [rows[i] for i in indices], PROMPTS)
            chosen = set(picked)
            skipped = [i for k, i in enumerate(indices) if k not in chosen]
            indices = [indices[k] for k in picked]
        batch = PromptBatch(indices, slice(0, PROMPTS), [rows[i] for i in indices],
                            [[0]] * PROMPTS, skipped)  # fmt: skip
        plan = curriculum.plan(batch)
        prompt, correct, loss = [], [], []
        p = 1.0 / (1.0 + np.exp(-theta))
        gained = np.zeros(len(levels))
        for k, (index, n) in enumerate(zip(indices, plan.counts, strict=True)):
            r = (rng.random(n) < p[index]).astype(np.float64)
            prompt += [k] * n
            correct += r.tolist()
            loss += (-grpo_advantages(r)).tolist()
            if 0 < r.sum() < n:
                informative += 1
                theta[index] += LEARN_SELF
                gained[level[index]] += 1
        step_rollouts = len(prompt)
        rollouts += step_rollouts
        max_step, min_step = max(max_step, step_rollouts), min(min_step, step_rollouts)
        theta += LEARN_LEVEL * gained[level] / PROMPTS
        if hasattr(curriculum, "observe_global"):
            curriculum.observe_global(plan, GlobalRows(prompt, correct, loss, correct))
    p = 1.0 / (1.0 + np.exp(-theta))
    budget = PROMPTS * NUM_GENERATIONS
    return ArmResult(informative, rollouts, max_step, min_step, budget, float(p.mean()))


def main(steps: int = 200, seeds: int = 5) -> None:
    for regime in REGIMES:
        report(regime, steps, seeds)


def report(regime: str, steps: int, seeds: int) -> dict[str, list[ArmResult]]:
    results = {arm: [run_arm(arm, s, steps, regime) for s in range(seeds)] for arm in ARMS}
    base = [r.informative_per_rollout for r in results["uniform"]]
    print(
        f"\nregime {regime}: {steps} steps x {PROMPTS} prompts x mean {NUM_GENERATIONS} "
        f"rollouts, pool {POOL}, seeds 0..{seeds - 1}"
    )
    print(f"{'arm':<18} {'inf/rollout':>11} {'ratio':>7} {'+-se':>6} {'max/step':>8} {'mean p':>7}")
    for arm, runs in results.items():
        values = [r.informative_per_rollout for r in runs]
        ratios = np.array(values) / np.array(base)
        se = float(ratios.std(ddof=1) / math.sqrt(len(ratios))) if len(ratios) > 1 else 0.0
        print(
            f"{arm:<18} {np.mean(values):>11.4f} {ratios.mean():>7.3f} {se:>6.3f} "
            f"{max(r.max_step_rollouts for r in runs):>8d} "
            f"{np.mean([r.final_mean_p for r in runs]):>7.3f}"
        )
    return results


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Ground-truth-difficulty simulation of the curricula: informative groups "
        "per rollout of each curriculum against uniform GRPO."
    )
    parser.add_argument("steps", nargs="?", type=int, default=200, help="steps per run")
    parser.add_argument("seeds", nargs="?", type=int, default=5, help="seeds per curriculum")
    return parser.parse_args(argv)


if __name__ == "__main__":
    options = parse_args(sys.argv[1:])
    main(options.steps, options.seeds)
