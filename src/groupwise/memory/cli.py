"""The command line of ``groupwise memory`` (also ``python -m groupwise.memory``).

``groupwise memory [CONFIG.yaml] [--model NAME | --params 7e9 --layers ..] [--json] [--measure]``

Options: command line over a YAML config's values over
:class:`groupwise.config.GRPOConfig`'s defaults. Prints :func:`~groupwise.memory.table.format_table`
or, with ``--json``, the plan's JSON; ``--measure`` adds :mod:`groupwise.memory.measure`'s results.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from .engine import planned_engine
from .fit import fit_rows, format_fits, parse_gpu_memory
from .measure import format_measurement, ppo_available, run_measurement
from .plan import (
    ACCOUNTINGS,
    DEFAULT_ALLOCATOR_SLACK,
    DEFAULT_CUDA_CONTEXT_GB,
    DTYPE_BYTES,
    GENERATION_ENGINES,
    OPTIM_NAMES,
    OPTIMIZERS,
    PRECISIONS,
    MemoryOptions,
    make_plan,
)
from .shapes import (
    MemoryPlanError,
    ModelShape,
    _flags,
    infer_intermediate,
    resolve_model_shape,
    shipped_name,
)
from .table import format_table


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


# The run's settings in GRPOConfig's spelling (``--dtype float32``) as well as the planner's
# (``--dtype fp32``); "auto" is resolved as the trainer resolves it.
_CONFIG_DTYPES = {"float32": "fp32", "bfloat16": "bf16"}


def _flag(group: Any, name: str, **kwargs: Any) -> None:
    """``--name`` in train's underscore style, and ``--na_me``, the spelling these flags had
    before (in the README's examples), as an alias."""
    spellings = [f"--{name}"]
    if "_" in name:
        spellings.append(f"--{name.replace('_', '-')}")
    group.add_argument(*spellings, dest=name, **kwargs)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="groupwise memory",
        description="Memory plan for PPO and GRPO side by side (see groupwise.memory's docstring "
        "for exactly what is counted). CONFIG is a groupwise YAML config or a run's output_dir "
        "(its config.yaml); any train option (--max_completion_length 64, ...) overrides it.",
    )
    p.add_argument("config", nargs="?", help="a groupwise YAML config or a run's output_dir")
    m = p.add_argument_group("model (a built-in name, a local HF folder, or shapes)")
    m.add_argument(
        "--model",
        help="tiny-random, smollm2-135m-instruct, a shipped shape (qwen3-8b, Qwen/Qwen2.5-7B, "
        "llama-3.1-8b, ...: groupwise.memory.shapes.shipped_configs), or a folder with "
        "config.json",
    )
    m.add_argument("--params", type=_count_arg, help="parameter count, e.g. 7e9 or 7B")
    for flag in ("layers", "hidden", "heads", "kv_heads", "vocab", "intermediate", "head_dim"):
        _flag(m, flag, type=int)
    _flag(m, "tie_embeddings", action="store_true", default=None)
    t = p.add_argument_group("training (default: CONFIG's values, as the trainer resolves them)")
    t.add_argument(
        "--dtype",
        choices=[*DTYPE_BYTES, *_CONFIG_DTYPES, "auto"],
        help="fp32, fp16, bf16 (mixed precision unless --precision pure), or the trainer's "
        "auto, float32, bfloat16 (weights and AdamW states in that dtype)",
    )
    t.add_argument("--precision", choices=list(PRECISIONS))
    t.add_argument("--optimizer", choices=list(OPTIMIZERS), help="the planner's names")
    t.add_argument("--optim", choices=list(OPTIM_NAMES), help="TRL's names (default: adamw_torch)")
    _flag(
        t, "load_in_4bit", action="store_true", default=None,
        help="QLoRA: the frozen base's linears in 4 bits (implies LoRA)",
    )  # fmt: skip
    _flag(
        t, "use_bnb_nested_quant", action="store_true", default=None,
        help="load_in_4bit: double quantisation of the 4-bit constants (QLoRA's setting)",
    )  # fmt: skip
    _flag(t, "lora_dropout", type=float, help="> 0: each adapter keeps its dropped-out input")
    _flag(t, "activation_offloading", action="store_true", default=None)
    _flag(t, "padding_free", action="store_true", default=None)
    _flag(
        t, "mean_completion_len", type=int,
        help="padding_free: the completions' mean length (default: the longest case)",
    )  # fmt: skip
    _flag(t, "lora_r", type=int, help="LoRA rank (0: full fine-tuning)")
    _flag(t, "lora_targets", help="comma-separated, e.g. q_proj,v_proj (default: all)")
    t.add_argument("--batch", type=int, help="completions per micro-batch")
    _flag(t, "group_size", type=int, help="G, completions per prompt")
    _flag(t, "grad_accum", type=int, help="micro-batches per step")
    _flag(t, "prompt_len", type=int, help="default: the longest of the task's prompts, tokenized")
    _flag(t, "completion_len", type=int, help="default: max_completion_length")
    _flag(
        t, "gradient_checkpointing", nargs="?", const=True, type=_bool_arg, default=None,
        help="default: the config's (on); --gradient_checkpointing false turns it off",
    )  # fmt: skip
    _flag(t, "logprob_impl", choices=["chunked", "naive"])
    _flag(t, "logprob_chunk_size", type=int)
    t.add_argument("--beta", type=float, help="KL coefficient; 0: no reference model")
    _flag(t, "reward_model_params", type=_count_arg, help="0: rule rewards")
    _flag(
        t, "generation_engine", choices=list(GENERATION_ENGINES),
        help="default: CONFIG's generation_engine (auto: resolved as the trainer resolves it, "
        "for each way of training in the --gpu_memory table)",
    )  # fmt: skip
    g = p.add_argument_group("the GPU (what fits)")
    _flag(
        g, "gpu_memory", help="plan for a GPU of this size (24 = 24 GiB, or 80GB) and list "
        "which ways of training fit it, and how far each stretches",
    )  # fmt: skip
    _flag(
        g, "cuda_context_gb", type=float,
        help=f"with --gpu_memory: default {DEFAULT_CUDA_CONTEXT_GB} (assumed)",
    )  # fmt: skip
    _flag(
        g, "allocator_slack", type=float,
        help=f"with --gpu_memory: default {DEFAULT_ALLOCATOR_SLACK} of the tensors (assumed)",
    )  # fmt: skip
    o = p.add_argument_group("output")
    o.add_argument("--accounting", choices=list(ACCOUNTINGS), default="full")
    o.add_argument("--json", action="store_true", help="print one JSON object")
    o.add_argument("--measure", action="store_true", help="run real steps and compare")
    _flag(o, "measure_steps", type=int, default=1)
    o.add_argument("--device", help="auto, cpu, cuda (default: CONFIG's device)")
    return p


