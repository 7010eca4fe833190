"""The training loop: one ``train()`` call from the output folder's checks to the final save.

:class:`TrainingLoop` runs it: start (earlier run, resume, config.yaml, run.json, loggers),
the steps with their :class:`Cadence` (when to log, sample completions, evaluate, save), the
failure monitor, SIGINT/SIGTERM (:class:`StopSignals`) and callbacks' requests to save or stop,
then the last evaluation, checkpoint and model. The step itself is the trainer's
``train_step()``.
"""

from __future__ import annotations

import math
import signal
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from tqdm.auto import tqdm
from transformers import TrainerControl

from ..config.grpo_config import GRPOConfig
from ..errors import OutputDirError, option
from ..report.record import record_run_end, record_run_start
from ..runtime.distributed import any_rank, barrier
from . import console
from .checkpoints import TrainingInterrupted, TrainingStopped, resolve_resume_path
from .records import check_output_dir, earlier_run, run_facts

if TYPE_CHECKING:
    import torch
    from transformers import TrainerControl

    from ..policy.policy import Policy
    from ..rewards.scoring import RolloutScorer
    from ..runtime.distributed import DistributedContext
    from ..runtime.precision import Precision
    from .monitor import TrainingMonitor
    from .records import RunRecords


class LoopTrainer(Protocol):
    """What the loop uses of the trainer it runs (:class:`groupwise.trainer.base.Trainer`): its
    options, parts and services, its step, evaluation, checkpoints and callbacks."""

    args: GRPOConfig
    control: TrainerControl
    device: torch.device
    dist: DistributedContext
    dtype: torch.dtype
    eval_dataset: Any
    global_step: int
    log_history: list[dict[str, float]]
    monitor: TrainingMonitor
    output_dir: Path
    policy: Policy
    precision: Precision
    records: RunRecords
    reward_names: list[str]
    scorer: RolloutScorer

    def train_step(self) -> dict[str, float]: ...
    def evaluate(self) -> dict[str, float]: ...
    def train_summary(
        self, seconds: float, steps: int, losses: Sequence[float]
    ) -> dict[str, float]: ...
    def save_checkpoint(self) -> Path: ...
    def load_checkpoint(self, path: str | Path) -> None: ...
    def save_model(self, path: str | Path | None = None) -> Path: ...
    def _log(self, logs: dict[str, float]) -> None: ...
    def _callback(self, event: str, **kwargs: Any) -> None: ...


class Cadence:
    """When the loop logs, samples completions, evaluates and saves, from the options'
    step counts (read at each step, so a callback's change to ``args`` counts)."""

    def __init__(self, args: GRPOConfig) -> None:
        self.args = args

    def log(self, step: int) -> bool:
        return step % self.args.logging_steps == 0 or step == self.args.max_steps

    def log_completions(self, step: int) -> bool:
        every = self.args.log_completions_steps
        if not every and self.args.log_completions:  # TRL's meaning: at every logged step
            return self.log(step)
        return bool(every) and step % every == 0

    def evaluate(self, step: int) -> bool:
        """Every eval_steps; the last step's evaluation comes after the loop (:meth:`end`)."""
        every = self.args.eval_steps
        return bool(every) and step % every == 0 and step < self.args.max_steps

    def save(self, step: int) -> bool:
        every = self.args.save_steps
        return bool(every) and step % every == 0

    def evaluates(self) -> bool:
        """Whether the run evaluates at all (and so once more at its end)."""
        return bool(self.args.eval_on_start or self.args.eval_steps)


class StopSignals:
    """SIGINT/SIGTERM finish the current step, save a checkpoint and stop (a second SIGINT
    aborts at once). Python lets only the main thread install handlers; elsewhere the default
    handling stays, and so does a signal the process was started ignoring (``nohup``)."""

    def __init__(self) -> None:
        self.received: int | None = None
        self.previous: dict[int, Any] = {}

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return

        def handler(signum: int, frame: Any) -> None:
            if self.received is not None and signum == signal.SIGINT:
                raise KeyboardInterrupt
            self.received = signum
            tqdm.write(
                f"[groupwise] {signal.Signals(signum).name}: saving a checkpoint after this "
                "step (Ctrl-C again to abort without saving)"
            )

        for signum in (signal.SIGINT, signal.SIGTERM):
            if signal.getsignal(signum) is not signal.SIG_IGN:  # an inherited ignore stays
                self.previous[signum] = signal.signal(signum, handler)

    def restore(self) -> None:
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)


