"""The curriculum experiment on a real model (an experiment, not a test).

SmolLM2-135M-Instruct, arithmetic with two operands and ``+-`` at three levels (1-, 2- and
3-digit operands: difficulty 12, 22, 32), five arms at an **equal generated-token budget**:

- ``uniform``: GRPO, 4 prompts x 4 rollouts per generation batch;
- ``dynamic_sampling``: DAPO dynamic sampling (drops groups whose correctness is uniform and
  generates more, at most 4 batches per step; the dropped tokens count against its budget);
- ``prompt_gdro_spg4``: Prompt-GDRO with ``steps_per_generation 4`` (the paper's verl setting);
- ``rollout_gdro``: Rollout-GDRO, square-root allocation per prompt (2..8 rollouts, mean 4);
- ``select``: predictive selection with adaptive group size (knapsack, 2..8, mean 4).

Stages (results go to ``--out``, one JSON line per finished run; a rerun skips what is done, so
an interrupted experiment continues):

1. **Warm start**, shared by every run: ``--warm_steps`` of uniform GRPO (format + accuracy
   rewards) from SmolLM2-135M-Instruct on a separate pool, so the model writes the answer
   format and the three levels have a real easy / medium / hard spread (the raw model's sampled
   pass rate is ~0.5% on this mix: nothing for a curriculum to act on). The token budget is
   ``--budget_batches`` x the warm start's generated tokens per batch over its last 4 steps.
2. **Runs**: per seed a training pool of ``--pool`` prompts per level (the same for every arm
   of that seed, different across seeds, reused over epochs), GRPO seed = the seed. Reward:
   ``accuracy`` only (so "informative" means the correctness varies). Each arm trains until its
   cumulative generated completion tokens reach the budget; held-out greedy accuracy is taken
   at half the budget and at the budget; pass@8 on the medium and hard levels at the budget.
3. **Report**: per arm the mean over seeds; paired differences against uniform (per-seed t
   interval, and a problem-level paired bootstrap pooled over seeds); the smallest effect the
   design detects with 80% power; informative groups per rollout; whether each arm reached
   uniform's final accuracy at half the tokens.

    python benchmarks/curriculum.py [--seeds 3] [--out runs/curriculum-experiment]
    python benchmarks/curriculum.py --report_only     # the tables from what has finished
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import tempfile
import time
from pathlib import Path
from statistics import NormalDist
from typing import Any

import numpy as np

from groupwise import GRPOConfig, GRPOTrainer
from groupwise.core import pass_at_k
from groupwise.data import arithmetic_dataset
from groupwise.evaluation import evaluate_model
from groupwise.models import load_model_and_tokenizer
from groupwise.rewards import accuracy_reward

LEVELS = (1, 2, 3)  # operand digits; difficulty column = digits * 10 + 2 operands
PASS_LEVELS = ("22", "32")  # pass@n on the medium (2-digit) and hard (3-digit) levels

BASE_OPTIONS: dict[str, Any] = dict(
    num_generations=4,
    per_device_train_batch_size=16,  # 4 prompts x 4 rollouts per batch
    max_completion_length=48,
    temperature=1.0,
    learning_rate=1e-5,
    beta=0.0,
    rollout_min=2,
    rollout_max=8,
    disable_tqdm=True,
    save_strategy="no",
    max_steps=400,
)

ARMS: dict[str, dict[str, Any]] = {
    "uniform": {},
    # At most 4 generation batches per optimizer step: one step can overshoot the token budget
    # by no more than that.
    "dynamic_sampling": {"dynamic_sampling": True, "max_num_gen_batches": 4},
    # 4 optimizer steps of 4 completions per generation batch of 16: Prompt-GDRO's pg_loss
    # signal is live (it is exactly 0 with one step per generation).
    "prompt_gdro_spg4": {
        "curriculum": "prompt_gdro",
        "per_device_train_batch_size": 4,
        "steps_per_generation": 4,
    },
    "rollout_gdro": {"curriculum": "rollout_gdro"},
    "select": {"curriculum": "select"},
}

# Two-sided 95% and one-sided 80% quantiles of Student's t, df = 1..10 (power of paired seeds).
T975 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228]
T80 = [1.376, 1.061, 0.978, 0.941, 0.920, 0.906, 0.896, 0.889, 0.883, 0.879]


def level_rows(count: int, split: str, seed: int) -> list[dict]:
    rows = []
    for digits in LEVELS:
        rows += arithmetic_dataset(count, split=split, seed=seed, digits=digits, ops="+-")
    return rows


class TokenBudget:
    """Stops training once the run's generated completion tokens reach ``budget``; greedy
    held-out accuracy at each fraction of the budget in ``marks`` (per problem, for paired
    statistics), and the seconds spent in training steps (evaluations excluded)."""

    def __init__(self, budget: int, marks: tuple[float, ...], eval_rows: list[dict]) -> None:
        self.budget, self.marks, self.eval_rows = budget, list(marks), eval_rows
        self.trainer: GRPOTrainer | None = None
        self.checkpoints: list[dict] = []
        self.step_seconds = 0.0  # training steps only, evaluations excluded
        self.last: dict[str, float] = {}

    def on_log(self, args, state, control, logs=None, **kwargs) -> None:
        if not logs or "compute/generated_tokens_total" not in logs:
            return
        self.last = dict(logs)
        self.step_seconds += logs.get("time/step", 0.0)
        tokens = logs["compute/generated_tokens_total"]
        while self.marks and tokens >= self.marks[0] * self.budget:
            greedy = greedy_correct(self.trainer.engine, self.trainer.tokenizer, self.eval_rows)
            self.trainer.model.train()
            self.checkpoints.append({"mark": self.marks.pop(0), "tokens": tokens, "greedy": greedy})
        if not self.marks:
            control.should_training_stop = True


def greedy_correct(model, tokenizer, rows: list[dict]) -> list[bool]:
    """Per problem: is the greedy completion correct (``model``: a model or a run's engine)."""
    result = evaluate_model(
        model, tokenizer, rows, [accuracy_reward], n=0, greedy=True,
        max_completion_length=BASE_OPTIONS["max_completion_length"], batch_size=64,
    )  # fmt: skip
    return [bool(r.greedy_correct) for r in result.per_prompt]


def sampled_counts(model, tokenizer, rows: list[dict], n: int, seed: int) -> list[int]:
    """Per problem: how many of ``n`` samples at temperature 1 are correct."""
    result = evaluate_model(
        model, tokenizer, rows, [accuracy_reward], n=n, ks=[1, n], greedy=False,
        temperature=1.0, max_completion_length=BASE_OPTIONS["max_completion_length"],
        seed=seed, batch_size=8,
    )  # fmt: skip
    return [r.c for r in result.per_prompt]


def warm_start(out: Path, steps: int) -> dict:
    """Uniform GRPO (format + accuracy) from SmolLM2-135M-Instruct; saved to ``out/warm``."""
    meta_path = out / "warm" / "warm.json"
    if meta_path.exists():
        return json.loads(meta_path.read_text())
    pool = level_rows(24, "train", seed=1000)
    args = GRPOConfig(
        **{
            **BASE_OPTIONS,
            "max_steps": steps,
            "seed": 1000,
            "output_dir": str(out / "warm"),
            "overwrite_output_dir": True,
        }
    )
    start = time.perf_counter()
    trainer = GRPOTrainer("smollm2-135m-instruct", ["format", "accuracy"], pool, args=args)
    trainer.train()
    logs = [x for x in trainer.log_history if "compute/generated_tokens" in x]
    per_batch = statistics.mean(x["compute/generated_tokens"] for x in logs[-4:])
    meta = {
        "steps": steps,
        "tokens_per_batch": per_batch,
        "seconds": time.perf_counter() - start,
        "accuracy_last4": statistics.mean(
            x.get("rewards/accuracy_reward/mean", math.nan) for x in logs[-4:]
        ),
    }
    meta_path.write_text(json.dumps(meta))
    return meta


def warm_eval(out: Path, eval_rows: list[dict], pass_rows: list[dict], n_pass: int) -> dict:
    """The warm start's held-out greedy accuracy per level and pass@n (cached)."""
    path = out / "warm" / "warm_eval.json"
    if path.exists():
        return json.loads(path.read_text())
    model, tokenizer = load_model_and_tokenizer(str(out / "warm"))
    greedy = greedy_correct(model, tokenizer, eval_rows)
    counts = sampled_counts(model, tokenizer, pass_rows, n_pass, seed=0)

    def level_mean(values: list, rows: list[dict], level: str) -> float:
        return statistics.mean(v for v, row in zip(values, rows, strict=True)
                               if str(row["difficulty"]) == level)  # fmt: skip

    result = {
        "greedy": {f"{d}2": level_mean(greedy, eval_rows, f"{d}2") for d in LEVELS},
        f"pass@{n_pass}": {
            level: level_mean([pass_at_k(n_pass, c, n_pass) for c in counts], pass_rows, level)
            for level in PASS_LEVELS
        },
    }
    path.write_text(json.dumps(result))
    return result


def run_arm(
    arm: str, seed: int, warm: Path, budget: int, pool_size: int, eval_rows, pass_rows, n_pass: int
) -> dict:
    pool = level_rows(pool_size, "train", seed=seed)
    budget_cb = TokenBudget(budget, (0.5, 1.0), eval_rows)
    with tempfile.TemporaryDirectory() as tmp:
        args = GRPOConfig(**{**BASE_OPTIONS, **ARMS[arm], "seed": seed, "output_dir": tmp})
        trainer = GRPOTrainer(str(warm), ["accuracy"], pool, args=args, callbacks=[budget_cb])
        budget_cb.trainer = trainer
        trainer.train()
        counts = sampled_counts(trainer.engine, trainer.tokenizer, pass_rows, n_pass, seed)
    last = budget_cb.last
    return {
        "arm": arm,
        "seed": seed,
        "budget": budget,
        "tokens": last["compute/generated_tokens_total"],
        "rollouts": last["compute/rollouts_total"],
        "optimizer_steps": last["compute/optimizer_steps_total"],
        "informative_per_rollout": last["compute/informative_groups_per_rollout_total"],
        "step_seconds": budget_cb.step_seconds,
        "checkpoints": budget_cb.checkpoints,
        "pass_counts": counts,
        "pass_levels": [str(r["difficulty"]) for r in pass_rows],
        "n_pass": n_pass,
    }


# --------------------------------------------------------------------------------------------
# Report


def t_interval(diffs: list[float]) -> tuple[float, float, float]:
    """Mean of paired per-seed differences and its 95% t half-width (nan for one seed)."""
    mean = statistics.mean(diffs)
    if len(diffs) < 2:
        return mean, math.nan, math.nan
    sd = statistics.stdev(diffs)
    return mean, T975[len(diffs) - 2] * sd / math.sqrt(len(diffs)), sd


def bootstrap_ci(diffs: np.ndarray, seed: int = 0, n_boot: int = 4000) -> tuple[float, float]:
    rng = np.random.default_rng(seed)
    means = diffs[rng.integers(0, len(diffs), (n_boot, len(diffs)))].mean(axis=1)
    return float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))


