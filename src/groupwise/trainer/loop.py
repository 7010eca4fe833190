"""The training loop: one ``train()`` call from the output folder's checks to the final save.

:class:`TrainingLoop` runs it: start (earlier run, resume, config.yaml, run.json, loggers),
the steps with their :class:`Cadence` (when to log, sample completions, evaluate, save), the
failure monitor, SIGINT/SIGTERM (:class:`StopSignals`) and callbacks' requests to save or stop,
then the last evaluation, checkpoint and model, and the end-of-training metrics
(:func:`train_summary`). It is given its collaborators: the options, the run record, the run's
records and failure monitor, and what it asks of the trainer (:class:`LoopCalls`: a step, an
evaluation, a checkpoint saved or loaded, a row logged, a callback event).
"""

from __future__ import annotations

import math
import signal
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm
from transformers import TrainerControl

from ..config.grpo_config import GRPOConfig
from ..config.trl_parity import differences_in_effect
from ..errors import GenerationServerError, OutputDirError, option
from ..report.record import record_run_end, record_run_start
from ..runtime.distributed import any_rank, barrier
from ..wiring.run import Run
from . import console
from .checkpoints import (
    TrainingInterrupted,
    TrainingStopped,
    latest_checkpoint,
    resolve_resume_path,
)
from .monitor import TrainingMonitor
from .records import RunRecords, check_output_dir, earlier_run, run_description


@dataclass(frozen=True)
class LoopCalls:
    """What the loop asks of the trainer it runs (its bound methods, read when ``train()``
    starts, so a test that replaced ``train_step`` is run): one step returning its metrics, an
    evaluation, a row logged (log_history, callbacks, files), a callback event, the callbacks'
    ``TrainerControl`` now, the step count, a checkpoint saved or loaded, the model saved, the
    epoch the run has reached, and the error to raise when a step ran out of memory (given the
    error, the step and the last checkpoint)."""

    step: Callable[[], dict[str, float]]
    evaluate: Callable[[], dict[str, float]]
    log: Callable[[dict[str, float]], None]
    callback: Callable[..., None]
    control: Callable[[], TrainerControl]
    global_step: Callable[[], int]
    save_checkpoint: Callable[[], Path]
    load_checkpoint: Callable[[Path], None]
    save_model: Callable[[Path], Path]
    epoch: Callable[[], float]
    out_of_memory: Callable[[BaseException, int, Path | None], BaseException]


def train_summary(
    seconds: float, steps: int, completions: int, losses: Sequence[float], epoch: float
) -> dict[str, float]:
    """transformers' end-of-training metrics of a ``train()`` call that ran ``steps`` steps
    and trained on ``completions`` completions (every rank's) in ``seconds``, with these finite
    per-step ``losses``, ending at ``epoch``: ``train_loss``, their mean (NaN when none ran),
    ``train_runtime``, ``train_samples_per_second``, ``train_steps_per_second`` and ``epoch``.
    The row ``state.log_history`` ends with; not written to metrics.jsonl, which holds one row
    per logged step."""
    seconds = max(seconds, 1e-9)
    return {
        "train_runtime": round(seconds, 4),
        "train_samples_per_second": round(completions / seconds, 3),
        "train_steps_per_second": round(steps / seconds, 3),
        "train_loss": sum(losses) / len(losses) if losses else math.nan,
        "epoch": epoch,
    }


