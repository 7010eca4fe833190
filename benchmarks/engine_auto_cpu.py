"""What ``generation_engine: auto`` should pick on a CPU: the HF engine against the static engine
in the numerics a default CPU run has (fp32 weights, no autocast), side by side.

    python benchmarks/engine_auto_cpu.py [--model smollm2-135m-instruct] [--batch 16]
        [--new_tokens 32] [--repeats 5]
    python benchmarks/engine_auto_cpu.py --steps 6     # whole demo steps instead

Both engines are built the way ``build_engine`` builds them for the default CPU run (the HF
engine on the policy's weights; the static engine on its own fp32 copy, eager, weights packed
for oneDNN where the CPU can). Rounds alternate the engines (A B A B ...), every call with the
same seed, after one warm-up call each; printed: median seconds, kept tokens per second and
their ratio (static / hf). With ``--steps N``: two trainers on configs/demo.yaml (fp32, the
default on a CPU), one per engine, take N whole GRPO steps in alternation (A B A B ...); printed:
the medians, after the first step, of the trainers' own generation / update / step timers.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import tempfile
import time
from pathlib import Path

import torch

from groupwise.config.grpo_config import GRPOConfig
from groupwise.data.prompts import tokenize_prompts
from groupwise.rollout import HFEngine, plain_sampling
from groupwise.rollout.static import StaticEngine
from groupwise.runtime.models import load_model_and_tokenizer
from groupwise.tasks.arithmetic import arithmetic_dataset

GROUP = 8


def whole_steps(steps: int) -> None:
    """Whole demo steps with each engine, alternating (see the module docstring)."""
    from groupwise import GRPOConfig, GRPOTrainer
    from groupwise.wiring.rewards import default_reward_names
    from groupwise.wiring.rows import build_datasets

    demo = Path(__file__).resolve().parents[1] / "configs" / "demo.yaml"
    trainers = {}
    with tempfile.TemporaryDirectory() as out:
        for engine in ("hf", "static"):
            args = GRPOConfig.from_yaml(demo, {
                "generation_engine": engine, "output_dir": f"{out}/{engine}", "max_steps": steps,
                "eval_on_start": False, "num_eval_prompts": 0, "save_steps": 0,
                "disable_tqdm": True, "logging_steps": 1,
            })  # fmt: skip
            train, _ = build_datasets(args)
            trainers[engine] = GRPOTrainer(args.model, default_reward_names(args), train, args=args)
        logs: dict[str, list[dict[str, float]]] = {engine: [] for engine in trainers}
        for step in range(steps):
            for engine, trainer in trainers.items():
                logs[engine].append(trainer.train_step())
                trainer.global_step += 1
            print(f"step {step + 1}/{steps}: " + ", ".join(
                f"{e} {logs[e][-1]['time/step']:.2f} s" for e in trainers), flush=True)  # fmt: skip
    print(f"configs/demo.yaml, {steps} steps per engine alternating, medians of steps 2-{steps}, "
          f"{torch.get_num_threads()} threads")  # fmt: skip
    medians = {}
    for engine, rows in logs.items():
        kept = rows[1:] or rows
        medians[engine] = {p: statistics.median(r[f"time/{p}"] for r in kept)
                           for p in ("generation", "update", "step")}  # fmt: skip
        tokens = statistics.median(r["completions/mean_length"] for r in kept)
        m = medians[engine]
        print(f"  {engine:<7} generation {m['generation']:6.2f} s  update {m['update']:6.2f} s  "
              f"step {m['step']:6.2f} s  mean completion {tokens:.1f} tokens")  # fmt: skip
    ratio = medians["static"]["step"] / medians["hf"]["step"]
    print(f"  static / hf whole step: {ratio:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--batch", type=int, default=16, help="completions (a multiple of 8)")
    parser.add_argument("--new_tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=0, help="whole demo steps per engine")
    args = parser.parse_args()
    if args.steps:
        whole_steps(args.steps)
        return
    model, tokenizer = load_model_and_tokenizer(args.model, seed=0)
    model.eval()
    rows = arithmetic_dataset(args.batch // GROUP, "train", seed=0)  # the demo's task
    prompts = tokenize_prompts([r["prompt"] for r in rows], tokenizer, 512)
    params = plain_sampling(args.new_tokens, 1.0)
    engines = {
        "hf": HFEngine(model, tokenizer, params),
        "static": StaticEngine(copy.deepcopy(model), tokenizer, params, dtype=torch.float32,
                               eos_check_every=GRPOConfig.static_eos_check_every,
                               cuda_graphs=GRPOConfig.static_cuda_graphs),  # fmt: skip
    }
    seconds: dict[str, list[float]] = {name: [] for name in engines}
    kept: dict[str, list[int]] = {name: [] for name in engines}

    def once(name: str) -> tuple[float, int]:
        start = time.perf_counter()
        rollout = engines[name].generate(prompts, GROUP, params, torch.Generator().manual_seed(0))
        return time.perf_counter() - start, int(rollout.completion_mask.sum())

    for name in engines:
        once(name)  # warm-up
    for r in range(args.repeats):
        for name in engines:
            s, k = once(name)
            seconds[name].append(s)
            kept[name].append(k)
        print(f"round {r + 1}/{args.repeats}: " + ", ".join(
            f"{n} {seconds[n][-1]:.2f} s" for n in engines), flush=True)  # fmt: skip
    print(f"{args.model}, {args.batch} completions, <= {args.new_tokens} new tokens, fp32, "
          f"{torch.get_num_threads()} threads, medians of {args.repeats} interleaved "
          "rounds")  # fmt: skip
    rate = {}
    for name in engines:
        median = statistics.median(seconds[name])
        rate[name] = statistics.median(kept[name]) / median
        print(f"  {name:<7} {median:7.2f} s  {rate[name]:8.1f} kept tokens/s")
    print(f"  static / hf tokens/s: {rate['static'] / rate['hf']:.2f}x")


if __name__ == "__main__":
    main()
