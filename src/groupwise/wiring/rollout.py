"""A run's options -> its rollout engine: the sampling parameters, the engine that
``generation_engine`` names (auto, hf, static, vllm) over the policy's weights, and what a
multi-turn run talks to (tools or an environment: :class:`Interaction`), with the rows such a run
trains on. :mod:`groupwise.wiring.rewards` builds the rest of a run and offers these names too.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase

from ..config.grpo_config import GRPOConfig
from ..data.prompts import prompt_text
from ..errors import ConfigError
from ..imports import import_callable, is_import_spec
from ..policy.policy import Policy
from ..rollout import Engine, HFEngine, RolloutEngine, SamplingParams, eos_token_ids
from ..rollout.multiturn import MultiTurnEngine, TurnLimits
from ..runtime.precision import Precision
from ..sections import (
    BatchOptions,
    DataOptions,
    GenerationOptions,
    OptimizationOptions,
    RuntimeOptions,
    SectionGroup,
    ToolOptions,
)
from ..sections.generation import STATIC_MULTI_TURN, resolve_generation_engine
from ..tools import ENVIRONMENTS, Environment, ToolEnvironment, resolve_tools
from ..tools.calls import TOOL_CALL_CLOSE
from ..tools.environment import (
    PLACEHOLDER_PROMPT,
    EnvironmentFactories,
    ToolLimits,
    is_groupwise_environment,
)

# The multi-turn feedback game (groupwise.tools.environment): its rows, its environment and its
# reward come with the name.
GUESS_TASK = "guess_number"


def sampling_params(generation: GenerationOptions, *, greedy: bool = False) -> SamplingParams:
    """The sampling of the ``generation`` section (``greedy``: temperature 0)."""
    return SamplingParams(
        max_completion_length=generation.max_completion_length,
        temperature=0.0 if greedy else generation.temperature,
        top_p=generation.top_p,
        top_k=generation.top_k,
        min_p=generation.min_p or 0.0,
        repetition_penalty=generation.repetition_penalty,
    )


@dataclass
class Interaction:
    """What a multi-turn run talks to: one environment per conversation (``make_env``), the
    tool schemas its prompts show (None: no tools), and where a turn ends besides EOS."""

    make_env: Callable[[], Environment]
    schemas: list[dict[str, Any]] | None
    stop_strings: tuple[str, ...]
    # TRL's environment_factory (its protocol, or a dict of environments): the rollouts'
    # environments are drawn per row, and make_env is not used.
    environments: EnvironmentFactories | None = None


def build_interaction(
    args: GRPOConfig,
    tools: Sequence[Callable[..., Any] | str] | None = None,
    environment_factory: Callable[[], Environment] | None = None,
) -> Interaction | None:
    """The run's tools (``args.tools`` and GRPOTrainer's ``tools``) or environment
    (``args.environment`` or GRPOTrainer's ``environment_factory``); None when it has neither
    (single-turn rollouts)."""
    specs = [*(args.tools or []), *(tools or [])]
    # Characters of tool output kept: a generous bound before the token cut.
    limits = ToolLimits(args.tool_timeout, 16 * args.max_tool_output_tokens, args.max_tool_calls,
                        args.slow_call_warning)  # fmt: skip
    if environment_factory is not None and args.environment is not None:
        raise ConfigError(
            "environment and GRPOTrainer(environment_factory=...) are both set; give one"
        )
    if environment_factory is not None and is_trl_environment_factory(environment_factory):
        environments = EnvironmentFactories(
            environment_factory, limits, resolve_tools(specs) if specs else ()
        )
        schemas = {s["function"]["name"]: s for each in environments.schemas.values() for s in each}

        def no_single_environment() -> Environment:
            raise RuntimeError("TRL environments are drawn per row (EnvironmentFactories.take)")

        return Interaction(
            no_single_environment, list(schemas.values()), (TOOL_CALL_CLOSE,), environments
        )
    factory = environment_factory
    environment = args.environment
    if environment is None and args.task == GUESS_TASK and factory is None and not specs:
        environment = GUESS_TASK  # the task's own environment
    if factory is None and environment is not None:
        factory = resolve_environment(environment)
    if factory is not None and specs:
        raise ConfigError(
            f"tools {[getattr(t, '__name__', t) for t in specs]} and an environment are both "
            "set: an environment runs its own tools (see groupwise.tools.ToolEnvironment); "
            "give tools or an environment"
        )
    if factory is not None:
        return Interaction(factory, None, tuple(getattr(factory, "stop_strings", ())))
    if not specs:
        return None
    toolbox = limits.toolbox(resolve_tools(specs))

    def make_env() -> Environment:
        return ToolEnvironment(toolbox, max_tool_calls=limits.max_tool_calls)

    return Interaction(make_env, toolbox.schemas, (TOOL_CALL_CLOSE,))


class _WithPrompt(Sequence):
    """Rows routed to TRL environments that carry no prompt (only an ``environment`` column):
    each gets the empty user turn their environment's reset() text fills."""

    def __init__(self, rows: Sequence[dict[str, Any]]) -> None:
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: Any) -> dict[str, Any]:
        return {"prompt": [dict(m) for m in PLACEHOLDER_PROMPT], **self.rows[index]}


