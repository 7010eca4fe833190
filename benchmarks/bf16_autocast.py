"""bf16 on this CPU, side by side: matmul throughput fp32 vs bf16 (AMX where present), and the
training forward + backward (completion log-probs) of a model in fp32 vs ``bf16_autocast``.

    python benchmarks/bf16_autocast.py [--model smollm2-135m-instruct] [--rows 16] [--length 64]

Times are medians of ``--repeats`` runs taken alternately (fp32, bf16, fp32, ...), printed as
ratios against fp32.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from groupwise.policy.logprobs import completion_logprobs
from groupwise.runtime.models import load_model_and_tokenizer


def matmul_gflops(dtype: torch.dtype, size: int = 2048, repeats: int = 5) -> float:
    a = torch.randn(size, size).to(dtype)
    b = torch.randn(size, size).to(dtype)
    a @ b  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - start)
    return 2 * size**3 / statistics.median(times) / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--length", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    ns = parser.parse_args()

    fp32, bf16 = matmul_gflops(torch.float32), matmul_gflops(torch.bfloat16)
    print(f"matmul 2048^3: fp32 {fp32:.0f} GFLOP/s, bf16 {bf16:.0f} GFLOP/s ({bf16 / fp32:.2f}x)")

    model, _ = load_model_and_tokenizer(ns.model, None, seed=0)
    model.train()
    torch.manual_seed(0)
    group = 8
    prompt_ids = torch.randint(10, 1000, (ns.rows // group, 64))
    prompt_mask = torch.ones_like(prompt_ids)
    completion_ids = torch.randint(10, 1000, (ns.rows, ns.length))
    completion_mask = torch.ones_like(completion_ids)

    def step(autocast: bool) -> tuple[float, torch.Tensor]:
        model.zero_grad(set_to_none=True)
        start = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            logp, _ = completion_logprobs(
                model, prompt_ids, prompt_mask, completion_ids, completion_mask,
                group_size=group,
            )  # fmt: skip
        logp.sum().backward()
        return time.perf_counter() - start, logp.detach()

    step(False)
    step(True)  # warm-up both paths
    times: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(ns.repeats):
        for autocast in (False, True):
            seconds, logp = step(autocast)
            times[autocast].append(seconds)
            if autocast:
                bf16_logp = logp
            else:
                fp32_logp = logp
    a, b = statistics.median(times[False]), statistics.median(times[True])
    drift = (bf16_logp - fp32_logp).abs().mean().item()
    print(
        f"{ns.model} log-probs fwd+bwd, {ns.rows} x ({64} prompt + {ns.length}) tokens: "
        f"fp32 {a:.2f} s, bf16 autocast {b:.2f} s ({a / b:.2f}x faster); "
        f"mean |log-prob difference| {drift:.4f} nats"
    )


if __name__ == "__main__":
    main()
