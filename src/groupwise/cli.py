"""Command line: ``groupwise train [CONFIG.yaml] [--field value ...]`` and ``groupwise demo``."""

from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path
from typing import Any

from .build import GUESS_TASK, REWARD_COLUMNS, build_reward_func, default_reward_names
from .checkpoint import CheckpointError, TrainingInterrupted, TrainingStopped, check_output_dir
from .config import (
    ConfigError,
    GRPOConfig,
    default_output_dir,
    option_help,
    parse_cli_overrides,
    unused_dir,
)
from .data import (
    TASKS,
    arithmetic_dataset,
    count_long_prompts,
    filter_long_prompts,
    load_dataset_rows,
)
from .errors import DataError, OutputDirError, UserError, cli_style
from .rewards.combine import RewardFunctionError

# Errors in what the user gave: printed as one paragraph, without a traceback (a bug keeps its
# traceback). ConfigError and CheckpointError predate UserError and are listed by name.
USER_ERRORS = (UserError, ConfigError, CheckpointError, RewardFunctionError)

USAGE = """usage: groupwise <command> [CONFIG.yaml] [--option value ...]

commands:
  train   run GRPO; options come from CONFIG.yaml and/or --option value (any GRPOConfig field)
  eval    evaluate --model (a path, checkpoint or built-in) on the task's held-out prompts:
          greedy accuracy, and with --eval_num_generations N unbiased pass@k / mean@k, overall
          and per difficulty; --compare_model M adds the paired difference with a 95% CI
  demo    fine-tune SmolLM2-135M-Instruct on arithmetic on the CPU, with held-out greedy
          accuracy before and after (--option value overrides the demo's settings)
  memory  plan the memory of a run, PPO vs GRPO side by side (groupwise memory --help);
          --measure runs one real step of each and prints predicted vs measured
  report  groupwise report RUN_DIR [RUN_DIR ...]: one run: RUN_DIR/report.html (held-out
          accuracy before -> after, curves, warnings, changed options, example completions);
          several: one page comparing them (compare-A-vs-B.html here, or --output FILE)

train options worth knowing: --resume (continue from the newest checkpoint in output_dir),
--overwrite_output_dir (start over in a folder that holds an earlier run), --debug (tracebacks),
--algorithm ppo (the actor-critic baseline), --use_peft true (LoRA), --report_to tensorboard

precision (README "Precision"): on a bf16 GPU the default is fp32 weights and AdamW state with
bf16 autocast for forward, backward and generation (--bf16_autocast auto; TRL's --bf16 true means
the same); on CPU, fp32 throughout. --dtype bfloat16 stores the trained weights in bf16 with no
fp32 master copy: less memory, but updates below ~1/512 of a weight are lost (it warns).
--generation_dtype bfloat16 generates in bf16 while an fp32 update corrects for the difference.
--tf32 (CUDA, default on), --attn_implementation sdpa|eager|flash_attention_2.

e.g. groupwise train --model tiny-random --task arithmetic --max_steps 5 --output_dir runs/x
"""

# The demo's settings: measured to raise held-out greedy accuracy well within 15 minutes on a
# 2-core CPU (README has the numbers).
DEMO_CONFIG: dict[str, Any] = {
    "model": "smollm2-135m-instruct",
    "task": "arithmetic",
    "digits": 1,
    "min_operands": 2,
    "max_operands": 2,
    "num_train_prompts": 200,
    "num_eval_prompts": 64,
    "num_generations": 8,
    "per_device_train_batch_size": 16,
    "gradient_accumulation_steps": 1,
    "max_completion_length": 48,
    "temperature": 1.0,
    "learning_rate": 1e-5,
    "beta": 0.0,
    "max_steps": 30,
    "seed": 0,
}
# Where the demo writes when --output_dir is not given: this folder, or the first of
# runs/demo-2, runs/demo-3, ... that does not exist, so a rerun never deletes an earlier one.
DEMO_OUTPUT_DIR = "runs/demo"