def environment_dataset(
    dataset: Sequence[dict[str, Any]] | None,
    environments: EnvironmentFactories | None,
    args: GRPOConfig,
) -> Sequence[dict[str, Any]]:
    """The training rows. Without ``train_dataset``, a TRL environment that owns the data
    (its reset() returns the prompt) gets one step's worth of empty prompts, cycled for
    ``max_steps`` steps (as TRL); several environments need rows naming theirs. Rows without
    a prompt get the empty one. ``max_steps`` must then be given (``args.is_set``): there is
    no dataset for epochs to count over."""
    if dataset is None:
        if environments is None:
            raise ConfigError(
                "`train_dataset` is required (rows with a 'prompt' column) unless an "
                "environment_factory is given whose environment owns the data"
            )
        if environments.multiple:
            raise ConfigError(
                "a dict environment_factory (several environments) requires a `train_dataset` "
                "with an 'environment' column naming each row's environment; or pass a single "
                "environment factory"
            )
        if not args.is_set("max_steps") or args.max_steps == -1:
            # No dataset to count epochs over: the environment serves prompts for as long as
            # training asks, so the length must be given (TRL refuses the same).
            got = f"max_steps={args.max_steps}" + ("" if args.is_set("max_steps") else " (default)")
            raise ConfigError(
                f"max_steps must be set (>= 1) when the environment owns the data (an "
                f"environment_factory without train_dataset); got {got}. There is no dataset "
                "for num_train_epochs to count over: give max_steps=N"
            )
        return [
            {"prompt": [dict(m) for m in PLACEHOLDER_PROMPT]} for _ in range(args.prompts_per_step)
        ]
    if environments is not None and len(dataset) and "prompt" not in dataset[0]:
        return _WithPrompt(dataset)
    return dataset


def is_trl_environment_factory(factory: Any) -> bool:
    """TRL's ``environment_factory``: a dict of factories, or a factory whose environments
    expose their tools as methods (no ``step`` / ``state``: groupwise's protocol). A single
    factory is probed with one instance."""
    if isinstance(factory, Mapping):
        return True
    return not is_groupwise_environment(factory())


def resolve_environment(spec: str) -> Callable[[], Environment]:
    """A built-in environment name, or ``module:factory`` / ``file.py:factory`` (a callable
    returning an environment)."""
    if spec in ENVIRONMENTS:
        return ENVIRONMENTS[spec]
    if is_import_spec(spec):
        return import_callable(spec, "environment")
    raise ConfigError(
        f"unknown environment {spec!r}; built-in: {', '.join(sorted(ENVIRONMENTS))}, "
        "or module:factory or path/to/file.py:factory"
    )


@dataclass(frozen=True)
class EngineOptions(SectionGroup):
    """The sections the rollout engine reads, and only those: sampling and the engine
    (``generation``), the multi-turn limits (``tools``), the chat template's options and the
    longest prompt (``data``), the run's length (``optimization`` and ``batch``: a static
    engine compiles when it repays) and the seed (``runtime``: vLLM's sampler)."""

    generation: GenerationOptions
    tools: ToolOptions
    data: DataOptions
    optimization: OptimizationOptions
    batch: BatchOptions
    runtime: RuntimeOptions


