"""The memory plan as a table: PPO | GRPO side by side in human units, the settings above it,
the alternatives not chosen and the reconciliation of the often-quoted 7B figures below."""

from __future__ import annotations

import textwrap

from .engine import static_copies_weights, static_slots
from .plan import (
    DTYPE_BYTES,
    GENERATION_WEIGHTS,
    HOST_ROWS,
    POLICY_STEP,
    PREFILL,
    QUOTED_NOTE,
    ROW_NOTES,
    ROW_ORDER,
    STATIC_LOAD,
    MemoryOptions,
    MemoryPlan,
    generation_dtype,
    quoted_trained_only,
    quoted_weights_only,
    resolved_engine,
    trained_bytes_per_param,
    trained_dtype,
)
from .shapes import LORA_TARGETS
from .units import human_bytes, human_count


def quoted_lines(params: int, dtype: str) -> list[str]:
    """The reconciliation of the often-quoted figures, for this parameter count and dtype."""
    width = DTYPE_BYTES[dtype]
    copy = params * width
    weights = quoted_weights_only(params, width)
    trained = quoted_trained_only(params, width)
    usual = 16 * params  # mixed precision: 2 + 2 + 4 + 4 + 4 bytes per trained parameter
    backbone = params  # the critic ~ the policy at this level of accounting
    ppo16 = usual + 16 * backbone + 2 * copy
    grpo16, grpo16_rule = usual + 2 * copy, usual + copy
    return [
        f"The often-quoted figures ({QUOTED_NOTE}), for {human_count(params)} parameters in "
        f"{dtype}:",
        f"  one model copy, weights only ({width} B/param): {human_bytes(copy)}",
        f"  weights only: PPO 4 copies {human_bytes(sum(weights['ppo'].values()))}, GRPO 3 copies "
        f"(actor, reference, reward model) {human_bytes(sum(weights['grpo'].values()))}"
        "   [--accounting weights-only]",
        f"  trained networks at {4 * width} B/param (weights, gradients, Adam m and v all in "
        f"{dtype}), frozen ones not counted: PPO actor + critic "
        f"{human_bytes(sum(trained['ppo'].values()))}, GRPO actor "
        f"{human_bytes(sum(trained['grpo'].values()))}, ratio 0.50   [--accounting quoted; "
        "the only accounting tried that gives 112 vs 56 GB exactly for 7B fp16]",
        f"  the usual 16 B per trained parameter (mixed precision) is {human_bytes(usual)} for "
        f"one trained network alone: PPO (actor + critic trained, reference and reward model "
        f"frozen) {human_bytes(ppo16)} vs GRPO {human_bytes(grpo16)} (ratio "
        f"{grpo16 / ppo16:.2f}), {human_bytes(grpo16_rule)} with rule rewards "
        f"(ratio {grpo16_rule / (ppo16 - copy):.2f} against PPO without a reward model)",
    ]


def _weights_note(o: MemoryOptions) -> str:
    if o.load_in_4bit:
        quant = "double-quantised " if o.double_quant else ""
        return (
            f"{quant}NF4 linears, embeddings/norms/LM head in {o.dtype}; adapter in "
            f"{o.adapter_dtype or o.dtype}"
        )
    if o.lora_r:
        return f"frozen base in {o.dtype}, adapter in {o.adapter_dtype or o.dtype}"
    return f"every parameter, {o.dtype}"


def _engine_line(plan: MemoryPlan) -> str:
    """Which rollout engine the plan prices, and what it holds."""
    o = plan.options
    engine = resolved_engine(plan.shape, o)
    how = f"auto on {o.device}" if o.generation_engine == "auto" else "as set"
    if engine == "static":
        what = (
            f"its own {generation_dtype(o)} weight copy, loaded one layer at a time"
            if static_copies_weights(o.lora_r) else
            "no weight copy: it reads the policy's frozen base in place, adapters unmerged"
        )  # fmt: skip
    elif engine == "vllm":
        what = "vLLM's own memory not counted"
    else:
        what = "samples from the policy's own weights"
    return f"  rollout engine: {engine} ({how}): {what}"


