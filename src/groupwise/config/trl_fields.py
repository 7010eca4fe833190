"""TRL 1.16's ``GRPOConfig`` fields as data, for transformers' ``HfArgumentParser`` (which TRL's
``TrlParser`` is): groupwise's ``GRPOConfig`` offers that parser exactly these names
(:class:`groupwise.config.construction.TRLConfigType`). tests/config/test_trl_hf_parser.py
compares both tables with the installed TRL's fields."""

from __future__ import annotations

from typing import Any

# TRL 1.16's GRPOConfig fields (TrainingArguments' included), as data: GRPOConfig hides its other
# options from transformers' HfArgumentParser (they are init=False fields), so that
# TrlParser((ScriptArguments, GRPOConfig, ModelConfig)) adds no option that ModelConfig or the
# script's own dataclass declares too. A TRL upgrade that adds a field fails the test comparing this
# with trl.GRPOConfig's fields.
TRL_GRPO_FIELDS: frozenset[str] = frozenset(
    (
        "accelerator_config", "activation_checkpointing", "activation_checkpointing_kwargs",
        "adam_beta1", "adam_beta2", "adam_epsilon", "auto_find_batch_size",
        "average_tokens_across_devices", "batch_eval_metrics", "beta", "bf16", "bf16_full_eval",
        "cache_implementation", "cast_lm_head_to_fp32", "chat_template_kwargs", "data_seed",
        "dataloader_drop_last", "dataloader_in_order", "dataloader_multiprocessing_context",
        "dataloader_num_workers", "dataloader_persistent_workers", "dataloader_pin_memory",
        "dataloader_prefetch_factor", "ddp_backend", "ddp_broadcast_buffers",
        "ddp_bucket_cap_mb", "ddp_find_unused_parameters", "ddp_static_graph", "ddp_timeout",
        "debug", "deepspeed", "delta", "disable_dropout", "disable_tqdm", "do_eval",
        "do_predict", "do_train", "ds3_gather_for_generation", "enable_jit_checkpoint",
        "entropy_coef", "entropy_coef_delta", "entropy_coef_max", "entropy_coef_min",
        "entropy_target", "epsilon", "epsilon_high", "eval_accumulation_steps", "eval_delay",
        "eval_do_concat_batches", "eval_on_start", "eval_steps", "eval_strategy",
        "eval_use_gather_object", "fp16", "fp16_full_eval", "fsdp", "fsdp_config",
        "full_determinism", "generation_batch_size", "generation_kwargs",
        "gradient_accumulation_steps", "gradient_checkpointing",
        "gradient_checkpointing_kwargs", "greater_is_better", "hub_always_push", "hub_model_id",
        "hub_private_repo", "hub_revision", "hub_strategy", "hub_token", "ignore_data_skip",
        "importance_sampling_level", "include_for_metrics", "include_num_input_tokens_seen",
        "label_names", "label_smoothing_factor", "learning_rate", "length_column_name",
        "liger_kernel_config", "load_best_model_at_end", "local_rank", "log_completions",
        "log_completions_hub_repo", "log_level", "log_level_replica", "log_multimodal",
        "log_on_each_node", "log_unique_prompts", "logging_first_step",
        "logging_nan_inf_filter", "logging_steps", "logging_strategy", "loss_type",
        "lr_scheduler_kwargs", "lr_scheduler_type", "mask_truncated_completions",
        "max_completion_length", "max_grad_norm", "max_steps", "max_tool_calling_iterations",
        "metric_for_best_model", "min_p", "model_init_kwargs", "multi_objective_aggregation",
        "neftune_noise_alpha", "num_completions_to_print", "num_generations",
        "num_generations_eval", "num_iterations", "num_train_epochs",
        "off_policy_mask_threshold", "optim", "optim_args", "optim_target_modules",
        "output_dir", "pad_to_multiple_of", "parallelism_config", "per_device_eval_batch_size",
        "per_device_train_batch_size", "prediction_loss_only", "project", "push_to_hub",
        "ref_model_mixup_alpha", "ref_model_sync_steps", "remove_unused_columns",
        "repetition_penalty", "report_to", "restore_callback_states_from_checkpoint",
        "resume_from_checkpoint", "reward_weights", "router_aux_loss_coef", "run_name",
        "sapo_temperature_neg", "sapo_temperature_pos", "save_on_each_node", "save_only_model",
        "save_steps", "save_strategy", "save_total_limit", "scale_rewards", "seed",
        "shuffle_dataset", "skip_memory_metrics", "steps_per_generation", "sync_ref_model",
        "temperature", "tf32", "top_entropy_quantile", "top_k", "top_p", "torch_compile",
        "torch_compile_backend", "torch_compile_mode", "torch_empty_cache_steps",
        "trackio_bucket_id", "trackio_space_id", "trackio_static_space_id",
        "train_sampling_strategy", "transformers_continuous_batching_config",
        "trust_remote_code", "use_adaptive_entropy", "use_bias_correction_kl", "use_cache",
        "use_cpu", "use_liger_kernel", "use_transformers_continuous_batching",
        "use_transformers_paged", "use_vllm", "vespo_k_neg", "vespo_k_pos", "vespo_lambda_neg",
        "vespo_lambda_pos", "vllm_enable_sleep_mode", "vllm_gpu_memory_utilization",
        "vllm_group_port", "vllm_importance_sampling_cap", "vllm_importance_sampling_clip_max",
        "vllm_importance_sampling_clip_min", "vllm_importance_sampling_correction",
        "vllm_importance_sampling_mode", "vllm_max_model_length", "vllm_mode",
        "vllm_model_impl", "vllm_server_base_url", "vllm_server_host", "vllm_server_port",
        "vllm_server_timeout", "vllm_structured_outputs_regex", "vllm_tensor_parallel_size",
        "warmup_steps", "weight_decay",
    )
)

