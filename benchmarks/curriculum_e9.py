"""The curriculum experiment E9, "the premise regime": in a pool where uniform GRPO wastes most
of its groups (all alike: solved or out of reach), do ``select`` and Rollout-GDRO with its level
prior learn the learnable level faster than uniform at the same generated-token budget?
(An experiment, not a test: hours of CPU, resumable, results committed beside it.)

Design, frozen in this file and in ``curriculum_e9_analysis.py`` before any curriculum run:

- **Model.** SmolLM2-135M-Instruct after the supervised warm start of
  ``benchmarks/curriculum.py`` (``fine_tune``: 10 AdamW steps on the worked answers of the
  1-digit problems). Accuracy reward only, KL to the warm start (beta 0.04), learning rate 1e-5,
  4 prompts x 4 rollouts a step, group sizes 2..8 where a curriculum sets them
  (``curriculum.BASE_OPTIONS``, ``RUN_OPTIONS``).
- **Pool, per seed** (the same for every arm of the seed): 80 one-digit additions (solved; drawn
  from all 100, since E9 evaluates no one-digit problem and the training split holds 76),
  32 two-digit (learnable; the endpoint's level), 80 four-digit (out of reach), from the
  training split. The ``difficulty`` column (digits x 10 + 2) is the level both curricula read.
- **Arms.** ``uniform``; ``select`` with its defaults; ``rollout_gdro`` with ``gdro_unseen:
  difficulty`` and its other defaults (the only shipped GDRO setting that acts within about one
  epoch: docs/curriculum.md, "When each curriculum acts").
- **Budget.** The same generated completion tokens per arm: ``BUDGET_STEPS`` (50) steps of 16
  completions as long as the pilot pool's mean worked answer (``tokens_per_step``, a count of
  the tokenizer's, recorded in ``warm.json``).
- **Evaluation.** At every tenth of the budget: the fixed 128 held-out two-digit problems (the
  first 128 of ``curriculum.py``'s evaluation set), one sample each at temperature 1, seeded by
  the evaluation's index. The warm start's point is measured once (``warm.json``). At the
  budget also: greedy on the same 128, and 128 held-out four-digit problems sampled once.
- **Analysis**: ``curriculum_e9_analysis.py`` (endpoint, paired t per curriculum at one-sided
  0.025, looks at 8, 14 and 20 seeds with the efficacy boundary and non-binding futility, the
  decision rule). ``run`` goes in blocks of seeds up to each look; after a block it analyses
  what is in, and stops the curricula that are decided (uniform runs while any runs).
- **Pilot and go/no-go** (``pilot``, seed 0, no curriculum run): the pass rates of seed 0's pool
  (16 samples a prompt at temperature 1) must be one-digit >= 0.9, four-digit <= 0.02,
  two-digit in [0.15, 0.45], with a best-quarter ceiling >= 3x (``curriculum.selection_ceiling``);
  one uniform run must raise its sampled two-digit accuracy by >= 0.10 (mean of the last three
  evaluations against the warm start's point) and keep four-digit at the budget <= 0.05. The
  verdict is written to ``pilot.json``; ``run`` refuses a no-go pilot.
- **Frozen code.** ``freeze`` makes a git worktree of the current commit (clean in ``src/`` and
  ``benchmarks/``) and records the commit in the results folder (``frozen.json``); ``pilot``,
  ``measure`` and ``run`` refuse to run from any other code (another commit, local changes, or a
  ``groupwise`` imported from elsewhere), and every record carries the commit.
- **Measuring** (``measure``): two one-thread uniform runs side by side against one two-thread
  run, in training steps per second, to decide ``run --jobs 1`` or ``2`` (written to
  ``measure.json``).

Results (committed): ``benchmarks/results_curriculum/e9/``: ``warm.json``, ``pilot.json``,
``measure.json``, ``frozen.json``, ``runs.jsonl`` (one line per finished run, appended as it
finishes; a rerun skips what is done), ``analysis.json`` (``report``). Weights go to ``--work``.

    python benchmarks/curriculum_e9.py freeze --tree runs/e9-code   # once
    cd runs/e9-code && PYTHONPATH=src python benchmarks/curriculum_e9.py pilot --results R
    ... measure --results R;  ... run --results R [--jobs 2];  ... report --results R

(``make bench-curriculum-e9-pilot``, ``bench-curriculum-e9-measure``, ``bench-curriculum-e9``
do exactly this; R is this checkout's ``benchmarks/results_curriculum/e9``.)
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from groupwise import GRPOConfig, GRPOTrainer
from groupwise.evaluation import evaluate_model
from groupwise.rewards import accuracy_reward
from groupwise.runtime.models import load_model_and_tokenizer

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import curriculum_e9_analysis as analysis  # noqa: E402

import curriculum as r8  # noqa: E402  (the warm start and helpers of the earlier experiment)

ROOT = HERE.parent
RESULTS = HERE / "results_curriculum" / "e9"
PILOT_SEED = 0
EVAL_SEED = 9000  # evaluation k samples with seed EVAL_SEED + k (k = 0: the warm start)
MARKS = tuple(round(0.1 * k, 1) for k in range(1, 11))
ARMS: dict[str, dict[str, Any]] = {
    "uniform": {},
    "select": {"curriculum": "select"},
    "rollout_gdro_level": {"curriculum": "rollout_gdro", "gdro_unseen": "difficulty"},
}
CURRICULA = ("select", "rollout_gdro_level")
# A step's phases, as the trainer logs them (time/<phase>); "step" is the whole step.
PHASES = ("generation", "scoring", "update", "planning", "step")
# Go/no-go of the pilot.
ONE_DIGIT_MIN, FOUR_DIGIT_MAX, TWO_DIGIT_RANGE, CEILING_MIN = 0.9, 0.02, (0.15, 0.45), 3.0
RISE_MIN, FOUR_DIGIT_RUN_MAX = 0.10, 0.05


@dataclass(frozen=True)
class Setup:
    """The experiment's sizes. The defaults are E9's; the tests run the same code with the tiny
    random model and a few problems (:func:`tiny`)."""

    model: str | None = None  # None: the supervised warm start, built into --work
    pool: tuple[tuple[int, int], ...] = ((1, 80), (2, 32), (4, 80))  # (digits, prompts)
    eval_two: int = 128
    eval_four: int = 128
    budget_steps: int = 50
    pass_samples: int = 16
    max_completion_length: int = r8.BASE_OPTIONS["max_completion_length"]
    seeds: int = analysis.LOOKS[-1]
    looks: tuple[int, ...] = analysis.LOOKS
    tokens_per_step: float | None = None  # None: 16 worked answers of the pilot pool


def tiny() -> Setup:
    """The same code at test size: the tiny random model, 2 prompts a level, 2 steps, looks
    at 2 and 3 seeds."""
    return Setup(model="tiny-random", pool=((1, 2), (2, 2), (4, 2)), eval_two=4, eval_four=2,
                 budget_steps=2, pass_samples=4, max_completion_length=8, seeds=3,
                 looks=(2, 3), tokens_per_step=16 * 8)  # fmt: skip


# --------------------------------------------------------------------------------------------
# Data


def pool_rows(seed: int, setup: Setup) -> list[dict]:
    """Seed ``seed``'s pool: per level (digits, count) of ``setup.pool``, additions from the
    training split; one-digit ones from all 100 (both splits: no one-digit problem is
    evaluated), a seeded choice."""
    rows: list[dict] = []
    for digits, count in setup.pool:
        if digits == 1:
            every = r8.problems(None, "train", seed, 1) + r8.problems(None, "eval", seed, 1)
            order = np.random.default_rng(seed).permutation(len(every))[:count]
            rows += [every[i] for i in order]
        else:
            rows += r8.problems(count, "train", seed, digits)
    return rows


def eval_sets(setup: Setup) -> dict[str, list[dict]]:
    """The held-out sets, fixed for the experiment: two-digit (the first of curriculum.py's
    evaluation set) and four-digit."""
    return {"two": r8.problems(setup.eval_two, "eval", 7, 2),
            "four": r8.problems(setup.eval_four, "eval", 7, 4)}  # fmt: skip


def sampled_correct(model, tokenizer, rows: list[dict], seed: int, setup: Setup,
                    n: int = 1) -> list[int]:  # fmt: skip
    """Correct samples of ``n`` per row at temperature 1 (``model``: a model or a run's
    engine), with the evaluation's own seed (training's sampling is untouched)."""
    result = evaluate_model(
        model, tokenizer, rows, [accuracy_reward], n=n, ks=[1], greedy=False,
        temperature=1.0, max_completion_length=setup.max_completion_length, seed=seed,
        batch_size=64 if n == 1 else 8,
    )  # fmt: skip
    return [int(r.c) for r in result.per_prompt]


def greedy_correct(model, tokenizer, rows: list[dict], setup: Setup) -> list[int]:
    result = evaluate_model(
        model, tokenizer, rows, [accuracy_reward], n=0, greedy=True,
        max_completion_length=setup.max_completion_length, batch_size=64,
    )  # fmt: skip
    return [int(bool(r.greedy_correct)) for r in result.per_prompt]


def read_json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {}


# --------------------------------------------------------------------------------------------
# Frozen code


def git(*args: str, cwd: Path = ROOT) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True,
                          text=True).stdout.strip()  # fmt: skip


def code_state() -> dict:
    """The commit this script runs from, whether ``src/`` or ``benchmarks/`` differ from it
    (results folders aside), and where ``groupwise`` is imported from."""
    import groupwise

    changes = git("status", "--porcelain", "--", "src", "benchmarks")
    changed = [line for line in changes.splitlines() if "results_" not in line]
    return {"commit": git("rev-parse", "HEAD"), "dirty": bool(changed),
            "groupwise": str(Path(groupwise.__file__).resolve().parent),
            "own_src": Path(groupwise.__file__).resolve().is_relative_to(ROOT / "src")}  # fmt: skip


def check_frozen(results: Path, unfrozen: bool) -> dict:
    """The code state, refused unless it is the frozen commit, clean, with its own groupwise
    (``unfrozen``: the tests' tiny runs; the state is still recorded)."""
    state = code_state()
    if unfrozen:
        return state
    frozen = read_json(results / "frozen.json")
    if not frozen:
        raise SystemExit(f"no {results / 'frozen.json'}: freeze the code first "
                         "(make bench-curriculum-e9-freeze)")  # fmt: skip
    problems = []
    if state["commit"] != frozen["commit"]:
        problems.append(f"this code is at {state['commit'][:10]}, the experiment's at "
                        f"{frozen['commit'][:10]}")  # fmt: skip
    if state["dirty"]:
        problems.append("src/ or benchmarks/ have local changes")
    if not state["own_src"]:
        problems.append(f"groupwise is imported from {state['groupwise']}, not from this tree's "
                        "src/ (set PYTHONPATH=src)")  # fmt: skip
    if problems:
        raise SystemExit("the experiment runs only from its frozen code: " + "; ".join(problems)
                         + f". Run it from the worktree {frozen['tree']}")  # fmt: skip
    return state


def command_freeze(results: Path, tree: Path) -> None:
    """A git worktree of this commit at ``tree`` (made once), recorded in ``frozen.json``."""
    frozen = read_json(results / "frozen.json")
    if not frozen:
        state = code_state()
        if state["dirty"]:
            raise SystemExit("commit the changes in src/ and benchmarks/ before freezing")
        frozen = {"commit": state["commit"], "tree": str(tree.resolve()),
                  "frozen_at": time.strftime("%Y-%m-%d %H:%M:%S %Z")}  # fmt: skip
        r8.write_json(results / "frozen.json", frozen)
    if not (Path(frozen["tree"]) / "benchmarks" / "curriculum_e9.py").exists():
        git("worktree", "add", "--detach", frozen["tree"], frozen["commit"])
    print(json.dumps(frozen), flush=True)


# --------------------------------------------------------------------------------------------
# The warm start


def warm_start(work: Path, results: Path, setup: Setup) -> tuple[str, dict]:
    """The model runs start from and its record (``warm.json``): the supervised warm start of
    curriculum.py built once into ``work`` (or ``setup.model``), its digest, the budget's unit,
    and its sampled two-digit and four-digit accuracy, measured once."""
    path = results / "warm.json"
    meta = read_json(path)
    if setup.model is None:
        folder = work / f"warm-supervised-{r8.SFT_STEPS}"
        meta["supervised"] = r8.built_once(folder, meta.get("supervised"), r8.fine_tune)
        model_path = str(folder)
        digest = r8.weights_digest(folder)
    else:
        model_path, digest = setup.model, setup.model
        meta.setdefault("supervised", {"digest": digest})
    if digest != meta["supervised"]["digest"]:
        raise SystemExit(f"the warm start in {model_path} (digest {digest}) is not the recorded "
                         f"one ({meta['supervised']['digest']}): the experiment's runs pair "
                         "only with runs from the recorded weights")  # fmt: skip
    if "tokens_per_step" not in meta or "sampled" not in meta:
        model, tokenizer = load_model_and_tokenizer(model_path)
        lengths = [len(r8.completion_ids(tokenizer, row)) for row in pool_rows(PILOT_SEED, setup)]
        meta["tokens_per_step"] = setup.tokens_per_step or (
            r8.BASE_OPTIONS["per_device_train_batch_size"] * statistics.mean(lengths)
        )
        sets = eval_sets(setup)
        meta["sampled"] = sampled_correct(model, tokenizer, sets["two"], EVAL_SEED, setup)
        meta["sampled_accuracy"] = float(np.mean(meta["sampled"]))
        four = sampled_correct(model, tokenizer, sets["four"], EVAL_SEED, setup)
        meta["four_digit_sampled_accuracy"] = float(np.mean(four))
        r8.write_json(path, meta)
    return model_path, meta


def budget_of(meta: dict, setup: Setup) -> int:
    return int(round(setup.budget_steps * meta["tokens_per_step"]))


# --------------------------------------------------------------------------------------------
# One run


class SampledBudget(r8.StepLogs):
    """Stops training at ``budget`` generated tokens; at each tenth of it, samples the held-out
    two-digit set once at temperature 1; at the budget also greedy two-digit and sampled
    four-digit. Records each step's groups as [digits, rollouts, correct]."""

    def __init__(self, budget: int, sets: dict[str, list[dict]], setup: Setup,
                 evaluate: bool = True, marks: tuple[float, ...] = MARKS) -> None:  # fmt: skip
        super().__init__()
        self.budget, self.sets, self.setup, self.evaluate = budget, sets, setup, evaluate
        self.marks = list(marks) if evaluate else []
        self.phases: list[list[float]] = []
        self.points: list[dict] = []
        self.final: dict[str, list[int]] = {}
        self.groups: list[list[list[int]]] = []
        self.last: dict[str, float] = {}
        self.step_seconds = 0.0

    step_groups = r8.TokenBudget.step_groups

    def on_log(self, args, state, control, logs=None, **kwargs) -> None:
        if not self.new_step(state, logs):
            return
        self.last = dict(logs)
        self.step_seconds += logs.get("time/step", 0.0)
        self.phases.append([logs.get("compute/generated_tokens", 0.0)] + [
            round(logs.get(f"time/{phase}", 0.0), 4) for phase in PHASES])
        self.groups.append(self.step_groups())
        tokens = logs["compute/generated_tokens_total"]
        if not self.evaluate:  # a timing run: to the budget, no evaluation
            control.should_training_stop = tokens >= self.budget
            return
        engine, tokenizer = self.trainer.engine, self.trainer.tokenizer
        while self.marks and tokens >= self.marks[0] * self.budget:
            mark = self.marks.pop(0)
            k = MARKS.index(mark) + 1
            sampled = sampled_correct(engine, tokenizer, self.sets["two"], EVAL_SEED + k,
                                      self.setup)  # fmt: skip
            self.points.append({"mark": mark, "tokens": tokens, "step": state.global_step,
                                "seconds": round(self.step_seconds, 2),
                                "sampled": sampled})  # fmt: skip
            print(f"  {mark:.1f} B: step {state.global_step}, sampled 2-digit "
                  f"{np.mean(sampled):.3f}", flush=True)  # fmt: skip
            self.trainer.model.train()
        if not self.marks:
            if not self.final:
                self.final = self.final_evaluations(engine, tokenizer)
            self.trainer.model.train()
            control.should_training_stop = True


    def final_evaluations(self, engine, tokenizer) -> dict[str, list[int]]:
        """At the budget: greedy two-digit and sampled four-digit."""
        return {
            "greedy_two": greedy_correct(engine, tokenizer, self.sets["two"], self.setup),
            "sampled_four": sampled_correct(engine, tokenizer, self.sets["four"],
                                            EVAL_SEED + 100, self.setup),  # fmt: skip
        }


def run_options(arm: str, seed: int, setup: Setup, output_dir: str, **extra: Any) -> Any:
    return GRPOConfig(**{**r8.BASE_OPTIONS, **r8.RUN_OPTIONS, **ARMS[arm],
                            "max_completion_length": setup.max_completion_length,
                            "seed": seed, "output_dir": output_dir, **extra})  # fmt: skip


def run_arm(arm: str, seed: int, model_path: str, meta: dict, setup: Setup, code: dict,
            evaluate: bool = True) -> dict:  # fmt: skip
    """One run of ``arm`` on seed ``seed``'s pool, to the budget (``evaluate`` false: no
    evaluation, for timing). ``phases``: each step's generated tokens and the seconds of each
    of ``PHASES``."""
    budget = budget_of(meta, setup)
    callback = SampledBudget(budget, eval_sets(setup), setup, evaluate)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        trainer = GRPOTrainer(model_path, ["accuracy"], pool_rows(seed, setup),
                                 args=run_options(arm, seed, setup, tmp),
                                 callbacks=[callback])  # fmt: skip
        callback.trainer = trainer
        trainer.train()
    last = callback.last
    _, two_digit_inform = r8_level_counts(callback.groups)
    return {
        "arm": arm, "seed": seed, "warm": meta["supervised"]["digest"], "commit": code["commit"],
        "dirty": code["dirty"], "budget": budget,
        "tokens": last["compute/generated_tokens_total"],
        "rollouts": last["compute/rollouts_total"],
        "optimizer_steps": last["compute/optimizer_steps_total"],
        "informative_per_rollout": last["compute/informative_groups_per_rollout_total"],
        "informative_two_digit": two_digit_inform,
        "step_seconds": round(callback.step_seconds, 1),
        "wall_seconds": round(time.perf_counter() - start, 1),
        "threads": int(torch.get_num_threads()),
        "points": callback.points, **callback.final, "groups": callback.groups,
        "phase_names": ["tokens", *PHASES], "phases": callback.phases,
    }  # fmt: skip


def r8_level_counts(steps: list[list[list[int]]]) -> tuple[dict, int]:
    """Groups per level and the informative two-digit groups of a run's recorded steps."""
    groups: dict[int, int] = {}
    inform = 0
    for step in steps:
        for digits, n, correct in step:
            groups[digits] = groups.get(digits, 0) + 1
            inform += digits == 2 and 0 < correct < n
    return groups, inform


def read_runs(results: Path) -> list[dict]:
    path = results / "runs.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def append_run(results: Path, record: dict) -> None:
    """One line per finished run, under a lock (``run --jobs 2`` appends from two processes)."""
    results.mkdir(parents=True, exist_ok=True)
    with (results / "runs.jsonl").open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.write(json.dumps(record) + "\n")
        f.flush()
        fcntl.flock(f, fcntl.LOCK_UN)


# --------------------------------------------------------------------------------------------
# Commands


def command_pilot(work: Path, results: Path, setup: Setup, unfrozen: bool) -> dict:
    """Pass rates of seed 0's pool, one uniform run, the go/no-go (``pilot.json``)."""
    code = check_frozen(results, unfrozen)
    model_path, meta = warm_start(work, results, setup)
    path = results / "pilot.json"
    pilot = read_json(path)
    if "pass_counts" not in pilot:
        model, tokenizer = load_model_and_tokenizer(model_path)
        start = time.perf_counter()
        pilot["pass_counts"] = sampled_correct(model, tokenizer, pool_rows(PILOT_SEED, setup),
                                               PILOT_SEED, setup, n=setup.pass_samples)  # fmt: skip
        pilot["pass_seconds"] = round(time.perf_counter() - start, 1)
        r8.write_json(path, pilot)
    counts = np.asarray(pilot["pass_counts"], float) / setup.pass_samples
    levels, start = {}, 0
    for digits, count in setup.pool:
        levels[f"{digits}-digit"] = float(counts[start : start + count].mean())
        start += count
    ceiling = r8.selection_ceiling(pilot["pass_counts"], setup.pass_samples)
    ceiling.pop("mean_pass_rate_by_level", None)  # curriculum.py's equal-level slicing
    pilot["pass_rates"], pilot["ceiling"] = levels, ceiling
    if "uniform" not in pilot:
        print(f"uniform pilot run: budget {budget_of(meta, setup)} generated tokens", flush=True)
        pilot["uniform"] = run_arm("uniform", PILOT_SEED, model_path, meta, setup, code)
        r8.write_json(path, pilot)
    pilot["go"] = go_no_go(levels, ceiling["best_quarter_ratio"], pilot["uniform"], meta)
    r8.write_json(path, pilot)
    print(json.dumps({"pass_rates": levels, "ceiling": ceiling, "go": pilot["go"]}), flush=True)
    return pilot


def go_no_go(levels: dict[str, float], ceiling: float, run: dict, meta: dict) -> dict:
    """The pilot's verdict: every check with its value and whether it holds."""
    late = [float(np.mean(p["sampled"])) for p in run["points"][-3:]]
    rise = float(np.mean(late)) - meta["sampled_accuracy"]
    four = float(np.mean(run["sampled_four"]))
    low, high = TWO_DIGIT_RANGE
    checks = {
        "one_digit_pass_rate": (levels.get("1-digit", 0.0), levels.get("1-digit", 0.0)
                                >= ONE_DIGIT_MIN),  # fmt: skip
        "four_digit_pass_rate": (levels.get("4-digit", 1.0), levels.get("4-digit", 1.0)
                                 <= FOUR_DIGIT_MAX),  # fmt: skip
        "two_digit_pass_rate": (levels.get("2-digit", 0.0),
                                low <= levels.get("2-digit", 0.0) <= high),
        "best_quarter_ratio": (ceiling, bool(ceiling >= CEILING_MIN)),
        "uniform_two_digit_rise": (rise, rise >= RISE_MIN),
        "uniform_four_digit_at_budget": (four, four <= FOUR_DIGIT_RUN_MAX),
    }
    # A pool with no informative prompt has no ceiling (NaN): recorded as null, a no-go.
    out: dict[str, Any] = {k: {"value": None if v != v else v, "holds": bool(ok)}
                           for k, (v, ok) in checks.items()}  # fmt: skip
    out["proceed"] = all(c["holds"] for c in out.values())
    return out


def blocks(setup: Setup) -> list[list[int]]:
    """Seeds 1..n in blocks ending at the looks."""
    out, first = [], 1
    for look in setup.looks:
        out.append(list(range(first, look + 1)))
        first = look + 1
    return out


def command_run(work: Path, results: Path, setup: Setup, jobs: int, unfrozen: bool,
                force: bool, only: list[tuple[str, int]] | None = None) -> None:  # fmt: skip
    """The experiment, block by block up to each look; after each block the analysis stops the
    decided curricula. ``only``: the (arm, seed) units of a ``--jobs`` worker."""
    code = check_frozen(results, unfrozen)
    if only is not None:  # a worker of this command: the parent checked the pilot
        model_path, meta = warm_start(work, results, setup)
        for arm, seed in only:
            append_run(results, run_arm(arm, seed, model_path, meta, setup, code))
        return
    pilot = read_json(results / "pilot.json")
    if "go" not in pilot:
        raise SystemExit("run the pilot first (make bench-curriculum-e9-pilot)")
    if not pilot["go"]["proceed"] and not force:
        raise SystemExit(f"the pilot said no-go ({json.dumps(pilot['go'])}); nothing is run "
                         "(--force runs anyway)")  # fmt: skip
    model_path, meta = warm_start(work, results, setup)
    for block in blocks(setup):
        state = current_analysis(results, meta, setup)
        if state.get("spread", {}).get("alarm"):
            print(f"stopped without a claim: the blinded spread {state['spread']}", flush=True)
            return
        running = [c for c in CURRICULA if state["curricula"][c]["state"] == analysis.CONTINUE]
        if not running:
            print("every curriculum is decided", flush=True)
            break
        done = {(r["arm"], r["seed"]) for r in read_runs(results)
                if r["warm"] == meta["supervised"]["digest"]}  # fmt: skip
        todo = [(arm, seed) for seed in block for arm in ("uniform", *running)
                if (arm, seed) not in done]  # fmt: skip
        print(f"seeds {block[0]}-{block[-1]}: {len(todo)} runs ({', '.join(running)} and "
              "uniform)", flush=True)  # fmt: skip
        run_units(todo, work, results, setup, jobs, unfrozen, force, model_path, meta, code)
    report(results, meta, setup)


def run_units(todo, work, results, setup, jobs, unfrozen, force, model_path, meta, code) -> None:
    """The block's runs: in this process (``jobs`` 1), or split by seed over ``jobs`` worker
    processes of one thread each."""
    if jobs <= 1:
        for arm, seed in todo:
            print(f"{arm} seed {seed}", flush=True)
            append_run(results, run_arm(arm, seed, model_path, meta, setup, code))
        return
    seeds = sorted({s for _, s in todo})
    procs = []
    for j in range(jobs):
        mine = [f"{a}:{s}" for a, s in todo if s in seeds[j::jobs]]
        if mine:
            procs.append(subprocess.Popen(worker_command(
                "run", work, results, setup, unfrozen, force, ["--units", ",".join(mine)]),
                env=one_thread_env(1)))  # fmt: skip
    codes = [p.wait() for p in procs]
    if any(codes):
        raise SystemExit(f"a worker failed (exit codes {codes})")


def worker_command(stage: str, work: Path, results: Path, setup: Setup, unfrozen: bool,
                   force: bool, extra: list[str]) -> list[str]:  # fmt: skip
    cmd = [sys.executable, str(HERE / "curriculum_e9.py"), stage, "--work", str(work),
           "--results", str(results), *extra]  # fmt: skip
    if setup == tiny():
        cmd.append("--tiny")
    return cmd + (["--unfrozen"] if unfrozen else []) + (["--force"] if force else [])


def one_thread_env(threads: int) -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
            "GROUPWISE_E9_THREADS": str(threads)}  # fmt: skip


