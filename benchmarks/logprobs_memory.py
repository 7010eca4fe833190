"""Completion log-probs three ways, side by side: memory and time of forward + backward.

- ``naive``: full [rows, length, V] logits from the decoder's hidden states, one log-softmax;
- ``checkpoint``: the LM head module per chunk of ``--chunk`` tokens, activation-checkpointed;
- ``chunked``: the custom autograd function (``ChunkedLMHeadLogprob``): head applied per chunk
  in both passes, only logsumexp per token saved, closed-form gradient.

Each (model, variant) runs in its own subprocess, and each measures, for forward + backward of
sum(logprobs * random weights) with gradients for every parameter:

- memory from the CPU allocator itself, through the profiler's allocation records (every tensor
  allocation and free, in order): ``held`` = bytes still allocated when the forward returns
  (what autograd keeps for the backward, plus the outputs), ``peak`` = the highest allocated
  total during forward + backward. Both relative to just before the forward, so the model and
  inputs are excluded but the parameter gradients (the same in every variant) are included;
- ``time``: wall seconds of a separate, unprofiled forward + backward (best of ``--repeats``).

Ratios are against ``naive``. A checksum of the log-probs and of the gradients confirms the
three compute the same thing.

    python benchmarks/logprobs_memory.py [--models tiny-random,smollm2-135m-instruct]
        [--rows 16] [--length 128] [--prompt 64] [--group 8] [--chunk 512] [--repeats 1]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

VARIANTS = ("naive", "checkpoint", "chunked")


def _allocator_stats(prof, forward_marker: str) -> tuple[int, int]:
    """(bytes live at the end of ``forward_marker``, peak live bytes) from allocation records."""
    events = prof.profiler.kineto_results.events()
    forward_end = max(e.end_ns() for e in events if e.name() == forward_marker)
    live = peak = held = 0
    for event in sorted((e for e in events if e.name() == "[memory]"), key=lambda e: e.start_ns()):
        live += event.nbytes()
        peak = max(peak, live)
        if event.start_ns() <= forward_end:
            held = live
    return held, peak


def worker(args: argparse.Namespace) -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    from groupwise.policy.logprobs import completion_logprobs
    from groupwise.runtime.models import load_model_and_tokenizer

    torch.manual_seed(0)
    model, _ = load_model_and_tokenizer(args.model)
    model = model.to(getattr(torch, args.dtype))
    prompts = args.rows // args.group
    prompt_ids = torch.randint(3, 1000, (prompts, args.prompt))
    prompt_mask = torch.ones_like(prompt_ids)
    completion_ids = torch.randint(3, 1000, (args.rows, args.length))
    completion_mask = torch.ones_like(completion_ids)
    weights = torch.randn(args.rows, args.length)
    params = [p for p in model.parameters() if p.requires_grad]

    def step() -> tuple[float, float]:
        for p in params:
            p.grad = None
        with record_function("logprobs_forward"):
            logp, _ = completion_logprobs(
                model,
                prompt_ids,
                prompt_mask,
                completion_ids,
                completion_mask,
                chunk_size=args.chunk,
                group_size=args.group,
                impl=args.worker,
            )
            loss = (logp * weights).sum()
        loss.backward()
        grad_sum = sum(float(p.grad.double().abs().sum()) for p in params if p.grad is not None)
        return float(logp.sum()), grad_sum

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        checksum = step()
    held, peak = _allocator_stats(prof, "logprobs_forward")
    seconds = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        step()
        seconds.append(time.perf_counter() - start)
    vocab = model.get_output_embeddings().weight.shape[0]
    print(
        json.dumps(
            {
                "seconds": min(seconds),
                "held_mb": held / 2**20,
                "peak_mb": peak / 2**20,
                "logp_sum": checksum[0],
                "grad_abs_sum": checksum[1],
                "vocab": vocab,
            }
        )
    )


def run_model(args: argparse.Namespace, model: str) -> dict[str, dict]:
    results = {}
    for variant in VARIANTS:
        command = [sys.executable, __file__, "--worker", variant, "--models", model]
        for name in ("rows", "length", "prompt", "group", "chunk", "repeats", "dtype"):
            command += [f"--{name}", str(getattr(args, name))]
        out = subprocess.run(command, capture_output=True, text=True)
        if out.returncode:
            raise RuntimeError(f"{model} / {variant} failed:\n{out.stderr[-3000:]}")
        results[variant] = json.loads(out.stdout.strip().splitlines()[-1])
    return results


def report(args: argparse.Namespace, model: str, results: dict[str, dict]) -> None:
    naive = results["naive"]
    logits_mb = args.rows * args.length * naive["vocab"] * 4 / 2**20
    print(
        f"\n{model} ({args.dtype}): {args.rows} completions x {args.length} tokens, "
        f"{args.rows // args.group} prompts x {args.prompt}, chunk {args.chunk}, "
        f"V = {naive['vocab']} (one fp32 [tokens x V] logits tensor = {logits_mb:.0f} MB)"
    )
    print(
        f"  {'variant':10s} {'held after fwd':>15s} {'peak fwd+bwd':>13s} {'time':>8s}"
        f"   {'held/naive':>10s} {'peak/naive':>10s} {'time/naive':>10s}   checksums"
    )
    for variant, r in results.items():
        print(
            f"  {variant:10s} {r['held_mb']:12.0f} MB {r['peak_mb']:10.0f} MB {r['seconds']:7.2f}s"
            f"   {r['held_mb'] / naive['held_mb']:10.2f} {r['peak_mb'] / naive['peak_mb']:10.2f}"
            f" {r['seconds'] / naive['seconds']:10.2f}   "
            f"logp {r['logp_sum']:.6g}, |grad| {r['grad_abs_sum']:.6g}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="tiny-random,smollm2-135m-instruct")
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--prompt", type=int, default=64)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--chunk", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--worker", choices=VARIANTS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        args.model = args.models
        worker(args)
        return
    for model in args.models.split(","):
        report(args, model, run_model(args, model))


if __name__ == "__main__":
    main()