def _bool_arg(text: str) -> bool:
    value = str(text).strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def load_run_config(path: str | None, overrides: dict[str, Any] | None = None) -> Any:
    """The run's GRPOConfig: a YAML file, a run's output_dir (its config.yaml), or the defaults;
    ``overrides`` are train options (``{"max_completion_length": "64"}``)."""
    from ..config.grpo_config import GRPOConfig
    from ..errors import ConfigError

    try:
        if path is None:
            return GRPOConfig.from_dict(dict(overrides or {}), source="command line")
        source = Path(path)
        if source.is_dir():
            if not (source / "config.yaml").is_file():
                raise MemoryPlanError(
                    f"{path} is a folder without config.yaml; give a groupwise YAML config or a "
                    "run's output_dir"
                )
            source = source / "config.yaml"
        return GRPOConfig.from_yaml(source, overrides)
    except ConfigError as err:
        raise MemoryPlanError(str(err)) from None


def resolve_run_device(device: str) -> str:
    """cpu or cuda: the device the trainer would pick for ``device`` (auto: cuda if present)."""
    if device == "auto":
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    return "cuda" if str(device).startswith("cuda") else "cpu"


def resolve_run_dtype(cfg: Any, device: str, use_peft: bool | None = None) -> str:
    """The dtype the trainer stores the weights in (groupwise.runtime.precision.resolve_precision):
    fp32 for dtype auto (LoRA on a bf16 GPU: the frozen base in bf16), else the one asked for.
    Planning for a GPU from a machine without one assumes a bf16-capable GPU (Ampere or newer)."""
    if cfg.dtype in _CONFIG_DTYPES:
        return _CONFIG_DTYPES[cfg.dtype]
    if (cfg.use_peft if use_peft is None else use_peft) and device == "cuda":
        import torch

        from ..runtime.precision import bf16_capable

        if not torch.cuda.is_available():
            return "bf16"
        return "bf16" if bf16_capable(torch.device("cuda")) else "fp32"
    return "fp32"


