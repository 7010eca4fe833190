"""Where groupwise's ``GRPOConfig`` deliberately differs from TRL's.

``groupwise.GRPOConfig()`` means what ``trl.GRPOConfig()`` means: every option that TRL's
``GRPOConfig`` (with the ``TrainingArguments`` fields it inherits) also has takes TRL's default
and TRL's meaning, except the differences in :data:`DIFFERENCES`, each with its reason. The
tests compare every field of the installed TRL (whose version must be :data:`TRL_VERSION`)
with groupwise's read-back, and fail on a difference missing here or on an entry here that no
longer differs; the docs' TRL page renders this list (``scripts/mkdocs_hooks.py``).

A run says the differences its settings depend on when it starts (:func:`differences_in_effect`)
and when it cuts a prompt (:func:`prompt_cut_message`). groupwise never imports trl.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .grpo_config import GRPOConfig

TRL_VERSION = "1.16.0"  # the TRL release DIFFERENCES was checked against


class TRLDifferenceWarning(UserWarning):
    """A run depends on one of the deliberate differences from TRL (:data:`DIFFERENCES`)."""


@dataclass(frozen=True)
class Difference:
    """One deliberate difference: groupwise's default or meaning, TRL's, and why."""

    groupwise: str
    trl: str
    reason: str
    # True: both read back the same default and only what it does differs; False: the
    # values read back differ (or TRL has no such option).
    same_default: bool = False


DIFFERENCES: dict[str, Difference] = {
    "output_dir": Difference(
        groupwise="`None`: each run writes to a new folder `runs/<model>-<task>-<time>`",
        trl='`"trainer_output"`',
        reason="a run never writes into an earlier run's folder; reusing one takes "
        "`overwrite_output_dir` or `resume_from_checkpoint`",
    ),
    "bf16": Difference(
        groupwise="`None` (auto): bf16 autocast on a GPU with bf16, float32 elsewhere; the run "
        "says which at its start",
        trl="`True` unless `fp16` (TrainingArguments refuses it on a CPU without `use_cpu`)",
        reason="the same script runs on a CPU, and on a GPU without bf16, without an error",
    ),
    "device": Difference(
        groupwise='an option: `"auto"` (CUDA if there is one), `"cpu"`, `"cuda"` or `"cuda:N"`',
        trl="`TrainingArguments.device`: a read-only `torch.device` derived from the "
        "accelerator state",
        reason="one option picks the device; there is no accelerate launcher to derive it from",
    ),
    "max_prompt_length": Difference(
        groupwise="`512`: a longer prompt keeps its last 512 tokens (the run says so when it "
        "cuts one; `None` keeps every prompt whole)",
        trl=f"no such option in TRL {TRL_VERSION} (removed in 1.0): prompts are never cut",
        reason="a prompt longer than the model's context would fail generation; its end holds "
        "the question and the generation prompt",
    ),
    "max_tool_calling_iterations": Difference(
        groupwise="`None`: at most `max_turns - 1` = 3 tool rounds and `max_tool_calls` = 8 "
        "calls per rollout; each tool reply is cut at `max_tool_output_tokens` = 256 tokens",
        trl="`None`: no limit",
        reason="a model that keeps calling tools would never finish its rollout",
        same_default=True,
    ),
    "vllm_max_model_length": Difference(
        groupwise="`None`: `max_prompt_length + max_completion_length` tokens",
        trl="`None`: the model's context length",
        reason="vLLM reserves KV cache for the longest sequence it may see; no sequence of a "
        "run is longer, so the same memory holds more sequences",
        same_default=True,
    ),
    "generation_batch_size": Difference(
        groupwise="`None`, resolved where it is used (`config.completions_per_generation`, "
        "per process)",
        trl="resolved when the config is made: `per_device_train_batch_size` x processes x "
        "`steps_per_generation`",
        reason="a saved config resumes on another number of processes; `None` keeps "
        "following the batch options",
    ),
    "steps_per_generation": Difference(
        groupwise="`None`, resolved where it is used (`config.micro_steps_per_generation`); "
        "it must be a multiple of `gradient_accumulation_steps`",
        trl="resolved when the config is made: `gradient_accumulation_steps`; any value whose "
        "generation batch holds whole groups (an optimizer step may span two generation "
        "batches)",
        reason="a saved config keeps following `gradient_accumulation_steps`; every optimizer "
        "step is taken on one generation batch, so a checkpoint never holds half a step",
    ),
    "save_steps": Difference(
        groupwise="`500`; when a generation batch trains several optimizer steps, a multiple "
        "of `save_steps` (of `logging_steps`, `eval_steps`) among them saves (logs, "
        "evaluates) once, when the batch ends, named by the step count then",
        trl="`500`; at that optimizer step, inside the generation batch",
        reason="a checkpoint between a generation batch's optimizer steps would have to hold "
        "the rest of the batch to resume exactly",
        same_default=True,
    ),
    "eval_steps": Difference(
        groupwise="`0`: no evaluation during training (`eval_strategy` reads back `no`)",
        trl="`None` (under `eval_strategy` `no`, the same)",
        reason="an integer cadence; `eval_strategy` `steps` without `eval_steps` still takes "
        "`logging_steps`, as in TRL",
    ),
    "lr_scheduler_type": Difference(
        groupwise="`linear`; `constant` warms up over `warmup_steps` / `warmup_ratio` "
        "(`constant_with_warmup` is read as `constant`); only `constant`, `linear` and "
        "`cosine` exist",
        trl="`linear`; `constant` has no warmup; every transformers scheduler",
        reason="one constant schedule with an optional warmup; the other schedules are not "
        "implemented and are refused",
        same_default=True,
    ),
    "epsilon_high": Difference(
        groupwise="`None`: `epsilon`, but with `loss_type` `cispo` 5.0 (the weight cap)",
        trl="`None`: `epsilon` (0.2), also as CISPO's weight cap",
        reason="a CISPO cap of 0.2 scales every on-policy weight by 0.2; TRL's docs advise 5.0",
        same_default=True,
    ),
    "vllm_importance_sampling_mode": Difference(
        groupwise="`token_truncate` (`rollout_correction_mode`): each token's weight capped at "
        "`rollout_correction_clip_max`",
        trl="`sequence_mask`: a completion whose summed log-ratio passes the bounds is dropped",
        reason="over 512-token completions a bf16 sampler's small per-token gaps (0.03 nats) "
        "sum past ln 3 in 11-12% of completions with the static engine, which sequence_mask "
        "would drop; no token passes the cap (benchmarks/rollout_correction.py)",
    ),
}


def _output_dir(config: GRPOConfig, device: str, autocast: bool) -> str | None:
    if config.is_set("output_dir"):
        return None
    where = config.output_dir or "a new folder runs/<model>-<task>-<time>"
    return f"output_dir was not given: this run writes to {where} (TRL: trainer_output)"


def _bf16(config: GRPOConfig, device: str, autocast: bool) -> str | None:
    if config.bf16_autocast is not None:
        return None
    precision = "bf16 autocast" if autocast else "float32, no bf16 autocast"
    return (
        f"bf16 was not given: auto gives {precision} on this {device} (TRL's default is "
        "bf16=True; give bf16=True or False to choose)"
    )


def _tool_rounds(config: GRPOConfig, device: str, autocast: bool) -> str | None:
    if not (config.tools or config.environment) or config.is_set("max_turns"):
        return None
    return (
        f"max_tool_calling_iterations was not given: at most {config.max_turns - 1} tool rounds "
        f"(max_turns={config.max_turns}) and {config.max_tool_calls} tool calls per rollout "
        "(TRL: no limit)"
    )


def _vllm_length(config: GRPOConfig, device: str, autocast: bool) -> str | None:
    if (
        config.generation_engine != "vllm"
        or config.vllm_max_model_length is not None
        or config.max_prompt_length is None
    ):
        return None
    length = config.max_prompt_length + config.max_completion_length
    return (
        f"vllm_max_model_length was not given: vLLM's context is max_prompt_length + "
        f"max_completion_length = {length} tokens (TRL: the model's context length)"
    )


def _batch_cadence(config: GRPOConfig, device: str, autocast: bool) -> str | None:
    per_batch = config.optimizer_steps_per_step
    names = ("logging_steps", "save_steps", "eval_steps")
    off = [n for n in names if per_batch > 1 and getattr(config, n) % per_batch]
    if not off:
        return None
    return (
        f"each generation batch trains {per_batch} optimizer steps, so "
        f"{', '.join(f'{n}={getattr(config, n)}' for n in off)} act when the batch that holds "
        "such a step ends (TRL: at that optimizer step)"
    )


def _constant_warmup(config: GRPOConfig, device: str, autocast: bool) -> str | None:
    if config.lr_scheduler_type != "constant" or not (config.warmup_steps or config.warmup_ratio):
        return None
    warmup = config.warmup_steps or f"warmup_ratio={config.warmup_ratio:g} of the steps"
    return (
        f"lr_scheduler_type=constant warms up over {warmup} first (TRL's "
        "constant_with_warmup; TRL's constant has no warmup)"
    )


def _cispo_cap(config: GRPOConfig, device: str, autocast: bool) -> str | None:
    if config.loss_type != "cispo" or config.epsilon_high is not None:
        return None
    cap = config.effective_epsilon_high
    return (
        f"epsilon_high was not given with loss_type=cispo: the weight cap is {cap:g} "
        f"(TRL: epsilon, {config.epsilon:g})"
    )


def _correction_mode(config: GRPOConfig, device: str, autocast: bool) -> str | None:
    """Rollout correction applies where the sampler's log-probs are recorded: the static and
    vLLM engines (auto picks the static one on CUDA) and bf16 generation."""
    engine = config.generation_engine
    samples_apart = engine in ("static", "vllm") or (engine == "auto" and device == "cuda")
    recorded = samples_apart or config.generation_dtype == "bfloat16"
    if not config.rollout_correction or config.is_set("rollout_correction_mode") or not recorded:
        return None
    return (
        "rollout_correction_mode was not given: token_truncate caps each token's weight "
        "(TRL's vllm_importance_sampling_mode default, sequence_mask, drops a whole completion "
        "whose summed log-ratio passes the cap)"
    )


# Each difference a run's settings can depend on at its start -> the line saying how, or None.
# max_prompt_length is said where prompts are tokenised (prompt_cut_message); the others
# (device, generation_batch_size, steps_per_generation, eval_steps) change only what a
# script reads back, not what the run does.
_IN_EFFECT: dict[str, Callable[[GRPOConfig, str, bool], str | None]] = {
    "output_dir": _output_dir,
    "bf16": _bf16,
    "max_tool_calling_iterations": _tool_rounds,
    "vllm_max_model_length": _vllm_length,
    "save_steps": _batch_cadence,
    "lr_scheduler_type": _constant_warmup,
    "epsilon_high": _cispo_cap,
    "vllm_importance_sampling_mode": _correction_mode,
}


def differences_in_effect(
    config: GRPOConfig, device: Any = "cpu", autocast: bool = False
) -> list[str]:
    """One line for each deliberate difference from TRL (:data:`DIFFERENCES`) that this run's
    settings depend on, in the list's order. ``device``: the run's device (a ``torch.device``
    or its type), ``autocast``: whether the run uses bf16 autocast (its resolved precision)."""
    kind = str(getattr(device, "type", device))
    lines = []
    for name in DIFFERENCES:
        check = _IN_EFFECT.get(name)
        line = check(config, kind, autocast) if check is not None else None
        if line is not None:
            lines.append(line)
    return lines


def prompt_cut_message(max_prompt_length: int) -> str:
    """What a run says, once, when it first cuts a prompt at ``max_prompt_length``."""
    return (
        f"some prompts are longer than max_prompt_length={max_prompt_length} tokens and keep "
        f"only their last {max_prompt_length} (TRL {TRL_VERSION} never cuts a prompt); raise "
        "max_prompt_length, or set it to None to keep every prompt whole"
    )


def prompt_cut_warning(max_prompt_length: int | None) -> TRLDifferenceWarning | None:
    """The warning a run issues at the first prompt it cuts (None: no limit, nothing to say)."""
    if max_prompt_length is None:
        return None
    return TRLDifferenceWarning(prompt_cut_message(max_prompt_length))