def current_analysis(results: Path, meta: dict, setup: Setup) -> dict:
    """The analysis of the runs from the recorded warm start, at the setup's looks."""
    runs = [r for r in read_runs(results) if r["warm"] == meta["supervised"]["digest"]]
    return analysis.analyse(runs, meta["sampled_accuracy"], CURRICULA, setup.looks)


def measure_one(work: Path, results: Path, setup: Setup, seed: int, steps: int) -> dict:
    """``steps`` uniform training steps on seed ``seed``'s pool (no evaluation): steps per
    second over the steps after the first, and the thread count."""
    model_path, meta = warm_start(work, results, setup)
    seconds: list[float] = []

    class Times(r8.StepLogs):
        def on_log(self, args, state, control, logs=None, **kwargs) -> None:
            if self.new_step(state, logs):
                seconds.append(logs.get("time/step", 0.0))

    with tempfile.TemporaryDirectory() as tmp:
        GRPOTrainer(model_path, ["accuracy"], pool_rows(seed, setup),
                       args=run_options("uniform", seed, setup, tmp, max_steps=steps),
                       callbacks=[Times()]).train()  # fmt: skip
    timed = seconds[1:] or seconds
    return {"seed": seed, "threads": int(torch.get_num_threads()), "steps": len(seconds),
            "steps_per_second": len(timed) / sum(timed)}  # fmt: skip