def level_mask(rows: list[dict], level: str | None) -> np.ndarray:
    return np.array([level is None or str(r["difficulty"]) == level for r in rows])


def report(results: list[dict], eval_rows: list[dict], warm_meta: dict) -> None:
    by = {(r["arm"], r["seed"]): r for r in results}
    arms = [a for a in ARMS if any(arm == a for arm, _ in by)]
    # Only seeds every arm has finished: the comparisons are paired.
    seeds = sorted({s for _, s in by if all((a, s) in by for a in arms)})
    if not seeds or "uniform" not in arms:
        print("no finished uniform run yet")
        return
    n_pass = results[0]["n_pass"]

    def greedy(r: dict, mark: float, level: str | None = None) -> float:
        point = next(c for c in r["checkpoints"] if c["mark"] == mark)
        return float(np.array(point["greedy"])[level_mask(eval_rows, level)].mean())

    def pass_rate(r: dict, k: int, level: str) -> np.ndarray:
        """Per problem of ``level``: the unbiased pass@k from n_pass samples."""
        return np.array(
            [
                pass_at_k(n_pass, c, k)
                for c, lv in zip(r["pass_counts"], r["pass_levels"], strict=True)
                if lv == level
            ]
        )

    budget = results[0]["budget"]
    print(
        f"\nbudget {budget} generated completion tokens per run ({warm_meta['steps']}-step warm "
        f"start: {warm_meta['tokens_per_batch']:.0f} tokens per batch of 16); seeds {seeds}; "
        f"held-out {len(eval_rows)} problems ({len(eval_rows) // 3} per level), pass@{n_pass} "
        f"from {n_pass} samples on the 2- and 3-digit ones"
    )
    header = [
        "greedy@B/2",
        "greedy@B",
        "1-digit",
        "2-digit",
        "3-digit",
        f"2-dig p@{n_pass}",
        f"3-dig p@{n_pass}",
        "tokens",
        "train s",
        "opt steps",
        "rollouts",
        "inform/rollout",
    ]
    print(f"{'arm':18s}" + "".join(f" {h:>14s}" for h in header))
    for arm in arms:
        runs = [by[(arm, s)] for s in seeds]
        cols = [
            [greedy(r, 0.5) for r in runs],
            [greedy(r, 1.0) for r in runs],
            *[[greedy(r, 1.0, f"{d}2") for r in runs] for d in LEVELS],
            *[[pass_rate(r, n_pass, level).mean() for r in runs] for level in PASS_LEVELS],
            [r["tokens"] for r in runs],
            [r["step_seconds"] for r in runs],
            [r["optimizer_steps"] for r in runs],
            [r["rollouts"] for r in runs],
            [r["informative_per_rollout"] for r in runs],
        ]
        cells = []
        for values in cols:
            spread = statistics.stdev(values) if len(values) > 1 else 0.0
            cells.append(
                f"{statistics.mean(values):.3f}+-{spread:.3f}"
                if max(values) < 10
                else f"{statistics.mean(values):.0f}"
            )
        print(f"{arm:18s}" + "".join(f" {c:>14s}" for c in cells))

    def paired(arm: str, metric: str) -> list[np.ndarray]:
        """Per seed, the per-problem differences arm - uniform at the budget."""
        diffs = []
        for s in seeds:
            a, u = by[(arm, s)], by[("uniform", s)]
            if metric == "greedy":
                final = [next(c for c in r["checkpoints"] if c["mark"] == 1.0) for r in (a, u)]
                diffs.append(np.array(final[0]["greedy"], float) - np.array(final[1]["greedy"]))
            else:
                diffs.append(pass_rate(a, n_pass, metric) - pass_rate(u, n_pass, metric))
        return diffs

    metrics = {"greedy": "greedy (all levels)"}
    metrics.update({level: f"{level[0]}-digit pass@{n_pass}" for level in PASS_LEVELS})
    uniform_mean = {
        "greedy": statistics.mean(greedy(by[("uniform", s)], 1.0) for s in seeds),
        **{
            level: statistics.mean(
                pass_rate(by[("uniform", s)], n_pass, level).mean() for s in seeds
            )
            for level in PASS_LEVELS
        },
    }
    print(
        "\npaired differences against uniform at the budget (arm - uniform): mean, 95% t "
        "interval over seeds, 95% paired bootstrap interval over seeds x problems"
    )
    for metric, label in metrics.items():
        for arm in arms[1:]:
            diffs = paired(arm, metric)
            per_seed = [float(d.mean()) for d in diffs]
            mean, half, _ = t_interval(per_seed)
            low, high = bootstrap_ci(np.concatenate(diffs))
            print(
                f"  {label:20s} {arm:18s} {mean:+.3f} (t: +-{half:.3f}; bootstrap "
                f"[{low:+.3f}, {high:+.3f}]) per seed {[round(x, 3) for x in per_seed]}"
            )

    # Power: the smallest paired difference detectable with 80% power at a two-sided 5% level,
    # from the pooled per-problem differences (normal; it treats problems x seeds as
    # independent, so it is optimistic) and from the spread of the per-seed means (t), and the
    # power of the pooled test for the target, +10% relative to uniform.
    z975, z80 = NormalDist().inv_cdf(0.975), NormalDist().inv_cdf(0.8)
    print("\npower (80%, two-sided 5%): minimum detectable difference (MDE) against uniform")
    for metric, label in metrics.items():
        target = 0.1 * uniform_mean[metric]
        for arm in arms[1:]:
            diffs = paired(arm, metric)
            pooled = np.concatenate(diffs)
            se = float(pooled.std(ddof=1) / math.sqrt(len(pooled)))
            line = f"  {label:20s} {arm:18s} pooled MDE {(z975 + z80) * se:.3f}; "
            if target > 0 and se > 0:
                power = NormalDist().cdf(target / se - z975)
                line += f"power for +10% relative (+{target:.3f}): {power:.0%}"
            else:  # uniform at 0 (or no spread): a relative target is undefined
                line += f"uniform's mean is {uniform_mean[metric]:.3f}: no relative target"
            if len(seeds) > 1:
                sd = statistics.stdev(float(d.mean()) for d in diffs)
                df = len(seeds) - 2
                line += f"; per-seed t MDE {(T975[df] + T80[df]) * sd / math.sqrt(len(seeds)):.3f}"
            print(line)

    print(
        "\nreached uniform's final greedy accuracy (same seed) with half the tokens (B/2) / "
        "with the budget (B), seeds out of " + str(len(seeds))
    )
    for arm in arms:
        half = sum(greedy(by[(arm, s)], 0.5) >= greedy(by[("uniform", s)], 1.0) for s in seeds)
        full = sum(greedy(by[(arm, s)], 1.0) >= greedy(by[("uniform", s)], 1.0) for s in seeds)
        print(f"  {arm:18s} B/2: {half}  B: {full}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--arms", default=",".join(ARMS))
    parser.add_argument("--out", default="runs/curriculum-experiment")
    parser.add_argument("--warm_steps", type=int, default=20)
    parser.add_argument(
        "--budget_batches",
        type=int,
        default=16,
        help="token budget = this many warm-start generation batches",
    )
    parser.add_argument("--pool", type=int, default=6, help="training prompts per level")
    parser.add_argument("--eval", type=int, default=40, help="held-out problems per level")
    parser.add_argument("--n_pass", type=int, default=8, help="samples per medium and hard problem")
    parser.add_argument("--report_only", action="store_true")
    opts = parser.parse_args()
    out = Path(opts.out)
    out.mkdir(parents=True, exist_ok=True)
    eval_rows = level_rows(opts.eval, "eval", seed=0)
    pass_rows = [r for r in eval_rows if str(r["difficulty"]) in PASS_LEVELS]
    results_path = out / "results.jsonl"
    results = (
        [json.loads(x) for x in results_path.read_text().splitlines() if x.strip()]
        if results_path.exists()
        else []
    )
    warm_meta_path = out / "warm" / "warm.json"
    if opts.report_only:
        start = warm_eval(out, eval_rows, pass_rows, opts.n_pass)
        print(f"warm start (every run's initialisation), held-out: {json.dumps(start)}")
        report(results, eval_rows, json.loads(warm_meta_path.read_text()))
        return
    warm = warm_start(out, opts.warm_steps)
    print(json.dumps({"warm_start": warm}), flush=True)
    start = warm_eval(out, eval_rows, pass_rows, opts.n_pass)
    print(json.dumps({"warm_start_eval": start}), flush=True)
    budget = int(round(opts.budget_batches * warm["tokens_per_batch"]))
    done = {(r["arm"], r["seed"]) for r in results}
    for seed in range(opts.seeds):  # seeds outermost: every finished seed is a complete pair
        for arm in opts.arms.split(","):
            if (arm, seed) in done:
                continue
            result = run_arm(
                arm, seed, out / "warm", budget, opts.pool, eval_rows, pass_rows, opts.n_pass
            )
            with results_path.open("a") as f:
                f.write(json.dumps(result) + "\n")
            results.append(result)
            print(
                json.dumps(
                    {
                        k: v
                        for k, v in result.items()
                        if k not in ("checkpoints", "pass_counts", "pass_levels")
                    }
                ),
                flush=True,
            )
    report(results, eval_rows, warm)


if __name__ == "__main__":
    main()
