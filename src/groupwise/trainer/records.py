"""The run's records: the rows it logged and the files that keep them in ``output_dir``.

``metrics.jsonl`` (one row per logged step or evaluation), ``events.jsonl`` (warnings and notes,
read by ``groupwise report``), ``completions.jsonl`` (a sample of the last step's completions),
the TensorBoard / wandb loggers, and the facts ``run.json`` records. Under data parallel every
rank keeps the rows; only rank 0 writes.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from ..config.grpo_config import GRPOConfig
from ..curriculum import Plan
from ..errors import OutputDirError, option
from ..files import atomic_write_text, fsync_dir
from ..report.record import changed_defaults
from ..rewards.scoring import Scores
from ..rollout import Rollout
from ..runtime.distributed import DistributedContext, all_gather_objects, barrier
from ..runtime.precision import Precision
from .checkpoints import PREFIX, checkpoint_dirs
from .console import completion_text, print_completions_sample
from .loggers import RunLoggers

# Files of one run that a new run in the same output_dir must not append to.
RUN_LOGS = ("events.jsonl", "completions.jsonl")


class RunRecords:
    """``history``: every logged row (``Trainer.log_history``); ``summaries``: each ``train()``
    call's end-of-training row with the length of ``history`` then (for ``state.log_history``;
    not in metrics.jsonl, which holds one row per logged step). ``reward_names`` and
    ``answer_column`` label the completion records."""

    def __init__(
        self,
        output_dir: Path,
        dist: DistributedContext,
        reward_names: Sequence[str],
        answer_column: str,
        keep_samples: bool = False,
    ) -> None:
        self.output_dir, self.dist = output_dir, dist
        # log_completions: keep_batch also keeps the batch's rows in last_samples
        self.keep_samples = keep_samples
        self.reward_names, self.answer_column = list(reward_names), answer_column
        self.history: list[dict[str, float]] = []
        self.summaries: list[tuple[int, dict[str, float]]] = []
        # Whether metrics.jsonl belongs to this trainer yet: set by its first row on rank 0, or
        # by a resume. Until then an earlier run's files are still there.
        self.started = False
        self.loggers: RunLoggers | None = None  # TensorBoard / wandb, open while train() runs
        # The last step's batch: (rows, texts, rewards, per-function rewards, advantages,
        # group ids, the reward functions' log_extra columns).
        self.last_batch: tuple | None = None
        # log_completions: the last batch's (prompt, completion, reward) rows
        self.last_samples: list[dict[str, Any]] = []

    # -- metrics.jsonl and the loggers ----------------------------------------------------------
    def write(self, logs: dict[str, float], step: int) -> None:
        """Append a row (already in ``history``) to metrics.jsonl and the loggers."""
        if not self.dist.is_main:  # under data parallel only rank 0 writes
            return
        self.output_dir.mkdir(parents=True, exist_ok=True)
        path = self.output_dir / "metrics.jsonl"
        if not self.started:
            # A new trainer is a new run: keep an earlier run's metrics under another name
            # instead of mixing the two or overwriting them.
            if path.exists():
                stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(path.stat().st_mtime))
                os.replace(path, path.with_name(f"metrics-{stamp}.jsonl"))
            for name in RUN_LOGS:
                if (self.output_dir / name).exists():
                    (self.output_dir / name).unlink()
            self.started = True
        with open(path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(logs) + "\n")
        if self.loggers is not None:
            self.loggers.log(logs, step=step)

    def open_loggers(self, args: GRPOConfig, step: int) -> None:
        """The ``report_to`` loggers, continuing at ``step`` when a run resumes (rank 0)."""
        self.loggers = RunLoggers(
            self.output_dir,
            args.report_to,
            config=args.to_dict(),
            run_name=args.run_name,  # TrainingArguments' (None: W&B names it)
            resume=step > 0,
            resume_step=step,
        )

    def close_loggers(self) -> None:
        if self.loggers is not None:
            self.loggers.close()
            self.loggers = None

    def rewind(self, step: int, history: list[dict[str, float]]) -> None:
        """A resumed checkpoint's rows: rows that the interrupted run logged after it would be
        logged again, so metrics.jsonl is rewritten and the other logs cut back to ``step``."""
        self.history = history
        if self.dist.is_main:
            self.output_dir.mkdir(parents=True, exist_ok=True)
            write_jsonl_atomic(self.output_dir / "metrics.jsonl", self.history)
            for name in RUN_LOGS:
                truncate_jsonl(self.output_dir / name, step)
        barrier(self.dist)
        self.started = True

    def clear_earlier_run(self) -> None:
        """overwrite_output_dir: remove all of the earlier run (not only its checkpoints, so no
        report or evaluation of another model stays behind) and say what went."""
        removed = clear_earlier_run(self.output_dir)
        if removed:
            more = f" and {len(removed) - 12} more" if len(removed) > 12 else ""
            tqdm.write(
                f"[groupwise] overwrite_output_dir: removed the earlier run from "
                f"{self.output_dir}: {', '.join(removed[:12])}{more}"
            )

    # -- events.jsonl -----------------------------------------------------------------------------
    def append_jsonl(self, name: str, record: dict[str, Any]) -> None:
        if not self.dist.is_main:
            return
        self.output_dir.mkdir(parents=True, exist_ok=True)
        with open(self.output_dir / name, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(record, default=str) + "\n")

    def warn(self, step: int, kind: str, message: str) -> None:
        """A warning or note: console, events.jsonl (read by ``groupwise report``), loggers."""
        if not self.dist.is_main:
            return
        tqdm.write(
            f"[groupwise] {'note' if kind == 'info' else 'warning'} (step {step}): {message}"
        )
        self.append_jsonl("events.jsonl", {"step": step, "kind": kind, "message": message})
        if self.loggers is not None:
            self.loggers.log_warning(step, kind, message)

    # -- completions.jsonl ------------------------------------------------------------------------
    def keep_batch(
        self,
        rows: list[dict[str, Any]],
        rollout: Rollout,
        scores: Scores,
        advantages: torch.Tensor,
        plan: Plan | None = None,
    ) -> None:
        """The last step's batch, for completions.jsonl (one advantage per completion: with a
        curriculum, its weighted advantage); with ``keep_samples`` (log_completions) also its
        rows in ``last_samples``."""
        group_ids = rollout.group_ids.cpu()
        weights = plan.row_weights(rollout) if plan is not None else None
        advantages = advantages.cpu() if weights is None else advantages.cpu() * weights
        self.last_batch = (rows, rollout.texts, scores.rewards, scores.per_func, advantages,
                           group_ids, scores.extra)  # fmt: skip
        if self.keep_samples:
            self.last_samples = [
                {"prompt": rows[g]["prompt"], "completion": text, "reward": float(r)}
                for g, text, r in zip(
                    group_ids.tolist(), rollout.texts, scores.rewards.tolist(), strict=True
                )
            ]

    def completion_records(self, step: int, num_prompts: int | None = None) -> list[dict[str, Any]]:
        """The last batch's first ``num_prompts`` prompts with all their completions, each with
        its reward, reward components and advantage, and the ground truth."""
        if not self.last_batch:
            return []
        rows, texts, rewards, per_func, advantages, group_ids, extra = self.last_batch
        records: dict[int, dict[str, Any]] = {}
        limit = len(rows) if num_prompts is None else num_prompts
        for i, g in enumerate(group_ids.tolist()):
            if g >= limit:
                continue
            if g not in records:
                row = rows[g]
                answer = row.get(self.answer_column, row.get("answer"))
                records[g] = {
                    "step": step,
                    "prompt": row["prompt"],
                    "answer": answer if isinstance(answer, (str, int, float, list, dict)) else None,
                    "completions": [],
                }
            records[g]["completions"].append(
                {
                    "text": texts[i],
                    "reward": _finite_or_none(rewards[i]),
                    "rewards": {
                        name: _finite_or_none(per_func[i, j])
                        for j, name in enumerate(self.reward_names)
                    },
                    "advantage": float(advantages[i]),
                    # columns the reward functions logged with log_extra
                    **({"extra": {k: v[i] for k, v in extra.items()}} if extra else {}),
                }
            )
        return [records[g] for g in sorted(records)]

    def completions_table(self) -> dict[str, list[Any]]:
        """TRL's completions table of the last batch, every rank's rows in rank order: columns
        ``prompt``, ``completion``, one per reward function (its reward, NaN for None), the
        reward functions' ``log_extra`` columns, and ``advantage``. Under data parallel a
        collective: every rank calls it."""
        table: dict[str, list[Any]] = {"prompt": [], "completion": []}
        table.update({name: [] for name in self.reward_names})
        if self.last_batch:
            rows, texts, _, per_func, advantages, group_ids, extra = self.last_batch
            table["prompt"] = [rows[g]["prompt"] for g in group_ids.tolist()]
            table["completion"] = list(texts)
            for j, name in enumerate(self.reward_names):
                table[name] = [float(v) for v in per_func[:, j].tolist()]
            for column, values in (extra or {}).items():
                table.setdefault(column, list(values))  # a reward's name wins over an extra's
            table["advantage"] = [float(a) for a in advantages.tolist()]
        else:
            table["advantage"] = []
        merged: dict[str, list[Any]] = {}
        for part in all_gather_objects(table, self.dist):
            for column, values in part.items():
                merged.setdefault(column, []).extend(values)
        return merged

    def log_completions(self, step: int, sample_size: int | None, to_print: int | None) -> None:
        """Append the last batch's first ``sample_size`` prompts to completions.jsonl. With
        ``log_completions`` (TRL's), print TRL's table of the step's completions
        (``to_print`` rows drawn at random, None: all) and send it to the ``report_to``
        loggers as "completions"; without, print the first ``to_print`` prompts' tables.
        Every rank calls it (the table gathers every rank's rows); rank 0 writes."""
        table = self.completions_table() if self.keep_samples else None
        if not self.dist.is_main:
            return
        records = self.completion_records(step, sample_size)
        for record in records:
            self.append_jsonl("completions.jsonl", record)
        if table is None:
            if to_print:
                print_completions(records[:to_print])
            return
        rewards = {name: table[name] for name in self.reward_names}
        fixed = {"prompt", "completion", "advantage", *self.reward_names}
        extra = {column: values for column, values in table.items() if column not in fixed}
        print_completions_sample(table["prompt"], table["completion"], rewards,
                                 table["advantage"], step, to_print, extra=extra,
                                 seed=step)  # fmt: skip
        if self.loggers is not None:
            columns, rows = tracker_table(step, table, self.reward_names, list(extra))
            self.loggers.log_table("completions", columns, rows, step)


def run_description(
    args: GRPOConfig,
    device: torch.device,
    world_size: int,
    dtype: torch.dtype,
    precision: Precision,
) -> dict[str, Any]:
    """What ``run.json`` records besides dates (``groupwise report`` shows it)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        release = version("groupwise")
    except PackageNotFoundError:  # a source checkout that was never installed
        release = "unknown"
    return {
        "groupwise_version": release,
        "device": str(device),
        "world_size": world_size,
        "dtype": str(dtype).removeprefix("torch."),
        "precision": precision.name,
        "defaults": changed_defaults(GRPOConfig().to_dict(), args.to_dict()),
    }


def tracker_table(
    step: int, table: dict[str, list[Any]], reward_names: Sequence[str], extra: Sequence[str]
) -> tuple[list[str], list[list[Any]]]:
    """The columns and rows TRL sends to the trackers: ``step``, ``prompt``, ``completion``,
    the rewards, the extra columns and ``advantage``; a conversation as its text, NaN as
    None (JSON has no NaN)."""
    columns = ["step", "prompt", "completion", *reward_names, *extra, "advantage"]

    def cell(column: str, value: Any) -> Any:
        if column in ("prompt", "completion") or column in extra:
            return value if isinstance(value, str) else completion_text(value).plain
        return _finite_or_none(value)

    cells = columns[1:]
    rows = [[step, *(cell(c, table[c][i]) for c in cells)] for i in range(len(table["prompt"]))]
    return columns, rows


def _finite_or_none(value: torch.Tensor | float) -> float | None:
    value = float(value)
    return value if math.isfinite(value) else None


def write_jsonl_atomic(path: Path, rows: Sequence[dict[str, Any]]) -> None:
    atomic_write_text(path, "".join(json.dumps(row) + "\n" for row in rows))


def truncate_jsonl(path: Path, max_step: int) -> None:
    """Keep the rows of a JSONL log whose step is <= max_step (and unreadable tails go)."""
    if not path.exists():
        return
    kept = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut short by the crash
        if int(row.get("step", 0)) <= max_step:
            kept.append(row)
    write_jsonl_atomic(path, kept)


def print_completions(records: Sequence[dict[str, Any]]) -> None:
    """A rich table per prompt: each completion with its reward components and advantage."""
    from rich.console import Console
    from rich.table import Table

    screen = Console()
    for record in records:
        prompt = record["prompt"]
        if isinstance(prompt, list):
            prompt = prompt[-1].get("content", "") if prompt else ""
        table = Table(
            title=f"step {record['step']}: {prompt[-200:]!s}",
            caption=f"answer: {record.get('answer')}",
            show_lines=True,
        )
        table.add_column("completion", overflow="fold")
        names = list(record["completions"][0]["rewards"]) if record["completions"] else []
        for name in names:
            table.add_column(name.removesuffix("_reward"), justify="right")
        table.add_column("reward", justify="right")
        table.add_column("advantage", justify="right")

        def fmt(value: float | None) -> str:
            return "-" if value is None else f"{value:.2f}"

        for item in record["completions"]:
            table.add_row(
                item["text"],
                *(fmt(item["rewards"][n]) for n in names),
                fmt(item["reward"]),
                f"{item['advantage']:+.2f}",
            )
        screen.print(table)


# Files that show a folder holds a run's output (besides checkpoint-<step> folders).
RUN_FILES = (
    "config.yaml",
    "metrics.jsonl",
    "completions.jsonl",
    "model.safetensors",
    "adapter_model.safetensors",
    "pytorch_model.bin",
)


def earlier_run(output_dir: str | Path) -> list[str]:
    """The names in ``output_dir`` that an earlier run left there (empty: none)."""
    output_dir = Path(output_dir)
    if not output_dir.is_dir():
        return []
    found = [name for name in RUN_FILES if (output_dir / name).exists()]
    found += [path.name for _, path in checkpoint_dirs(output_dir)]
    # config.yaml alone: a run stopped before its first step, with nothing to keep or resume;
    # refusing it would block both a rerun and --resume.
    return [] if found == ["config.yaml"] else found


def check_output_dir(output_dir: str | Path, resume: str | None, overwrite: bool) -> None:
    """Refuse an output_dir that is not a usable folder, or that holds an earlier run when the
    run neither resumes it (``resume_from_checkpoint``) nor may overwrite it
    (``overwrite_output_dir``): nothing a user has is replaced silently."""
    path = Path(output_dir)
    if path.exists() and not path.is_dir():
        raise OutputDirError(
            f"output_dir={str(output_dir)!r} is a file, not a folder; choose another output_dir"
        )
    parent = path
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise OutputDirError(
            f"output_dir={str(output_dir)!r} cannot be created: {parent} is a file, not a "
            "folder; choose another output_dir"
        )
    if not os.access(parent, os.W_OK):
        raise OutputDirError(
            f"output_dir={str(output_dir)!r}: {parent} is not writable; choose another output_dir"
        )
    # os.access trusts permission bits; a read-only file system, a full disk or (for root) a
    # folder like /proc refuses writes anyway, so try one, before any model is loaded.
    try:
        handle, probe = tempfile.mkstemp(prefix=".groupwise-write-test-", dir=parent)
        os.close(handle)
        os.unlink(probe)
    except OSError as err:
        raise OutputDirError(
            f"output_dir={str(output_dir)!r}: cannot write in {parent} "
            f"({err.strerror or err}); choose another output_dir"
        ) from None
    found = earlier_run(path)
    if found and not resume and not overwrite:
        resume_option = option("--resume", 'resume_from_checkpoint="auto"')
        overwrite_option = option("--overwrite_output_dir true", "overwrite_output_dir=True")
        raise OutputDirError(
            f"output_dir={str(output_dir)!r} holds an earlier run ({', '.join(found[:6])}); "
            f"continue it with {resume_option}, start over in it with {overwrite_option} (its "
            "model, metrics, reports and checkpoints are removed), or choose another "
            "output_dir (without one, each run gets a new folder)"
        )


# Everything a run (and `groupwise eval` / `report` on it) writes into its output_dir, besides
# checkpoint-<step> folders: what overwrite_output_dir removes. Files a run did not write stay.
RUN_ARTEFACTS = (
    *RUN_FILES,
    "rewards.json",
    "run.json",
    "events.jsonl",
    "report.html",
    "eval.json",
    "wandb_run_id.txt",
    "config.json",
    "generation_config.json",
    "model.safetensors.index.json",
    "adapter_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
    "chat_template.json",
    "tensorboard",
    "wandb",
    "merged",
)


# Name patterns of the same: rotated metrics, sharded weights, interrupted saves.
RUN_ARTEFACT_PATTERNS = (
    "metrics-*.jsonl",
    "model-*-of-*.safetensors",
    "pytorch_model-*-of-*.bin",
    f".tmp-{PREFIX}*",
    ".save-*",
)


def clear_earlier_run(output_dir: str | Path) -> list[str]:
    """Remove every artefact of an earlier run from ``output_dir`` (its checkpoints, model,
    metrics, logs, reports, evaluation results) so that nothing left there describes another
    model; return the names removed, sorted. PEFT's model card (README.md) goes with the
    adapter it describes; files groupwise does not write are kept."""
    folder = Path(output_dir)
    if not folder.is_dir():
        return []
    targets = {folder / name for name in RUN_ARTEFACTS if (folder / name).exists()}
    for pattern in RUN_ARTEFACT_PATTERNS:
        targets.update(folder.glob(pattern))
    targets.update(path for _, path in checkpoint_dirs(folder))
    if (folder / "adapter_config.json").exists() and (folder / "README.md").is_file():
        targets.add(folder / "README.md")
    for path in targets:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
    fsync_dir(folder)
    return sorted(path.name for path in targets)
