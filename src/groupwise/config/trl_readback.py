"""What a script reads back from a ``GRPOConfig`` under TRL's and TrainingArguments' names.

``GRPOConfig.__getattr__`` answers a name that is no groupwise field from here: the value a
translated name has in groupwise (:data:`TRL_VIEWS`: ``bf16``, ``use_vllm``,
``max_tool_calling_iterations``, ...), TrainingArguments' runtime properties and methods for
one process per rank (``world_size``, ``process_index``, ``should_save``,
``main_process_first()``, ...), or TRL 1.16's default of a name groupwise only accepts
(:data:`TRL_DEFAULTS`; tests/config/test_trl_readback.py compares it with the installed
``trl.GRPOConfig``). The names a caller gave are answered before these, from
``config.trl_ignored``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from collections.abc import Callable, Iterator
from typing import Any

_LOG_LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40, "critical": 50}


def _process_log_level(config: Any) -> Callable[[], int]:
    """TrainingArguments' ``get_process_log_level()``: ``log_level`` on each machine's first
    process (transformers' own verbosity while "passive", its default), ``log_level_replica``
    ("warning" by default) on the others."""

    def get_process_log_level() -> int:
        import os

        from transformers.utils import logging as hf_logging

        first = int(os.environ.get("LOCAL_RANK", "0")) == 0
        name = (config.trl_ignored.get("log_level", "passive") if first
                else config.trl_ignored.get("log_level_replica", "warning"))  # fmt: skip
        return _LOG_LEVELS.get(name, hf_logging.get_verbosity())

    return get_process_log_level


def _n_gpu(config: Any) -> int:
    """TrainingArguments' ``n_gpu``: GPUs this process uses; groupwise uses one per process."""
    import torch

    return int(config.device != "cpu" and torch.cuda.is_available())


def _world_size(config: Any = None) -> int:
    """Processes of the run: torchrun's WORLD_SIZE (groupwise runs one process per rank)."""
    return max(1, int(os.environ.get("WORLD_SIZE", "1")))


def _process_index(config: Any = None) -> int:
    return int(os.environ.get("RANK", "0")) if _world_size() > 1 else 0


def _local_process_index(config: Any = None) -> int:
    if _world_size() <= 1:
        return 0
    return int(os.environ.get("LOCAL_RANK", os.environ.get("RANK", "0")))


def _parallel_mode(config: Any) -> Any:
    """TrainingArguments' ``parallel_mode``: one process per GPU (DISTRIBUTED) under torchrun,
    else NOT_PARALLEL (groupwise never spreads one process over several GPUs)."""
    from transformers.training_args import ParallelMode

    return ParallelMode.DISTRIBUTED if _world_size() > 1 else ParallelMode.NOT_PARALLEL


@dataclasses.dataclass(frozen=True)
class DistributedState:
    """What scripts read of TrainingArguments' ``distributed_state`` (accelerate's
    ``PartialState``), from torchrun's environment; ``distributed_type`` as accelerate's
    ``DistributedType`` value (a string: "NO", "MULTI_GPU", "MULTI_CPU")."""

    num_processes: int
    process_index: int
    local_process_index: int
    distributed_type: str

    @property
    def is_main_process(self) -> bool:
        return self.process_index == 0

    @property
    def is_local_main_process(self) -> bool:
        return self.local_process_index == 0


def _distributed_state(config: Any) -> DistributedState:
    kind = "NO"
    if _world_size() > 1:
        kind = "MULTI_CPU" if config.device == "cpu" else "MULTI_GPU"
    return DistributedState(_world_size(), _process_index(), _local_process_index(), kind)


def _should_write(config: Any, on_each_node: str) -> bool:
    """TrainingArguments' ``should_log`` / ``should_save``: the first process of each machine
    when ``on_each_node`` (log_on_each_node / save_on_each_node) is on, else of the run."""
    each = config.trl_ignored.get(on_each_node, TRL_DEFAULTS[on_each_node])
    return (_local_process_index() if each else _process_index()) == 0


def _main_process_first(config: Any) -> Callable[..., Any]:
    """TrainingArguments' ``main_process_first(local=True, desc="work")``: under torchrun the
    other ranks wait (a barrier of the process group, joined here as the trainer would join it)
    until the main process (of the machine when ``local``) has run the block."""

    @contextlib.contextmanager
    def main_process_first(local: bool = True, desc: str = "work") -> Iterator[None]:
        if _world_size() <= 1:
            yield
            return
        import torch.distributed as dist

        from ..runtime.distributed import init_distributed

        init_distributed(config.device)
        main = (_local_process_index() if local else _process_index()) == 0
        try:
            if not main:
                dist.barrier()
            yield
        finally:
            if main:
                dist.barrier()

    return main_process_first


def _checkpointing_kwargs(config: Any) -> Any:
    """TrainingArguments mirrors both names of the checkpointing kwargs: the newer one's value
    when given, else the older one's."""
    given = config.trl_ignored
    newer = given.get("activation_checkpointing_kwargs")
    return newer if newer is not None else given.get("gradient_checkpointing_kwargs")


def _sanitized_dict(config: Any) -> Callable[[], dict[str, Any]]:
    """TrainingArguments' ``to_sanitized_dict()`` (TensorBoard's hparams): the options with the
    batch sizes, values that are no bool, int, float or str as their ``str()``."""

    def to_sanitized_dict() -> dict[str, Any]:
        values = {**config.to_dict(), "train_batch_size": config.train_batch_size,
                  "eval_batch_size": config.eval_batch_size}  # fmt: skip
        return {k: v if type(v) in (bool, int, float, str) else str(v) for k, v in values.items()}

    return to_sanitized_dict


def _accelerator_config(config: Any) -> Any:
    """TrainingArguments' ``accelerator_config`` as TrainingArguments builds it when not given."""
    from transformers.trainer_pt_utils import AcceleratorConfig

    return AcceleratorConfig()


# TRL's translated names as a script reads them back from its config (training_args.bf16, ...),
# and TrainingArguments' runtime properties and methods, for one process per rank.
TRL_VIEWS: dict[str, Callable[[Any], Any]] = {
    "get_process_log_level": _process_log_level,  # open-r1 sets its loggers' level with it
    "n_gpu": _n_gpu,
    "bf16": lambda config: config.bf16_autocast,  # None: auto (on with a bf16 GPU)
    "fp16": lambda config: False,  # fp16=True is refused
    "use_cpu": lambda config: config.device == "cpu",
    "use_vllm": lambda config: config.generation_engine == "vllm",
    # max_turns counts assistant turns, TRL's tool rounds between them (None: not given)
    "max_tool_calling_iterations": lambda config: (
        config.max_turns - 1 if config.is_set("max_turns") else None
    ),
    "vllm_importance_sampling_correction": lambda config: config.rollout_correction,
    "vllm_importance_sampling_mode": lambda config: config.rollout_correction_mode,
    "vllm_importance_sampling_clip_max": lambda config: config.rollout_correction_clip_max,
    "vllm_importance_sampling_clip_min": lambda config: config.rollout_correction_clip_min,
    # TRL's older name: None unless given (it then sets the upper bound)
    "vllm_importance_sampling_cap": lambda config: (
        config.rollout_correction_clip_max if config.is_set("rollout_correction_clip_max")
        else None
    ),
    # TrainingArguments mirrors the older and newer names of activation checkpointing
    "activation_checkpointing": lambda config: config.gradient_checkpointing,
    "activation_checkpointing_kwargs": lambda config: _checkpointing_kwargs(config),
    "gradient_checkpointing_kwargs": lambda config: _checkpointing_kwargs(config),
    "use_transformers_continuous_batching": lambda config: bool(
        config.trl_ignored.get("use_transformers_paged")
    ),
    "accelerator_config": _accelerator_config,
    "world_size": _world_size,
    "process_index": _process_index,
    "local_process_index": _local_process_index,
    "parallel_mode": _parallel_mode,
    "distributed_state": _distributed_state,
    "should_log": lambda config: _should_write(config, "log_on_each_node"),
    "should_save": lambda config: _should_write(config, "save_on_each_node"),
    # one GPU per process at most: TrainingArguments' per-device size times max(1, n_gpu)
    "train_batch_size": lambda config: config.per_device_train_batch_size,
    "eval_batch_size": lambda config: config.per_device_eval_batch_size,
    "main_process_first": _main_process_first,
    "get_warmup_steps": lambda config: config.warmup_steps_for,
    "to_json_string": lambda config: lambda: json.dumps(config.to_dict(), indent=2),
    "to_sanitized_dict": _sanitized_dict,
}

# TRL 1.16's values (TrainingArguments' included, as a CPU process reads them back from a fresh
# trl.GRPOConfig) of every name here that is no groupwise field: a script reads any of them
# back (TRL's grpo.py model_init_kwargs and push_to_hub, open-r1 local_rank and do_eval, ...).
# Enums are held as their values; TRL_VIEWS answers first for the names with a groupwise meaning.
# tests/config/test_trl_readback.py compares this table with the installed trl.GRPOConfig.
TRL_DEFAULTS: dict[str, Any] = {
    "accelerator_config": None,  # read back as transformers' AcceleratorConfig() (TRL_VIEWS)
    "activation_checkpointing": False,  # read back as gradient_checkpointing (TRL_VIEWS)
    "activation_checkpointing_kwargs": None,
    "auto_find_batch_size": False,
    "average_tokens_across_devices": True,
    "batch_eval_metrics": False,
    "bf16": None,  # read back as bf16_autocast (TRL_VIEWS)
    "bf16_full_eval": False,
    "cache_implementation": None,
    "cast_lm_head_to_fp32": False,
    "data_seed": None,
    "dataloader_drop_last": False,
    "dataloader_in_order": True,
    "dataloader_multiprocessing_context": None,
    "dataloader_num_workers": 0,
    "dataloader_persistent_workers": False,
    "dataloader_pin_memory": True,
    "dataloader_prefetch_factor": None,
    "ddp_backend": None,
    "ddp_broadcast_buffers": None,
    "ddp_bucket_cap_mb": None,
    "ddp_find_unused_parameters": None,
    "ddp_static_graph": None,
    "ddp_timeout": 1800,
    "debug": [],
    "deepspeed": None,
    "disable_dropout": False,
    "do_eval": False,
    "do_predict": False,
    "do_train": False,
    "ds3_gather_for_generation": True,
    "enable_jit_checkpoint": False,
    "eval_accumulation_steps": None,
    "eval_delay": 0,
    "eval_do_concat_batches": True,
    "eval_use_gather_object": False,
    "fp16": False,
    "fp16_full_eval": False,
    "fsdp": None,
    "fsdp_config": None,
    "full_determinism": False,
    "gradient_checkpointing_kwargs": None,
    "greater_is_better": None,
    "hub_always_push": False,
    "hub_model_id": None,
    "hub_private_repo": None,
    "hub_revision": None,
    "hub_strategy": "every_save",
    "hub_token": None,
    "ignore_data_skip": False,
    "include_for_metrics": [],
    "include_num_input_tokens_seen": "no",
    "label_names": None,
    "label_smoothing_factor": 0.0,
    "length_column_name": "length",
    "liger_kernel_config": None,
    "load_best_model_at_end": False,
    "local_rank": -1,
    "log_completions_hub_repo": None,
    "log_level": "passive",
    "log_level_replica": "warning",
    "log_multimodal": True,
    "log_on_each_node": True,
    "log_unique_prompts": False,
    "logging_dir": None,  # an older TrainingArguments name
    "logging_first_step": False,
    "logging_nan_inf_filter": True,
    "logging_strategy": "steps",
    "lr_scheduler_kwargs": None,
    "max_tool_calling_iterations": None,
    "metric_for_best_model": None,
    "model_init_kwargs": None,
    "neftune_noise_alpha": None,
    "num_generations_eval": None,
    "optim_args": None,
    "optim_target_modules": None,
    "pad_to_multiple_of": None,
    "parallelism_config": None,
    "prediction_loss_only": False,
    "project": "huggingface",
    "push_to_hub": False,
    "remove_unused_columns": False,
    "restore_callback_states_from_checkpoint": False,
    "router_aux_loss_coef": None,
    "save_on_each_node": False,
    "save_only_model": False,
    "skip_memory_metrics": True,
    "torch_compile": False,
    "torch_compile_backend": None,
    "torch_compile_mode": None,
    "torch_empty_cache_steps": None,
    "trackio_bucket_id": None,
    "trackio_space_id": None,
    "trackio_static_space_id": None,
    "train_sampling_strategy": "random",
    "transformers_continuous_batching_config": None,
    "use_cache": False,
    "use_cpu": False,
    "use_liger_kernel": False,
    "use_transformers_continuous_batching": False,
    "use_transformers_paged": False,
    "use_vllm": False,
    "vllm_group_port": 51216,
    "vllm_importance_sampling_cap": None,
    "vllm_importance_sampling_clip_max": 3.0,
    "vllm_importance_sampling_clip_min": None,
    "vllm_importance_sampling_correction": True,
    "vllm_importance_sampling_mode": "sequence_mask",
    "vllm_model_impl": "vllm",
    "vllm_server_base_url": None,
    "vllm_server_host": "0.0.0.0",
    "vllm_server_port": 8000,
    "vllm_server_timeout": 240.0,
    "vllm_structured_outputs_regex": None,
}
