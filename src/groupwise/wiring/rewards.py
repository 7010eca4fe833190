"""A run's options (:class:`~groupwise.config.GRPOConfig`) -> its reward functions and the
scorer: built-in names, weights, the correctness reward, reward models and remote verifiers.
The rest of :mod:`groupwise.wiring` maps the other option names to components (the model, the
rollout engine, the curriculum); everything below it takes plain arguments.

Names accepted in ``reward_funcs`` (YAML and the command line):

- ``format``: strict think-then-answer format (shaping.format_reward)
- ``soft_format``: partial credit per well-placed tag (shaping.soft_format_reward)
- ``accuracy``: final answer equals the ``answer`` column mathematically (math.accuracy_reward)
- ``length_penalty``: DAPO soft overlong punishment (max_completion_length, overlong_buffer_len)
- ``repetition_penalty``: n-gram repetition (repetition_ngram_size, repetition_max_penalty)
- ``code`` / ``code_binary``: fraction / all of the ``tests`` column passed in a sandbox
- ``countdown``: the answer expression uses each given number once and equals the target
- ``reasoning_gym``: the reasoning-gym dataset's own scorer on the ``<answer>`` content
- ``task``: the ``mixed`` task's dispatcher (each row scored by its own task's reward)
- ``tool_call``: 1 when the conversation called a tool and no call failed (tool-use shaping)
- ``guess``: the guess_number environment's game was won (its state says ``solved``)
- ``reward_model:PATH``: a sequence-classification checkpoint's score (model.RewardModel)
- ``remote:URL``: an HTTP verifier (remote.RemoteReward)

Any other string is TRL's form of a reward model: a local folder or a hub id (``org/name``) of
an ``AutoModelForSequenceClassification`` checkpoint, loaded with ``num_labels=1`` and scored by
``logits[:, 0]`` (model.RewardModel). A loaded sequence-classification model in
``reward_funcs`` is scored the same way, with its entry of ``reward_processing_classes`` (or its
own tokenizer).

Options come from the run's config, so one YAML file describes the whole reward.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from ..config.grpo_config import GRPOConfig
from ..errors import ConfigError
from ..imports import import_callable, is_import_spec
from ..rewards import RewardFunc, reward_func_name
from ..rewards.scoring import RolloutScorer
from ..runtime.distributed import resolve_device
from ..sections import (
    GenerationOptions,
    ModelOptions,
    RewardOptions,
    RuntimeOptions,
    SectionGroup,
)
from .rollout import GUESS_TASK

if TYPE_CHECKING:
    from ..rewards.model import RewardModel


# ----------------------------------------------------------------------------------------------
# Machine and model










# ----------------------------------------------------------------------------------------------
# Rewards


def _format(spec: str, options: ScorerOptions) -> RewardFunc:
    from ..rewards.shaping import format_reward

    return format_reward


def _tool_call(spec: str, options: ScorerOptions) -> RewardFunc:
    from ..tools.environment import tool_call_reward

    return tool_call_reward


def _guess(spec: str, options: ScorerOptions) -> RewardFunc:
    from ..tools.environment import guess_reward

    return guess_reward


def _soft_format(spec: str, options: ScorerOptions) -> RewardFunc:
    from ..rewards.shaping import soft_format_reward

    return soft_format_reward


def _accuracy(spec: str, options: ScorerOptions) -> RewardFunc:
    from ..rewards.math import make_accuracy_reward

    return make_accuracy_reward(timeout_s=options.rewards.accuracy_timeout)


def _length_penalty(spec: str, options: ScorerOptions) -> RewardFunc:
    from ..rewards.shaping import make_length_penalty

    rewards, max_len = options.rewards, options.generation.max_completion_length
    buffer = rewards.overlong_buffer_len or max(1, max_len // 4)  # None: max_len // 4
    return make_length_penalty(max_len, buffer, penalty_factor=rewards.overlong_penalty_factor)


def _repetition_penalty(spec: str, options: ScorerOptions) -> RewardFunc:
    from ..rewards.shaping import make_repetition_penalty

    rewards = options.rewards
    return make_repetition_penalty(
        ngram_size=rewards.repetition_ngram_size, max_penalty=rewards.repetition_max_penalty
    )


def _code(spec: str, options: ScorerOptions) -> RewardFunc:
    from ..rewards.code import make_code_reward

    return make_code_reward(timeout_s=options.rewards.code_timeout, binary=spec == "code_binary")


def _task(spec: str, options: ScorerOptions) -> RewardFunc:
    from ..tasks import task_reward_func

    return task_reward_func(spec)


# The built-in reward functions by name, each a factory ``(name, options) -> RewardFunc`` that
# imports its module only when the name is used.
BUILT_IN_REWARDS: dict[str, Callable[[str, ScorerOptions], RewardFunc]] = {
    "format": _format,
    "tool_call": _tool_call,
    "guess": _guess,
    "soft_format": _soft_format,
    "accuracy": _accuracy,
    "length_penalty": _length_penalty,
    "repetition_penalty": _repetition_penalty,
    "code": _code,
    "code_binary": _code,
    "countdown": _task,
    "reasoning_gym": _task,
    "task": _task,
}
# Every name reward_funcs accepts besides a function or a model: the built-ins, a reward model
# (a sequence classifier's folder or hub id) and a remote verifier.
REWARD_NAMES = (*BUILT_IN_REWARDS, "reward_model:PATH", "remote:URL")

# The dataset column each built-in reward reads (checked when the data loads).
REWARD_COLUMNS = {"accuracy": "answer", "code": "tests", "code_binary": "tests"}

# Rewards of a file task (a path, not a built-in task name) when reward_funcs is not given.
FILE_TASK_REWARDS = ("format", "accuracy")


@dataclass(frozen=True)
class ScorerOptions(SectionGroup):
    """The sections the reward functions and their scorer read, and only those: ``rewards``,
    the longest completion (``generation``: the overlong penalty's length), how reward models
    load (``model``: trust_remote_code) and where they run by default (``runtime``: device)."""

    rewards: RewardOptions
    generation: GenerationOptions
    model: ModelOptions
    runtime: RuntimeOptions
    @classmethod
    def of(cls, args: GRPOConfig | ScorerOptions | None) -> ScorerOptions:
        """``args`` as these options (``GRPOConfig()``'s defaults when None)."""
        if isinstance(args, ScorerOptions):
            return args
        return cls.from_sections((args if args is not None else GRPOConfig()).sections())


def default_reward_names(args: GRPOConfig) -> list[str]:
    """The run's reward function names: ``reward_funcs``, else the built-in task's default
    rewards, else ``["format", "accuracy"]`` (a file task). A new list each call."""
    if args.reward_funcs is not None:
        return list(args.reward_funcs)
    from ..tasks import TASKS, task_reward_funcs

    if args.task == GUESS_TASK:
        return ["guess"]
    return task_reward_funcs(args.task) if args.task in TASKS else list(FILE_TASK_REWARDS)


def build_reward_func(
    spec: str | RewardFunc, args: GRPOConfig | ScorerOptions | None = None
) -> RewardFunc:
    """A reward function from a built-in name (see the module docstring), configured from
    ``args`` (a config or its :class:`ScorerOptions`; ``GRPOConfig()``'s defaults when None), or
    a callable as is."""
    if callable(spec):
        return spec
    if not isinstance(spec, str):
        raise ValueError(f"a reward function must be a callable or a name, got {spec!r}")
    options = ScorerOptions.of(args)
    if spec in BUILT_IN_REWARDS:
        return BUILT_IN_REWARDS[spec](spec, options)
    if spec.startswith(("reward_model:", "remote:")):
        try:
            if spec.startswith("reward_model:"):
                from ..rewards.model import RewardModel

                return RewardModel(spec.split(":", 1)[1])
            from ..rewards.remote import RemoteReward

            return RemoteReward(spec.split(":", 1)[1], timeout=options.rewards.remote_timeout)
        except (ValueError, OSError) as err:
            raise ConfigError(f"reward_funcs: {spec!r}: {err}") from err
    if is_import_spec(spec):  # the user's own function: module:function or file.py:function
        return import_callable(spec, "reward_funcs")
    if _is_model_spec(spec):
        return reward_model(spec, options)  # TRL: any other string is a reward model
    names = [n for n in REWARD_NAMES if ":" not in n]
    close = difflib.get_close_matches(spec, names, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    raise ConfigError(
        f"reward_funcs: unknown reward function {spec!r}; {hint}built-in ones are: "
        f"{', '.join(REWARD_NAMES)}; or your own as module:function or path/to/file.py:function; "
        "or a sequence-classification reward model's folder or hub id (org/name)"
    )


def reward_tokenizers(classes: Any, count: int) -> list[Any]:
    """TRL's ``reward_processing_classes`` as one entry per reward function: None -> all None,
    one tokenizer -> a list of it; a list must have ``count`` entries."""
    if classes is None:
        return [None] * count
    listed = list(classes) if isinstance(classes, (list, tuple)) else [classes]
    if len(listed) != count:
        raise ConfigError(
            f"reward_processing_classes has {len(listed)} entries for {count} reward functions: "
            "the two must match (one entry per reward function, None for those that are not "
            "reward models)"
        )
    return listed


def _is_model_spec(spec: str) -> bool:
    """Whether ``build_reward_func`` reads the string ``spec`` as a reward model."""
    if spec in REWARD_NAMES or spec.startswith(("reward_model:", "remote:")):
        return False
    if is_import_spec(spec):
        return False
    return os.path.exists(os.path.expanduser(spec)) or bool(_HUB_ID.match(spec))


# A hub id: "org/name" of letters, digits, "-", "_" and "." (one "/"); a bare word is a
# built-in name (or its typo), never a hub id.
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def reward_model(
    model: str | torch.nn.Module,
    options: ScorerOptions,
    tokenizer: PreTrainedTokenizerBase | None = None,
    device: torch.device | None = None,
) -> RewardModel:
    """TRL's reward model in ``reward_funcs``: a folder or hub id, loaded as
    ``AutoModelForSequenceClassification.from_pretrained(path, num_labels=1)``, or a loaded
    sequence-classification model; on ``device`` (default: the ``device`` option's), named by
    the last part of its path (TRL's reward name), with ``tokenizer`` (TRL's
    ``reward_processing_classes`` entry) or its own."""
    from ..rewards.model import RewardModel

    device = device if device is not None else resolve_device(options.runtime.device)
    trust_remote_code = options.model.trust_remote_code
    if isinstance(model, str):
        try:
            return RewardModel(
                model,
                tokenizer,
                device=device,
                name=Path(model.rstrip("/\\")).name,
                model_kwargs={"num_labels": 1, "trust_remote_code": trust_remote_code},
            )
        except (ValueError, OSError) as err:
            raise ConfigError(
                f"reward_funcs: {model!r} is not a built-in reward name ({', '.join(REWARD_NAMES)})"
                f", so it was read as a sequence-classification reward model's folder or hub id, "
                f"and that failed: {err}"
            ) from err
    path = getattr(model, "name_or_path", "") or getattr(model.config, "_name_or_path", "")
    if tokenizer is None:
        if not path:
            raise ConfigError(
                f"reward_funcs: a loaded {type(model).__name__} has no name_or_path to load its "
                "tokenizer from; pass it in reward_processing_classes"
            )
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    name = Path(str(path).rstrip("/\\")).name if path else type(model).__name__
    return RewardModel(model, tokenizer, device=device, name=name)


def build_scorer(
    reward_funcs: RewardFunc | str | Sequence[RewardFunc | str] | None,
    options: ScorerOptions,
    reward_processing_classes: Any = None,
    device: torch.device | None = None,
    environment_rewards: Sequence[RewardFunc] = (),
    trainer_state: Callable[[], Any] | None = None,
) -> RolloutScorer:
    """Reward functions from built-in names (configured from ``options``), callables or reward
    models (see the module docstring), with ``reward_weights`` (default 1 each), then the
    rewards of environments that own theirs (TRL's ``get_reward``), weight 1 each
    (``reward_weights`` covers the others only, as TRL). ``reward_processing_classes``: TRL's
    tokenizers of the reward models, one or a list with one entry per reward function (entries
    of other functions are not used). ``device``: where TRL-style reward models run (the
    trainer's device; default: the ``device`` option's). ``trainer_state``: what gives the reward
    functions TRL's ``trainer_state`` keyword (the training run's state when a batch is scored)."""
    if reward_funcs is None:
        reward_funcs = []
    elif callable(reward_funcs) or isinstance(reward_funcs, str):
        reward_funcs = [reward_funcs]
    reward_funcs = list(reward_funcs)
    tokenizers = reward_tokenizers(reward_processing_classes, len(reward_funcs))
    funcs = []
    for spec, tokenizer in zip(reward_funcs, tokenizers, strict=True):
        if isinstance(spec, torch.nn.Module) or (isinstance(spec, str) and _is_model_spec(spec)):
            funcs.append(reward_model(spec, options, tokenizer, device))  # TRL's reward models
        else:
            funcs.append(build_reward_func(spec, options))
    rewards = options.rewards
    weights = list(rewards.reward_weights or [1.0] * len(funcs))
    if len(weights) != len(funcs):
        names = [reward_func_name(f) for f in funcs]
        raise ConfigError(
            f"reward_weights has {len(weights)} entries for {len(funcs)} reward functions "
            f"({names}); give one weight per reward function"
        )
    if not funcs and not environment_rewards:
        raise ConfigError(
            "No reward source provided: pass reward_funcs, or an environment_factory whose "
            "environment defines get_reward()"
        )
    funcs = [*funcs, *environment_rewards]
    weights = [*weights, *[1.0] * len(environment_rewards)]
    return RolloutScorer(
        funcs,
        weights,
        max_failure_fraction=rewards.reward_max_failure_fraction,
        timeout=rewards.reward_timeout,
        slow_call_s=rewards.slow_call_warning,
        trainer_state=trainer_state,
    )


# ----------------------------------------------------------------------------------------------
# Curriculum


