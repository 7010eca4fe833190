"""The command line of ``groupwise memory`` (also ``python -m groupwise.memory``).

``groupwise memory [CONFIG.yaml] [--model NAME | --params 7e9 --layers ..] [--json] [--measure]``

Options: command line over a YAML config's values over :class:`groupwise.config.GRPOConfig`'s
defaults. Prints :func:`~groupwise.memory.plan.format_table` or, with ``--json``, the plan's
JSON; ``--measure`` adds :mod:`groupwise.memory.measure`'s results. The hidden ``--_child SPEC``
is the entry of a measurement's subprocess.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from dataclasses import asdict, replace
from typing import Any

from .measure import (
    _RESULT_MARK,
    _child_main,
    format_measurement,
    ppo_available,
    run_measurement,
)
from .plan import (
    ACCOUNTINGS,
    DTYPE_BYTES,
    OPTIMIZERS,
    PRECISIONS,
    MemoryOptions,
    MemoryPlanError,
    ModelShape,
    _flags,
    format_table,
    infer_intermediate,
    make_plan,
    resolve_model_shape,
)


class _ArgError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse would exit; main() returns 2 instead
        raise _ArgError(message)


def parse_count(text: str) -> int:
    """'7e9', '7B', '135M', '1.5b' -> an integer count."""
    match = re.fullmatch(r"\s*([0-9.]+(?:e[+-]?[0-9]+)?)\s*([kmbt]?)\s*", str(text), re.I)
    if not match:
        raise ValueError(text)
    scale = {"": 1, "k": 1e3, "m": 1e6, "b": 1e9, "t": 1e12}[match.group(2).lower()]
    value = float(match.group(1)) * scale
    if not math.isfinite(value) or value < 0:
        raise ValueError(text)
    return int(round(value))


def _count_arg(text: str) -> int:
    try:
        return parse_count(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a count like 7e9, 7B or 135M, got {text!r}"
        ) from None


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="groupwise memory",
        description="Memory plan for PPO and GRPO side by side (see groupwise.memory's docstring "
        "for exactly what is counted).",
    )
    p.add_argument("config", nargs="?", help="a groupwise YAML config supplying defaults")
    m = p.add_argument_group("model (a built-in name, a local HF folder, or shapes)")
    m.add_argument(
        "--model", help="tiny-random, smollm2-135m-instruct, or a folder with config.json"
    )
    m.add_argument("--params", type=_count_arg, help="parameter count, e.g. 7e9 or 7B")
    for flag in ("layers", "hidden", "heads", "kv-heads", "vocab", "intermediate", "head-dim"):
        m.add_argument(f"--{flag}", type=int)
    m.add_argument("--tie-embeddings", action="store_true", default=None)
    t = p.add_argument_group("training")
    t.add_argument("--dtype", choices=list(DTYPE_BYTES))
    t.add_argument("--precision", choices=list(PRECISIONS))
    t.add_argument("--optimizer", choices=list(OPTIMIZERS))
    t.add_argument("--lora-r", type=int, help="LoRA rank (0: full fine-tuning)")
    t.add_argument("--lora-targets", help="comma-separated, e.g. q_proj,v_proj (default: all)")
    t.add_argument("--batch", type=int, help="completions per micro-batch")
    t.add_argument("--group-size", type=int, help="G, completions per prompt")
    t.add_argument("--grad-accum", type=int, help="micro-batches per step")
    t.add_argument("--prompt-len", type=int)
    t.add_argument("--completion-len", type=int)
    t.add_argument("--gradient-checkpointing", action="store_true", default=None)
    t.add_argument("--logprob-impl", choices=["chunked", "naive"])
    t.add_argument("--logprob-chunk-size", type=int)
    t.add_argument("--beta", type=float, help="KL coefficient; 0: no reference model")
    t.add_argument("--reward-model-params", type=_count_arg, help="0: rule rewards")
    o = p.add_argument_group("output")
    o.add_argument("--accounting", choices=list(ACCOUNTINGS), default="full")
    o.add_argument("--json", action="store_true", help="print one JSON object")
    o.add_argument("--measure", action="store_true", help="run real steps and compare")
    o.add_argument("--measure-steps", type=int, default=1)
    o.add_argument("--device", default="auto", help="device for --measure: auto, cpu, cuda")
    o.add_argument("--_child", help=argparse.SUPPRESS)
    return p


def _config_defaults(path: str | None) -> dict[str, Any]:
    """Planner defaults from GRPOConfig (a YAML file's values, else the dataclass defaults)."""
    if path is None:
        from dataclasses import fields

        from ..config import GRPOConfig

        cfg = {f.name: f.default for f in fields(GRPOConfig)}
    else:
        from ..config import ConfigError, GRPOConfig

        try:
            cfg = asdict(GRPOConfig.from_yaml(path))
        except ConfigError as err:
            raise MemoryPlanError(str(err)) from None
    dtype = {"float32": "fp32", "bfloat16": "bf16"}.get(cfg["dtype"])  # auto: the default below
    return {
        "model": cfg["model"],
        "dtype": dtype,
        "batch": cfg["per_device_train_batch_size"],
        "group_size": cfg["num_generations"],
        "grad_accum": cfg["gradient_accumulation_steps"],
        "prompt_len": cfg["max_prompt_length"] or 512,
        "completion_len": cfg["max_completion_length"],
        "gradient_checkpointing": cfg["gradient_checkpointing"],
        "logprob_impl": cfg["logprob_impl"],
        "logprob_chunk_size": cfg["logprob_chunk_size"],
        "beta": cfg["beta"],
        "lora_r": cfg["lora_r"] if cfg["use_peft"] else 0,
        "lora_targets": cfg["lora_target_modules"],
    }


def options_from_args(args: argparse.Namespace) -> tuple[ModelShape, MemoryOptions, str]:
    """Resolve the model shape and the options: command line over CONFIG over defaults."""
    base = _config_defaults(args.config)
    pick = {
        k: getattr(args, k) if getattr(args, k, None) is not None else v for k, v in base.items()
    }
    shape_flags = ("layers", "hidden", "heads", "kv_heads", "vocab", "intermediate", "head_dim")
    custom = args.params is not None or any(getattr(args, f) is not None for f in shape_flags)
    if args.model is None and custom:
        shape = ModelShape(name="custom")
        model = "custom"
    else:
        model = pick["model"]
        shape = resolve_model_shape(model)
    overrides = {f: getattr(args, f) for f in shape_flags if getattr(args, f) is not None}
    if args.tie_embeddings:
        overrides["tie_embeddings"] = True
    if args.params is not None:
        if args.params <= 0:
            raise MemoryPlanError(f"--params must be > 0, got {args.params}")
        overrides["params"] = args.params
    for name, value in overrides.items():
        if name != "params" and value < 1:
            raise MemoryPlanError(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    shape = replace(shape, **overrides)
    if shape.heads is not None and shape.head_dim is None and shape.hidden is not None:
        if shape.hidden % shape.heads:
            raise MemoryPlanError(
                f"--hidden {shape.hidden} is not divisible by --heads {shape.heads}; "
                "give --head-dim"
            )
    if shape.kv_heads is not None and shape.heads is not None and shape.heads % shape.kv_heads:
        raise MemoryPlanError(
            f"--heads {shape.heads} must be a multiple of --kv-heads {shape.kv_heads}"
        )
    if shape.params is not None and shape.intermediate is None:
        shape = infer_intermediate(shape)
    if shape.params is None and shape.missing("hidden", "layers", "heads", "intermediate", "vocab"):
        missing = shape.missing("hidden", "layers", "heads", "intermediate", "vocab")
        raise MemoryPlanError(f"give --params, or all of the shapes (missing {_flags(missing)})")
    targets = pick["lora_targets"]
    if isinstance(targets, str):
        targets = [t.strip() for t in targets.split(",") if t.strip()]
    opts = MemoryOptions(
        dtype=pick["dtype"] or "bf16",
        precision=args.precision or "mixed",
        optimizer=args.optimizer or "adamw",
        lora_r=pick["lora_r"] or 0,
        lora_targets=tuple(targets) if targets else None,
        batch=pick["batch"],
        group_size=pick["group_size"],
        grad_accum=pick["grad_accum"],
        prompt_len=pick["prompt_len"],
        completion_len=pick["completion_len"],
        gradient_checkpointing=bool(pick["gradient_checkpointing"]),
        logprob_impl=pick["logprob_impl"],
        logprob_chunk_size=pick["logprob_chunk_size"],
        beta=pick["beta"],
        reward_model_params=args.reward_model_params or 0,
    )
    opts.validate()
    if opts.lora_r:
        shape.lora_params(opts.lora_r, opts.lora_targets)  # raises on missing shapes/targets
    return shape, opts, model


def main(argv: list[str] | None = None) -> int:
    """``groupwise memory ...``; returns the exit status (2 for bad options)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        if args._child is not None:
            result = _child_main(json.loads(args._child))
            print(_RESULT_MARK + json.dumps(result), flush=True)
            return 0
        shape, opts, model = options_from_args(args)
        plan = make_plan(shape, opts, args.accounting)
        if args.measure and args.measure_steps < 1:
            raise MemoryPlanError(f"--measure-steps must be >= 1, got {args.measure_steps}")
        if args.measure and model == "custom":
            raise MemoryPlanError("--measure needs --model (a built-in name or a local folder)")
    except (_ArgError, MemoryPlanError) as err:
        print(f"groupwise memory: error: {err}", file=sys.stderr)
        return 2
    if plan.missing and args.json:
        rows = ", ".join(f"{k} ({v})" for k, v in plan.missing.items())
        print(f"groupwise memory: not in the totals: {rows}", file=sys.stderr)
    measured = None
    if args.measure:
        if not ppo_available():
            print(
                "groupwise memory: groupwise.ppo is not available yet: measuring GRPO only",
                file=sys.stderr,
            )
        measured = run_measurement(model, opts, steps=args.measure_steps, device=args.device)
    if args.json:
        out = plan.to_json()
        if measured is not None:
            out["measured"] = {r["algorithm"]: r for r in measured}
        print(json.dumps(out, indent=2))
    else:
        print(format_table(plan))
        if measured is not None:
            print(format_measurement(measured))
    return 0
