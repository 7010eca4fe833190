"""``groupwise train`` and ``groupwise demo``."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import yaml

from ..config.grpo_config import GRPOConfig, unused_dir
from ..errors import ConfigError
from ..wiring.rows import apply_long_prompt_policy, build_datasets

# The demo's settings: one file, shipped with the package and linked from configs/demo.yaml,
# so `groupwise demo`, `make demo` and `groupwise train configs/demo.yaml` cannot drift apart.
DEMO_YAML = Path(__file__).with_name("demo.yaml")
DEMO_CONFIG: dict[str, Any] = yaml.safe_load(DEMO_YAML.read_text(encoding="utf-8"))
# Where the demo writes when --output_dir is not given: this folder, or the first of
# runs/demo-2, runs/demo-3, ... that does not exist, so a rerun never deletes an earlier one.
DEMO_OUTPUT_DIR = "runs/demo"


def run_train(args: GRPOConfig) -> dict[str, float]:
    from ..trainer.grpo import GRPOTrainer
    from ..trainer.ppo import PPOTrainer
    from ..trainer.records import check_output_dir
    from ..wiring.rewards import default_reward_names

    trainer_class = PPOTrainer if args.algorithm == "ppo" else GRPOTrainer

    # Everything checkable without the model is checked first (a model can take minutes).
    # Without an output_dir the trainer names a new folder (the same on every rank).
    if args.output_dir is not None:
        check_output_dir(args.output_dir, args.resume_from_checkpoint, args.overwrite_output_dir)
    train, evals = build_datasets(args)
    trainer = trainer_class(
        args.model, default_reward_names(args), train, args=args, eval_dataset=evals
    )
    trainer.train_dataset = apply_long_prompt_policy(train, trainer.tokenizer, args)
    trainer.eval_dataset = apply_long_prompt_policy(evals, trainer.tokenizer, args)
    trainer.train()
    history = trainer.log_history
    print(f"[groupwise] metrics: {Path(args.output_dir) / 'metrics.jsonl'}")
    print(f"[groupwise] model:   {Path(args.output_dir)} (AutoModelForCausalLM.from_pretrained)")
    return history[-1] if history else {}


def run_demo(args: GRPOConfig) -> tuple[float, float]:
    """Held-out greedy accuracy, GRPO training, held-out greedy accuracy again."""
    from ..trainer.grpo import GRPOTrainer
    from ..trainer.records import check_output_dir
    from ..wiring.rewards import default_reward_names

    start = time.perf_counter()
    if args.output_dir is None:
        args.output_dir = unused_dir(DEMO_OUTPUT_DIR)
        if args.output_dir != DEMO_OUTPUT_DIR:
            print(
                f"[groupwise] {DEMO_OUTPUT_DIR} holds an earlier demo (kept); this one writes to "
                f"{args.output_dir}"
            )
    check_output_dir(args.output_dir, args.resume_from_checkpoint, args.overwrite_output_dir)
    train, evals = build_datasets(args)
    if not evals:
        raise ConfigError("the demo needs num_eval_prompts >= 1")
    # The demo evaluates before and after itself, so the numbers can be printed side by side.
    args.eval_on_start, args.eval_steps = False, 0
    trainer = GRPOTrainer(
        args.model, default_reward_names(args), train, args=args, eval_dataset=evals
    )
    if args.overwrite_output_dir and not args.resume_from_checkpoint:
        trainer._clear_earlier_run()  # before the first evaluation is logged there
    acc, fmt = "eval/rewards/accuracy_reward/mean", "eval/rewards/format_reward/mean"

    def evaluate(when: str) -> dict[str, float]:
        # Greedy decoding of every held-out problem takes a while on a CPU: say what runs.
        print(f"[groupwise] evaluating {len(evals)} held-out problems {when} (greedy) ...",
              flush=True)  # fmt: skip
        began = time.perf_counter()
        result = trainer.evaluate()
        trainer._log({"step": trainer.global_step, **result})
        print(
            f"[groupwise] {when}: held-out greedy accuracy {result.get(acc, 0):.1%} "
            f"(format {result.get(fmt, 0):.1%}) on {len(evals)} problems "
            f"({time.perf_counter() - began:.0f} s)"
        )
        return result

    before = evaluate("before training")
    trainer.train()
    after = evaluate(f"after {trainer.global_step} GRPO steps")
    minutes = (time.perf_counter() - start) / 60
    print(
        f"[groupwise] accuracy {before.get(acc, 0):.1%} -> {after.get(acc, 0):.1%} "
        f"in {minutes:.1f} min"
    )
    print(f"[groupwise] metrics: {Path(args.output_dir) / 'metrics.jsonl'}")
    print(f"[groupwise] model:   {Path(args.output_dir)} (AutoModelForCausalLM.from_pretrained)")
    return before.get(acc, 0.0), after.get(acc, 0.0)
