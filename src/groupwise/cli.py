"""Command line: ``groupwise train [CONFIG.yaml] [--field value ...]`` and ``groupwise demo``."""

from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path
from typing import Any

from .config import (
    ConfigError,
    GRPOConfig,
    default_output_dir,
    option_help,
    parse_cli_overrides,
    unused_dir,
)
from .errors import DataError, OutputDirError, UserError, cli_style, first_line

# Only light modules are imported here: torch and transformers take seconds to import, and
# `groupwise --help` or a mistyped option needs neither. Each command imports what it uses.


def _is_user_error(err: BaseException) -> bool:
    """Errors in what the user gave: printed as one paragraph, without a traceback (a bug keeps
    its traceback). A reward function's failure is the user's code, reported the same way; its
    class is looked up only if its module was imported (otherwise it cannot have been raised)."""
    if isinstance(err, UserError):
        return True
    combine = sys.modules.get(f"{__package__}.rewards.combine")
    return combine is not None and isinstance(err, combine.RewardFunctionError)


USAGE = """usage: groupwise <command> [CONFIG.yaml] [--option value ...]

commands:
  train   run GRPO; options come from CONFIG.yaml and/or --option value (any GRPOConfig field)
  eval    evaluate --model (a path, checkpoint or built-in) on the task's held-out prompts:
          greedy accuracy, and with --eval_num_generations N unbiased pass@k / mean@k, overall
          and per difficulty; --compare_model M adds the paired difference with a 95% CI.
          groupwise eval RUN: the run's model with its task and generation settings
          (RUN/config.yaml); results in RUN/eval.json
  chat    groupwise chat RUN [--prompt TEXT ...]: the trained model's answers to your prompts
          (or to 3 held-out prompts of the run's task), with the run's generation settings
  demo    fine-tune SmolLM2-135M-Instruct on arithmetic on the CPU, with held-out greedy
          accuracy before and after (--option value overrides the demo's settings)
  memory  plan the memory of a run, PPO vs GRPO side by side (groupwise memory --help);
          --measure runs one real step of each and prints predicted vs measured
  report  groupwise report RUN_DIR [RUN_DIR ...]: one run: RUN_DIR/report.html (held-out
          accuracy before -> after, curves, warnings, changed options, example completions);
          several: one page comparing them (compare-A-vs-B.html here, or --output FILE)

TRL's names work too: --model_name_or_path, --dataset_name (a data file, a saved datasets
folder, or a hub id), --config FILE.

train options worth knowing: --resume (continue from the newest checkpoint in output_dir; with
--output_dir RUN alone it takes the run's own options from RUN/config.yaml),
--overwrite_output_dir (start over in a folder that holds an earlier run), --debug (tracebacks),
--algorithm ppo (the actor-critic baseline), --use_peft true (LoRA), --report_to tensorboard

precision (docs/gpu.md): on a bf16 GPU the default is fp32 weights and AdamW state with
bf16 autocast for forward, backward and generation (--bf16_autocast auto; TRL's --bf16 true means
the same); on CPU, fp32 throughout. --dtype bfloat16 stores the trained weights in bf16 with no
fp32 master copy: less memory, but updates below ~1/512 of a weight are lost (it warns).
--generation_dtype bfloat16 generates in bf16 while an fp32 update corrects for the difference.
--tf32 (CUDA, default on), --attn_implementation sdpa|eager|flash_attention_2.

e.g. groupwise train --model tiny-random --task arithmetic --max_steps 5 --output_dir runs/x
"""

# The demo's settings: measured to raise held-out greedy accuracy well within 15 minutes on a
# 2-core CPU (docs/quickstart.md has the numbers).
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


