"""The run's memory plan against its GPU: a warning before the model loads when the plan's peak
is over the device's memory, and, when a step runs out of memory, which phase did, the plan and
the settings that fit.

The plan is ``groupwise memory``'s (:mod:`groupwise.memory`): the run's options are read as that
command reads a config (:func:`groupwise.memory.cli.options_from_args`), planned for this GPU's
memory, and the settings that fit are picked from its fit table
(:func:`groupwise.memory.fit.fit_rows`): the fewest changes to the run first. The planner is an
estimate, so a plan over the device's memory warns and the run goes on; a step that runs out of
memory raises :class:`TrainingOutOfMemory`, which is still a ``torch.OutOfMemoryError``. Only
CUDA devices are checked (:func:`device_memory`).
"""

from __future__ import annotations

import tempfile
import traceback
import warnings
from dataclasses import dataclass, replace
from pathlib import Path
from types import TracebackType
from typing import Any

import torch

from ..config.grpo_config import GRPOConfig
from ..errors import UserError, first_line, option

# The stage a frame's module belongs to; the outermost groupwise stage of a traceback is the
# phase that ran out of memory (the engine's generate, or the learner's update, calls further
# down into the policy and the engine).
PHASES = (
    ("groupwise.rollout.", "generation"),
    ("groupwise.rewards.", "scoring"),
    ("groupwise.policy.", "update"),
)
MAX_SUGGESTIONS = 4  # the settings that fit, the fewest changes first


class MemoryFitWarning(UserWarning):
    """The memory plan of a run is over its GPU's memory (``warnings.filterwarnings("ignore",
    category=MemoryFitWarning)`` silences it)."""


class TrainingOutOfMemory(UserError, torch.OutOfMemoryError):
    """A step ran out of GPU memory: the phase, the plan and the settings that fit. Still a
    ``torch.OutOfMemoryError`` (code that catches it keeps working); the original error is its
    ``__cause__``."""


@dataclass(frozen=True)
class MemoryAdvice:
    """The plan of a run for a device of ``device_bytes``: its ``peak``, the ``rows`` it adds up
    (the algorithm's column of ``groupwise memory``), the ``settings`` that fit (each one line),
    and the fit table (``table``; empty for PPO, whose fits are not searched)."""

    device_bytes: int
    peak: int
    rows: dict[str, int]
    settings: list[str]
    table: str

    @property
    def fits(self) -> bool:
        return self.peak <= self.device_bytes


def device_memory(device: torch.device) -> int | None:
    """The memory of ``device`` in bytes; None where it is not checked (not a CUDA device)."""
    if device.type != "cuda":
        return None
    return torch.cuda.get_device_properties(device).total_memory


def _planner() -> Any:
    """:mod:`groupwise.memory`, imported when a plan is asked for (its command line's parser
    and the shipped shapes are not needed by a run that never plans)."""
    from .. import memory

    return memory


def human(count: int) -> str:
    return _planner().human_bytes(count)


def plan_run(args: GRPOConfig, model: str, device_bytes: int) -> MemoryAdvice | None:
    """The plan of the run ``args`` describes, training ``model``, on a GPU of ``device_bytes``
    (as ``groupwise memory CONFIG --model MODEL --gpu_memory SIZE`` plans it); None when the
    planner cannot plan it (a model whose shapes it cannot read)."""
    memory = _planner()
    with tempfile.TemporaryDirectory() as folder:
        config = Path(folder) / "config.yaml"
        args.to_yaml(config)
        argv = [str(config), "--model", model, "--gpu_memory", f"{device_bytes / 2**30:.6f}"]
        try:
            cli = memory.build_parser().parse_args(argv)
            shape, opts, _ = memory.options_from_args(cli)
            plan = memory.make_plan(shape, opts)
        except (ValueError, OSError):  # MemoryPlanError is a ValueError
            return None
    rows = plan.ppo if args.algorithm == "ppo" else plan.grpo
    peak = memory.total_bytes(rows)
    if args.algorithm == "ppo" or not shape.has_layer_shapes or shape.vocab is None:
        return MemoryAdvice(device_bytes, peak, rows, [], "")
    fits = memory.fit_rows(shape, opts, device_bytes, cli.method_dtypes)
    settings = [*fit_settings(fits, opts, peak), *batch_settings(shape, opts, device_bytes)]
    longest = memory.fit.longest_completion(shape, opts, device_bytes)
    if longest is not None and longest < opts.completion_len:
        settings.append(f"{_set('max_completion_length', longest)} or less")
    table = memory.format_fits(shape, opts, device_bytes, fits)
    return MemoryAdvice(device_bytes, peak, rows, settings, table)


def _set(name: str, value: Any) -> str:
    """An option set to ``value``, spelled as the user sets it (a flag or a keyword)."""
    if isinstance(value, bool):
        return option(f"--{name} {str(value).lower()}", f"{name}={value}")
    return option(f"--{name} {value}", f"{name}={value}")


def _method(opts: Any) -> str:
    return "qlora" if opts.load_in_4bit else "lora" if opts.lora_r else "full"


def row_changes(row: Any, opts: Any) -> list[str]:
    """The options a fit-table ``row`` changes in the run planned with ``opts``."""
    changes = []
    method = _method(opts)
    if row.method != method:
        if (row.method == "full") != (method == "full"):
            changes.append(_set("use_peft", row.method != "full"))
        if (row.method == "qlora") != (method == "qlora"):
            changes.append(_set("load_in_4bit", row.method == "qlora"))
    if ("8bit" in row.optim) != ("8bit" in opts.optimizer):
        changes.append(_set("optim", row.optim))
    if row.offload != opts.activation_offloading:
        changes.append(_set("activation_offloading", row.offload))
    if row.checkpointing != opts.gradient_checkpointing:
        changes.append(_set("gradient_checkpointing", row.checkpointing))
    return changes


