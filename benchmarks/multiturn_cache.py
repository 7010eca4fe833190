"""Multi-turn generation: continuing from the KV cache after each tool reply vs re-encoding the
whole conversation every turn (the multi-turn engine's ``reencode=True``), side by side.

SmolLM2-135M-Instruct, greedy, conversations of ``--turns`` assistant turns, each ended at a
stop string and answered by a scripted environment with a reply of about ``--reply`` tokens (a
tool output). Both modes generate the same tokens (greedy; checked); the figure is the ratio of
wall times, alternated ABAB over ``--rounds`` to spread machine noise over both.

    python benchmarks/multiturn_cache.py [--prompts 8] [--turns 4] [--rounds 2]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from transformers import AutoModelForCausalLM

from groupwise.config.grpo_config import GRPOConfig
from groupwise.data.prompts import tokenize_prompts
from groupwise.rollout import plain_sampling
from groupwise.rollout.multiturn import TurnLimits, TurnRenderer, converse
from groupwise.runtime.models import smollm2_path, smollm2_tokenizer
from groupwise.tasks.arithmetic import arithmetic_dataset
from groupwise.tools import EnvStep


class Replies:
    """Replies ``reply`` filler words to every turn; done after ``turns`` turns."""

    def __init__(self, turns: int, reply_words: int) -> None:
        self.turns, self.reply = turns, " ".join(["value"] * reply_words)
        self.count = 0

    def reset(self, row) -> None:
        self.count = 0

    def step(self, message: str) -> EnvStep:
        self.count += 1
        return EnvStep([{"role": "tool", "content": self.reply}], self.count >= self.turns)

    def state(self) -> dict:
        return {"turns": self.count}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--generations", type=int, default=4)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--reply", type=int, default=24, help="words per environment reply")
    parser.add_argument("--rounds", type=int, default=2)
    opts = parser.parse_args()
    tokenizer = smollm2_tokenizer()
    model = AutoModelForCausalLM.from_pretrained(smollm2_path(), dtype=torch.float32)
    rows = arithmetic_dataset(opts.prompts, digits=2, ops="*")
    ids = tokenize_prompts([r["prompt"] for r in rows], tokenizer, None)
    # Turns end at a newline: the model writes a line, the environment answers.
    limits = TurnLimits(opts.turns, GRPOConfig.max_tool_output_tokens, stop_strings=("\n",))
    params = plain_sampling(96 * opts.turns, 0.0)

    def run(reencode: bool):
        envs = [Replies(opts.turns, opts.reply) for _ in range(opts.prompts * opts.generations)]
        start = time.perf_counter()
        rollout, timing = converse(
            model, tokenizer, ids, [opts.generations] * opts.prompts, envs,
            TurnRenderer(tokenizer, True), params, limits, reencode=reencode,
        )  # fmt: skip
        return time.perf_counter() - start, rollout, timing

    times: dict[bool, list[float]] = {False: [], True: []}
    inserts: dict[bool, list[float]] = {False: [], True: []}
    tokens = None
    for _ in range(opts.rounds):
        for reencode in (False, True):
            seconds, rollout, timing = run(reencode)
            times[reencode].append(seconds)
            inserts[reencode].append(timing["insert_s"])
            if tokens is None:
                tokens = rollout.completion_ids
            elif not torch.equal(tokens, rollout.completion_ids):
                print("note: the two modes generated different tokens (float rounding)")
    rows_n = opts.prompts * opts.generations
    turns = statistics.mean(s["turns"] for s in rollout.env_states)
    context = int((rollout.completion_mask.sum() - rollout.loss_mask.sum()).item())
    cached, again = statistics.median(times[False]), statistics.median(times[True])
    print(f"{rows_n} conversations, {turns:.1f} turns each, {context} inserted context tokens")
    insert, reencode = statistics.median(inserts[False]), statistics.median(inserts[True])
    print(f"cached continuation: {cached:.2f} s (inserting the replies: {insert:.2f} s)")
    print(f"re-encoding:         {again:.2f} s (re-encoding at each turn: {reencode:.2f} s)")
    print(f"ratio re-encode / cached: {again / cached:.2f}x")


if __name__ == "__main__":
    main()
