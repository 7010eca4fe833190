"""Inverse-CDF sampling (groupwise) against torch.multinomial, side by side, on a 49k vocabulary.

python benchmarks/sampling_speed.py [--rows 16] [--vocab 49152] [--repeats 50]
"""

from __future__ import annotations

import argparse
import time

import torch

from groupwise.rollout import plain_sampling, sample_next_token


def timed(fn, repeats: int) -> float:
    fn()  # warm-up
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - start) / repeats


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--vocab", type=int, default=49152)
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args()
    logits = torch.randn(args.rows, args.vocab)
    gen = torch.Generator().manual_seed(0)
    params = plain_sampling(256, 1.0)

    def multinomial():
        return torch.multinomial(torch.softmax(logits, -1), 1, generator=gen)

    def inverse_cdf():
        return sample_next_token(logits, params, gen)

    base = timed(multinomial, args.repeats)
    ours = timed(inverse_cdf, args.repeats)
    print(f"{args.rows} rows x {args.vocab} vocab, one token each")
    print(f"  torch.multinomial  {base * 1e3:8.2f} ms  ({base / args.rows * 1e3:.3f} ms per row)")
    print(f"  inverse CDF        {ours * 1e3:8.2f} ms  ({ours / args.rows * 1e3:.3f} ms per row)")
    print(f"  speed-up: {base / ours:.1f}x")


if __name__ == "__main__":
    main()
