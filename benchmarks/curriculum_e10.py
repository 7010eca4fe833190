"""The curriculum experiment E10: do the curricula beat the baselines a practitioner would try
first, and do they pay where difficulty must be learned rather than read from a label?
(An experiment, not a test: hours of CPU, resumable, results committed beside it.)

Design, frozen in this file and in ``curriculum_e10_analysis.py`` before any run:

- **Model and options.** E9's: SmolLM2-135M-Instruct after the supervised warm start of
  ``benchmarks/curriculum.py`` (10 AdamW steps on the worked 1-digit answers), accuracy reward,
  KL to the warm start (beta 0.04), learning rate 1e-5, 4 prompts x 4 rollouts a step, group
  sizes 2..8 where a curriculum sets them (``curriculum.BASE_OPTIONS``, ``RUN_OPTIONS``).
- **Part "labelled"** (the E9 pool against the obvious baselines). Seed k's pool is E9's: 80
  one-digit (solved), 32 two-digit (learnable), 80 four-digit (out of reach), each row with its
  ``difficulty`` column. Budget: half of E9's generated tokens (``budget_steps`` 25 of E9's
  473.83-token steps). Arms:
  ``uniform_learnable`` (uniform GRPO over the 32 rows the label marks two-digit: the free
  baseline a label allows), ``dapo`` (DAPO dynamic sampling, ``max_num_gen_batches`` 10, every
  generated token charged to the budget, the dropped groups' included), ``select`` (defaults)
  and ``rollout_gdro_level`` (``gdro_unseen: difficulty``). Hypotheses (one-sided, curriculum
  better): each curriculum against each baseline, four in all.
- **Part "learned"** (difficulty learned, not read). Seed k's pool: 13 one-digit, 6 two-digit,
  13 four-digit (81% waste, E9's is 83%), the same half budget, so uniform plans each prompt
  about 3 times (the revisits the per-prompt curricula need); every arm at
  ``steps_per_generation`` 4 (the source's four optimizer steps per generation, which Prompt-GDRO's
  ``pg_loss`` signal needs). Arms, on the pool **without** its ``difficulty`` column:
  ``uniform``, ``prompt_gdro``, ``rollout_gdro`` and ``select`` at their defaults (the source's
  for the two GDROs; ``select``'s 64 candidates a generation are capped at the 32-prompt pool,
  so it ranks the whole pool); on the pool with the labels of a seeded 30% of rows permuted
  among them (about 20% end with a wrong level: same-level swaps and fixed points):
  ``select_shuffled`` and ``rollout_gdro_level_shuffled`` (``gdro_unseen: difficulty``).
  Hypotheses: each of the five against ``uniform``.
- **Evaluation** (both parts). At every fifth of the budget: the fixed 128 held-out two-digit
  problems of E9, one sample each at temperature 1, seeded by the evaluation (E9's seeds). At the
  budget also: greedy on the 128; 8 samples each of the first 64 (pass@8 and mean@8); every
  one-digit problem (100) sampled once (forgetting: the solved level, mostly in the pools). The
  warm start's values are measured once (``warm.json``). Every step's generated tokens and
  phase seconds are recorded, and each evaluation's cumulative training seconds.
- **Analysis**: ``curriculum_e10_analysis.py`` (endpoints, the group-sequential graphical test,
  repeated intervals, bias-adjusted estimates, secondaries).
- **Seeds and looks, sized by cost.** Looks after 3 and 5 seeds per arm. ``run`` goes block by
  block (seeds 1-3, then 4-5); before a block it analyses what is in and runs only the arms some
  undecided hypothesis still needs (a pair of arms runs while its token or its wall-clock
  hypothesis is undecided). A run costs about 17 one-thread minutes (8-9 of training at half
  E9's budget, 8-9 of evaluation), so the 10 arms cost about 8.5 CPU-hours to the first look and
  14 at most. Power, from E9's per-seed sd of the paired difference (0.06), by simulation of the
  paired t with these looks, boundaries and futility: at a hypothesis' first Holm level (0.025/4
  in "labelled", 0.025/5 in "learned") a true +0.085 (E9's ``select``) is found with probability
  about 0.3, +0.12 about 0.6, +0.15 about 0.8; at 0.0125, 0.5 / 0.8 / 0.9. The budget buys a
  decision on large effects only; the intervals say how large an effect the data leave open. The
  first look's efficacy boundaries on t with 2 degrees of freedom are 20-41: it acts through
  futility.
- **Why half E9's budget.** In E9 the arms separated early: ``select`` was ahead at every
  evaluation, Rollout-GDRO's lead was largest over 0.3-0.7 of the budget, and uniform's rise was
  over within its first 10-30%; and the cost per run is what bounds the seeds.
- **Protocol.** Two worker processes of one thread each, nothing else on the machine; the
  block's runs, seed by seed and part by part, each (part, seed)'s arms in an order rotated by
  seed, are dealt to the workers in turn (so both are busy until the block's last run or two,
  and the arms of a pair run at about the same time). The code is frozen (``freeze``: a git
  worktree of the commit, recorded in ``frozen.json``); ``run`` refuses other code.
  ``runs.jsonl`` gets one line per finished run, appended as it finishes; a rerun skips what is
  done.

Results: ``benchmarks/results_curriculum/e10/``. Weights go to ``--work``.

    python benchmarks/curriculum_e10.py freeze --tree runs/e10-code   # once
    cd runs/e10-code && PYTHONPATH=src python benchmarks/curriculum_e10.py run --results R
    ... report --results R

(``make bench-curriculum-e10`` does this; R is this checkout's
``benchmarks/results_curriculum/e10``.)
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import curriculum_e9 as e9  # noqa: E402
import curriculum_e10_analysis as analysis  # noqa: E402

from groupwise import GRPOConfig, GRPOTrainer  # noqa: E402
from groupwise.runtime.models import load_model_and_tokenizer  # noqa: E402

RESULTS = e9.RESULTS.parent / "e10"
MARKS = (0.2, 0.4, 0.6, 0.8, 1.0)
PASS_K, PASS_PROBLEMS = 8, 64
SHUFFLED_SHARE = 0.3
LEARNABLE = 22  # the two-digit level's difficulty value (digits x 10 + 2)
PLANNING_SD = 0.06  # E9's per-seed sd of the paired endpoint difference (0.057 and 0.060)


@dataclass(frozen=True)
class Part:
    """One part of the experiment: its pool, budget, options shared by its arms, and arms (name
    -> (options, labels)); labels: ``exact``, ``none`` (column removed), ``shuffled`` (30% of
    rows' labels permuted among them) or ``learnable`` (only the rows labelled two-digit)."""

    pool: tuple[tuple[int, int], ...]
    budget_steps: int
    options: dict[str, Any]
    arms: dict[str, tuple[dict[str, Any], str]]
    hypotheses: tuple[tuple[str, str], ...]  # (curriculum, baseline)


SELECT = {"curriculum": "select"}
LEVEL_GDRO = {"curriculum": "rollout_gdro", "gdro_unseen": "difficulty"}
PARTS: dict[str, Part] = {
    "labelled": Part(
        pool=((1, 80), (2, 32), (4, 80)), budget_steps=25, options={},
        arms={"uniform_learnable": ({}, "learnable"), "dapo": ({"dynamic_sampling": True}, "exact"),
              "select": (SELECT, "exact"), "rollout_gdro_level": (LEVEL_GDRO, "exact")},
        hypotheses=(("select", "uniform_learnable"), ("select", "dapo"),
                    ("rollout_gdro_level", "uniform_learnable"), ("rollout_gdro_level", "dapo")),
    ),
    "learned": Part(
        pool=((1, 13), (2, 6), (4, 13)), budget_steps=25, options={"steps_per_generation": 4},
        arms={"uniform": ({}, "none"), "prompt_gdro": ({"curriculum": "prompt_gdro"}, "none"),
              "rollout_gdro": ({"curriculum": "rollout_gdro"}, "none"), "select": (SELECT, "none"),
              "select_shuffled": (SELECT, "shuffled"),
              "rollout_gdro_level_shuffled": (LEVEL_GDRO, "shuffled")},
        hypotheses=tuple((c, "uniform") for c in ("prompt_gdro", "rollout_gdro", "select",
                                                  "select_shuffled",
                                                  "rollout_gdro_level_shuffled")),
    ),
}  # fmt: skip


@dataclass(frozen=True)
class Setup:
    """The experiment's sizes; :func:`tiny` runs the same code at test size."""

    model: str | None = None  # None: the supervised warm start, built into --work
    parts: dict[str, Part] = field(default_factory=lambda: PARTS)
    e9: e9.Setup = field(default_factory=e9.Setup)
    pass_problems: int = PASS_PROBLEMS
    one_digit: int | None = None  # None: every one-digit problem
    looks: tuple[int, ...] = analysis.LOOKS


def tiny() -> Setup:
    """The tiny random model, 2 prompts a level, 2-step budgets, looks at 2 and 3 seeds."""
    small = {name: Part(pool=((1, 2), (2, 2), (4, 2)), budget_steps=2, options=p.options,
                        arms=p.arms, hypotheses=p.hypotheses)
             for name, p in PARTS.items()}  # fmt: skip
    return Setup(model="tiny-random", parts=small, e9=e9.tiny(), pass_problems=2, one_digit=4,
                 looks=(2, 3))  # fmt: skip


# --------------------------------------------------------------------------------------------
# Data


def pool_rows(part: Part, labels: str, seed: int) -> list[dict]:
    """Seed ``seed``'s pool of ``part`` (E9's draw at the part's sizes) with its labels as the arm
    sees them."""
    rows = [dict(r) for r in e9.pool_rows(seed, e9.Setup(pool=part.pool))]
    if labels == "learnable":
        return [r for r in rows if r["difficulty"] == LEARNABLE]
    if labels == "none":
        for r in rows:
            del r["difficulty"]
    elif labels == "shuffled":
        rng = np.random.default_rng(1000 + seed)
        chosen = rng.choice(len(rows), size=round(SHUFFLED_SHARE * len(rows)), replace=False)
        values = [rows[i]["difficulty"] for i in chosen]
        for i, v in zip(chosen, rng.permutation(values), strict=True):
            rows[i]["difficulty"] = int(v)
    elif labels != "exact":
        raise ValueError(f"unknown labels {labels!r}")
    return rows


def one_digit_rows(setup: Setup) -> list[dict]:
    every = e9.r8.problems(None, "train", 7, 1) + e9.r8.problems(None, "eval", 7, 1)
    return every if setup.one_digit is None else every[: setup.one_digit]


def final_evaluations(model, tokenizer, setup: Setup, seed_offset: int) -> dict[str, list[int]]:
    """At the budget (and once at the warm start): greedy two-digit, pass@8 counts on the first
    problems, one-digit sampled once."""
    two = e9.eval_sets(setup.e9)["two"]
    return {
        "greedy_two": e9.greedy_correct(model, tokenizer, two, setup.e9),
        "pass_counts": e9.sampled_correct(model, tokenizer, two[: setup.pass_problems],
                                          e9.EVAL_SEED + 200 + seed_offset, setup.e9,
                                          n=PASS_K),
        "sampled_one": e9.sampled_correct(model, tokenizer, one_digit_rows(setup),
                                          e9.EVAL_SEED + 300 + seed_offset, setup.e9),
    }  # fmt: skip


# --------------------------------------------------------------------------------------------
# The warm start and one run


def warm_start(work: Path, results: Path, setup: Setup) -> tuple[str, dict]:
    """The warm start (built once into ``work``), its digest, E9's budget unit, and its values
    on every evaluation, measured once (``warm.json``)."""
    path = results / "warm.json"
    meta = e9.read_json(path)
    if setup.model is None:
        folder = work / f"warm-supervised-{e9.r8.SFT_STEPS}"
        if not (folder / "config.json").exists():
            e9.r8.fine_tune(folder)
        model_path, digest = str(folder), e9.r8.weights_digest(folder)
    else:
        model_path, digest = setup.model, setup.model
    if meta and meta["digest"] != digest:
        raise SystemExit(f"the warm start in {model_path} (digest {digest}) is not the recorded "
                         f"one ({meta['digest']}): runs pair only on one warm start")  # fmt: skip
    if not meta:
        model, tokenizer = load_model_and_tokenizer(model_path)
        lengths = [len(e9.r8.completion_ids(tokenizer, row))
                   for row in e9.pool_rows(e9.PILOT_SEED, setup.e9)]  # fmt: skip
        meta = {"digest": digest, "tokens_per_step": setup.e9.tokens_per_step or (
            e9.r8.BASE_OPTIONS["per_device_train_batch_size"] * float(np.mean(lengths)))}
        sampled = e9.sampled_correct(model, tokenizer, e9.eval_sets(setup.e9)["two"],
                                     e9.EVAL_SEED, setup.e9)  # fmt: skip
        meta.update(sampled=sampled, sampled_accuracy=float(np.mean(sampled)),
                    **final_evaluations(model, tokenizer, setup, 0))  # fmt: skip
        e9.r8.write_json(path, meta)
    return model_path, meta


class Budget(e9.SampledBudget):
    """E9's callback at E10's marks, with E10's evaluations at the budget."""

    def __init__(self, budget: int, setup: Setup, seed: int) -> None:
        super().__init__(budget, e9.eval_sets(setup.e9), setup.e9, marks=MARKS)
        self.e10, self.seed = setup, seed

    def final_evaluations(self, engine, tokenizer) -> dict[str, list[int]]:
        return final_evaluations(engine, tokenizer, self.e10, self.seed)

    def step_groups(self) -> list[list[int]]:
        """The last generation's groups as [digits, rollouts, correct], the digits read from
        the problem (an arm may see no label, or a shuffled one)."""
        rows, _, rewards, _, _, group_ids, _ = self.trainer.records.last_batch
        groups = []
        for g, row in enumerate(rows):
            member = group_ids == g
            if member.any():
                correct = int((rewards[member] > 0.5).sum())
                groups.append([digits_of(row), int(member.sum()), correct])
        return groups


def digits_of(row: dict) -> int:
    """A problem's level: the digits of its longest operand."""
    return max(len(token) for token in row["expression"].split() if token.isdigit())


def run_arm(part_name: str, arm: str, seed: int, model_path: str, meta: dict, setup: Setup,
            code: dict) -> dict:  # fmt: skip
    """One run of ``arm`` of ``part_name`` on seed ``seed``'s pool, to the part's budget."""
    part = setup.parts[part_name]
    options, labels = part.arms[arm]
    budget = int(round(part.budget_steps * meta["tokens_per_step"]))
    callback = Budget(budget, setup, seed)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        args = GRPOConfig(**{**e9.r8.BASE_OPTIONS, **e9.r8.RUN_OPTIONS, **part.options,
                             **options, "max_completion_length": setup.e9.max_completion_length,
                             "seed": seed, "output_dir": tmp})  # fmt: skip
        trainer = GRPOTrainer(model_path, ["accuracy"], pool_rows(part, labels, seed), args=args,
                              callbacks=[callback])  # fmt: skip
        callback.trainer = trainer
        trainer.train()
    last = callback.last
    return {
        "part": part_name, "arm": arm, "seed": seed, "warm": meta["digest"],
        "commit": code["commit"], "dirty": code["dirty"], "budget": budget,
        "tokens": last["compute/generated_tokens_total"],
        "rollouts": last["compute/rollouts_total"],
        "optimizer_steps": last["compute/optimizer_steps_total"],
        "informative_per_rollout": last["compute/informative_groups_per_rollout_total"],
        "step_seconds": round(callback.step_seconds, 1),
        "wall_seconds": round(time.perf_counter() - start, 1),
        "threads": int(e9.torch.get_num_threads()),
        "points": callback.points, **callback.final, "groups": callback.groups,
        "phase_names": ["tokens", *e9.PHASES], "phases": callback.phases,
    }  # fmt: skip


# --------------------------------------------------------------------------------------------
# Commands


def blocks(setup: Setup) -> list[list[int]]:
    out, first = [], 1
    for look in setup.looks:
        out.append(list(range(first, look + 1)))
        first = look + 1
    return out


def block_units(setup: Setup, block: list[int], needed: dict[str, set[str]],
                done: set[tuple[str, str, int]]) -> list[list[tuple[str, str, int]]]:  # fmt: skip
    """The block's runs not yet done, grouped by (part, seed), each group's arms rotated by
    seed, the groups interleaved across parts."""
    groups = []
    for seed in block:
        for part_name, part in setup.parts.items():
            arms = [a for a in part.arms if a in needed[part_name]]
            if arms:
                k = seed % len(arms)
                arms = arms[k:] + arms[:k]
                group = [(part_name, a, seed) for a in arms if (part_name, a, seed) not in done]
                if group:
                    groups.append(group)
    return groups


def command_run(work: Path, results: Path, setup: Setup, jobs: int, unfrozen: bool,
                only: list[tuple[str, str, int]] | None = None) -> None:  # fmt: skip
    """Block by block up to each look; before a block, only the arms an undecided hypothesis
    needs. ``only``: a worker's units."""
    code = e9.check_frozen(results, unfrozen)
    model_path, meta = warm_start(work, results, setup)
    if only is not None:
        for part_name, arm, seed in only:
            print(f"{part_name} {arm} seed {seed}", flush=True)
            e9.append_run(results, run_arm(part_name, arm, seed, model_path, meta, setup, code))
        return
    for block in blocks(setup):
        state = report(results, setup, quiet=True)
        needed = analysis.arms_needed(state, {n: p.hypotheses for n, p in setup.parts.items()})
        if not any(needed.values()):
            print("every hypothesis is decided", flush=True)
            break
        done = {(r["part"], r["arm"], r["seed"]) for r in read_runs(results, meta)}
        groups = block_units(setup, block, needed, done)
        print(f"seeds {block[0]}-{block[-1]}: {sum(map(len, groups))} runs", flush=True)
        if jobs <= 1:
            command_run(work, results, setup, 1, unfrozen, [u for g in groups for u in g])
            continue
        procs, flat = [], [u for g in groups for u in g]
        for j in range(jobs):
            mine = flat[j::jobs]  # dealt in turn: both workers busy to the block's last run
            if mine:
                cmd = [sys.executable, str(Path(__file__).resolve()), "run", "--work", str(work),
                       "--results", str(results),
                       "--units", ",".join(f"{p}:{a}:{s}" for p, a, s in mine)] + (
                       ["--tiny"] if setup == tiny() else []) + (
                       ["--unfrozen"] if unfrozen else [])  # fmt: skip
                procs.append(subprocess.Popen(cmd, env=e9.one_thread_env(1)))
        codes = [p.wait() for p in procs]
        if any(codes):
            raise SystemExit(f"a worker failed (exit codes {codes})")
    report(results, setup)


def read_runs(results: Path, meta: dict) -> list[dict]:
    return [r for r in e9.read_runs(results) if r["warm"] == meta["digest"]]


def report(results: Path, setup: Setup, quiet: bool = False) -> dict:
    """The analysis of what is in (``analysis.json``), printed unless ``quiet``."""
    meta = e9.read_json(results / "warm.json")
    runs = read_runs(results, meta) if meta else []
    out = analysis.analyse(runs, meta, {n: p.hypotheses for n, p in setup.parts.items()},
                           setup.looks)  # fmt: skip
    e9.r8.write_json(results / "analysis.json", out)
    if not quiet:
        for line in analysis.summary(out):
            print(line, flush=True)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("stage", choices=["design", "freeze", "run", "report"])
    parser.add_argument("--results", default=str(RESULTS))
    parser.add_argument("--work", default="runs/curriculum-e9-work", help="model weights")
    parser.add_argument("--tree", default="runs/e10-code", help="freeze: the worktree")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--units", default=None, help="part:arm:seed,... (a worker)")
    parser.add_argument("--tiny", action="store_true", help="the tiny test setup")
    parser.add_argument("--unfrozen", action="store_true",
                        help="run from code other than the frozen commit (tests only)")
    o = parser.parse_args(argv)
    setup = tiny() if o.tiny else Setup()
    threads = e9.os.environ.get("GROUPWISE_E9_THREADS")
    if threads:
        e9.torch.set_num_threads(int(threads))
    results = Path(o.results)
    if o.stage == "design":
        out = analysis.design(PLANNING_SD, [analysis.ALPHA / len(p.hypotheses) for p in
                                            setup.parts.values()] + [analysis.ALPHA / 2,
                                                                     analysis.ALPHA],
                              [0.04, 0.06, 0.085, 0.12, 0.15, 0.2], setup.looks)  # fmt: skip
        e9.r8.write_json(results / "design.json", {"planning_sd": PLANNING_SD, "levels": out})
        for level, row in out.items():
            print(f"level {level}: t boundaries {[round(t, 2) for t in row['t']]}, spent "
                  f"{[round(a, 5) for a in row['spent_alpha']]}, power {row['power']}")
    elif o.stage == "freeze":
        e9.command_freeze(results, Path(o.tree))
    elif o.stage == "run":
        only = None
        if o.units:
            only = [(u.split(":")[0], u.split(":")[1], int(u.split(":")[2]))
                    for u in o.units.split(",")]  # fmt: skip
        command_run(Path(o.work), results, setup, o.jobs, o.unfrozen, only)
    else:
        report(results, setup)


if __name__ == "__main__":
    main(sys.argv[1:])