def _file_rows(path: str, args: GRPOConfig, option: str = "task") -> list[dict]:
    try:
        rows, report = load_dataset_rows(
            path,
            prompt_column=args.prompt_column,
            answer_column=args.answer_column,
            system_prompt=args.system_prompt,
            prompt_template=args.prompt_template,
            on_invalid=args.on_invalid_rows,
        )
    except DataError:
        raise
    except (ValueError, TypeError, OSError) as err:
        message = str(err) if str(err).startswith(str(path)) else f"{path}: {err}"
        if (
            "UTF-8" not in message
            and args.on_invalid_rows == "error"
            and re.search(r":\d+: |\[item \d+\]: ", message)
        ):
            message += " (fix that row, or set on_invalid_rows: skip to skip and count bad rows)"
        elif " column; available columns: " in message:
            message += " (name the file's columns with prompt_column and answer_column)"
        raise DataError(f"{option}: {message}") from err
    print(f"[groupwise] {report.summary()}")
    return rows


def _is_data_file(task: str) -> bool:
    return task.endswith((".jsonl", ".json", ".csv", ".parquet")) or os.path.isdir(task)


def build_datasets(args: GRPOConfig) -> tuple[list[dict], list[dict] | None]:
    """Training and held-out rows for ``args.task``: a built-in task or a data file."""
    if args.task == "arithmetic":
        return _arithmetic(args)
    return _task_rows(args)


def _arithmetic(args: GRPOConfig) -> tuple[list[dict], list[dict] | None]:
    try:
        common = dict(
            digits=args.digits,
            min_operands=args.min_operands,
            max_operands=args.max_operands,
            ops=args.ops,
            few_shot=args.few_shot,
        )
        train = arithmetic_dataset(args.num_train_prompts, "train", seed=args.seed, **common)
        evals = (
            arithmetic_dataset(args.num_eval_prompts, "eval", seed=0, **common)
            if args.num_eval_prompts
            else None
        )
    except ValueError as err:  # the arithmetic options (digits, operands, ops)
        raise ConfigError(f"task=arithmetic: {err}") from err
    return train, evals


def _task_rows(args: GRPOConfig) -> tuple[list[dict], list[dict] | None]:
    if _is_data_file(args.task):
        if not os.path.exists(args.task):
            raise ConfigError(f"task={args.task!r}: file does not exist")
        train = _file_rows(args.task, args)
        check_reward_columns(train, default_reward_names(args), f"task={args.task!r}")
        evals = None
        if args.eval_task:
            if not os.path.exists(args.eval_task):
                raise ConfigError(f"eval_task={args.eval_task!r}: file does not exist")
            evals = _file_rows(args.eval_task, args, "eval_task")[: args.num_eval_prompts or None]
        return train, evals
    if args.task == GUESS_TASK:  # the multi-turn feedback game (an environment)
        from .tools import guess_number_dataset

        train = guess_number_dataset(args.num_train_prompts, "train", seed=args.seed)
        evals = (
            guess_number_dataset(args.num_eval_prompts, "eval") if args.num_eval_prompts else None
        )
        return train, evals
    try:
        from .tasks import TASKS as BUILTIN_TASKS
        from .tasks import build_task
    except ImportError:
        BUILTIN_TASKS, build_task = TASKS, None
    if build_task is not None and args.task in BUILTIN_TASKS:
        train = build_task(
            args.task, args.num_train_prompts, "train", seed=args.seed, few_shot=args.few_shot
        )
        evals = (
            build_task(args.task, args.num_eval_prompts, "eval", seed=0, few_shot=args.few_shot)
            if args.num_eval_prompts
            else None
        )
        return train, evals
    raise ConfigError(
        f"task={args.task!r} is neither a built-in task {sorted(BUILTIN_TASKS)} nor a data file "
        "(.jsonl, .json, .csv, .parquet, or a saved datasets folder)"
    )


def apply_long_prompt_policy(rows: list[dict] | None, tokenizer, args: GRPOConfig):
    """Skip (and count) or reject prompts over max_prompt_length; 'truncate' keeps them (the
    trainer keeps their last max_prompt_length tokens) and reports how many are cut."""
    if rows is None or args.max_prompt_length is None:
        return rows
    if args.long_prompts == "truncate":
        long = count_long_prompts(rows, tokenizer, args.max_prompt_length)
        if long:
            print(
                f"[groupwise] warning: {long} of {len(rows)} prompts are longer than "
                f"max_prompt_length={args.max_prompt_length} tokens and lose their first tokens "
                "(raise max_prompt_length, or set long_prompts: skip or error)"
            )
        return rows
    try:
        kept, skipped = filter_long_prompts(
            rows, tokenizer, args.max_prompt_length, args.long_prompts
        )
    except ValueError as err:
        raise DataError(
            f"long_prompts=error: {err}; raise max_prompt_length, or set long_prompts: skip "
            "(drop them) or truncate (keep their last max_prompt_length tokens)"
        ) from err
    if skipped:
        print(f"[groupwise] skipped {skipped} prompts longer than {args.max_prompt_length} tokens")
    if not kept:
        raise DataError(
            f"every prompt is longer than max_prompt_length={args.max_prompt_length} tokens, so "
            "long_prompts=skip left none; raise max_prompt_length"
        )
    return kept


