"""Chunked log-probs (groupwise) against full-logits log-probs, side by side on one config.

Each variant runs in its own subprocess (forward + backward of sum(logprobs)) so its peak RSS is
its own. Prints seconds and peak memory, and the ratios chunked / full.

    python benchmarks/logprobs_memory.py [--model smollm2-135m-instruct] [--rows 16] [--length 128]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time


def worker(variant: str, model_name: str, rows: int, length: int, group: int) -> None:
    import torch

    from groupwise.logprobs import completion_logprobs, full_logits_logprobs
    from groupwise.models import load_model_and_tokenizer

    model, _ = load_model_and_tokenizer(model_name)
    torch.manual_seed(0)
    prompts = rows // group
    prompt_ids = torch.randint(3, 1000, (prompts, 64))
    prompt_mask = torch.ones_like(prompt_ids)
    completion_ids = torch.randint(3, 1000, (rows, length))
    completion_mask = torch.ones_like(completion_ids)
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    if variant == "full":
        index = torch.arange(rows) // group
        logp = full_logits_logprobs(
            model, prompt_ids[index], prompt_mask[index], completion_ids, completion_mask
        )
    else:
        logp, _ = completion_logprobs(
            model, prompt_ids, prompt_mask, completion_ids, completion_mask, group_size=group
        )
    logp.sum().backward()
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(
        json.dumps({"seconds": seconds, "peak_mb": peak / 1024, "extra_mb": (peak - base) / 1024})
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--worker", choices=["full", "chunked"])
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.model, args.rows, args.length, args.group)
        return
    results = {}
    for variant in ("full", "chunked"):
        out = subprocess.run(
            [sys.executable, __file__, "--worker", variant, "--model", args.model,
             "--rows", str(args.rows), "--length", str(args.length), "--group", str(args.group)],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        results[variant] = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"model {args.model}, {args.rows} rows x {args.length} completion tokens (+64 prompt)")
    for variant, r in results.items():
        print(
            f"  {variant:8s} {r['seconds']:7.2f} s   peak RSS {r['peak_mb']:7.0f} MB   "
            f"(+{r['extra_mb']:.0f} MB over the loaded model)"
        )
    full, chunked = results["full"], results["chunked"]
    print(
        f"  chunked / full: time {chunked['seconds'] / full['seconds']:.2f}x, "
        f"extra memory {chunked['extra_mb'] / max(full['extra_mb'], 1e-9):.2f}x"
    )


if __name__ == "__main__":
    main()
