"""E9's three arms re-timed as whole runs: training seconds per generated token of ``select``
and Rollout-GDRO (level prior) against uniform's, with the update that shares each prompt's
forward across its group whatever the group's size. (A benchmark, not a test: hours of CPU,
resumable, results committed beside it.)

Each run is an E9 run (``curriculum_e9.run_arm``: same warm-start recipe, pool, options and
token budget) without its evaluations, which are not training time and do not change what is
trained (they sample with their own seed). Every step's generated tokens and phase seconds
(generation, scoring, update, planning, the whole step) are recorded.

Protocol: ``--jobs`` (2) worker processes of one thread each, nothing else on the machine;
the seeds are split over the workers and each worker runs its seed's three arms in a rotated
order (seed k starts with arm k mod 3), so every arm runs early and late, beside every other
arm. The code must be committed (the commit is in every record).

The warm start is rebuilt in ``--work`` if absent. A rebuild on another machine is not
bit-identical to E9's recorded one (``warm.json``): its digest is recorded in this folder's
``warm.json`` beside E9's; the token budget (E9's ``tokens_per_step``, a count of the tokenizer's)
is E9's exactly.

Results: ``benchmarks/results_curriculum/e9/retime/``: ``warm.json``, ``runs.jsonl`` (one line
per finished run; a rerun skips what is done), ``analysis.json`` (``report``).

    PYTHONPATH=src python benchmarks/curriculum_e9_retime.py run [--seeds 4] [--jobs 2]
    PYTHONPATH=src python benchmarks/curriculum_e9_retime.py report

(``make bench-curriculum-e9-retime`` does both.)
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import numpy as np
from scipy import stats

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import curriculum_e9 as e9  # noqa: E402

RESULTS = e9.RESULTS / "retime"
ARMS = tuple(e9.ARMS)  # uniform first: the baseline of every ratio
TARGET = 1.10  # the ratio a curriculum's time per token should stay within


def warm_start(work: Path, e9_results: Path, results: Path, setup: e9.Setup) -> tuple[str, dict]:
    """The warm start's path and this folder's record of it: E9's ``warm.json`` (its budget
    unit and warm-start point) with the digest of the weights actually used."""
    path = results / "warm.json"
    meta = e9.read_json(path)
    if setup.model is not None:
        model_path, digest = setup.model, setup.model
    else:
        folder = work / f"warm-supervised-{e9.r8.SFT_STEPS}"
        if not (folder / "config.json").exists():
            e9.r8.fine_tune(folder)
        model_path, digest = str(folder), e9.r8.weights_digest(folder)
    if not meta:
        recorded = e9.read_json(e9_results / "warm.json")
        if "tokens_per_step" not in recorded:
            raise SystemExit(f"no E9 warm start recorded in {e9_results / 'warm.json'}")
        meta = {**recorded, "e9_digest": recorded["supervised"]["digest"],
                "supervised": {**recorded["supervised"], "digest": digest}}  # fmt: skip
        e9.r8.write_json(path, meta)
    if meta["supervised"]["digest"] != digest:
        raise SystemExit(f"the warm start in {model_path} (digest {digest}) is not the one this "
                         f"folder's runs used ({meta['supervised']['digest']}): runs pair only "
                         f"on one warm start; use another --results folder")  # fmt: skip
    return model_path, meta


def units(seeds: int) -> list[tuple[str, int]]:
    """Every (arm, seed), seed by seed, each seed's arms rotated to start at arm seed mod 3."""
    out = []
    for seed in range(1, seeds + 1):
        k = seed % len(ARMS)
        out += [(arm, seed) for arm in ARMS[k:] + ARMS[:k]]
    return out


def command_run(work: Path, e9_results: Path, results: Path, setup: e9.Setup, seeds: int,
                jobs: int, unfrozen: bool,
                only: list[tuple[str, int]] | None = None) -> None:  # fmt: skip
    """The runs not yet in ``runs.jsonl``: in this process (``jobs`` 1) or split by seed over
    ``jobs`` one-thread workers."""
    code = e9.code_state()
    if code["dirty"] and not unfrozen:
        raise SystemExit("commit the changes in src/ and benchmarks/ first: every record "
                         "names the commit it ran")  # fmt: skip
    model_path, meta = warm_start(work, e9_results, results, setup)
    if only is not None:  # a worker
        for arm, seed in only:
            print(f"{arm} seed {seed}", flush=True)
            record = e9.run_arm(arm, seed, model_path, meta, setup, code, evaluate=False)
            e9.append_run(results, record)
        return
    done = {(r["arm"], r["seed"]) for r in e9.read_runs(results)}
    todo = [u for u in units(seeds) if u not in done]
    print(f"{len(todo)} runs to go ({len(done)} done)", flush=True)
    if jobs <= 1:
        return command_run(work, e9_results, results, setup, seeds, jobs, unfrozen, todo)
    seed_list = sorted({s for _, s in todo})
    procs = []
    for j in range(jobs):
        mine = [f"{a}:{s}" for a, s in todo if s in seed_list[j::jobs]]
        if not mine:
            continue
        cmd = [sys.executable, str(Path(__file__).resolve()), "run", "--work", str(work),
               "--e9-results", str(e9_results), "--results", str(results),
               "--units", ",".join(mine)] + (["--tiny"] if setup == e9.tiny() else []) + (
               ["--unfrozen"] if unfrozen else [])  # fmt: skip
        procs.append(subprocess.Popen(cmd, env=e9.one_thread_env(1)))
    codes = [p.wait() for p in procs]
    if any(codes):
        raise SystemExit(f"a worker failed (exit codes {codes})")