# The type of each TRL 1.16 GRPOConfig field that is no groupwise option, as transformers'
# HfArgumentParser reads it from the command line (TRL's own, or the nearest type it can parse:
# an enum or a config object as its name, str). GRPOConfig declares them as parser-only fields
# (groupwise.config.grpo_config: TRL's parser offers --bf16, --push_to_hub, ...); their values
# are read as GRPOConfig(name=value) reads them.
_TRL_ONLY_BY_TYPE: dict[Any, tuple[str, ...]] = {
    bool: (
        "auto_find_batch_size", "average_tokens_across_devices", "batch_eval_metrics",
        "bf16_full_eval", "cast_lm_head_to_fp32", "dataloader_drop_last", "dataloader_in_order",
        "dataloader_persistent_workers", "dataloader_pin_memory", "disable_dropout", "do_eval",
        "do_predict", "do_train", "ds3_gather_for_generation", "enable_jit_checkpoint",
        "eval_do_concat_batches", "eval_use_gather_object", "fp16", "fp16_full_eval",
        "full_determinism", "hub_always_push", "ignore_data_skip", "load_best_model_at_end",
        "log_multimodal", "log_on_each_node", "log_unique_prompts", "logging_first_step",
        "logging_nan_inf_filter", "prediction_loss_only", "push_to_hub",
        "restore_callback_states_from_checkpoint", "save_on_each_node", "save_only_model",
        "skip_memory_metrics", "torch_compile", "use_cache", "use_cpu", "use_liger_kernel",
        "use_transformers_continuous_batching", "use_transformers_paged", "use_vllm",
        "vllm_importance_sampling_correction",
    ),
    bool | None: (
        "activation_checkpointing", "bf16", "ddp_broadcast_buffers",
        "ddp_find_unused_parameters", "ddp_static_graph", "greater_is_better",
        "hub_private_repo", "remove_unused_columns",
    ),
    int: (
        "dataloader_num_workers", "ddp_timeout", "local_rank",
    ),
    int | None: (
        "data_seed", "dataloader_prefetch_factor", "ddp_bucket_cap_mb",
        "eval_accumulation_steps", "max_tool_calling_iterations", "num_generations_eval",
        "torch_empty_cache_steps",
    ),
    float: (
        "eval_delay", "label_smoothing_factor",
    ),
    float | None: (
        "neftune_noise_alpha", "router_aux_loss_coef", "vllm_importance_sampling_cap",
        "vllm_importance_sampling_clip_max", "vllm_importance_sampling_clip_min",
    ),
    str: (
        "length_column_name", "log_level", "log_level_replica", "project",
        "train_sampling_strategy", "vllm_importance_sampling_mode", "vllm_model_impl",
    ),
    str | None: (
        "cache_implementation", "dataloader_multiprocessing_context", "ddp_backend", "debug",
        "fsdp", "hub_model_id", "hub_revision", "hub_strategy", "hub_token",
        "include_num_input_tokens_seen", "log_completions_hub_repo", "logging_strategy",
        "metric_for_best_model", "optim_args", "optim_target_modules", "parallelism_config",
        "torch_compile_backend", "torch_compile_mode", "trackio_bucket_id",
        "trackio_space_id", "trackio_static_space_id", "vllm_structured_outputs_regex",
    ),
    int | str | None: (
        "pad_to_multiple_of",
    ),
    list[str] | None: (
        "include_for_metrics", "label_names",
    ),
    dict[str, Any] | str | None: (
        "accelerator_config", "activation_checkpointing_kwargs", "deepspeed", "fsdp_config",
        "gradient_checkpointing_kwargs", "liger_kernel_config", "lr_scheduler_kwargs",
        "model_init_kwargs", "transformers_continuous_batching_config",
    ),
}
TRL_ONLY_TYPES: dict[str, Any] = {
    name: tp for tp, names in _TRL_ONLY_BY_TYPE.items() for name in names
}