def resolve_generation_dtype(cfg: Any, device: str, use_peft: bool | None = None) -> str:
    """The static engine's dtype (its weight copy, its KV cache) in the run ``cfg`` describes,
    trained with LoRA or not (``use_peft``, default the config's)
    (groupwise.wiring.rollout.static_dtype): bf16 wherever the run generates in bf16. Planning
    for a GPU from a machine without one assumes a bf16-capable GPU (Ampere or newer)."""
    import torch

    from ..runtime.precision import resolve_precision
    from ..wiring.rollout import static_dtype

    peft = cfg.use_peft if use_peft is None else use_peft
    if device == "cuda" and not torch.cuda.is_available():  # runtime.precision on a bf16 GPU
        autocast = True if cfg.bf16_autocast is None else bool(cfg.bf16_autocast)
        bf16_base = cfg.dtype == "bfloat16" or (cfg.dtype == "auto" and bool(peft))
        return "bf16" if autocast or bf16_base or cfg.generation_dtype == "bfloat16" else "fp32"
    precision = resolve_precision(
        cfg.dtype, cfg.bf16_autocast, cfg.generation_dtype, torch.device(device),
        use_peft=bool(peft),
    )  # fmt: skip
    return "bf16" if static_dtype(precision) == torch.bfloat16 else "fp32"


def task_prompt_length(cfg: Any, model: str) -> int | None:
    """The longest training prompt of ``cfg``'s task in ``model``'s tokens (chat template
    included, cut at max_prompt_length as the trainer cuts it); None if the model's tokenizer
    or the task cannot be read here."""
    import contextlib

    from ..data.prompts import tokenize_prompts
    from ..errors import UserError
    from .measure import load_tokenizer

    try:
        tokenizer = load_tokenizer(model)
        from ..wiring.rows import build_datasets

        with contextlib.redirect_stdout(sys.stderr):  # the loader's summary; keeps --json clean
            rows, _ = build_datasets(cfg)
        ids = tokenize_prompts([r["prompt"] for r in rows], tokenizer, cfg.max_prompt_length)
    except (OSError, ValueError, UserError):
        return None
    return max((len(x) for x in ids), default=None)