def phase_times(work: Path, results: Path, setup: Setup, seed: int, steps: int,
                arms: tuple[str, ...] = tuple(ARMS)) -> list[dict]:  # fmt: skip
    """Where an arm's training time goes: ``steps`` training steps per arm on seed ``seed``'s
    pool (no evaluation), one after the other in this process, and the seconds of each phase
    (generation, scoring, update, the curriculum's planning, the whole step) per 1,000
    generated tokens over the steps after the first."""
    model_path, meta = warm_start(work, results, setup)

    class Steps(r8.StepLogs):
        def __init__(self) -> None:
            super().__init__()
            self.rows: list[dict] = []

        def on_log(self, args, state, control, logs=None, **kwargs) -> None:
            if self.new_step(state, logs):
                self.rows.append(dict(logs))

    out = []
    for arm in arms:
        steps_logs = Steps()
        with tempfile.TemporaryDirectory() as tmp:
            GRPOTrainer(model_path, ["accuracy"], pool_rows(seed, setup),
                           args=run_options(arm, seed, setup, tmp, max_steps=steps),
                           callbacks=[steps_logs]).train()  # fmt: skip
        timed = steps_logs.rows[1:] or steps_logs.rows
        tokens = sum(r["compute/generated_tokens"] for r in timed)
        record = {"arm": arm, "seed": seed, "steps": len(timed), "tokens": tokens,
                  "threads": int(torch.get_num_threads())}  # fmt: skip
        for phase in PHASES:
            seconds = sum(r.get(f"time/{phase}", 0.0) for r in timed)
            record[f"{phase}_s_per_1k_tokens"] = 1000 * seconds / tokens
        print(json.dumps(record), flush=True)
        out.append(record)
    return out


