"""What fits a GPU: GRPO's peak for each way of training a model, and how far each one stretches.

For a GPU of a given size, every combination of {full fine-tuning, LoRA, QLoRA} x {AdamW,
8-bit AdamW} x {activation offloading off, on} x {gradient checkpointing off, on} is planned
with the run's other settings (:func:`groupwise.memory.plan.plan_grpo`); for each one that fits,
two searches say how far it stretches, each changing one setting:

- the longest completion at the asked group size (binary search: the peak grows with the
  completion length), up to the model's ``max_position_embeddings`` minus the prompt;
- the largest group size G (powers of two) at the asked completion length, with the same number
  of prompts per step and the same micro-batch (rows per forward/backward pass): G multiplies
  the completions generated together (the KV cache) while the update's micro-batch stays.

Pure arithmetic, like the plan it searches.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace

from .plan import MemoryOptions, plan_grpo, resolved_engine, total_bytes
from .shapes import MemoryPlanError, ModelShape
from .units import human_bytes

METHODS = ("full", "lora", "qlora")
FIT_OPTIMIZERS = ("adamw_torch", "adamw_8bit")
METHOD_NAMES = {"full": "full", "lora": "LoRA", "qlora": "QLoRA"}
MAX_GROUP = 1024  # the group-size search stops here
DEFAULT_LORA_R = 16  # TRL's ModelConfig.lora_r, for LoRA rows when the run has no rank
UNKNOWN_MAX_POSITIONS = 32768  # completion search bound when the model's context is unknown


def parse_gpu_memory(text: str) -> int:
    """'24' or '24GiB' -> 24 x 2**30 bytes (a card sold as 24 GB has 24 GiB); '24GB' -> 24e9."""
    match = re.fullmatch(r"\s*([0-9.]+)\s*(gib|gb|g)?\s*", str(text), re.I)
    if not match:
        raise MemoryPlanError(f"--gpu_memory expects a size like 24, 24GiB or 80GB, got {text!r}")
    value = float(match.group(1))
    unit = (match.group(2) or "gib").lower()
    scale = 1e9 if unit == "gb" else 2**30
    if not math.isfinite(value) or value <= 0:
        raise MemoryPlanError(f"--gpu_memory must be > 0, got {text!r}")
    return int(value * scale)


@dataclass(frozen=True)
class FitRow:
    method: str  # full | lora | qlora
    optim: str  # TRL's optim name
    offload: bool
    checkpointing: bool
    peak: int  # GRPO's peak at the asked settings
    fits: bool
    longest_completion: int | None  # at the asked G; None: nothing fits
    largest_group: int | None  # at the asked completion length; None: nothing fits
    engine: str = "hf"  # the rollout engine the combination gets (auto resolved per method)

    def to_json(self) -> dict:
        return dict(self.__dict__)


def combination(
    opts: MemoryOptions,
    method: str,
    optim: str,
    offload: bool,
    checkpointing: bool,
    dtypes: dict[str, tuple[str | None, ...]] | None = None,
) -> MemoryOptions:
    """``opts`` trained with ``method`` and ``optim``, offloading and checkpointing as given;
    ``dtypes`` maps a method to its (dtype, precision, adapter dtype[, generation dtype]), as
    the trainer resolves them. ``generation_engine: auto`` is resolved for each method in the
    plan itself (plan.resolved_engine): a full fine-tune, LoRA and QLoRA may get different
    engines, and the static engine holds a weight copy only for a full fine-tune."""
    rank = opts.lora_r or DEFAULT_LORA_R
    default = (opts.dtype, opts.precision, opts.adapter_dtype, opts.generation_dtype)
    chosen = (dtypes or {}).get(method, default)
    dtype, precision, adapter_dtype = chosen[:3]
    generation = chosen[3] if len(chosen) > 3 else opts.generation_dtype
    return replace(
        opts,
        lora_r=0 if method == "full" else rank,
        load_in_4bit=method == "qlora",
        optimizer=optim,
        activation_offloading=offload,
        gradient_checkpointing=checkpointing,
        dtype=dtype,
        precision=precision,
        adapter_dtype=adapter_dtype,
        generation_dtype=generation,
    )


def _peak(shape: ModelShape, opts: MemoryOptions) -> int:
    return total_bytes(plan_grpo(shape, opts))


def longest_completion(shape: ModelShape, opts: MemoryOptions, budget: int) -> int | None:
    """The longest completion (tokens) whose peak fits ``budget`` bytes, other settings kept."""
    limit = (shape.max_positions or UNKNOWN_MAX_POSITIONS) - opts.prompt_len
    if limit < 1:
        return None

    def fits(length: int) -> bool:
        mean = opts.mean_completion_len
        changed = replace(
            opts, completion_len=length,
            mean_completion_len=None if mean is None else min(mean, length),
        )  # fmt: skip
        return _peak(shape, changed) <= budget

    if not fits(1):
        return None
    low, high = 1, limit  # fits(low) holds
    while low < high:
        mid = (low + high + 1) // 2
        if fits(mid):
            low = mid
        else:
            high = mid - 1
    return low


def group_options(opts: MemoryOptions, group: int) -> MemoryOptions:
    """``opts`` with ``group`` completions per prompt: the same prompts per step and, where it
    divides the step, the same micro-batch; every completion generated together."""
    prompts = opts.batch * opts.grad_accum // opts.group_size
    completions = prompts * group
    batch = math.gcd(opts.batch, completions)
    return replace(opts, group_size=group, batch=batch, grad_accum=completions // batch)


def largest_group(shape: ModelShape, opts: MemoryOptions, budget: int) -> int | None:
    """The largest power-of-two group size (>= 2) whose peak fits ``budget`` bytes."""
    best = None
    group = 2
    while group <= MAX_GROUP and _peak(shape, group_options(opts, group)) <= budget:
        best = group
        group *= 2
    return best


def fit_rows(
    shape: ModelShape,
    opts: MemoryOptions,
    budget: int,
    dtypes: dict[str, tuple[str | None, ...]] | None = None,
) -> list[FitRow]:
    """Every combination, smallest peak first."""
    if not shape.has_layer_shapes or shape.vocab is None:
        raise MemoryPlanError(
            "--gpu_memory needs the model's layer shapes: give --model, or --layers, --hidden, "
            "--heads, --intermediate and --vocab"
        )
    rows = []
    for method in METHODS:
        for optim in FIT_OPTIMIZERS:
            for offload in (False, True):
                for checkpointing in (False, True):
                    o = combination(opts, method, optim, offload, checkpointing, dtypes)
                    peak = _peak(shape, o)
                    fits = peak <= budget
                    rows.append(
                        FitRow(
                            method, optim, offload, checkpointing, peak, fits,
                            longest_completion(shape, o, budget) if fits else None,
                            largest_group(shape, o, budget) if fits else None,
                            resolved_engine(shape, o),
                        )
                    )  # fmt: skip
    return sorted(rows, key=lambda r: (r.peak, METHODS.index(r.method)))


def format_fits(shape: ModelShape, opts: MemoryOptions, budget: int, rows: list[FitRow]) -> str:
    """The fit table: one line per combination, what fits first."""
    prompts = opts.batch * opts.grad_accum // opts.group_size
    fitting = [r for r in rows if r.fits]
    gib = budget / 2**30
    lines = [
        f"What fits a {gib:g} GiB GPU ({human_bytes(budget)}): {shape.name}, GRPO, {prompts} "
        f"prompts x G {opts.group_size} per step, micro-batches of {opts.batch}, prompt "
        f"{opts.prompt_len} + completion {opts.completion_len} tokens "
        f"({len(fitting)} of {len(rows)} combinations fit)",
        "",
        f"{'method':<7}{'optim':<13}{'offload':<9}{'checkpointing':<15}{'engine':<8}"
        f"{'peak':>10}  {'fits':<6}"
        f"{'longest completion @G' + str(opts.group_size):>26}"
        f"{'largest G @' + str(opts.completion_len):>18}",
    ]
    for r in rows:
        longest = f"{r.longest_completion:,}" if r.longest_completion else "-"
        group = str(r.largest_group) if r.largest_group else "-"
        lines.append(
            f"{METHOD_NAMES[r.method]:<7}{r.optim:<13}{'on' if r.offload else 'off':<9}"
            f"{'on' if r.checkpointing else 'off':<15}{r.engine:<8}{human_bytes(r.peak):>10}  "
            f"{'yes' if r.fits else 'no':<6}{longest:>26}{group:>18}"
        )
    limit = shape.max_positions or UNKNOWN_MAX_POSITIONS
    lines.append(
        f"LoRA rows: rank {opts.lora_r or DEFAULT_LORA_R}; completions searched up to {limit:,} "
        f"- prompt tokens (max_position_embeddings{'' if shape.max_positions else ', unknown'}), "
        f"G over powers of two up to {MAX_GROUP}; offloaded activations live in host memory; "
        "engine: the rollout engine each row gets (generation_engine auto resolves per method)"
        + ("; vLLM's own memory is not counted" if any(r.engine == "vllm" for r in rows) else "")
        + "."
    )
    return "\n".join(lines)