def options_from_args(
    args: argparse.Namespace, overrides: dict[str, Any] | None = None
) -> tuple[ModelShape, MemoryOptions, str]:
    """Resolve the model shape and the options: command line over CONFIG (or its defaults), the
    run's dtype, device and prompt lengths read as the trainer would have them."""
    cfg = load_run_config(args.config, overrides)
    device = "cuda" if args.gpu_memory else resolve_run_device(args.device or cfg.device)
    shape_flags = ("layers", "hidden", "heads", "kv_heads", "vocab", "intermediate", "head_dim")
    custom = args.params is not None or any(getattr(args, f) is not None for f in shape_flags)
    if args.model is None and custom:
        shape = ModelShape(name="custom")
        model = "custom"
    else:
        model = args.model or cfg.model
        shape = resolve_model_shape(model)
    overrides_ = {f: getattr(args, f) for f in shape_flags if getattr(args, f) is not None}
    if args.tie_embeddings:
        overrides_["tie_embeddings"] = True
    if args.params is not None:
        if args.params <= 0:
            raise MemoryPlanError(f"--params must be > 0, got {args.params}")
        overrides_["params"] = args.params
    for name, value in overrides_.items():
        if name != "params" and value < 1:
            raise MemoryPlanError(f"--{name} must be >= 1, got {value}")
    shape = replace(shape, **overrides_)
    if shape.heads is not None and shape.head_dim is None and shape.hidden is not None:
        if shape.hidden % shape.heads:
            raise MemoryPlanError(
                f"--hidden {shape.hidden} is not divisible by --heads {shape.heads}; "
                "give --head_dim"
            )
    if shape.kv_heads is not None and shape.heads is not None and shape.heads % shape.kv_heads:
        raise MemoryPlanError(
            f"--heads {shape.heads} must be a multiple of --kv_heads {shape.kv_heads}"
        )
    if shape.params is not None and shape.intermediate is None:
        shape = infer_intermediate(shape)
    if shape.params is None and shape.missing("hidden", "layers", "heads", "intermediate", "vocab"):
        missing = shape.missing("hidden", "layers", "heads", "intermediate", "vocab")
        raise MemoryPlanError(f"give --params, or all of the shapes (missing {_flags(missing)})")
    # Options other branches add to GRPOConfig, read where present (TRL's names).
    load_in_4bit = _pick_flag(args.load_in_4bit, cfg, "load_in_4bit")
    requested = args.generation_engine or cfg.generation_engine
    lora_r = args.lora_r if args.lora_r is not None else (cfg.lora_r if cfg.use_peft else 0)
    if lora_r == 0 and load_in_4bit and args.lora_r is None:
        lora_r = cfg.lora_r  # QLoRA is LoRA on the 4-bit base
    use_dora = bool(getattr(cfg, "use_dora", False)) and bool(lora_r)
    multi_turn = bool(cfg.tools or cfg.environment)
    # As the trainer resolves auto (engine.py); the plan keeps "auto" so that the --gpu_memory
    # table resolves it again for each way of training.
    engine = planned_engine(
        requested, device=device, refusal=shape.static_refusal, use_dora=use_dora,
        multi_turn=multi_turn, generation_kwargs=bool(cfg.generation_kwargs),
    )  # fmt: skip
    if engine != cfg.generation_engine:  # --measure then runs the engine the plan counts
        cfg = replace_config(cfg, generation_engine=engine)
    # dtype: the planner's fp32/fp16/bf16 (mixed precision by default, for setups groupwise's
    # trainer does not run), else the run's, as the trainer stores it (AdamW states in the
    # parameters' dtype: pure).
    if args.dtype in DTYPE_BYTES:
        dtype, precision = args.dtype, args.precision or "mixed"
        engine_dtype = None  # the planner's dtype: mixed precision generates in it
        adapter_dtype = None
        args.method_dtypes = None
    else:
        run = replace_config(cfg, dtype=args.dtype) if args.dtype else cfg
        dtype, precision = resolve_run_dtype(run, device, bool(lora_r)), args.precision or "pure"
        engine_dtype = resolve_generation_dtype(run, device, bool(lora_r))
        # groupwise.runtime.precision: LoRA adapters train in fp32 unless dtype is bfloat16.
        adapter_dtype = "bf16" if run.dtype == "bfloat16" else "fp32"
        full = (
            resolve_run_dtype(run, device, False), precision, None,
            resolve_generation_dtype(run, device, False),
        )  # fmt: skip
        peft = (
            resolve_run_dtype(run, device, True), precision, adapter_dtype,
            resolve_generation_dtype(run, device, True),
        )  # fmt: skip
        args.method_dtypes = {"full": full, "lora": peft, "qlora": peft}
    targets = args.lora_targets if args.lora_targets is not None else cfg.lora_target_modules
    if isinstance(targets, str):
        targets = [t.strip() for t in targets.split(",") if t.strip()]
    prompt_len = args.prompt_len
    if prompt_len is None and model != "custom" and shipped_name(model) is None:
        prompt_len = task_prompt_length(cfg, model)
    if prompt_len is None:
        prompt_len = cfg.max_prompt_length or 512

    def pick(flag: str, option: str) -> Any:
        value = getattr(args, flag)
        return getattr(cfg, option) if value is None else value

    gpu = args.gpu_memory is not None
    opts = MemoryOptions(
        dtype=dtype,
        precision=precision,
        optimizer=args.optim or args.optimizer or getattr(cfg, "optim", None) or "adamw",
        lora_r=lora_r or 0,
        lora_targets=tuple(targets) if targets else None,
        batch=pick("batch", "per_device_train_batch_size"),
        group_size=pick("group_size", "num_generations"),
        grad_accum=pick("grad_accum", "gradient_accumulation_steps"),
        prompt_len=prompt_len,
        completion_len=pick("completion_len", "max_completion_length"),
        gradient_checkpointing=bool(pick("gradient_checkpointing", "gradient_checkpointing")),
        logprob_impl=pick("logprob_impl", "logprob_impl"),
        logprob_chunk_size=pick("logprob_chunk_size", "logprob_chunk_size"),
        beta=pick("beta", "beta"),
        reward_model_params=args.reward_model_params or 0,
        generation_engine=requested,
        generation_dtype=engine_dtype,
        adapter_dtype=adapter_dtype,
        load_in_4bit=load_in_4bit,
        double_quant=_pick_flag(args.use_bnb_nested_quant, cfg, "use_bnb_nested_quant"),
        lora_dropout=pick("lora_dropout", "lora_dropout"),
        activation_offloading=_pick_flag(args.activation_offloading, cfg, "activation_offloading"),
        padding_free=_pick_flag(args.padding_free, cfg, "padding_free"),
        mean_completion_len=args.mean_completion_len,
        cuda_context_bytes=round(
            1e9
            * (
                args.cuda_context_gb
                if args.cuda_context_gb is not None
                else DEFAULT_CUDA_CONTEXT_GB * gpu
            )
        ),  # fmt: skip
        allocator_slack=(
            args.allocator_slack
            if args.allocator_slack is not None
            else DEFAULT_ALLOCATOR_SLACK * gpu
        ),  # fmt: skip
        device=device,
        cuda_graphs=bool(getattr(cfg, "static_cuda_graphs", True) is not False),
        use_dora=use_dora,
        multi_turn=multi_turn,
        generation_kwargs=bool(cfg.generation_kwargs),
    )
    opts.validate()
    if opts.lora_r:
        shape.lora_params(opts.lora_r, opts.lora_targets)  # raises on missing shapes/targets
    if args.measure:
        cfg = _config_for_measure(cfg, args, opts)
    args.resolved_config, args.resolved_device = cfg, device
    return shape, opts, model


