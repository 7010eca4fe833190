"""Code-reward throughput: the shipped problems' reference solutions scored by ``code_reward``.

Each completion's assert tests run in the sandbox, so this times the sandbox's start-up and
isolation per completion, which is what a GRPO step pays for code tasks. Run it from two
checkouts side by side (same machine, same moment) to compare them; it prints completions per
second and checks that every reference solution still scores 1.0.

    python benchmarks/sandbox_reward.py --rounds 3 --workers 1
"""

from __future__ import annotations

import argparse
import time


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="passes over the problems")
    parser.add_argument("--workers", type=int, default=1, help="parallel sandboxes")
    args = parser.parse_args(argv)

    from groupwise.rewards.code import make_code_reward
    from groupwise.sandbox import sandbox_info
    from groupwise.tasks.python_tasks import load_problems

    print(sandbox_info().summary())
    problems = load_problems()
    reward = make_code_reward(max_workers=args.workers)
    # Distinct code per round (a comment): identical (code, tests) pairs are run once.
    start = time.perf_counter()
    count = 0
    for round_index in range(args.rounds):
        completions = [
            f"```python\n# round {round_index}\n{p['solution']}```" for p in problems
        ]
        scores = reward([""] * len(problems), completions, tests=[p["tests"] for p in problems])
        if scores != [1.0] * len(problems):
            raise SystemExit(f"a reference solution did not score 1.0: {scores}")
        count += len(problems)
    seconds = time.perf_counter() - start
    print(f"{count} completions in {seconds:.2f} s: {count / seconds:.1f} completions/s")


if __name__ == "__main__":
    main()