def check_reward_columns(rows: list[dict], reward_names: list[str], where: str) -> None:
    """Refuse, before any model loads, a built-in reward whose dataset column no row has."""
    for name in reward_names:
        column = REWARD_COLUMNS.get(name)
        if column is not None and not any(column in row for row in rows):
            columns = sorted({key for row in rows for key in row})
            raise DataError(
                f"{where}: reward {name!r} reads the column {column!r}, which no row has "
                f"(columns: {columns}); name the ground-truth column with answer_column, or "
                "choose other reward_funcs"
            )


def _config_from_argv(argv: list[str], base: dict[str, Any] | None = None) -> GRPOConfig:
    config_path = None
    if argv and not argv[0].startswith("--"):
        config_path, argv = argv[0], argv[1:]
    overrides = parse_cli_overrides(argv)
    if "resume" in overrides:  # --resume [PATH]: the newest checkpoint in output_dir, or PATH
        value = overrides.pop("resume")
        overrides["resume_from_checkpoint"] = "auto" if value == "true" else value
    if config_path is not None:
        values = dict(base or {})
        return GRPOConfig.from_yaml(config_path, {**values, **overrides})
    return GRPOConfig.from_dict({**(base or {}), **overrides}, source="command line")


def run_train(args: GRPOConfig) -> dict[str, float]:
    if args.algorithm == "ppo":
        from .ppo import PPOTrainer as GRPOTrainer
    else:
        from .trainer import GRPOTrainer

    # Everything checkable without the model is checked first (a model can take minutes).
    # Without an output_dir the trainer names a new folder (the same on every rank).
    if args.output_dir is not None:
        check_output_dir(args.output_dir, args.resume_from_checkpoint, args.overwrite_output_dir)
    train, evals = build_datasets(args)
    trainer = GRPOTrainer(
        args.model, default_reward_names(args), train, args=args, eval_dataset=evals
    )
    trainer.train_dataset = apply_long_prompt_policy(train, trainer.tokenizer, args)
    trainer.eval_dataset = apply_long_prompt_policy(evals, trainer.tokenizer, args)
    history = trainer.train()
    print(f"[groupwise] metrics: {Path(args.output_dir) / 'metrics.jsonl'}")
    print(f"[groupwise] model:   {Path(args.output_dir)} (AutoModelForCausalLM.from_pretrained)")
    return history[-1] if history else {}


def run_demo(args: GRPOConfig) -> tuple[float, float]:
    """Held-out greedy accuracy, GRPO training, held-out greedy accuracy again."""
    from .trainer import GRPOTrainer

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

    def report(when: str, result: dict[str, float]) -> None:
        print(
            f"[groupwise] {when}: held-out greedy accuracy {result.get(acc, 0):.1%} "
            f"(format {result.get(fmt, 0):.1%}) on {len(evals)} problems"
        )

    before = trainer.evaluate()
    trainer._log({"step": 0, **before})
    report("before training", before)
    trainer.train()
    after = trainer.evaluate()
    trainer._log({"step": trainer.global_step, **after})
    report(f"after {trainer.global_step} GRPO steps", after)
    minutes = (time.perf_counter() - start) / 60
    print(
        f"[groupwise] accuracy {before.get(acc, 0):.1%} -> {after.get(acc, 0):.1%} "
        f"in {minutes:.1f} min"
    )
    print(f"[groupwise] metrics: {Path(args.output_dir) / 'metrics.jsonl'}")
    print(f"[groupwise] model:   {Path(args.output_dir)} (AutoModelForCausalLM.from_pretrained)")
    return before.get(acc, 0.0), after.get(acc, 0.0)