def _config_for_measure(cfg: Any, args: argparse.Namespace, opts: MemoryOptions) -> Any:
    """The run ``--measure`` runs: the config with the plan's LoRA rank, QLoRA, optimizer,
    offloading and padding-free choices, where this groupwise has those options; refused where
    it has not (a measurement of another setting would not check the plan)."""
    wanted = {
        "load_in_4bit": opts.load_in_4bit,
        "activation_offloading": opts.activation_offloading,
        "padding_free": opts.padding_free,
    }
    if opts.load_in_4bit:
        wanted["use_bnb_nested_quant"] = opts.double_quant
    if args.optim or args.optimizer:
        wanted["optim"] = args.optim or args.optimizer
    changes: dict[str, Any] = {}
    if opts.lora_r and (not cfg.use_peft or cfg.lora_r != opts.lora_r):
        changes.update(use_peft=True, lora_r=opts.lora_r)  # the adapter the plan counts
    for option, value in wanted.items():
        if getattr(cfg, option, None) == value or (option != "optim" and not value and
                                                    not hasattr(cfg, option)):  # fmt: skip
            continue
        if not hasattr(cfg, option):
            raise MemoryPlanError(
                f"--measure cannot run --{option} {value}: this groupwise's training options "
                f"have no {option}"
            )
        changes[option] = value
    return replace_config(cfg, **changes) if changes else cfg


