"""GRPO with a calculator tool vs without, at the same wall-clock budget (a
demonstration; an experiment, not a test).

Task: two-digit x two-digit multiplication, which SmolLM2-135M-Instruct cannot do in its head.
Arms, each starting from the same SmolLM2-135M-Instruct weights and trained for ``--minutes``:

- ``tool``: the prompt shows the ``calculator`` tool (groupwise's default tool format for a
  template without tool support: instructions in the system message and one worked example),
  multi-turn rollouts (``max_turns`` 3), reward = the final answer is right (``accuracy``);
- ``no_tool``: the same task with the arithmetic task's usual worked example (think, then
  answer), single-turn, same reward.

Held-out greedy accuracy (and, for ``tool``, the share of conversations that call the tool) is
measured before training and after, on ``--eval`` problems the training never sees.

    python benchmarks/tool_use.py [--minutes 15] [--arms tool,no_tool] [--eval 100]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from groupwise import GRPOConfig, GRPOTrainer
from groupwise.data.prompts import tokenize_prompts
from groupwise.rollout import plain_sampling
from groupwise.tasks import answer_block
from groupwise.tasks.arithmetic import arithmetic_dataset
from groupwise.tools.prompting import EXAMPLES

TOOL_SYSTEM = (
    "You are a careful calculator. Use the calculator tool for multiplication, then give only "
    "the final number inside <answer> </answer>."
)


def rows_for(arm: str, count: int, split: str) -> list[dict[str, Any]]:
    rows = arithmetic_dataset(count, split=split, digits=2, ops="*", few_shot=arm == "no_tool")
    if arm == "tool":  # the tool's worked example replaces the arithmetic one
        for row in rows:
            row["prompt"] = [{"role": "system", "content": TOOL_SYSTEM}, row["prompt"][-1]]
    return rows


class StopAfter:
    """A callback that stops training after ``seconds`` of wall time."""

    def __init__(self, seconds: float) -> None:
        self.seconds, self.start = seconds, time.perf_counter()

    def on_train_begin(self, args, state, control, **kwargs) -> None:
        self.start = time.perf_counter()  # the budget is training time, not evaluation

    def on_step_end(self, args, state, control, **kwargs) -> None:
        if time.perf_counter() - self.start > self.seconds:
            control.should_training_stop = True


def greedy_eval(trainer: GRPOTrainer, rows: list[dict[str, Any]]) -> dict[str, float]:
    """Greedy held-out accuracy and tool-call rate, through the run's own engine."""
    engine, correct, calls = trainer.engine, 0, 0
    render = getattr(engine, "prompt_text", None)
    params = plain_sampling(trainer.args.max_completion_length, 0.0)
    for begin in range(0, len(rows), 25):
        batch = rows[begin : begin + 25]
        ids = tokenize_prompts([r["prompt"] for r in batch], trainer.tokenizer, None, render)
        rollout = engine.generate(ids, 1, params, rows=batch)
        for i, row in enumerate(batch):
            if rollout.conversations is not None:
                last = rollout.conversations[i][-1]["content"]
                calls += int(rollout.env_states[i].get("tool_calls", 0) > 0)
            else:
                last = rollout.texts[i]
            answer = answer_block(last)
            correct += answer is not None and answer.replace(",", "") == str(row["answer"])
    return {"greedy_accuracy": correct / len(rows), "tool_call_rate": calls / len(rows)}


def run_arm(
    arm: str, minutes: float, eval_rows: int, seed: int, out: Path, opts_lr: float
) -> dict[str, Any]:
    train, held_out = rows_for(arm, 400, "train"), rows_for(arm, eval_rows, "eval")
    args = GRPOConfig(
        model="smollm2-135m-instruct",
        tools=["calculator"] if arm == "tool" else None,
        max_turns=3,
        # accuracy decides; tool_call (0.5) pays for a well-formed call, without which the
        # rare first calls give almost no signal (the tool arm only: no_tool has no calls)
        reward_funcs=["accuracy", "tool_call"] if arm == "tool" else ["accuracy"],
        reward_weights=[1.0, 0.5] if arm == "tool" else None,
        num_generations=8,
        per_device_train_batch_size=32,  # 4 prompts x 8 conversations per step
        max_completion_length=64,
        learning_rate=opts_lr,
        beta=0.0,
        # the loss and schedule the recorded results were measured with (TRL's defaults differ)
        loss_type="grpo",
        lr_scheduler_type="constant",
        gradient_checkpointing=False,
        max_steps=1000,  # the wall-clock budget stops it
        logging_steps=1,
        save_strategy="no",
        output_dir=str(out / arm),
        overwrite_output_dir=True,
        disable_tqdm=True,
        seed=seed,
    )
    trainer = GRPOTrainer(
        args.model, args.reward_funcs, train, args, callbacks=[StopAfter(minutes * 60)]
    )
    torch.manual_seed(seed)
    before = greedy_eval(trainer, held_out)
    print(f"[{arm}] before: {before}", flush=True)
    start = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - start
    after = greedy_eval(trainer, held_out)
    print(f"[{arm}] after {trainer.global_step} steps, {seconds / 60:.1f} min: {after}", flush=True)
    curve = [json.loads(line) for line in open(out / arm / "metrics.jsonl")]
    keys = ("step", "reward", "tools/call_rate", "tools/failure_frequency", "turns/mean",
            "tokens/masked_fraction", "time/step")  # fmt: skip
    for row in curve:
        print("  " + " ".join(f"{k}={row[k]:.3g}" for k in keys if k in row), flush=True)
    return {"arm": arm, "steps": trainer.global_step, "minutes": seconds / 60,
            "before": before, "after": after}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=15.0)
    parser.add_argument("--arms", default="tool,no_tool")
    parser.add_argument("--eval", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", type=float, default=2e-5)
    parser.add_argument("--examples", type=int, default=2, help="calculator worked examples")
    parser.add_argument("--out", default=None)
    opts = parser.parse_args()
    out = Path(opts.out or tempfile.mkdtemp(prefix="tool_use-"))
    if opts.examples != 2:  # the library shows two; fewer measures what the second one buys
        EXAMPLES["calculator"] = EXAMPLES["calculator"][: 4 * opts.examples]
    results = [
        run_arm(a, opts.minutes, opts.eval, opts.seed, out, opts.lr) for a in opts.arms.split(",")
    ]
    print("\narm      steps  minutes  greedy accuracy  tool-call rate (before -> after)")
    for r in results:
        b, a = r["before"], r["after"]
        acc = f"{b['greedy_accuracy']:.2f} -> {a['greedy_accuracy']:.2f}"
        calls = f"{b['tool_call_rate']:.2f} -> {a['tool_call_rate']:.2f}"
        print(f"{r['arm']:8} {r['steps']:5d}  {r['minutes']:7.1f}  {acc:15}  {calls}")


if __name__ == "__main__":
    main()
