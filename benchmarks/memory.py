"""Peak training memory, side by side in one run: PPO vs GRPO (full fine-tune), GRPO with LoRA,
GRPO with naive vs chunked log-probs, and with gradient checkpointing.

Each configuration runs ``--steps`` real training steps (same model, task, batch, group size,
completion length) in a fresh process, so peaks never mix; the figure is the process's peak RSS
minus its RSS before the model was loaded (CPU) or peak allocated memory (GPU). Printed as ratios
against full-fine-tune PPO and against the default GRPO, with the planner's prediction
(``groupwise memory``) for the same settings next to each.

    python benchmarks/memory.py                       # tiny-random and SmolLM2-135M
    python benchmarks/memory.py --models tiny-random  # a quick run
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

from groupwise.memory import MemoryOptions, human_bytes, run_measurement

# name -> (algorithm, changes to the options)
VARIANTS = {
    "PPO (actor + critic + reference)": ("ppo", {}),
    "GRPO (policy + reference)": ("grpo", {}),
    "GRPO, beta = 0 (no reference)": ("grpo", {"beta": 0.0}),
    "GRPO + LoRA r=16 (reference = adapter off)": ("grpo", {"lora_r": 16}),
    "GRPO, naive full-logits log-probs": ("grpo", {"logprob_impl": "naive"}),
    "GRPO + gradient checkpointing": ("grpo", {"gradient_checkpointing": True}),
    "GRPO + LoRA + gradient checkpointing, beta = 0": (
        "grpo",
        {"lora_r": 16, "gradient_checkpointing": True, "beta": 0.0},
    ),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["tiny-random", "smollm2-135m-instruct"])
    parser.add_argument("--batch", type=int, default=16, help="completions per step")
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--completion-len", type=int, default=64)
    parser.add_argument("--steps", type=int, default=2, help="steps per process (AdamW states "
                        "exist from the first update on, so 2 shows the steady state)")  # fmt: skip
    parser.add_argument("--variants", nargs="*", help="substrings of variant names to run")
    ns = parser.parse_args()
    for model in ns.models:
        base = MemoryOptions(
            dtype="fp32",
            precision="pure",
            batch=ns.batch,
            group_size=ns.group_size,
            prompt_len=128,
            completion_len=ns.completion_len,
            beta=0.04,
        )
        print(
            f"\n{model}: {ns.batch} completions per step (G={ns.group_size}), up to "
            f"{ns.completion_len} completion tokens, fp32 AdamW, {ns.steps} steps per process"
        )
        rows = []
        for name, (algorithm, changes) in VARIANTS.items():
            if ns.variants and not any(v in name for v in ns.variants):
                continue
            start = time.perf_counter()
            (result,) = run_measurement(
                model, replace(base, **changes), algorithms=(algorithm,), steps=ns.steps
            )
            if "error" in result:
                print(f"  {name}: failed: {result['error']}")
                continue
            rows.append((name, result, time.perf_counter() - start))
            print(f"  measured {name}: {human_bytes(result['measured_bytes'])}", flush=True)
        ppo = next((r for n, r, _ in rows if n.startswith("PPO")), None)
        grpo = next((r for n, r, _ in rows if n.startswith("GRPO (policy")), None)
        print(
            f"\n  {'configuration':<48}{'peak':>10}{'vs PPO':>9}{'vs GRPO':>9}"
            f"{'predicted':>11}{'meas/pred':>10}"
        )
        for name, result, _ in rows:
            measured = result["measured_bytes"]
            vs_ppo = f"{measured / ppo['measured_bytes']:.2f}" if ppo else "-"
            vs_grpo = f"{measured / grpo['measured_bytes']:.2f}" if grpo else "-"
            print(
                f"  {name:<48}{human_bytes(measured):>10}{vs_ppo:>9}{vs_grpo:>9}"
                f"{human_bytes(result['predicted_bytes']):>11}{result['ratio']:>10.2f}"
            )


if __name__ == "__main__":
    main()
