"""Optional metric backends (``report_to``): TensorBoard and Weights & Biases.

``metrics.jsonl`` and ``events.jsonl`` belong to the trainer; :class:`RunLoggers` only fans the
same metrics and warnings out to the backends named in ``report_to``. Each backend's package is an
optional extra, imported when it is asked for; a missing one is an error at construction, before
any training time is spent.
"""

from __future__ import annotations

import json
import math
import numbers
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

BACKENDS = ("tensorboard", "wandb")
WANDB_RUN_ID_FILE = "wandb_run_id.txt"


class MissingLoggerError(ImportError):
    """A backend in ``report_to`` whose package is not installed; the message says what to
    install."""


def _missing(backend: str, package: str) -> MissingLoggerError:
    return MissingLoggerError(
        f"report_to={backend!r} needs the {package} package, which is not installed; "
        f"install it with: pip install 'groupwise[{backend}]'"
    )


def scalars(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The plottable part of a metrics dict: finite real numbers (not bools), without ``step``
    (that is the x axis)."""
    out = {}
    for key, value in metrics.items():
        if key == "step" or isinstance(value, bool) or not isinstance(value, numbers.Real):
            continue
        value = float(value)
        if math.isfinite(value):
            out[key] = value
    return out


def markdown_table(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A Markdown table (which TensorBoard's text tab renders); a cell's ``|`` is escaped and
    its line breaks become ``<br>``, so each row stays one line."""

    def cell(value: Any) -> str:
        if isinstance(value, float):
            value = f"{value:.4g}"
        text = value if isinstance(value, str) else json.dumps(value, default=str)
        return text.replace("|", "\\|").replace("\r\n", "<br>").replace("\n", "<br>")

    lines = ["| " + " | ".join(cell(c) for c in columns) + " |"]
    lines.append("|" + "---|" * len(columns))
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def _warning_fields(warning: Any) -> tuple[int, str, str]:
    """(step, kind, message) of a ``TrainingWarning`` or of its ``{"step", "kind", "message"}``
    dict."""
    if isinstance(warning, Mapping):
        return int(warning["step"]), str(warning["kind"]), str(warning["message"])
    return int(warning.step), str(warning.kind), str(warning.message)


class TensorBoardLogger:
    """Scalars and warning texts to ``output_dir/tensorboard`` (one event file per run or
    resume; TensorBoard merges the files of a folder)."""

    def __init__(self, output_dir: Path, purge_step: int | None = None) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise _missing("tensorboard", "tensorboard") from None
        self.log_dir = output_dir / "tensorboard"
        # purge_step: events at or after it in earlier files of log_dir are hidden (resume).
        self.writer = SummaryWriter(log_dir=str(self.log_dir), purge_step=purge_step)

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        for key, value in scalars(metrics).items():
            self.writer.add_scalar(key, value, global_step=step)
        self.writer.flush()  # a step takes seconds; flushing each keeps a crash from losing data

    def log_warning(self, step: int, kind: str, message: str) -> None:
        self.writer.add_text(f"warnings/{kind}", message, global_step=step)
        self.writer.flush()

    def log_table(self, name: str, columns: list[str], rows: list[list[Any]], step: int) -> None:
        """The table as a Markdown text summary (TensorBoard has no table type)."""
        self.writer.add_text(name, markdown_table(columns, rows), global_step=step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbLogger:
    """A W&B run set up as transformers' ``WandbCallback`` sets it up: the run already open
    (``wandb.run``, e.g. the caller's own ``wandb.init(...)``), or a new one in project
    ``WANDB_PROJECT`` (default "huggingface") named ``run_name`` (None: ``WANDB_NAME`` or
    W&B's own name). wandb reads its other settings (``WANDB_MODE``, ``WANDB_ENTITY``, ...) from
    the environment; without ``WANDB_DIR`` the run's files go under ``output_dir/wandb``.

    The run id is kept in ``output_dir/wandb_run_id.txt`` so that a resumed training run
    continues the same W&B run (unless ``WANDB_RUN_ID`` names one). ``close`` finishes only a
    run this logger opened; the caller's stays open. Every row carries ``train/global_step``,
    the x axis it defines, as the HF Trainer's rows do."""

    def __init__(
        self,
        output_dir: Path,
        config: Mapping[str, Any],
        run_name: str | None = None,
        resume: bool = False,
    ) -> None:
        try:
            import wandb
        except ImportError:
            raise _missing("wandb", "wandb") from None
        self.wandb = wandb
        id_file = output_dir / WANDB_RUN_ID_FILE
        self.owned = wandb.run is None
        if self.owned:
            init: dict[str, Any] = {"project": os.getenv("WANDB_PROJECT", "huggingface")}
            if run_name:
                init["name"] = run_name
            if not os.getenv("WANDB_DIR"):  # an explicit dir would override WANDB_DIR
                init["dir"] = str(output_dir)
            if resume and id_file.exists() and not os.getenv("WANDB_RUN_ID"):
                run_id = id_file.read_text(encoding="utf-8").strip()
                if run_id:
                    init.update(id=run_id, resume="allow")
            self.run = wandb.init(**init)
        else:
            self.run = wandb.run
        self.run_id = str(self.run.id)
        id_file.write_text(self.run_id + "\n", encoding="utf-8")
        # As WandbCallback: the options also go into a run the caller opened.
        self.run.config.update(dict(config), allow_val_change=True)
        self.run.define_metric("train/global_step")
        self.run.define_metric("*", step_metric="train/global_step", step_sync=True)
        self._messages: list[str] = []

    def _log(self, row: dict[str, Any], step: int) -> None:
        # W&B drops a row whose step is below its own counter, which a caller's run or an online
        # run resumed past its checkpoint may be at: such rows go at W&B's next step instead
        # (train/global_step still places them).
        try:
            at = {"step": step} if step >= self.run.step else {}
        except Exception:  # a run kind without a step counter (mode="shared")
            at = {}
        self.run.log({**row, "train/global_step": step}, **at)

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        self._log(scalars(metrics), step)

    def log_warning(self, step: int, kind: str, message: str) -> None:
        # A 1 in the history marks where warnings happened; the texts go to the summary.
        self._log({f"warnings/{kind}": 1.0}, step)
        self._messages.append(f"step {step} [{kind}] {message}")
        self.run.summary["warning_messages"] = "\n".join(self._messages)

    def log_table(self, name: str, columns: list[str], rows: list[list[Any]], step: int) -> None:
        """A ``wandb.Table`` under ``name`` (TRL's "completions")."""
        self._log({name: self.wandb.Table(columns=columns, data=rows)}, step)

    def close(self) -> None:
        # finish() returns once W&B's background process has the exit record; it writes the
        # last records to run-<id>.wandb a few milliseconds later (and at the latest on exit).
        if self.owned:
            self.run.finish()


class RunLoggers:
    """The ``report_to`` backends of one training run, behind one ``log`` call.

    output_dir: the run's folder (TensorBoard writes to ``tensorboard/``, W&B to ``wandb/``
    unless ``WANDB_DIR`` says otherwise).
    report_to: backend names from :data:`BACKENDS`; None or [] logs nowhere (a no-op).
    config: the run's configuration (``GRPOConfig.to_dict()``), stored by W&B.
    run_name: the W&B run's name (TrainingArguments' ``run_name``; None: W&B's choice).
    resume: continue the W&B run whose id is in ``wandb_run_id.txt``.
    resume_step: with ``resume``, the step of the checkpoint training resumes from (its
    ``global_step``); TensorBoard hides what the interrupted run logged after it.
    """

    def __init__(
        self,
        output_dir: str | os.PathLike[str],
        report_to: list[str] | None,
        config: Mapping[str, Any],
        run_name: str | None = None,
        resume: bool = False,
        resume_step: int | None = None,
    ) -> None:
        names = list(dict.fromkeys(report_to or []))
        unknown = [name for name in names if name not in BACKENDS]
        if unknown:
            raise ValueError(f"report_to: unknown logger(s) {unknown}; expected {list(BACKENDS)}")
        self.output_dir = Path(output_dir)
        self.output_dir.mkdir(parents=True, exist_ok=True)
        self.backends: dict[str, TensorBoardLogger | WandbLogger] = {}
        try:
            for name in names:
                if name == "tensorboard":
                    # Steps after the checkpoint were logged by the interrupted run: hide them.
                    purge = resume_step + 1 if resume and resume_step is not None else None
                    self.backends[name] = TensorBoardLogger(self.output_dir, purge_step=purge)
                else:
                    self.backends[name] = WandbLogger(self.output_dir, config, run_name, resume)
        except BaseException:
            self.close()  # do not leave a half-built set of writers open
            raise

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        """Send one metrics row (training or ``eval/*``) to every backend."""
        for backend in self.backends.values():
            backend.log(metrics, step)

    def log_table(
        self, name: str, columns: Sequence[str], rows: Sequence[Sequence[Any]], step: int
    ) -> None:
        """Send a table (TRL's "completions": a row per completion) to every backend: a
        ``wandb.Table``, a TensorBoard text summary."""
        columns, table = list(columns), [list(row) for row in rows]
        for backend in self.backends.values():
            backend.log_table(name, columns, table, step)

    def log_warning(
        self, warning: Any, kind: str | None = None, message: str | None = None
    ) -> None:
        """Send a warning: a ``TrainingWarning``, its ``{"step", "kind", "message"}`` dict, or
        ``log_warning(step, kind, message)``."""
        if kind is not None:
            step, message = int(warning), str(message or "")
        else:
            step, kind, message = _warning_fields(warning)
        for backend in self.backends.values():
            backend.log_warning(step, kind, message)

    def close(self) -> None:
        """Flush and close every backend; safe to call twice."""
        backends, self.backends = list(self.backends.values()), {}
        for backend in backends:
            backend.close()

    def __enter__(self) -> RunLoggers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