def seconds_per_1k(record: dict, phase: str = "step") -> float:
    """Seconds of ``phase`` per 1,000 generated tokens over the run's steps."""
    names = record["phase_names"]
    column = names.index(phase)
    tokens = sum(step[0] for step in record["phases"])
    return 1000.0 * sum(step[column] for step in record["phases"]) / tokens


def seconds_per_rollout(record: dict) -> float:
    """Training-step seconds per generated completion."""
    return record["step_seconds"] / record["rollouts"]


def completion_length(record: dict) -> float:
    """Mean generated tokens per completion."""
    return record["tokens"] / record["rollouts"]


def equal_group_share(record: dict, size: int) -> float:
    """The share of a run's steps whose groups all hold ``size`` rollouts."""
    steps = record["groups"]
    return sum(all(n == size for _, n, _ in step) for step in steps) / len(steps)


def paired_ratio(curriculum: list[float], uniform: list[float]) -> dict:
    """The geometric mean of per-seed ratios curriculum / uniform, with a 95% t interval on
    the log ratios (one seed: no interval)."""
    logs = np.log(np.asarray(curriculum) / np.asarray(uniform))
    out = {"seeds": len(logs), "ratio": float(np.exp(logs.mean())),
           "per_seed": [float(x) for x in np.exp(logs)]}  # fmt: skip
    if len(logs) > 1:
        half = stats.t.ppf(0.975, len(logs) - 1) * logs.std(ddof=1) / np.sqrt(len(logs))
        out["low"] = float(np.exp(logs.mean() - half))
        out["high"] = float(np.exp(logs.mean() + half))
    return out


def analyse(runs: list[dict], size: int) -> dict:
    """Per arm: seconds per 1,000 tokens of each phase (mean over seeds) and the share of steps
    with equal groups; per curriculum: the paired ratio of step time per token to uniform's,
    over the seeds both ran."""
    by_arm = {arm: {r["seed"]: r for r in runs if r["arm"] == arm} for arm in ARMS}
    out: dict = {"arms": {}, "ratios": {}, "target": TARGET}
    for arm, records in by_arm.items():
        if records:
            out["arms"][arm] = {
                "seeds": sorted(records),
                **{f"{p}_s_per_1k_tokens": float(np.mean([seconds_per_1k(r, p)
                                                          for r in records.values()]))
                   for p in e9.PHASES},
                "equal_group_share": float(np.mean([equal_group_share(r, size)
                                                    for r in records.values()])),
                "completion_length": float(np.mean([completion_length(r)
                                                    for r in records.values()])),
                "step_s_per_rollout": float(np.mean([seconds_per_rollout(r)
                                                     for r in records.values()])),
            }  # fmt: skip
    uniform = by_arm["uniform"]
    for arm in e9.CURRICULA:
        seeds = sorted(set(by_arm[arm]) & set(uniform))
        if seeds:
            out["ratios"][arm] = {
                phase: paired_ratio([seconds_per_1k(by_arm[arm][s], phase) for s in seeds],
                                    [seconds_per_1k(uniform[s], phase) for s in seeds])
                for phase in ("step", "generation", "update")
            }  # fmt: skip
            out["ratios"][arm]["step_per_rollout"] = paired_ratio(
                [seconds_per_rollout(by_arm[arm][s]) for s in seeds],
                [seconds_per_rollout(uniform[s]) for s in seeds])
    return out


def report(results: Path) -> dict:
    size = e9.r8.BASE_OPTIONS["num_generations"]
    out = analyse(e9.read_runs(results), size)
    e9.r8.write_json(results / "analysis.json", out)
    for arm, a in out["arms"].items():
        print(f"{arm} (seeds {a['seeds']}): " + ", ".join(
            f"{p} {a[f'{p}_s_per_1k_tokens']:.2f}" for p in e9.PHASES)
            + f" s per 1k tokens; {a['step_s_per_rollout']:.3f} s per completion of "
              f"{a['completion_length']:.1f} tokens; steps with all groups of {size}: "
              f"{a['equal_group_share']:.0%}", flush=True)  # fmt: skip
    for arm, r in out["ratios"].items():
        step = r["step"]
        interval = f" (95% {step['low']:.2f}-{step['high']:.2f})" if "low" in step else ""
        print(f"{arm} / uniform, step time per token: {step['ratio']:.2f}x{interval} over "
              f"{step['seeds']} seeds; generation {r['generation']['ratio']:.2f}x, update "
              f"{r['update']['ratio']:.2f}x; step time per completion "
              f"{r['step_per_rollout']['ratio']:.2f}x", flush=True)  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("stage", choices=["run", "report"])
    parser.add_argument("--results", default=str(RESULTS))
    parser.add_argument("--e9-results", default=str(e9.RESULTS), help="E9's warm.json")
    parser.add_argument("--work", default="runs/curriculum-e9-work", help="model weights")
    parser.add_argument("--seeds", type=int, default=4)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--units", default=None, help="arm:seed,... (a worker)")
    parser.add_argument("--tiny", action="store_true", help="the tiny test setup")
    parser.add_argument("--unfrozen", action="store_true",
                        help="run from uncommitted code (tests only)")
    o = parser.parse_args(argv)
    setup = e9.tiny() if o.tiny else e9.Setup()
    results = Path(o.results)
    if o.stage == "report":
        report(results)
        return
    only = None
    if o.units:
        only = [(u.split(":")[0], int(u.split(":")[1])) for u in o.units.split(",")]
    threads = e9.os.environ.get("GROUPWISE_E9_THREADS")
    if threads:
        e9.torch.set_num_threads(int(threads))
    command_run(Path(o.work), Path(o.e9_results), results, setup, o.seeds, o.jobs, o.unfrozen,
                only)  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1:])