def command_measure(work: Path, results: Path, setup: Setup, steps: int, unfrozen: bool) -> dict:
    """Two one-thread runs side by side, then one two-thread run: steps per second, and the
    throughput ratio that decides ``run --jobs``."""
    check_frozen(results, unfrozen)
    warm_start(work, results, setup)  # built once, before the timed processes

    def launch(seed: int, threads: int) -> subprocess.Popen:
        cmd = worker_command("measure-one", work, results, setup, unfrozen, False,
                             ["--seed", str(seed), "--steps", str(steps)])  # fmt: skip
        return subprocess.Popen(cmd, env=one_thread_env(threads), stdout=subprocess.PIPE,
                                text=True)  # fmt: skip

    def result(p: subprocess.Popen) -> dict:
        out, _ = p.communicate()
        if p.returncode:
            raise SystemExit(f"a measuring run failed (exit {p.returncode})")
        return json.loads(out.strip().splitlines()[-1])

    pair = [launch(1, 1), launch(2, 1)]
    side_by_side = [result(p) for p in pair]
    alone = result(launch(1, 2))
    together = sum(r["steps_per_second"] for r in side_by_side)
    ratio = together / alone["steps_per_second"]
    out = {"one_thread_side_by_side": side_by_side, "two_threads": alone, "steps": steps,
           "throughput_ratio": ratio, "jobs": 2 if ratio > 1.0 else 1,
           "cpus": os.cpu_count()}  # fmt: skip
    r8.write_json(results / "measure.json", out)
    print(f"two one-thread runs side by side: {together:.4f} steps/s in all; one two-thread "
          f"run: {alone['steps_per_second']:.4f} steps/s; ratio {ratio:.2f}x, so run with "
          f"--jobs {out['jobs']}", flush=True)  # fmt: skip
    return out


