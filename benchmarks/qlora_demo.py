"""QLoRA on the demo's task: does GRPO on a frozen 4-bit base with LoRA adapters raise held-out
accuracy? (An experiment, not a test: 7 to 10 minutes an arm on 2 CPU cores; an arm that is in
the results file is skipped on a rerun.)

Every arm is ``groupwise demo`` (the demo's settings: one-digit arithmetic, format + accuracy
rewards, 2 prompts x 8 completions, 30 steps, held-out greedy accuracy on 64 problems before and
after) with the base quantised to NF4 with double quantisation and LoRA adapters trained on it
(``--use_peft --load_in_4bit --use_bnb_nested_quant``), LoRA r 16, alpha 32, on every linear
layer but the head, and the learning rate raised for the adapter (``--lr``, default 2e-4; the
demo's full fine-tune uses 1e-5). The arms differ in the model that is quantised:

- ``base``: SmolLM2-135M-Instruct as shipped. Its weights arrive dequantised from a 4-bit GGUF
  (Q4_1), so NF4 quantises them a second time, and it starts without the answer format.
- ``warm``: the same model after the supervised warm start of ``benchmarks/curriculum.py``
  (``fine_tune``: ``--sft-steps`` AdamW steps, default 2, on worked answers of one-digit
  ``+``/``-`` training problems, in fp32), quantised to NF4 afterwards. The demo's held-out
  problems are the evaluation split (and include ``*``), which the warm start never saw. Two
  steps bring back part of the answer format and leave the held-out accuracy where the
  unquantised shipped model's is; ten (``benchmarks/curriculum.py``'s own) leave little for
  GRPO to learn.

Results: ``benchmarks/results_qlora_demo.json``, one record per arm: accuracy and format before
and after, the reward of the first and last steps, minutes, and the command.

    python benchmarks/qlora_demo.py [--arms warm base] [--lr 2e-4] [--sft-steps 2] [--rerun]
        [--work runs/qlora-demo]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results_qlora_demo.json"
ACC, FMT = "eval/rewards/accuracy_reward/mean", "eval/rewards/format_reward/mean"
QLORA = ["--use_peft", "true", "--load_in_4bit", "true", "--use_bnb_nested_quant", "true",
         "--lora_r", "16", "--lora_alpha", "32"]  # fmt: skip


def warm_model(work: Path, steps: int) -> Path:
    """The supervised warm start of benchmarks/curriculum.py with ``steps`` AdamW steps, built
    once into ``work``."""
    folder = work / f"warm-supervised-{steps}"
    if not (folder / "config.json").exists():
        sys.path.insert(0, str(HERE))
        import curriculum

        curriculum.SFT_STEPS = steps  # fine_tune's step count
        record = curriculum.fine_tune(folder)
        (folder / "warm_start.json").write_text(json.dumps(record, indent=1))
    return folder


def read_metrics(output_dir: Path) -> tuple[list[dict], list[dict]]:
    """(evaluations, training steps) from a run's metrics.jsonl."""
    rows = [json.loads(line) for line in (output_dir / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in rows if ACC in r]
    steps = [r for r in rows if "reward" in r and ACC not in r]
    return evals, steps


def run_arm(key: str, model: str, lr: float, work: Path) -> dict:
    out = work / key
    cmd = [sys.executable, "-m", "groupwise", "demo", "--model", model, *QLORA,
           "--learning_rate", str(lr), "--output_dir", str(out), "--overwrite_output_dir",
           "true"]  # fmt: skip
    print("$ " + " ".join(cmd), flush=True)
    start = time.perf_counter()
    subprocess.run(cmd, check=True)
    evals, steps = read_metrics(out)
    first, last = evals[0], evals[-1]
    return {
        "arm": key.split("-")[0],
        "model": model,
        "learning_rate": lr,
        "accuracy_before": first[ACC],
        "format_before": first[FMT],
        "accuracy_after": last[ACC],
        "format_after": last[FMT],
        "eval_problems": 64,
        "reward_first_steps": [round(s["reward"], 4) for s in steps[:3]],
        "reward_last_steps": [round(s["reward"], 4) for s in steps[-3:]],
        "steps": len(steps),
        "minutes": round((time.perf_counter() - start) / 60, 1),
        "threads": os.environ.get("OMP_NUM_THREADS", "default"),
        "command": " ".join(["groupwise", *cmd[3:]]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--arms", nargs="+", default=["base", "warm"],
                        choices=["base", "warm"])  # fmt: skip
    parser.add_argument("--rerun", action="store_true", help="run arms already in the results")
    parser.add_argument("--lr", type=float, default=2e-4)
    parser.add_argument("--sft-steps", type=int, default=2, help="the warm start's steps")
    parser.add_argument("--work", default="runs/qlora-demo")
    o = parser.parse_args()
    work = Path(o.work)
    work.mkdir(parents=True, exist_ok=True)
    results = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    for arm in o.arms:
        key = f"{arm}-lr{o.lr:g}" + (f"-sft{o.sft_steps}" if arm == "warm" else "")
        if key in results and not o.rerun:
            print(f"{key}: in {RESULTS.name} already (skipped; --rerun runs it again)")
            continue
        model = "smollm2-135m-instruct" if arm == "base" else str(warm_model(work, o.sft_steps))
        results[key] = {**run_arm(key, model, o.lr, work),
                        "sft_steps": o.sft_steps if arm == "warm" else 0}  # fmt: skip
        RESULTS.write_text(json.dumps(results, indent=1) + "\n")
    for key, r in results.items():
        print(f"{key}: held-out greedy accuracy {r['accuracy_before']:.1%} -> "
              f"{r['accuracy_after']:.1%}, format {r['format_before']:.1%} -> "
              f"{r['format_after']:.1%}, reward {r['reward_first_steps']} -> "
              f"{r['reward_last_steps']} ({r['minutes']} min)")  # fmt: skip


if __name__ == "__main__":
    main()
