"""The rows a command trains or evaluates on: ``--task`` as a built-in task, a data file, a
saved datasets folder or a hub dataset (TRL's ``--dataset_name``), with held-out rows where
the task has them; then the prompt-length policy and the reward columns checked before any
model loads."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from ..config.grpo_config import GRPOConfig
from ..errors import ConfigError, DataError, first_line


def _file_rows(
    path: Any, args: GRPOConfig, option: str = "task", split: str | None = None
) -> list[dict]:
    from ..data.rows import load_dataset_rows

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
    from ..tasks.arithmetic import arithmetic_dataset

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
    from ..tasks import TASKS, build_task
    from .rewards import default_reward_names
    from .rollout import GUESS_TASK

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
        from ..tools import guess_number_dataset

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
    from ..data.prompts import count_long_prompts, filter_long_prompts

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
    from .rewards import REWARD_COLUMNS

    for name in reward_names:
        column = REWARD_COLUMNS.get(name)
        if column is not None and not any(column in row for row in rows):
            columns = sorted({key for row in rows for key in row})
            raise DataError(
                f"{where}: reward {name!r} reads the column {column!r}, which no row has "
                f"(columns: {columns}); name the ground-truth column with answer_column, or "
                "choose other reward_funcs"
            )