def _file_rows(
    path: Any, args: GRPOConfig, option: str = "task", split: str | None = None
) -> list[dict]:
    from .data import load_dataset_rows

    try:
        rows, report = load_dataset_rows(
            path,
            split=split,
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
    from .data import arithmetic_dataset

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
    from .build import GUESS_TASK, default_reward_names
    from .tasks import TASKS, build_task

    if _is_data_file(args.task):
        if not os.path.exists(args.task):
            raise ConfigError(f"task={args.task!r}: file does not exist")
        splits = _saved_splits(args.task)
        if splits is None:
            train = _file_rows(args.task, args)
            evals = None
        else:  # a saved DatasetDict: TRL's dataset_train_split / dataset_test_split defaults
            train, evals = _split_rows(args.task, splits, args)
        check_reward_columns(train, default_reward_names(args), f"task={args.task!r}")
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
    if args.task in TASKS:
        train = build_task(
            args.task, args.num_train_prompts, "train", seed=args.seed, few_shot=args.few_shot
        )
        evals = (
            build_task(args.task, args.num_eval_prompts, "eval", seed=0, few_shot=args.few_shot)
            if args.num_eval_prompts
            else None
        )
        return train, evals
    if _looks_like_hub_id(args.task):
        train, evals = _hub_rows(args)
        check_reward_columns(train, default_reward_names(args), f"task={args.task!r}")
        return train, evals
    raise ConfigError(
        f"task={args.task!r} is neither a built-in task {sorted(TASKS)} nor a data file "
        "(.jsonl, .json, .csv, .parquet, or a saved datasets folder)"
    )


# TRL's ScriptArguments defaults: dataset_train_split="train", dataset_test_split="test".
TRAIN_SPLIT, TEST_SPLIT = "train", "test"


def _saved_splits(path: str) -> list[str] | None:
    """The split names of a folder written by ``DatasetDict.save_to_disk`` (None: not one)."""
    index = Path(path) / "dataset_dict.json"
    if not index.is_file():
        return None
    import json

    try:
        splits = json.loads(index.read_text(encoding="utf-8"))["splits"]
    except (ValueError, KeyError, TypeError, OSError):
        return None  # load_dataset_rows names what is wrong with the folder
    return [str(name) for name in splits]


def _split_rows(
    source: Any, splits: list[str], args: GRPOConfig
) -> tuple[list[dict], list[dict] | None]:
    """Training rows from the ``train`` split (or the only one), held-out rows from ``test``
    when there is one and no eval_task is given, as ``trl grpo --dataset_name`` takes them."""
    if TRAIN_SPLIT in splits:
        train_split = TRAIN_SPLIT
    elif len(splits) == 1:
        train_split = splits[0]
    else:
        raise DataError(
            f"task={args.task!r} holds the splits {splits} and none is called {TRAIN_SPLIT!r}; "
            "save the training split as 'train' (and the held-out one as 'test')"
        )
    train = _file_rows(source, args, split=train_split)
    evals = None
    if TEST_SPLIT in splits and not args.eval_task and args.num_eval_prompts:
        evals = _file_rows(source, args, split=TEST_SPLIT)[: args.num_eval_prompts]
    return train, evals


def _looks_like_hub_id(name: str) -> bool:
    """``owner/name`` that is no local path: a dataset on the Hugging Face hub."""
    import re

    return not os.path.exists(name) and re.fullmatch(r"[\w.-]+/[\w.-]+", name) is not None


def _hub_offline() -> bool:
    return any(
        os.environ.get(name, "").lower() in ("1", "true", "yes", "on")
        for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")
    )


def _hub_rows(args: GRPOConfig) -> tuple[list[dict], list[dict] | None]:
    """Rows of a hub dataset (``datasets.load_dataset``), where a hub can be reached."""
    name = args.task
    local = (
        "give a local data file (.jsonl, .json, .csv, .parquet) or a folder written by "
        "datasets' save_to_disk"
    )
    if _hub_offline():
        raise DataError(
            f"task={name!r} is no local file or folder, and the Hugging Face hub is switched "
            f"off here (HF_HUB_OFFLINE / HF_DATASETS_OFFLINE); {local}"
        )
    try:
        import datasets
    except ImportError:
        raise DataError(
            f"task={name!r}: a hub dataset needs the datasets package (pip install datasets); "
            f"or {local}"
        ) from None
    try:
        loaded = datasets.load_dataset(name)
    except Exception as err:  # noqa: BLE001 - network, missing dataset, bad config: all named
        text = first_line(err)
        raise DataError(
            f"task={name!r} is no local file or folder, and loading it from the Hugging Face "
            f"hub failed ({type(err).__name__}: {text}); {local}"
        ) from err
    if hasattr(loaded, "keys"):
        return _split_rows(loaded, list(loaded.keys()), args)
    return _file_rows(loaded, args), None


def apply_long_prompt_policy(rows: list[dict] | None, tokenizer, args: GRPOConfig):
    """Skip (and count) or reject prompts over max_prompt_length; 'truncate' keeps them (the
    trainer keeps their last max_prompt_length tokens) and reports how many are cut."""
    from .data import count_long_prompts, filter_long_prompts

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
    from .build import REWARD_COLUMNS

    for name in reward_names:
        column = REWARD_COLUMNS.get(name)
        if column is not None and not any(column in row for row in rows):
            columns = sorted({key for row in rows for key in row})
            raise DataError(
                f"{where}: reward {name!r} reads the column {column!r}, which no row has "
                f"(columns: {columns}); name the ground-truth column with answer_column, or "
                "choose other reward_funcs"
            )


# TRL's command-line names for options groupwise spells differently (`trl grpo
# --model_name_or_path M --dataset_name D --config F`): accepted on the command line and in YAML.
CLI_ALIASES = {"model_name_or_path": "model", "dataset_name": "task"}


def _apply_aliases(values: dict[str, Any], where: str) -> dict[str, Any]:
    values = dict(values)
    for alias, name in CLI_ALIASES.items():
        if alias not in values:
            continue
        value = values.pop(alias)
        if name in values and values[name] != value:
            raise ConfigError(
                f"{where}: {alias} (TRL's name) and {name} are the same option and disagree "
                f"({value!r} vs {values[name]!r}); give one"
            )
        values[name] = value
    return values


def _yaml_with_aliases(path: str, overrides: dict[str, Any]) -> GRPOConfig:
    """``GRPOConfig.from_yaml``, with TRL's script names (model_name_or_path, dataset_name) in
    the file read as groupwise's."""
    import yaml

    try:
        with open(path, encoding="utf-8") as handle:
            raw = yaml.safe_load(handle)
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        raw = None  # from_yaml reports it
    if isinstance(raw, dict) and any(alias in raw for alias in CLI_ALIASES):
        values = {**_apply_aliases(raw, str(path)), **overrides}
        return GRPOConfig.from_dict(values, source=str(path))
    return GRPOConfig.from_yaml(path, overrides)


def _run_config(overrides: dict[str, Any]) -> str | None:
    """``--resume`` without a config file: the config.yaml the run wrote into its output_dir
    (or, for ``--resume RUN/checkpoint-N``, into the checkpoint's run folder), so that the
    resumed run has the run's own options; None when there is none."""
    resume = overrides.get("resume_from_checkpoint")
    folder = overrides.get("output_dir")
    if folder is None and resume not in (None, "auto"):
        folder = str(Path(resume).parent)
    if folder is None:
        return None
    path = Path(folder) / "config.yaml"
    if not path.is_file():
        return None
    # The folder as found now (config.yaml holds it as given then, maybe from another cwd).
    overrides.setdefault("output_dir", folder)
    return str(path)


def _config_from_argv(argv: list[str], base: dict[str, Any] | None = None) -> GRPOConfig:
    config_path = None
    if argv and not argv[0].startswith("--"):
        config_path, argv = argv[0], argv[1:]
    overrides = _apply_aliases(parse_cli_overrides(argv), "command line")
    if "config" in overrides:  # TRL's --config FILE
        if config_path is not None:
            raise ConfigError(
                f"two config files: {config_path} and --config {overrides['config']}; give one"
            )
        config_path = overrides.pop("config")
    if "resume" in overrides:  # --resume [PATH]: the newest checkpoint in output_dir, or PATH
        value = overrides.pop("resume")
        overrides["resume_from_checkpoint"] = "auto" if value == "true" else value
    if config_path is None and base is None and overrides.get("resume_from_checkpoint"):
        config_path = _run_config(overrides)
        if config_path is not None:
            given = sorted(set(overrides) - {"resume_from_checkpoint", "output_dir"})
            more = f", with {', '.join('--' + n for n in given)} on top" if given else ""
            print(f"[groupwise] resuming with the run's own options from {config_path}{more}")
    if config_path is not None and os.path.isdir(config_path):
        raise ConfigError(
            f"{config_path} is a folder, not a YAML config; to continue the run there: "
            f"groupwise train --output_dir {config_path} --resume (its options are read from "
            f"{Path(config_path) / 'config.yaml'})"
        )
    if config_path is not None:
        values = dict(base or {})
        return _yaml_with_aliases(config_path, {**values, **overrides})
    return GRPOConfig.from_dict({**(base or {}), **overrides}, source="command line")


def run_train(args: GRPOConfig) -> dict[str, float]:
    from .build import default_reward_names
    from .checkpoint import check_output_dir
    from .ppo import PPOTrainer
    from .trainer import GRPOTrainer

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
    from .build import default_reward_names
    from .checkpoint import check_output_dir
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


def run_eval(args: GRPOConfig) -> dict:
    """Evaluate ``args.model`` (and ``args.compare_model``) on the task's held-out prompts."""
    from .build import (
        build_interaction,
        build_reward_func,
        default_reward_names,
        resolve_device,
        with_interaction,
    )
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
        print(format_table(result.summary, task=args.task))
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
        for name, value in _defaults().items():
            print(f"  --{name} [{value}]  {meanings[name]}".rstrip())
        return 0
    debug = "--debug" in rest or os.environ.get("GROUPWISE_DEBUG", "") not in ("", "0")
    rest = [a for a in rest if a != "--debug"]
    if command not in ("train", "eval", "demo", "chat"):
        print(f"groupwise: unknown command {command!r}\n\n{USAGE}", file=sys.stderr)
        return 2
    watch = _StartupInterrupt()
    try:
        with cli_style(), watch:  # errors name options as flags: --name value
            _run_command(command, rest, watch)
    except Exception as err:
        if debug and _is_user_error(err):
            raise
        code = _exit_code(err)
        if watch.seen and code is None and not debug:  # a half-finished import after Ctrl-C
            code = 130
            print("groupwise: interrupted (nothing saved)", file=sys.stderr)
        if code is None:
            raise
        return code
    except KeyboardInterrupt:  # a second Ctrl-C, or one during start-up: the shell's 130
        if debug:
            raise
        print("groupwise: interrupted (nothing saved)", file=sys.stderr)
        return 130
    return 0


def _defaults() -> dict[str, Any]:
    """Every option's default, read from the dataclass fields: building a GRPOConfig validates
    it against registries that import torch, which help does not need."""
    import dataclasses

    values = {}
    for field in dataclasses.fields(GRPOConfig):
        if field.default is not dataclasses.MISSING:
            values[field.name] = field.default
        elif field.default_factory is not dataclasses.MISSING:
            values[field.name] = field.default_factory()
    return values


def _exit_code(err: Exception) -> int | None:
    """Print ``err`` as the command line reports it and return the exit status; None for a bug
    (it keeps its traceback)."""
    if _is_user_error(err):
        print(f"groupwise: error: {err}", file=sys.stderr)
        return 2 if isinstance(err, UserError) else 1  # 1: a reward function failed
    checkpoint = sys.modules.get(f"{__package__}.checkpoint")
    if checkpoint is not None and isinstance(err, checkpoint.TrainingInterrupted):
        print(f"groupwise: {err}", file=sys.stderr)
        return 128 + err.signum
    if checkpoint is not None and isinstance(err, checkpoint.TrainingStopped):
        print(f"groupwise: stopped: {err}", file=sys.stderr)
        return 1
    return None


MODEL_FILES = ("config.json", "adapter_config.json")


def _folder_config(folder: str, rest: list[str], command: str) -> GRPOConfig:
    """``groupwise eval RUN`` / ``chat RUN``: the model in a run folder (or a checkpoint, or any
    model folder), with the run's own task and generation settings from its config.yaml (the
    run folder's, also for one of its checkpoints), the options in ``rest`` on top. eval
    writes its results into that folder."""
    from .checkpoint import latest_checkpoint

    path = Path(folder)
    model = path
    if not any((path / name).is_file() for name in MODEL_FILES):
        model = latest_checkpoint(path)  # a run stopped before its final save
        if model is None:
            raise ConfigError(
                f"{folder}: holds no model ({' or '.join(MODEL_FILES)}) and no checkpoint-<step> "
                f"folder; give a run folder, a checkpoint or a model folder, e.g. groupwise "
                f"{command} runs/demo"
            )
    run_config = next(
        (c for c in (path / "config.yaml", path.parent / "config.yaml") if c.is_file()), None
    )
    overrides = _apply_aliases(parse_cli_overrides(rest), "command line")
    values: dict[str, Any] = {"model": str(model)}
    if command == "eval":
        values["eval_output"] = str(model / "eval.json")  # next to the model it describes
    values["resume_from_checkpoint"] = None
    values["overwrite_output_dir"] = False
    values.update(overrides)
    if run_config is None:
        print(f"[groupwise] {model}: no config.yaml of a run next to it; default settings")
        return GRPOConfig.from_dict(values, source="command line")
    args = _yaml_with_aliases(str(run_config), values)
    print(
        f"[groupwise] {model} with the run's task and generation settings from {run_config} "
        f"(task {args.task}, max_completion_length {args.max_completion_length}, temperature "
        f"{args.temperature})"
    )
    return args


def run_chat(args: GRPOConfig, prompts: list[str], count: int = 3) -> list[dict[str, Any]]:
    """Print ``args.model``'s answers to ``prompts`` (or to ``count`` held-out prompts of the
    task), sampled with the run's generation settings; returns them."""
    from .build import build_interaction, resolve_device, sampling_params, with_interaction
    from .data import tokenize_prompts
    from .evaluation import prompt_render
    from .models import load_model_and_tokenizer
    from .precision import resolve_precision
    from .rollout import HFEngine, SamplingParams

    if prompts:
        rows: list[dict] = [{"prompt": [{"role": "user", "content": text}]} for text in prompts]
    else:
        train, evals = build_datasets(args)
        rows = list((evals or train)[:count])
    device = resolve_device(args.device)
    precision = resolve_precision(
        args.dtype, args.bf16_autocast, args.generation_dtype, device, use_peft=args.use_peft
    )
    model, tokenizer = load_model_and_tokenizer(
        args.model, seed=args.seed, dtype=precision.weights, device=device
    )
    model.to(device=device, dtype=precision.weights)
    engine = HFEngine(model, tokenizer, SamplingParams(),
                      numerics=lambda: precision.generation_context(device))  # fmt: skip
    engine = with_interaction(engine, args, build_interaction(args))
    ids = tokenize_prompts(
        [row["prompt"] for row in rows], tokenizer, args.max_prompt_length, prompt_render(engine)
    )
    params = sampling_params(args, greedy=args.temperature <= 0)
    rollout = engine.generate(ids, 1, params, rows=rows)
    answers = []
    for row, text in zip(rows, rollout.texts, strict=True):
        prompt = row["prompt"]
        shown = prompt[-1]["content"] if isinstance(prompt, list) and prompt else prompt
        print(f"\n>>> {shown}\n{text.strip()}")
        if row.get("answer") is not None:
            print(f"(expected answer: {row['answer']})")
        answers.append({"prompt": shown, "completion": text, "answer": row.get("answer")})
    return answers


def _pop_prompts(rest: list[str]) -> tuple[list[str], list[str]]:
    """``--prompt TEXT`` may be given several times (each is one prompt)."""
    prompts, kept, i = [], [], 0
    while i < len(rest):
        if rest[i] == "--prompt" and i + 1 < len(rest):
            prompts.append(rest[i + 1])
            i += 2
        elif rest[i].startswith("--prompt="):
            prompts.append(rest[i].split("=", 1)[1])
            i += 1
        else:
            kept.append(rest[i])
            i += 1
    return prompts, kept


class _StartupInterrupt:
    """Ctrl-C while torch and transformers are imported: some library code there catches every
    exception (a bare ``except``) and would swallow the KeyboardInterrupt, so the run would go
    on. The handler also records it, and :meth:`check` raises it again once imports are done.
    The trainer installs its own handler (finish the step, save, stop) for the run itself."""

    def __init__(self) -> None:
        self.seen = False
        self.previous: Any = None

    def __enter__(self) -> _StartupInterrupt:
        import signal
        import threading

        if threading.current_thread() is threading.main_thread():
            self.previous = signal.signal(signal.SIGINT, self._handler)
        return self

    def __exit__(self, *exc: object) -> None:
        import signal

        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)

    def _handler(self, signum: int, frame: Any) -> None:
        self.seen = True
        raise KeyboardInterrupt

    def check(self) -> None:
        if self.seen:
            raise KeyboardInterrupt


def _run_command(command: str, rest: list[str], watch: _StartupInterrupt | None = None) -> None:
    import importlib

    prompts: list[str] = []
    if command == "chat":
        prompts, rest = _pop_prompts(rest)
    folder = rest[0] if rest and not rest[0].startswith("--") else None
    if command in ("eval", "chat") and folder is not None and os.path.isdir(folder):
        args = _folder_config(rest[0], rest[1:], command)
    elif command == "chat":
        raise ConfigError(
            "chat: give a run or model folder first, e.g. groupwise chat runs/demo "
            '--prompt "What is 7 * 3?"'
        )
    else:
        args = _config_from_argv(rest, base=DEMO_CONFIG if command == "demo" else None)
    # What every command imports anyway (seconds), then a Ctrl-C during it is honoured.
    importlib.import_module(".ppo" if args.algorithm == "ppo" else ".trainer", __package__)
    if watch is not None:
        watch.check()
    if not sys.stderr.isatty():  # a log file: transformers' bars would fill it with \r updates
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    if command == "train":
        run_train(args)
    elif command == "eval":
        run_eval(args)
    elif command == "chat":
        run_chat(args, prompts)
    else:
        run_demo(args)