def speedup_text(k: float) -> str:
    """An implied speed-up as the report prints it (0: the curriculum never reached the level)."""
    return "never reached" if k == 0 else f"{k:.2f}x"


def report(results: Path, meta: dict, setup: Setup) -> dict:
    """The analysis of what is in (``analysis.json``) and a table of it."""
    out = current_analysis(results, meta, setup)
    r8.write_json(results / "analysis.json", out)
    if "spread" in out:
        s = out["spread"]
        print(f"blinded spread at the first look: sd {s['sd']:.4f} (limit {s['limit']:.3f})"
              + (": stop without a claim" if s["alarm"] else ""))  # fmt: skip
    for arm, r in out["curricula"].items():
        line = f"{arm}: {r['state']}"
        if r.get("test"):
            t = r["test"]
            line += (f" at {r['look']} seeds: difference {t['mean']:+.4f} (95% "
                     f"{t['low']:+.4f}, {t['high']:+.4f}), t {t['t']:.2f} against boundary "
                     f"{r['boundary']:.2f}; 1.35x gain {r['gain_135']:+.4f}; informative "
                     f"groups per rollout {r['informative']['ratio']:.2f}x")  # fmt: skip
            k = {key: speedup_text(r["implied_speedup"][key]) for key in ("estimate", "low",
                                                                           "high")}  # fmt: skip
            line += (f"; implied token speed-up at uniform's half-budget level {k['estimate']} "
                     f"(95% seed bootstrap {k['low']}, {k['high']})")  # fmt: skip
        else:
            line += f" ({r.get('seeds', 0)} seeds; the first look is at {r['next_look']})"
        if "welch_p" in r:
            line += f"; Welch (sensitivity) one-sided p {r['welch_p']:.4f}"
        print(line, flush=True)
    runs = [r for r in read_runs(results) if r["warm"] == meta["supervised"]["digest"]]
    for arm in ARMS:  # the secondary endpoints, per arm over every run so far
        mine = [r for r in runs if r["arm"] == arm]
        parts = [f"{key} {np.mean([np.mean(r[key]) for r in mine]):.3f}"
                 for key in ("informative_two_digit", "greedy_two", "sampled_four")
                 if mine and all(key in r for r in mine)]  # fmt: skip
        if parts:
            print(f"  {arm} ({len(mine)} runs): " + ", ".join(parts), flush=True)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("stage", choices=["freeze", "pilot", "measure", "run", "report",
                                          "measure-one", "phases"])  # fmt: skip
    parser.add_argument("--results", default=str(RESULTS))
    parser.add_argument("--work", default="runs/curriculum-e9-work", help="model weights")
    parser.add_argument("--tree", default="runs/e9-code", help="freeze: the worktree")
    parser.add_argument("--jobs", type=int, default=1, help="run: worker processes (measure)")
    parser.add_argument("--steps", type=int, default=10, help="measure, phases: steps a run")
    parser.add_argument("--seed", type=int, default=1, help="measure-one, phases")
    parser.add_argument("--units", default=None, help="run: arm:seed,... (a --jobs worker)")
    parser.add_argument("--force", action="store_true", help="run despite a no-go pilot")
    parser.add_argument("--tiny", action="store_true", help="the tiny test setup")
    parser.add_argument("--unfrozen", action="store_true",
                        help="run from code other than the frozen commit (tests only)")
    o = parser.parse_args(argv)
    setup = tiny() if o.tiny else Setup()
    threads = os.environ.get("GROUPWISE_E9_THREADS")
    if threads:
        torch.set_num_threads(int(threads))
    results, work = Path(o.results), Path(o.work)
    if o.stage == "freeze":
        command_freeze(results, Path(o.tree))
    elif o.stage == "pilot":
        command_pilot(work, results, setup, o.unfrozen)
    elif o.stage == "measure":
        command_measure(work, results, setup, o.steps, o.unfrozen)
    elif o.stage == "measure-one":
        print(json.dumps(measure_one(work, results, setup, o.seed, o.steps)), flush=True)
    elif o.stage == "phases":
        phase_times(work, results, setup, o.seed, o.steps)
    elif o.stage == "run":
        only = None
        if o.units:
            only = [(u.split(":")[0], int(u.split(":")[1])) for u in o.units.split(",")]
        command_run(work, results, setup, o.jobs, o.unfrozen, o.force, only)
    else:
        meta = read_json(results / "warm.json")
        if "sampled_accuracy" not in meta:
            raise SystemExit(f"no warm start measured in {results}: run the pilot first")
        report(results, meta, setup)


if __name__ == "__main__":
    main(sys.argv[1:])