class Cadence:
    """When the loop logs, samples completions, evaluates and saves, from the options'
    step counts (read at each step, so a callback's change to ``args`` counts). Steps are
    optimizer steps, as TRL's; a generation batch trains several when ``num_iterations`` or
    ``steps_per_generation`` ask for it, so each method is asked about the steps one batch
    took, ``before`` (exclusive) to ``step`` (inclusive), and answers whether a multiple of
    its interval lies among them (transformers' Trainer would act inside the batch; here the
    batch ends first, so a checkpoint always resumes exactly)."""

    def __init__(self, args: GRPOConfig) -> None:
        self.args = args

    @staticmethod
    def due(every: int, before: int, step: int) -> bool:
        """Whether a multiple of ``every`` (0: never) is in ``(before, step]``."""
        return bool(every) and step // every > before // every

    def log(self, before: int, step: int) -> bool:
        return self.due(self.args.logging_steps, before, step) or step >= self.args.max_steps

    def log_completions(self, before: int, step: int) -> bool:
        every = self.args.log_completions_steps
        if not every and self.args.log_completions:  # TRL's meaning: at every logged step
            return self.log(before, step)
        return self.due(every, before, step)

    def evaluate(self, before: int, step: int) -> bool:
        """Every eval_steps; the last step's evaluation comes after the loop (:meth:`end`)."""
        return self.due(self.args.eval_steps, before, step) and step < self.args.max_steps

    def save(self, before: int, step: int) -> bool:
        return self.due(self.args.save_steps, before, step)

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
    """One ``train()`` call: the loop reads the options as they are when it runs (a callback
    may change ``args``), the run's parts from ``run``, and logs through ``records``;
    ``evaluates``: whether the trainer has an evaluation set."""

    def __init__(
        self,
        args: GRPOConfig,
        run: Run[Any],
        records: RunRecords,
        monitor: TrainingMonitor,
        output_dir: Path,
        calls: LoopCalls,
        *,
        evaluates: bool,
    ) -> None:
        self.args, self.run, self.records, self.monitor = args, run, records, monitor
        self.output_dir, self.calls, self.has_eval_set = output_dir, calls, evaluates
        self.losses: list[float] = []  # this call's finite per-step losses, for train_loss
        self.signals = StopSignals()

    def train(self) -> dict[str, float]:
        """Train to ``max_steps``; returns the end-of-training metrics (:func:`train_summary`)."""
        args, calls, records, output_dir = self.args, self.calls, self.records, self.output_dir
        dist = self.run.dist
        started, first_step = time.perf_counter(), calls.global_step()
        earlier: list[str] = []  # what an earlier run left in output_dir
        if first_step == 0 and not records.started:  # not a continuation
            check_output_dir(output_dir, args.resume_from_checkpoint, args.overwrite_output_dir)
            earlier = earlier_run(output_dir)
        barrier(dist)  # every rank looked before rank 0 writes anything
        output_dir.mkdir(parents=True, exist_ok=True)
        self._resume_if_asked(earlier)
        fresh = calls.global_step() == 0 and not records.started  # nothing logged yet
        if fresh and args.overwrite_output_dir and dist.is_main:
            records.clear_earlier_run()
        if dist.is_main:
            args.to_yaml(output_dir / "config.yaml")
            # Reward names, weights and which one is correctness, for `groupwise report`.
            self.run.scorer.combine.write_manifest(output_dir / "rewards.json")
            # Version, device, dtype, dates, wall time and the changed options' defaults, too.
            precision = self.run.precision
            facts = run_description(args, self.run.device, dist.world_size, precision.weights,
                                    precision)  # fmt: skip
            segment_start = record_run_start(output_dir, facts, not fresh)
            if fresh:  # once per run: where this run's settings differ from TRL's
                for line in differences_in_effect(args, self.run.device, precision.autocast):
                    tqdm.write(f"[groupwise] {line}")
        if records.loggers is None and args.report_to and dist.is_main:
            records.open_loggers(args, calls.global_step())
        self.signals.install()
        try:
            calls.callback("on_train_begin")
            self._steps()
            self._finish()
            step, ranks = calls.global_step(), dist.world_size
            # steps are optimizer steps; each generation batch trained up to this many
            batches = math.ceil((step - first_step) / args.optimizer_steps_per_step)
            completions = batches * args.completions_per_generation * ranks
            metrics = train_summary(time.perf_counter() - started, step - first_step,
                                    completions, self.losses, calls.epoch())  # fmt: skip
            self._add_summary(metrics, ran=step > first_step)
            calls.callback("on_train_end")
        finally:
            if dist.is_main:
                record_run_end(output_dir, segment_start)
            self.signals.restore()
            records.close_loggers()
        return metrics

    def _resume_if_asked(self, earlier: list[str]) -> None:
        value, output_dir = self.args.resume_from_checkpoint, self.output_dir
        if not value:
            return
        path = resolve_resume_path(value, output_dir)
        if path is None:
            if earlier and not self.args.overwrite_output_dir:
                overwrite = option("--overwrite_output_dir true", "overwrite_output_dir=True")
                raise OutputDirError(
                    f"resume_from_checkpoint=auto, but output_dir={str(output_dir)!r} "
                    f"holds a run without checkpoints ({', '.join(earlier)}) that starting over "
                    f"would replace; pass {overwrite} to replace it, or choose another "
                    "output_dir (save_steps makes checkpoints)"
                )
            tqdm.write(f"[groupwise] no checkpoint in {output_dir}: starting from step 0")
            return
        self.calls.load_checkpoint(path)

    def _steps(self) -> None:
        args, calls, records, scorer = self.args, self.calls, self.records, self.run.scorer
        is_main = self.run.dist.is_main
        cadence = Cadence(args)
        if self.has_eval_set and args.eval_on_start and calls.global_step() == 0:
            self._evaluate_and_log(calls.global_step())
        # A bar on a terminal; a line per logged step without one, or when stdout is a file.
        show_bar = console.show_bar(args.disable_tqdm, is_main)
        step_lines = console.print_step_lines(show_bar, is_main)
        bar = tqdm(
            total=args.max_steps,
            initial=calls.global_step(),
            desc=args.algorithm.upper(),
            disable=not show_bar,
            dynamic_ncols=True,
        )
        while calls.global_step() < args.max_steps:
            calls.callback("on_step_begin")
            before = calls.global_step()
            logs = self._step(before)
            step = calls.global_step()
            if math.isfinite(logs.get("loss", math.nan)):  # transformers skips nan/inf losses
                self.losses.append(float(logs["loss"]))
            calls.callback("on_step_end")
            if cadence.log(before, step):
                calls.log(logs)
                if step_lines:
                    tqdm.write(console.step_line(logs, args.max_steps, scorer.names))
            if cadence.log_completions(before, step):
                records.log_completions(
                    step, args.completions_sample_size, args.num_completions_to_print
                )
            self._watch(step, logs, bar)
            bar.set_postfix_str(
                console.progress_postfix(logs, scorer.names, scorer.correctness_name),
                refresh=False,
            )
            bar.update(step - before)
            if self.has_eval_set and cadence.evaluate(before, step):
                metrics = self._evaluate_and_log(step)
                calls.callback("on_evaluate", metrics=metrics)
            control = calls.control()
            if cadence.save(before, step) or control.should_save:
                control.should_save = False
                calls.save_checkpoint()
            self._stop_if_signalled(bar)
            if calls.control().should_training_stop:  # a callback asked to stop
                break
        bar.close()

    def _step(self, before: int) -> dict[str, float]:
        """One step. Out of memory, it raises what the trainer makes of the error (the phase,
        the memory plan, the settings that fit); when the generation server stops answering, it
        names the step and the checkpoint to resume from. Nothing more is saved on the way out,
        so the last checkpoint stays the run's last good state."""
        try:
            return self.calls.step()
        except torch.OutOfMemoryError as err:
            checkpoint = latest_checkpoint(self.output_dir)
            raise self.calls.out_of_memory(err, before + 1, checkpoint) from err
        except GenerationServerError as err:
            # The step's state is the server's as much as the trainer's: nothing is saved now.
            checkpoint = latest_checkpoint(self.output_dir)
            if checkpoint is None:
                resume = "no checkpoint was saved yet (save_steps sets how often one is)"
            else:
                flag = option(
                    "--resume " + str(checkpoint), f'resume_from_checkpoint="{checkpoint}"'
                )
                resume = f"once it is back, resume from the last checkpoint: {flag}"
            raise GenerationServerError(f"step {before + 1}: {err}; {resume}") from None

    def _watch(self, step: int, logs: dict[str, float], bar: tqdm) -> None:
        """The failure monitor's warnings; after max_bad_steps NaN/inf steps in a row, save and
        stop."""
        monitor, records = self.monitor, self.records
        if logs.get("nonfinite_step"):
            for w in monitor.record_bad_step(step, "loss or gradient is NaN/inf"):
                records.warn(w.step, w.kind, w.message)
        for w in monitor.update(logs):
            records.warn(w.step, w.kind, w.message)
        if monitor.should_stop:
            bar.close()
            path = self.calls.save_checkpoint()
            raise TrainingStopped(
                f"{self.args.max_bad_steps} steps in a row had a NaN/inf loss or gradient "
                f"and were skipped; the weights are unchanged since the last good step and "
                f"were saved to {path}. Lower learning_rate or check the rewards."
            )

    def _stop_if_signalled(self, bar: tqdm) -> None:
        """A signal on any rank: every rank saves, then stops."""
        if any_rank(self.signals.received is not None, self.run.dist):
            bar.close()
            path = self.calls.save_checkpoint()
            signum, self.signals.received = self.signals.received or signal.SIGTERM, None
            raise TrainingInterrupted(signum, path)

    def _finish(self) -> None:
        """The end of a run: the last step's evaluation and checkpoint when not done yet, and
        the model in output_dir."""
        args, calls, dist = self.args, self.calls, self.run.dist
        step, history = calls.global_step(), self.records.history
        if self.has_eval_set and Cadence(args).evaluates():
            last = history[-1] if history else {}
            evaluated = any(key.startswith("eval/") for key in last)
            if not (last.get("step") == step and evaluated):
                self._evaluate_and_log(step)
        saved = (self.output_dir / f"checkpoint-{step}").exists()
        if args.save_steps and any_rank(not saved, dist):
            calls.save_checkpoint()
        if dist.is_main or self.run.policy.network.sharded:  # FSDP: gathering is collective
            calls.save_model(self.output_dir)
        barrier(dist)

    def _evaluate_and_log(self, step: int) -> dict[str, float]:
        """Evaluate, log the results and print them (on the main rank)."""
        metrics = self.calls.evaluate()
        self.calls.log({"step": step, **metrics})
        if self.run.dist.is_main:
            tqdm.write(console.eval_line(metrics, step))
        return metrics

    def _add_summary(self, metrics: dict[str, float], ran: bool) -> None:
        """The end-of-training row of ``state.log_history``, passed to ``on_log`` (before
        ``on_train_end``, as transformers does). As in TRL (whose log() merges the metrics not
        yet logged into this row), it also carries the final step's metrics:
        ``log_history[-1]["reward"]`` works."""
        step, history = self.calls.global_step(), self.records.history
        final = next((r for r in reversed(history) if r.get("step") == step and "loss" in r), {})
        row = {**(final if ran else {}), **metrics, "step": step}
        self.records.summaries.append((len(history), row))
        self.calls.callback("on_log", logs=dict(row))