def _kv_note(plan: MemoryPlan) -> str:
    o = plan.options
    sequences = o.batch * o.grad_accum
    if resolved_engine(plan.shape, o) != "static":
        return f"{sequences} sequences x {o.prompt_len + o.completion_len} tokens, {o.dtype}"
    slots = static_slots(o.prompt_len + o.completion_len, o.device, o.cuda_graphs)
    return (
        f"prompt cache ({sequences // o.group_size}) + row cache ({sequences}) x {slots} slots, "
        f"{generation_dtype(o)}"
    )


def _settings_lines(plan: MemoryPlan) -> list[str]:
    o = plan.options
    per = trained_bytes_per_param(o)
    trained = trained_dtype(o)
    precision = (
        f"{trained}, {o.precision} precision" if DTYPE_BYTES[trained] < 4 else "fp32"
    ) + (
        f" trained parameters ({o.dtype} frozen base)" if trained != o.dtype else ""
    ) + (
        f": per trained parameter {per['weights']} B weights + {per['gradients']} B gradients + "
        f"{per['master']} B fp32 master + {per['optimizer']} B {o.optimizer} states = "
        f"{sum(per.values())} B"
        + (" (8-bit: + block statistics)" if o.optimizer_kind != "adamw" and
           o.optimizer_kind != "sgd" else "")
    )  # fmt: skip
    tuning = ("QLoRA (NF4 base), " if o.load_in_4bit else "") + (
        f"LoRA r={o.lora_r} on {','.join(o.lora_targets or LORA_TARGETS)} "
        f"({human_count(plan.shape.lora_params(o.lora_r, o.lora_targets))} trainable)"
        if o.lora_r
        else "full fine-tuning"
    )
    return [
        f"groupwise memory plan: {plan.shape.describe()}",
        f"  {precision}; {tuning}",
        f"  {o.batch} completions per micro-batch x {o.grad_accum} accumulation, group size "
        f"{o.group_size}, prompt {o.prompt_len} + completion {o.completion_len} tokens, "
        f"{o.logprob_impl} log-probs"
        + (f" ({o.logprob_chunk_size} tokens per chunk)" if o.logprob_impl == "chunked" else "")
        + (", gradient checkpointing" if o.gradient_checkpointing else ", no checkpointing")
        + (", activation offloading" if o.activation_offloading else "")
        + (
            f", padding-free update ({o.update_completion_len} completion tokens per row)"
            if o.padding_free
            else ""
        ),  # fmt: skip
        f"  beta {o.beta:g}"
        + (" (no reference model)" if o.beta == 0 else "")
        + (
            f", reward model of {human_count(o.reward_model_params)} parameters"
            if o.reward_model_params
            else ", rule rewards (no reward model)"
        ),
        _engine_line(plan),
    ]


