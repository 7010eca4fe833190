"""Optional metric backends (``report_to``): TensorBoard and Weights & Biases (offline only).

``metrics.jsonl`` and ``events.jsonl`` belong to the trainer; :class:`RunLoggers` only fans the
same metrics and warnings out to the backends named in ``report_to``. Each backend's package is an
optional extra, imported when it is asked for; a missing one is an error at construction, before
any training time is spent.
"""

from __future__ import annotations

import math
import numbers
import os
import secrets
import string
from collections.abc import Mapping
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


def new_run_id() -> str:
    """A W&B-style run id: 8 random lowercase letters and digits."""
    return "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(8))


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

    def close(self) -> None:
        self.writer.close()


class WandbLogger:
    """An offline W&B run under ``output_dir/wandb`` (sync later with ``wandb sync``).

    Offline is forced through the run's own settings (not the environment), so an online
    ``WANDB_MODE`` cannot make it reach the network, and nothing prompts for a login. The run id
    is kept in ``output_dir/wandb_run_id.txt`` so that a resumed training run continues the same
    W&B run."""

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
        id_file = output_dir / WANDB_RUN_ID_FILE
        run_id = id_file.read_text(encoding="utf-8").strip() if resume and id_file.exists() else ""
        if not run_id:
            run_id = new_run_id()
            id_file.write_text(run_id + "\n", encoding="utf-8")
        self.run_id = run_id
        settings = wandb.Settings(
            mode="offline",
            silent=True,
            console="off",  # no stdout/stderr capture (it wraps the process's streams)
            save_code=False,
            disable_code=True,
            disable_git=True,
            disable_job_creation=True,
            x_disable_stats=True,  # no system-metrics sampler
            x_disable_machine_info=True,
        )
        self.run = wandb.init(
            dir=str(output_dir),
            config=dict(config),
            name=run_name,
            id=run_id,
            resume="allow" if resume else None,
            reinit="create_new",  # never finish a W&B run the caller has open
            settings=settings,
        )
        self._messages: list[str] = []

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        self.run.log(scalars(metrics), step=step)

    def log_warning(self, step: int, kind: str, message: str) -> None:
        # A 1 in the history marks where warnings happened; the texts go to the summary.
        self.run.log({f"warnings/{kind}": 1.0}, step=step)
        self._messages.append(f"step {step} [{kind}] {message}")
        self.run.summary["warning_messages"] = "\n".join(self._messages)

    def close(self) -> None:
        # finish() returns once W&B's background process has the exit record; it writes the
        # last records to run-<id>.wandb a few milliseconds later (and at the latest on exit).
        self.run.finish()


class RunLoggers:
    """The ``report_to`` backends of one training run, behind one ``log`` call.

    output_dir: the run's folder (TensorBoard writes to ``tensorboard/``, W&B to ``wandb/``).
    report_to: backend names from :data:`BACKENDS`; None or [] logs nowhere (a no-op).
    config: the run's configuration (``GRPOConfig.to_dict()``), stored by W&B.
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