def _pick_flag(value: bool | None, cfg: Any, option: str) -> bool:
    """A boolean flag, else the config's option of that name where it has one (False)."""
    return bool(getattr(cfg, option, False) if value is None else value)


def replace_config(cfg: Any, **changes: Any) -> Any:
    """``cfg`` with ``changes`` (validated again)."""
    from ..errors import ConfigError

    try:
        return cfg.replace(**changes)  # GRPOConfig.replace keeps every option
    except ConfigError as err:
        raise MemoryPlanError(str(err)) from None


def _split_argv(argv: list[str], parser: argparse.ArgumentParser) -> tuple[list[str], dict]:
    """The planner's own arguments, and the train options among them (``--name value`` with a
    GRPOConfig field's name and no planner flag of that name, as ``groupwise train`` takes
    them): ``(planner argv, {name: value})``."""
    from ..config.grpo_config import GRPOConfig

    fields = set(GRPOConfig.field_names())
    actions = parser._option_string_actions  # flag -> action
    own: list[str] = []
    overrides: dict[str, Any] = {}
    i = 0
    while i < len(argv):
        token = argv[i]
        flag, has_value, value = token.partition("=")
        name = flag[2:].replace("-", "_")
        if not token.startswith("--") or flag in actions or name not in fields:
            own.append(token)  # argparse reports what is neither
            i += 1
            continue
        if has_value:
            overrides[name] = value
            i += 1
        elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            overrides[name] = argv[i + 1]
            i += 2
        else:  # a bare --flag means true, as in train
            overrides[name] = "true"
            i += 1
    return own, overrides


def main(argv: list[str] | None = None) -> int:
    """``groupwise memory ...``; returns the exit status (2 for bad options)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    try:
        own, overrides = _split_argv(argv, parser)
        _refuse_renamed(own)
        args = parser.parse_args(own)
        budget = parse_gpu_memory(args.gpu_memory) if args.gpu_memory is not None else None
        shape, opts, model = options_from_args(args, overrides)
        plan = make_plan(shape, opts, args.accounting)
        if args.measure and args.measure_steps < 1:
            raise MemoryPlanError(f"--measure_steps must be >= 1, got {args.measure_steps}")
        if args.measure and model == "custom":
            raise MemoryPlanError("--measure needs --model (a built-in name or a local folder)")
        if args.measure and shipped_name(model) is not None and not Path(model).exists():
            raise MemoryPlanError(
                f"--measure needs a model's weights; {model!r} is a shipped shape without them "
                "(give a local folder)"
            )
        fits = (
            fit_rows(shape, opts, budget, args.method_dtypes) if budget is not None else None
        )  # fmt: skip
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
                "groupwise memory: groupwise.trainer.ppo is not available yet: measuring GRPO only",
                file=sys.stderr,
            )
        measured = run_measurement(
            model,
            opts,
            steps=args.measure_steps,
            device=args.resolved_device,
            config=args.resolved_config.to_dict(),
            plans={"grpo": plan.grpo, "ppo": plan.ppo},
        )
    if args.json:
        out = plan.to_json()
        if measured is not None:
            out["measured"] = {r["algorithm"]: r for r in measured}
        if fits is not None:
            out["fits"] = {"gpu_bytes": budget, "combinations": [r.to_json() for r in fits]}
        print(json.dumps(out, indent=2))
    else:
        print(format_table(plan))
        if measured is not None:
            print(format_measurement(measured))
        if fits is not None:
            print()
            print(format_fits(shape, opts, budget, fits))
    return 0


# Option values renamed, and what they are now called.
_RENAMED = {("--accounting", "seeds"): "quoted"}


def _refuse_renamed(argv: list[str]) -> None:
    """A clear error for a renamed option value, naming the new one."""
    for i, token in enumerate(argv):
        flag, has_value, value = token.partition("=")
        if not has_value:
            value = argv[i + 1] if i + 1 < len(argv) else ""
        new = _RENAMED.get((flag, value))
        if new is not None:
            raise MemoryPlanError(
                f"{flag} {value} is now {flag} {new} (named after what it prints: the "
                "often-quoted 112 vs 56 GB accounting)"
            )