def format_table(plan: MemoryPlan) -> str:
    """Side-by-side PPO | GRPO table in human units, with totals and the GRPO/PPO ratio."""
    o = plan.options
    lines: list[str] = []
    if plan.accounting == "full":
        for line in _settings_lines(plan):
            lines.append(textwrap.fill(line, 100, subsequent_indent="    "))
    else:
        what = (
            "trained networks only, each at weights + gradients + Adam m, v in "
            f"{o.dtype}; frozen networks not counted (reproduces the quoted 112 vs 56 GB)"
            if plan.accounting == "quoted"
            else f"weights only, one {o.dtype} copy per network (reward model as large as the "
            "policy, as the quoted figures assume)"
        )
        lines += [
            f"groupwise memory plan ({plan.accounting} accounting): {plan.shape.describe()}",
            f"  {what}",
        ]
    notes = {
        "dtype": o.dtype,
        "weights": _weights_note(o),
        "trained_dtype": trained_dtype(o),
        "slack": o.allocator_slack,
        "optimizer": {
            "adamw": "AdamW m and v",
            "adamw8bit": "8-bit AdamW m and v, absmax per 256 (tensors < 4096: fp32)",
            "paged_adamw8bit": "paged 8-bit AdamW (unified memory: may spill to host)",
            "paged_adamw32bit": "paged fp32 AdamW (unified memory: may spill to host)",
            "sgd": "",
        }[o.optimizer_kind],
        "logits": f"{o.logprob_impl} log-probs",
        "shared": (
            "; a group's prompt encoded once"
            if o.share_prompt and not o.gradient_checkpointing and o.batch % o.group_size == 0
            else ""
        ),
        "reference": "adapter-disabled base, no copy" if o.lora_r else "frozen copy",
        "generation_dtype": generation_dtype(o),
        "kv": _kv_note(plan) if plan.shape.has_layer_shapes else "",
    }
    present = {**plan.ppo, **plan.grpo, **plan.missing}
    names = list(present)
    if plan.accounting == "full":
        names = [k for k in ROW_ORDER if k in present] + [k for k in names if k not in ROW_ORDER]
    width = max(len(n) for n in names + ["peak total", *plan.alternatives]) + 2
    lines.append("")
    lines.append(f"{'component':<{width}}{'PPO':>12}{'GRPO':>12}   note")

    def cell(value: int | None, row: str, table: dict[str, int]) -> str:
        if row in plan.missing and row not in table:
            return "?"
        return "-" if value is None else human_bytes(value)

    for name in names:
        note = plan.missing.get(name) or (
            ROW_NOTES.get(name, "").format(**notes) if plan.accounting == "full" else ""
        )
        ppo = cell(plan.ppo.get(name), name, plan.ppo)
        grpo = "-" if name.startswith("critic") else cell(plan.grpo.get(name), name, plan.grpo)
        lines.append(f"{name:<{width}}{ppo:>12}{grpo:>12}   {note}".rstrip())
    lines.append("-" * (width + 24))
    lines.append(
        f"{'peak total':<{width}}{human_bytes(plan.ppo_total):>12}"
        f"{human_bytes(plan.grpo_total):>12}"
    )
    lines.append(f"{'GRPO / PPO':<{width}}{'':>12}{plan.ratio:>12.2f}")
    if plan.accounting == "full":
        lines.append(
            textwrap.fill(
                "peak = resident (weights, master weights, optimizer states"
                + (", the static engine's weight copy" if GENERATION_WEIGHTS in present else "")
                + (", the CUDA context, the allocator's slack" if o.cuda_context_bytes else "")
                + ") + max(generation: KV cache + sampler logits, update: gradients + "
                "activations + logits"
                + (", step: the optimizer's buffers + gradients" if POLICY_STEP in present else "")
                + (", sync: the static engine's one-layer load" if STATIC_LOAD in present else "")
                + (", prefill: the prompts' cache + one layer" if PREFILL in present else "")
                + ")"
                + ("; host rows are not GPU memory" if any(k in HOST_ROWS for k in present) else "")
                + "; GB = 1e9 bytes",
                100,
            )
        )
        if plan.missing:
            lines.append("'?': not in the totals, " + "; ".join(sorted(set(plan.missing.values()))))
    if plan.alternatives:
        lines.append("")
        lines.append("not in the totals (the other choice of each option):")
        for name, (ppo, grpo) in plan.alternatives.items():
            ppo_s = human_bytes(ppo) if ppo is not None else "-"
            grpo_s = human_bytes(grpo) if grpo is not None else "-"
            lines.append(f"{name:<{width}}{ppo_s:>12}{grpo_s:>12}")
    if plan.accounting == "full":
        lines.append("")
        for line in quoted_lines(plan.shape.num_params(), o.dtype):
            lines.append(textwrap.fill(line, 100, subsequent_indent="    "))
    return "\n".join(lines)