def run_eval(args: GRPOConfig) -> dict:
    """Evaluate ``args.model`` (and ``args.compare_model``) on the task's held-out prompts."""
    from .build import build_interaction, resolve_device, with_interaction
    from .evaluation import (
        EvalConfig,
        compare,
        evaluate_model,
        format_comparison,
        format_table,
        save_json,
    )
    from .models import load_model_and_tokenizer
    from .precision import resolve_precision
    from .rollout import HFEngine, SamplingParams

    if args.output_dir is None and not args.eval_output:
        args.output_dir = default_output_dir(args.model, args.task)
    output = Path(args.eval_output or Path(args.output_dir) / "eval.json")
    if output.is_dir():
        raise ConfigError(
            f"eval_output={str(output)!r} is a folder; give the JSON file to write, e.g. "
            f"{output / 'eval.json'}"
        )
    train, evals = build_datasets(args)
    rows = evals if evals else train
    config = EvalConfig(
        n=args.eval_num_generations,
        greedy=True,
        ks=args.eval_ks if args.eval_num_generations else None,
        temperature=args.temperature if args.eval_num_generations else 1.0,
        top_p=args.top_p,
        top_k=args.top_k,
        max_completion_length=args.max_completion_length,
        max_prompt_length=args.max_prompt_length,
        seed=args.seed,
    )
    device = resolve_device(args.device)
    # Evaluation samples in the training numerics: bf16 autocast on a bf16 GPU, fp32 on CPU.
    precision = resolve_precision(
        args.dtype, args.bf16_autocast, args.generation_dtype, device, use_peft=args.use_peft
    )
    funcs = [build_reward_func(name, args) for name in default_reward_names(args)]

    interaction = build_interaction(args)  # tools / environment: multi-turn, as in training

    def run(model_name: str):
        model, tokenizer = load_model_and_tokenizer(
            model_name, seed=args.seed, dtype=precision.weights, device=device
        )
        model.to(device=device, dtype=precision.weights)

        def numerics():
            return precision.generation_context(device)

        engine = HFEngine(model, tokenizer, SamplingParams(), numerics=numerics)
        engine = with_interaction(engine, args, interaction)
        result = evaluate_model(engine, tokenizer, rows, funcs, config)
        print(f"[groupwise] {model_name} on {len(rows)} prompts")
        print(format_table(result.summary))
        return result

    result = run(args.model)
    report: dict = {"model": args.model, **result.to_dict()}
    if args.compare_model:
        other = run(args.compare_model)
        diff = compare(result.per_prompt, other.per_prompt, config.ks)
        print(f"[groupwise] {args.compare_model} minus {args.model} (paired bootstrap 95% CI)")
        print(format_comparison(diff))
        report = {
            "a": report,
            "b": {"model": args.compare_model, **other.to_dict()},
            "comparison": diff,
        }
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        save_json(report, output)
    except OSError as err:
        raise OutputDirError(
            f"eval_output={str(output)!r} cannot be written ({err.strerror}); choose another "
            "eval_output or output_dir"
        ) from err
    print(f"[groupwise] results: {output}")
    return report


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE)
        return 0
    command, rest = argv[0], argv[1:]
    if command == "memory":
        from .memory import main as memory_main

        return memory_main(rest)
    if command == "report":
        from .report import main as report_main

        return report_main(rest)
    if any(a in ("-h", "--help") for a in rest):
        print(USAGE)
        print("options (GRPOConfig fields, default in brackets):")
        meanings = option_help()
        for name, value in GRPOConfig().to_dict().items():
            print(f"  --{name} [{value}]  {meanings[name]}".rstrip())
        return 0
    debug = "--debug" in rest or os.environ.get("GROUPWISE_DEBUG", "") not in ("", "0")
    rest = [a for a in rest if a != "--debug"]
    if command not in ("train", "eval", "demo"):
        print(f"groupwise: unknown command {command!r}\n\n{USAGE}", file=sys.stderr)
        return 2
    try:
        with cli_style():  # errors name options as flags: --name value
            _run_command(command, rest)
    except USER_ERRORS as err:
        if debug:
            raise
        print(f"groupwise: error: {err}", file=sys.stderr)
        return 1 if isinstance(err, RewardFunctionError) else 2
    except TrainingInterrupted as err:
        print(f"groupwise: {err}", file=sys.stderr)
        return 128 + err.signum
    except TrainingStopped as err:
        print(f"groupwise: stopped: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # a second Ctrl-C, or one during start-up: the shell's 130
        if debug:
            raise
        print("groupwise: interrupted (nothing saved)", file=sys.stderr)
        return 130
    return 0


def _run_command(command: str, rest: list[str]) -> None:
    if command == "train":
        run_train(_config_from_argv(rest))
    elif command == "eval":
        run_eval(_config_from_argv(rest))
    else:
        run_demo(_config_from_argv(rest, base=DEMO_CONFIG))