def build_engine(
    policy: Policy,
    tokenizer: PreTrainedTokenizerBase,
    options: EngineOptions,
    generator: torch.Generator,
    precision: Precision,
    interaction: Interaction | None = None,
) -> RolloutEngine:
    """The rollout engine ``generation_engine`` names (``auto``: :func:`choose_engine`, printed
    in one line with its reason).

    ``hf``: the Hugging Face / torch engine on the policy's own weights, in the training
    forward's numerics. With bf16 generation alone (``generation_dtype: bfloat16``, an fp32
    update) it generates under bf16 autocast and records its log-probs, which turns rollout
    correction on. With tools or an environment (``interaction``) the multi-turn engine wraps it.
    With ``generation_kwargs`` it generates through transformers' ``generate()``.

    ``static``: the lean decoder on its own weight copy (:mod:`groupwise.rollout.static`), which
    always records its log-probs (its numerics are not the trainer's, bit for bit).

    ``vllm``: the colocated vLLM engine (:mod:`groupwise.rollout.vllm`), which always records its
    log-probs (its own bf16 kernels: rollout correction is on).

    TRL's ``chat_template_kwargs`` reach a single-turn engine's prompts through its
    ``prompt_text``, which the prompt batches and evaluation read (a multi-turn engine takes
    them itself)."""
    name, why = choose_engine(policy, options.generation, interaction)
    if policy.dist.is_main:
        print(f"[groupwise] rollout engine: {name} ({why})")
    generation = dataclasses.replace(options.generation, generation_engine=name)
    options = dataclasses.replace(options, generation=generation)
    if interaction is not None:
        check_multi_turn(generation)
    engine: RolloutEngine
    if generation.generation_engine == "vllm":
        engine = with_interaction(
            build_vllm(policy, tokenizer, options, generator),
            options.tools,
            options.data.chat_template_kwargs,
            interaction,
        )
    elif generation.generation_engine == "static":
        engine = build_static(policy, tokenizer, options, generator, precision)
    else:
        cuda = policy.device.type == "cuda"
        hf = HFEngine(
            policy.model,
            tokenizer,
            sampling_params(generation),
            generator,
            numerics=functools.partial(precision.generation_context, policy.device),
            weights=policy.full_weights,
            records_logprobs=precision.generation_only,
            generate_kwargs=generation.generation_kwargs,
            # A host read stalls a GPU's queue of kernels; on a CPU it costs nothing, and
            # dropping finished rows after every token saves their compute.
            eos_check_every=generation.static_eos_check_every if cuda else 1,
        )
        engine = with_interaction(hf, options.tools, options.data.chat_template_kwargs, interaction)
    template_kwargs = options.data.chat_template_kwargs
    if template_kwargs and interaction is None:
        engine.prompt_text = functools.partial(  # type: ignore[attr-defined]
            prompt_text, tokenizer=tokenizer, template_kwargs=template_kwargs
        )
    return engine


def choose_engine(
    policy: Policy, generation: GenerationOptions, interaction: Interaction | None = None
) -> tuple[str, str]:
    """The engine ``generation_engine`` resolves to for this policy, and why (one line):
    :func:`~groupwise.sections.generation.resolve_generation_engine` on the policy's device and
    on whether the static engine can decode its model."""
    from ..rollout.static import supports

    requested = generation.generation_engine
    return resolve_generation_engine(
        requested,
        device_type=policy.device.type,
        static_unsupported=supports(policy.model) if requested == "auto" else None,
        multi_turn=interaction is not None,
        generation_kwargs=bool(generation.generation_kwargs),
    )


def check_multi_turn(generation: GenerationOptions) -> None:
    """Refuse the generation options a multi-turn run (tools or an environment) cannot use."""
    if generation.repetition_penalty != 1.0:
        # The multi-turn loop inserts tool and user replies between turns; which of those
        # tokens the penalty should count is not settled (HF counts every input token).
        raise ConfigError(
            f"repetition_penalty={generation.repetition_penalty} is not supported with tools or "
            "an environment (the multi-turn engine does not apply it); leave it at 1.0"
        )
    if generation.generation_kwargs:
        raise ConfigError(
            f"generation_kwargs ({', '.join(sorted(generation.generation_kwargs))}) are not "
            "supported with tools or an environment: multi-turn rollouts decode token by token "
            "to stop at tool calls and insert their replies, which transformers' generate() does "
            "not do"
        )
    if generation.generation_engine == "static":
        raise ConfigError(STATIC_MULTI_TURN)


def static_dtype(precision: Precision) -> torch.dtype:
    """The static engine's weight dtype: bf16 wherever the run generates in bf16 (autocast, bf16
    generation, bf16 weights), fp32 otherwise."""
    bf16 = precision.autocast or precision.generation_only
    return torch.bfloat16 if bf16 or precision.weights == torch.bfloat16 else torch.float32


