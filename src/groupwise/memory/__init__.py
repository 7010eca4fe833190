"""Memory planner: bytes for PPO and GRPO side by side, and a measurement that checks them.

``groupwise memory [CONFIG.yaml] [--model NAME | --params 7e9 --layers ..] [--json] [--measure]``

The package, in three layers, each importing only the ones before it:

- the planner proper, pure arithmetic (no torch, no trainers): :mod:`groupwise.memory.shapes`
  (model shapes and parameter counts; the shipped shapes of Qwen2.5, Qwen3 and Llama-3.x models
  and :func:`~groupwise.memory.shapes.model_config`, their transformers config for random
  weights), :mod:`groupwise.memory.quant` (NF4 and 8-bit optimizer bytes),
  :mod:`groupwise.memory.terms` (the per-component formulas), :mod:`groupwise.memory.engine`
  (the rollout engine ``generation_engine: auto`` gives a run, and what it holds),
  :mod:`groupwise.memory.fit` (what fits a GPU, ``--gpu_memory``), :mod:`groupwise.memory.plan`
  (the options and the bytes of each component; its docstring says exactly what is counted:
  weights, gradients, master weights, optimizer states, activations, logits, KV cache, the peak
  total, and how the often-quoted 112 vs 56 GB for 7B are reproduced with ``--accounting
  quoted``) and
  :mod:`groupwise.memory.table` (the printed table), with :mod:`groupwise.memory.units`.
- :mod:`groupwise.memory.measure`: ``--measure``, real training steps of each algorithm in a
  fresh subprocess (:mod:`groupwise.cli.memory_child`, which runs the trainers from above
  them), the measured peak next to the plan for the same settings.
- :mod:`groupwise.memory.cli`: the command line (``groupwise memory``, ``python -m
  groupwise.memory``).

The planner sits below the trainer, which plans a run with it before loading the weights and
when a step runs out of memory (:mod:`groupwise.trainer.memory_check`).

Every public name of them is re-exported here (``from groupwise.memory import ...``).
"""

from .cli import build_parser, main, options_from_args, parse_count
from .fit import FitRow, fit_rows, format_fits, parse_gpu_memory
from .measure import format_measurement, ppo_available, run_measurement
from .plan import (
    ACCOUNTINGS,
    CRITIC_ACTS,
    CRITIC_GRADS,
    CRITIC_MASTER,
    CRITIC_OPTIM,
    CRITIC_STEP,
    CRITIC_WEIGHTS,
    DTYPE_BYTES,
    GENERATION_PHASE,
    GENERATION_WEIGHTS,
    KV_CACHE,
    LOGITS,
    OPTIMIZERS,
    POLICY_ACTS,
    POLICY_GRADS,
    POLICY_MASTER,
    POLICY_OPTIM,
    POLICY_STEP,
    POLICY_WEIGHTS,
    PRECISIONS,
    PREFILL,
    QUOTED_NOTE,
    REF_WEIGHTS,
    RM_WEIGHTS,
    ROW_ORDER,
    STATIC_LOAD,
    STEP_PHASE,
    SYNC_PHASE,
    UPDATE_PHASE,
    MemoryOptions,
    MemoryPlan,
    activation_bytes,
    critic_split,
    kv_cache_bytes,
    layer_activation_values,
    logits_bytes,
    make_plan,
    missing_rows,
    plan_grpo,
    plan_ppo,
    quoted_trained_only,
    quoted_weights_only,
    resolved_engine,
    total_bytes,
    trained_bytes_per_param,
)
from .shapes import (
    BUILTIN_SHAPES,
    LORA_TARGETS,
    MemoryPlanError,
    ModelShape,
    infer_intermediate,
    model_config,
    resolve_model_shape,
    shape_from_hf_config,
    shipped_configs,
)
from .table import format_table, quoted_lines
from .units import human_bytes, human_count

__all__ = [
    "FitRow",
    "fit_rows",
    "format_fits",
    "model_config",
    "parse_gpu_memory",
    "shipped_configs",
    "ACCOUNTINGS",
    "BUILTIN_SHAPES",
    "CRITIC_ACTS",
    "CRITIC_GRADS",
    "CRITIC_MASTER",
    "CRITIC_OPTIM",
    "CRITIC_STEP",
    "CRITIC_WEIGHTS",
    "DTYPE_BYTES",
    "GENERATION_PHASE",
    "GENERATION_WEIGHTS",
    "KV_CACHE",
    "LOGITS",
    "LORA_TARGETS",
    "OPTIMIZERS",
    "POLICY_ACTS",
    "POLICY_GRADS",
    "POLICY_MASTER",
    "POLICY_OPTIM",
    "POLICY_STEP",
    "POLICY_WEIGHTS",
    "PRECISIONS",
    "REF_WEIGHTS",
    "RM_WEIGHTS",
    "ROW_ORDER",
    "PREFILL",
    "STATIC_LOAD",
    "STEP_PHASE",
    "SYNC_PHASE",
    "QUOTED_NOTE",
    "UPDATE_PHASE",
    "MemoryOptions",
    "MemoryPlan",
    "MemoryPlanError",
    "ModelShape",
    "activation_bytes",
    "build_parser",
    "critic_split",
    "format_measurement",
    "format_table",
    "human_bytes",
    "human_count",
    "infer_intermediate",
    "kv_cache_bytes",
    "layer_activation_values",
    "logits_bytes",
    "main",
    "make_plan",
    "missing_rows",
    "options_from_args",
    "parse_count",
    "plan_grpo",
    "plan_ppo",
    "ppo_available",
    "resolve_model_shape",
    "resolved_engine",
    "run_measurement",
    "quoted_lines",
    "quoted_trained_only",
    "quoted_weights_only",
    "shape_from_hf_config",
    "total_bytes",
    "trained_bytes_per_param",
]
