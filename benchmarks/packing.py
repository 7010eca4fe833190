"""The padding-free update (``padding_free: true``) against the padded one, side by side on
the CPU: one optimizer pass (forward, backward, AdamW step) over the same rollout.

    python benchmarks/packing.py [--repeats 5] [--long-limit 256] [--out FILE.json]

Two length mixes, both from the demo's settings (configs/demo.yaml: SmolLM2-135M-Instruct, one
micro-batch of 2 prompts x 8 completions, its chat-templated arithmetic prompts):

- ``demo``: the rollout the demo's first step samples (completions up to 48 tokens);
- ``long-tail``: the same prompts, 14 completions of 8 to 48 tokens and 2 at the limit
  (``--long-limit``), random tokens.

The arms run interleaved (padded, packed, padded, ...) after one warm-up each, ``--repeats``
times; medians are printed with the packed / padded time ratio, and the tokens each forward
runs (the padded one shares each prompt's forward across its group; the packed one runs every
sequence whole).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch

from groupwise import GRPOConfig, GRPOTrainer
from groupwise.policy import update
from groupwise.policy.batches import trimmed_completions
from groupwise.policy.packing import pack_rows
from groupwise.rollout import Rollout
from groupwise.trainer.base import PhaseTimer
from groupwise.wiring.rewards import default_reward_names
from groupwise.wiring.rows import build_datasets

ROOT = Path(__file__).resolve().parents[1]


def long_tailed(rollout: Rollout, limit: int, seed: int = 0) -> Rollout:
    """The rollout's prompts with 14 completions of 8..48 random tokens and 2 of ``limit``."""
    g = torch.Generator().manual_seed(seed)
    n_rows = rollout.completion_ids.shape[0]
    lengths = torch.randint(8, 49, (n_rows,), generator=g)
    lengths[torch.randperm(n_rows, generator=g)[:2]] = limit
    ids = torch.randint(100, 40000, (n_rows, limit), generator=g)
    mask = (torch.arange(limit)[None, :] < lengths[:, None]).long()
    return Rollout(rollout.prompt_ids, rollout.prompt_mask, ids * mask, mask,
                   lengths >= limit, rollout.group_ids, [""] * n_rows)  # fmt: skip


def tokens(trainer: GRPOTrainer, rollout: Rollout) -> tuple[int, int]:
    """Token positions one update's forwards run: padded (shared prompts, each micro-batch
    trimmed to its longest completion) and packed (rows x width)."""
    padded = packed = 0
    for rows in update.micro_batches_of(trainer.policy.options, rollout):
        ids, mask, width = trimmed_completions(rollout, rows)
        groups = rollout.group_ids[rows]
        prompt_mask = rollout.prompt_mask[groups]
        used = prompt_mask.any(0).nonzero()
        prompt_width = prompt_mask.shape[1] - int(used[0])
        padded += len(groups.unique()) * prompt_width + len(rows) * width
        layout = pack_rows(rollout.prompt_ids[groups], prompt_mask, ids, mask)
        packed += layout.input_ids.numel()
    return padded, packed


def time_update(trainer: GRPOTrainer, rollout: Rollout, advantages: torch.Tensor) -> float:
    inputs = update.prepare(trainer.policy, rollout, advantages, None)
    start = time.perf_counter()
    update.update(trainer.policy, inputs, trainer.loss)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--long-limit", type=int, default=256)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results_packing.json"))
    ns = parser.parse_args()
    torch.manual_seed(0)

    with tempfile.TemporaryDirectory() as folder:
        config = GRPOConfig.from_yaml(
            ROOT / "configs" / "demo.yaml",
            {"output_dir": folder, "eval_on_start": False, "max_steps": 1, "learning_rate": 1e-9},
        )
        train, _ = build_datasets(config)
        trainer = GRPOTrainer(config.model, default_reward_names(config), train, args=config)
        draw = trainer.draw(PhaseTimer())
        advantages = trainer.advantages(draw.scores, draw.rollout.group_ids)
        if float(advantages.abs().sum()) == 0:  # a zero loss is still a full pass; keep it real
            advantages = torch.randn(advantages.shape, generator=torch.Generator().manual_seed(0))
        mixes = {
            "demo": draw.rollout,
            "long-tail": long_tailed(draw.rollout, ns.long_limit),
        }
        base = trainer.policy.options
        arms = {
            "padded": base,
            "packed": dataclasses.replace(
                base, runtime=dataclasses.replace(base.runtime, padding_free=True)
            ),
        }
        results = {}
        for mix, rollout in mixes.items():
            times: dict[str, list[float]] = {arm: [] for arm in arms}
            for repeat in range(ns.repeats + 1):  # the first round warms up
                for arm, options in arms.items():
                    trainer.policy.options = options
                    seconds = time_update(trainer, rollout, advantages)
                    if repeat:
                        times[arm].append(seconds)
            padded_tokens, packed_tokens = tokens(trainer, rollout)
            lengths = rollout.host_lengths
            medians = {arm: statistics.median(values) for arm, values in times.items()}
            results[mix] = {
                "completion_lengths": lengths.tolist(),
                "prompt_tokens": rollout.prompt_mask.sum(1).tolist(),
                "forward_tokens": {"padded": padded_tokens, "packed": packed_tokens},
                "seconds": times,
                "median_seconds": medians,
                "packed_over_padded": medians["packed"] / medians["padded"],
            }
            print(
                f"{mix:>9}: completions {int(lengths.min())}..{int(lengths.max())} tokens "
                f"(mean {lengths.float().mean():.0f}); forward tokens padded {padded_tokens}, "
                f"packed {packed_tokens}; update padded {medians['padded']:.2f} s, packed "
                f"{medians['packed']:.2f} s: packed / padded = "
                f"{medians['packed'] / medians['padded']:.2f}x",
                flush=True,
            )
    record = {
        "command": "python benchmarks/packing.py " + " ".join(
            f"--{k.replace('_', '-')} {v}" for k, v in vars(ns).items() if k != "out"
        ),
        "machine": f"{platform.processor() or platform.machine()}, "
        f"{torch.get_num_threads()} torch threads",
        "torch": torch.__version__,
        "model": config.model,
        "results": results,
    }
    Path(ns.out).write_text(json.dumps(record, indent=1) + "\n")
    print(f"written: {ns.out}")


if __name__ == "__main__":
    main()