def build_static(
    policy: Policy,
    tokenizer: PreTrainedTokenizerBase,
    options: EngineOptions,
    generator: torch.Generator,
    precision: Precision,
) -> RolloutEngine:
    """The static engine over the policy, compiled when asked, or on a GPU when the run is long
    enough to repay the compile time (``static_compile_min_steps``). On a CPU the eager step
    with oneDNN-packed weights is faster than the compiled one (benchmarks/roofline.py). On a
    GPU its decode step (eager or compiled) replays as CUDA graphs unless
    ``static_cuda_graphs: false``: a capture costs two warm-up steps per batch shape."""
    from ..rollout.static import StaticEngine, supports
    from ..rollout.static_weights import reads_in_place

    reason = supports(policy.model)
    if reason is not None:
        raise ConfigError(f"generation_engine=static: {reason}; use generation_engine: hf")
    generation = options.generation
    compile_step = generation.static_compile
    if compile_step is None:  # measured on CPU: the compiled step is slower than the eager one
        # static_compile_min_steps counts generation batches; max_steps, optimizer steps
        batches = options.optimization.max_steps / options.batch.optimizer_steps_per_batch
        long_run = batches >= generation.static_compile_min_steps
        # Compiled only over the engine's own copy (the measured case); layers read in place
        # (LoRA, bitsandbytes' 4-bit matmul) run eagerly, replayed as CUDA graphs.
        in_place = reads_in_place(policy.model)
        compile_step = policy.device.type == "cuda" and long_run and not in_place
    if generation.static_cuda_graphs and policy.device.type != "cuda":
        raise ConfigError(
            f"static_cuda_graphs=True needs a CUDA device (the run's is {policy.device.type}); "
            "leave it unset (auto: on a CUDA device)"
        )
    return StaticEngine(
        policy.model,
        tokenizer,
        sampling_params(generation),
        generator,
        dtype=static_dtype(precision),
        compile=compile_step,
        eos_check_every=generation.static_eos_check_every,
        cuda_graphs=generation.static_cuda_graphs,
        weights=policy.full_weights,
        device=policy.device,
    )


def build_vllm(
    policy: Policy,
    tokenizer: PreTrainedTokenizerBase,
    options: EngineOptions,
    generator: torch.Generator,
) -> Engine:
    """The vLLM engine for the policy (its weights pushed once), from the ``vllm_*`` options:
    colocated (``vllm_mode: colocate``), or on a vLLM server (``server``). Both seed every
    request from the run's sampling ``generator``. vLLM's context length defaults to the
    longest prompt plus the longest completion (a server's is its own)."""
    generation, max_prompt_length = options.generation, options.data.max_prompt_length
    if generation.vllm_mode == "server":
        from ..rollout.vllm_server import connect_vllm_server, server_url
        from ..runtime.distributed import barrier

        return connect_vllm_server(
            policy.model,
            tokenizer,
            sampling_params(generation),
            eos_token_ids(policy.model, tokenizer),
            device=policy.device,
            generator=generator,
            base_url=server_url(
                generation.vllm_server_base_url,
                generation.vllm_server_host,
                generation.vllm_server_port,
            ),
            timeout=generation.vllm_server_timeout,
            group_port=generation.vllm_group_port,
            rank=policy.dist.rank,
            barrier=functools.partial(barrier, policy.dist),
            weights=policy.full_weights,
        )
    from ..rollout.vllm import build_vllm_engine

    max_len = generation.vllm_max_model_length
    if max_len is not None and max_prompt_length is not None and max_len <= max_prompt_length:
        # vLLM refuses a prompt as long as its context, in the middle of generate().
        raise ConfigError(
            f"vllm_max_model_length={max_len} leaves no room to generate after a prompt of "
            f"max_prompt_length={max_prompt_length} tokens; set it above max_prompt_length "
            "(by default it is max_prompt_length + max_completion_length)"
        )
    if max_len is None and max_prompt_length is not None:
        max_len = max_prompt_length + generation.max_completion_length
    return build_vllm_engine(
        policy.model,
        tokenizer,
        sampling_params(generation),
        eos_token_ids(policy.model, tokenizer),
        device=policy.device,
        weights_dtype=policy.precision.weights,
        seed=options.runtime.seed,
        generator=generator,
        gpu_memory_utilization=generation.vllm_gpu_memory_utilization,
        max_model_len=max_len,
        enable_prefix_caching=generation.vllm_enable_prefix_caching,
        enable_sleep_mode=generation.vllm_enable_sleep_mode,
        weights=policy.full_weights,
    )


def with_interaction(
    engine: Engine,
    tools: ToolOptions,
    chat_template_kwargs: Mapping[str, Any] | None,
    interaction: Interaction | None,
) -> RolloutEngine:
    """``engine`` itself (single-turn), or the multi-turn engine around it (the HF or the vLLM
    engine), within the ``tools`` section's limits."""
    if interaction is None:
        return engine
    limits = TurnLimits(tools.max_turns, tools.max_tool_output_tokens, interaction.stop_strings)
    return MultiTurnEngine(
        engine,
        interaction.make_env,
        limits,
        tools=interaction.schemas,
        examples=tools.tool_examples,
        template_kwargs=chat_template_kwargs,
        environments=interaction.environments,
    )