class TrainingLoop:
    """One ``train()`` call of ``trainer``: the loop reads the trainer's options, parts and
    services as they are when it runs (a test or callback may have replaced ``train_step`` or
    changed ``args``)."""

    def __init__(self, trainer: LoopTrainer) -> None:
        self.trainer = trainer
        self.losses: list[float] = []  # this call's finite per-step losses, for train_loss
        self.signals = StopSignals()

    def run(self) -> dict[str, float]:
        """Train to ``max_steps``; returns the end-of-training metrics (``train_summary``)."""
        trainer, args = self.trainer, self.trainer.args
        dist, records, output_dir = trainer.dist, trainer.records, trainer.output_dir
        started, first_step = time.perf_counter(), trainer.global_step
        earlier: list[str] = []  # what an earlier run left in output_dir
        if trainer.global_step == 0 and not records.started:  # not a continuation
            check_output_dir(
                output_dir, args.resume_from_checkpoint, args.overwrite_output_dir
            )
            earlier = earlier_run(output_dir)
        barrier(dist)  # every rank looked before rank 0 writes anything
        output_dir.mkdir(parents=True, exist_ok=True)
        self._resume_if_asked(earlier)
        fresh = trainer.global_step == 0 and not records.started  # nothing logged yet
        if fresh and args.overwrite_output_dir and dist.is_main:
            records.clear_earlier_run()
        if dist.is_main:
            args.to_yaml(output_dir / "config.yaml")
            # Reward names, weights and which one is correctness, for `groupwise report`.
            trainer.scorer.combine.write_manifest(output_dir / "rewards.json")
            # Version, device, dtype, dates, wall time and the changed options' defaults, too.
            facts = run_facts(
                args, trainer.device, dist.world_size, trainer.dtype, trainer.precision
            )
            segment_start = record_run_start(output_dir, facts, not fresh)
        if records.loggers is None and args.report_to and dist.is_main:
            records.open_loggers(args, trainer.global_step)
        self.signals.install()
        trainer.control = TrainerControl()
        try:
            trainer._callback("on_train_begin")
            self._steps()
            self._finish()
            metrics = trainer.train_summary(
                time.perf_counter() - started, trainer.global_step - first_step, self.losses
            )
            self._add_summary(metrics, ran=trainer.global_step > first_step)
            trainer._callback("on_train_end")
        finally:
            if dist.is_main:
                record_run_end(output_dir, segment_start)
            self.signals.restore()
            records.close_loggers()
        return metrics

    def _resume_if_asked(self, earlier: list[str]) -> None:
        trainer = self.trainer
        value = trainer.args.resume_from_checkpoint
        if not value:
            return
        path = resolve_resume_path(value, trainer.output_dir)
        if path is None:
            if earlier and not trainer.args.overwrite_output_dir:
                overwrite = option("--overwrite_output_dir true", "overwrite_output_dir=True")
                raise OutputDirError(
                    f"resume_from_checkpoint=auto, but output_dir={str(trainer.output_dir)!r} "
                    f"holds a run without checkpoints ({', '.join(earlier)}) that starting over "
                    f"would replace; pass {overwrite} to replace it, or choose another "
                    "output_dir (save_steps makes checkpoints)"
                )
            tqdm.write(f"[groupwise] no checkpoint in {trainer.output_dir}: starting from step 0")
            return
        trainer.load_checkpoint(path)

    def _steps(self) -> None:
        trainer, args = self.trainer, self.trainer.args
        cadence = Cadence(args)
        if trainer.eval_dataset is not None and args.eval_on_start and trainer.global_step == 0:
            self._evaluate_and_log(trainer.global_step)
        # A bar on a terminal; a line per logged step without one, or when stdout is a file.
        show_bar = console.show_bar(args.disable_tqdm, trainer.dist.is_main)
        step_lines = console.print_step_lines(show_bar, trainer.dist.is_main)
        bar = tqdm(
            total=args.max_steps,
            initial=trainer.global_step,
            desc=args.algorithm.upper(),
            disable=not show_bar,
            dynamic_ncols=True,
        )
        while trainer.global_step < args.max_steps:
            trainer._callback("on_step_begin")
            logs = trainer.train_step()
            step = trainer.global_step
            if math.isfinite(logs.get("loss", math.nan)):  # transformers skips nan/inf losses
                self.losses.append(float(logs["loss"]))
            trainer._callback("on_step_end")
            if cadence.log(step):
                trainer._log(logs)
                if step_lines:
                    tqdm.write(console.step_line(logs, args.max_steps, trainer.reward_names))
            if cadence.log_completions(step):
                trainer.records.log_completions(
                    step, args.completions_sample_size, args.num_completions_to_print
                )
            self._watch(step, logs, bar)
            bar.set_postfix_str(
                console.progress_postfix(
                    logs, trainer.reward_names, trainer.scorer.correctness_name
                ),
                refresh=False,
            )
            bar.update(1)
            if trainer.eval_dataset is not None and cadence.evaluate(step):
                metrics = self._evaluate_and_log(step)
                trainer._callback("on_evaluate", metrics=metrics)
            if cadence.save(step) or trainer.control.should_save:
                trainer.control.should_save = False
                trainer.save_checkpoint()
            self._stop_if_signalled(bar)
            if trainer.control.should_training_stop:  # a callback asked to stop
                break
        bar.close()

    def _watch(self, step: int, logs: dict[str, float], bar: tqdm) -> None:
        """The failure monitor's warnings; after max_bad_steps NaN/inf steps in a row, save and
        stop."""
        trainer = self.trainer
        if logs.get("nonfinite_step"):
            for w in trainer.monitor.record_bad_step(step, "loss or gradient is NaN/inf"):
                trainer.records.warn(w.step, w.kind, w.message)
        for w in trainer.monitor.update(logs):
            trainer.records.warn(w.step, w.kind, w.message)
        if trainer.monitor.should_stop:
            bar.close()
            path = trainer.save_checkpoint()
            raise TrainingStopped(
                f"{trainer.args.max_bad_steps} steps in a row had a NaN/inf loss or gradient "
                f"and were skipped; the weights are unchanged since the last good step and "
                f"were saved to {path}. Lower learning_rate or check the rewards."
            )

    def _stop_if_signalled(self, bar: tqdm) -> None:
        """A signal on any rank: every rank saves, then stops."""
        if any_rank(self.signals.received is not None, self.trainer.dist):
            bar.close()
            path = self.trainer.save_checkpoint()
            signum, self.signals.received = self.signals.received or signal.SIGTERM, None
            raise TrainingInterrupted(signum, path)

    def _finish(self) -> None:
        """The end of a run: the last step's evaluation and checkpoint when not done yet, and
        the model in output_dir."""
        trainer, args = self.trainer, self.trainer.args
        if trainer.eval_dataset is not None and Cadence(args).evaluates():
            last = trainer.log_history[-1] if trainer.log_history else {}
            evaluated = any(key.startswith("eval/") for key in last)
            if not (last.get("step") == trainer.global_step and evaluated):
                self._evaluate_and_log(trainer.global_step)
        saved = (trainer.output_dir / f"checkpoint-{trainer.global_step}").exists()
        if args.save_steps and any_rank(not saved, trainer.dist):
            trainer.save_checkpoint()
        if trainer.dist.is_main or trainer.policy.sharded:  # FSDP: gathering is collective
            trainer.save_model(trainer.output_dir)
        barrier(trainer.dist)

    def _evaluate_and_log(self, step: int) -> dict[str, float]:
        """Evaluate, log the results and print them (on the main rank)."""
        trainer = self.trainer
        metrics = trainer.evaluate()
        trainer._log({"step": step, **metrics})
        if trainer.dist.is_main:
            tqdm.write(console.eval_line(metrics, step))
        return metrics

    def _add_summary(self, metrics: dict[str, float], ran: bool) -> None:
        """The end-of-training row of ``state.log_history``, passed to ``on_log`` (before
        ``on_train_end``, as transformers does). As in TRL (whose log() merges the metrics not
        yet logged into this row), it also carries the final step's metrics:
        ``log_history[-1]["reward"]`` works."""
        trainer = self.trainer
        final = next(
            (
                r
                for r in reversed(trainer.log_history)
                if r.get("step") == trainer.global_step and "loss" in r
            ),
            {},
        )
        row = {**(final if ran else {}), **metrics, "step": trainer.global_step}
        trainer.records.summaries.append((len(trainer.log_history), row))
        trainer._callback("on_log", logs=dict(row))
