"""The numerics of five short seed-0 runs, to show that a change to the code leaves training
bitwise unchanged: each run's logged metrics (timing keys aside) and a SHA-256 of its saved
weights.

    python scripts/fingerprint.py run OUT.json [--work DIR]   # run the five, write the fingerprint
    python scripts/fingerprint.py compare A.json B.json       # exit 1 where they differ

The runs: (a) tiny-random GRPO, 4 steps; (b) tiny-random Rollout-GDRO with the dapo loss,
num_iterations 2 and beta 0.04; (c) configs/demo.yaml for 4 steps (the demo model); (d, e) the
setups of (a) and (b) through the Python API, with a reward that varies within each group.
Run it with the groupwise to fingerprint on the path (``PYTHONPATH=src``, from any checkout).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TIMING = ("time/", "perf/")
TINY = ["--model", "tiny-random", "--task", "arithmetic", "--max_steps", "4", "--seed", "0",
        "--disable_tqdm", "true"]  # fmt: skip
GDRO = ["--curriculum", "rollout_gdro", "--loss_type", "dapo", "--num_iterations", "2",
        "--beta", "0.04"]  # fmt: skip
CLI_RUNS = {
    "a_tiny_grpo": TINY,
    "b_tiny_gdro_dapo": TINY + GDRO,
    "c_demo": [str(ROOT / "configs" / "demo.yaml"), "--max_steps", "4", "--seed", "0",
               "--disable_tqdm", "true"],  # fmt: skip
}


def kept(key: str) -> bool:
    """Whether a metric is numerics (timings and throughputs vary run to run)."""
    return not key.startswith(TIMING) and not key.endswith("tokens_per_second")


def run_fingerprint(folder: Path) -> dict:
    """The metrics rows (timing keys aside) and the weights' digest of a finished run."""
    rows = []
    for line in (folder / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        rows.append({k: v for k, v in sorted(row.items()) if kept(k)})
    weights = sorted(folder.glob("*.safetensors"))
    if not weights:
        raise SystemExit(f"{folder}: no saved weights (*.safetensors)")
    digest = hashlib.sha256()
    for path in weights:
        digest.update(path.read_bytes())
    return {"metrics": rows, "weights_sha256": digest.hexdigest()}


def varied_reward(prompts, completions, completion_ids, **kwargs):
    """The share of even token ids in a completion: varies within a group from the first step."""
    return [sum(t % 2 == 0 for t in ids) / max(len(ids), 1) for ids in completion_ids]


def python_run(name: str, out: Path, **extra) -> None:
    from groupwise import GRPOConfig, GRPOTrainer

    rows = [{"prompt": f"Count to {i} and say something."} for i in range(16)]
    args = GRPOConfig(model="tiny-random", max_steps=4, seed=0, disable_tqdm=True,
                      output_dir=str(out / name), **extra)  # fmt: skip
    trainer = GRPOTrainer("tiny-random", varied_reward, rows, args=args)
    trainer.train()
    trainer.save_model(str(out / name))


def run(path: Path, work: Path) -> None:
    work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    for name, argv in CLI_RUNS.items():
        folder = work / name
        command = [sys.executable, "-m", "groupwise", "train", *argv, "--output_dir", str(folder),
                   "--overwrite_output_dir", "true"]  # fmt: skip
        print("$", " ".join(command), flush=True)
        subprocess.run(command, env=env, check=True)
    for name, extra in {
        "d_python_grpo": {},
        "e_python_gdro_dapo": dict(
            curriculum="rollout_gdro", loss_type="dapo", num_iterations=2, beta=0.04
        ),
    }.items():
        print("$ python API:", name, extra, flush=True)
        subprocess.run(
            [sys.executable, __file__, "python-run", name, str(work), json.dumps(extra)],
            env=env,
            check=True,
        )
    names = [*CLI_RUNS, "d_python_grpo", "e_python_gdro_dapo"]
    result = {name: run_fingerprint(work / name) for name in names}
    path.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    print(f"wrote {path}")


def compare(a: Path, b: Path) -> int:
    left, right = json.loads(a.read_text()), json.loads(b.read_text())
    differ = 0
    for name in sorted(set(left) | set(right)):
        if name not in left or name not in right:
            print(f"{name}: only in {'the first' if name in left else 'the second'}")
            differ += 1
            continue
        x, y = left[name], right[name]
        same_weights = x["weights_sha256"] == y["weights_sha256"]
        same_metrics = x["metrics"] == y["metrics"]
        print(f"{name}: weights {'identical' if same_weights else 'DIFFER'}, "
              f"metrics {'identical' if same_metrics else 'DIFFER'} "
              f"({len(x['metrics'])} rows)")  # fmt: skip
        if not same_metrics:
            for i, (r, s) in enumerate(zip(x["metrics"], y["metrics"], strict=False)):
                for key in sorted(set(r) | set(s)):
                    if r.get(key) != s.get(key):
                        print(f"  row {i} {key}: {r.get(key)!r} != {s.get(key)!r}")
        differ += not (same_weights and same_metrics)
    return 1 if differ else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("run")
    p.add_argument("out", type=Path)
    p.add_argument("--work", type=Path, default=ROOT / "runs" / "fingerprint")
    p = sub.add_parser("compare")
    p.add_argument("a", type=Path)
    p.add_argument("b", type=Path)
    p = sub.add_parser("python-run")
    p.add_argument("name")
    p.add_argument("work", type=Path)
    p.add_argument("extra")
    args = parser.parse_args()
    if args.command == "run":
        run(args.out, args.work)
    elif args.command == "compare":
        return compare(args.a, args.b)
    else:
        python_run(args.name, args.work, **json.loads(args.extra))
    return 0


if __name__ == "__main__":
    sys.exit(main())