def fit_settings(rows: list[Any], opts: Any, peak: int) -> list[str]:
    """The fit table's rows that fit and lower the run's ``peak``, as the options each changes:
    the fewest changes first, none that only adds to a change already listed."""
    chosen: list[tuple[list[str], int]] = []
    candidates = [(row_changes(r, opts), r.peak) for r in rows if r.fits and r.peak < peak]
    for changes, row_peak in sorted(candidates, key=lambda c: (len(c[0]), c[1])):
        if changes and not any(set(kept) <= set(changes) for kept, _ in chosen):
            chosen.append((changes, row_peak))
    return [f"{', '.join(c)} (plan: {human(p)})" for c, p in chosen[:MAX_SUGGESTIONS]]


def batch_settings(shape: Any, opts: Any, budget: int) -> list[str]:
    """The largest smaller ``per_device_train_batch_size`` that fits, the step's completions
    kept (``gradient_accumulation_steps`` raised to match); none when none fits."""
    memory = _planner()
    completions = opts.batch * opts.grad_accum
    for batch in range(opts.batch - 1, 0, -1):
        if completions % batch:
            continue
        smaller = replace(opts, batch=batch, grad_accum=completions // batch)
        peak = memory.total_bytes(memory.plan_grpo(shape, smaller))
        if peak <= budget:
            accumulation = _set("gradient_accumulation_steps", smaller.grad_accum)
            return [f"{_set('per_device_train_batch_size', batch)}, {accumulation} (plan: "
                    f"{human(peak)}, the same {completions} completions per step)"]  # fmt: skip
    return []


def fit_warning(advice: MemoryAdvice) -> str:
    """The warning of a plan over the device's memory."""
    lines = [
        f"the memory plan of this run peaks at {human(advice.peak)}, over this GPU's "
        f"{human(advice.device_bytes)} ({advice.device_bytes / 2**30:.1f} GiB): it may run out of "
        "memory (the plan is an estimate; groupwise memory CONFIG shows it row by row)."
    ]
    lines += _settings_lines(advice)
    return "\n".join(lines)


def _settings_lines(advice: MemoryAdvice) -> list[str]:
    if not advice.settings:
        return ["No setting in the planner's fit table fits this GPU."] if advice.table else []
    lines = [f"Settings that fit {human(advice.device_bytes)} by the plan:"]
    return lines + [f"  {setting}" for setting in advice.settings]


def check_before_load(args: GRPOConfig, model: str, is_main: bool, device: torch.device) -> None:
    """Before any weight is loaded: warn (on the main process) when the plan of the run is over
    the memory of ``device``. Not a refusal: the plan is an estimate."""
    device_bytes = device_memory(device)
    if not is_main or device_bytes is None:
        return
    advice = plan_run(args, model, device_bytes)
    if advice is not None and not advice.fits:
        warnings.warn(fit_warning(advice), MemoryFitWarning, stacklevel=2)


def phase_of(tb: TracebackType | None) -> str:
    """The phase of a step a traceback ran out of memory in: its outermost frame in a stage
    of :data:`PHASES` (generation, scoring, update), else "step"."""
    for frame, _ in traceback.walk_tb(tb):
        module = frame.f_globals.get("__name__", "")
        for prefix, phase in PHASES:
            if module.startswith(prefix):
                return phase
    return "step"


def out_of_memory_report(
    err: BaseException, step: int, advice: MemoryAdvice | None, checkpoint: Path | None
) -> str:
    """What :class:`TrainingOutOfMemory` says: the phase of ``step`` that ran out of memory,
    the plan's rows and total, the settings that fit and the checkpoint left as it was."""
    phase = phase_of(err.__traceback__)
    lines = [f"out of GPU memory in the {phase} phase of step {step}: {first_line(err)}"]
    if advice is None:
        lines.append(
            "No memory plan of this run here: groupwise memory CONFIG --gpu_memory SIZE plans it "
            "for a GPU, or says why it cannot."
        )
    else:
        size = f"{advice.device_bytes / 2**30:.1f} GiB"
        lines.append(f"The memory plan of this run on this {size} GPU (groupwise memory):")
        width = max(len(name) for name in advice.rows)
        lines += [f"  {name:<{width}}  {human(count):>10}" for name, count in advice.rows.items()]
        lines.append(f"  {'peak total':<{width}}  {human(advice.peak):>10}")
        if advice.fits:
            lines.append(
                "The plan is under the GPU's memory: other processes on the GPU or "
                "fragmentation (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True) may take "
                "the rest; these settings lower the peak."
            )
        lines += _settings_lines(advice)
        if advice.table:
            lines += ["", advice.table]
    if checkpoint is not None:
        lines.append(f"The last checkpoint, {checkpoint}, is as it was saved.")
    return "\n".join(lines)


def out_of_memory_error(
    args: GRPOConfig,
    model: str,
    device: torch.device,
    err: BaseException,
    step: int,
    checkpoint: Path | None,
) -> TrainingOutOfMemory:
    """The error a step that ran out of memory raises (``from err``): on a CUDA device the
    cache is emptied first, so that planning and printing have memory."""
    if device.type == "cuda":
        torch.cuda.empty_cache()
    device_bytes = device_memory(device)
    advice = plan_run(args, model, device_bytes) if device_bytes is not None else None
    return TrainingOutOfMemory(out_of_memory_report(err, step, advice, checkpoint))
