"""Reward functions by name, for YAML and the command line (``reward_funcs: [format, accuracy]``).

- ``format``: strict think-then-answer format (shaping.format_reward)
- ``soft_format``: partial credit per well-placed tag (shaping.soft_format_reward)
- ``accuracy``: final answer equals the ``answer`` column mathematically (math.accuracy_reward)
- ``length_penalty``: DAPO soft overlong punishment (max_completion_length, overlong_buffer_len)
- ``repetition_penalty``: n-gram repetition (repetition_ngram_size, repetition_max_penalty)
- ``code`` / ``code_binary``: fraction / all of the ``tests`` column passed in a sandbox
- ``countdown``: the answer expression uses each given number once and equals the target
- ``reasoning_gym``: the reasoning-gym dataset's own scorer on the ``<answer>`` content
- ``task``: the ``mixed`` task's dispatcher (each row scored by its own task's reward)
- ``reward_model:PATH``: a sequence-classification checkpoint's score (model.RewardModel)
- ``remote:URL``: an HTTP verifier (remote.RemoteReward)

Options come from the run's config, so one YAML file describes the whole reward.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .basic import RewardFunc

if TYPE_CHECKING:
    from ..config import GRPOConfig

REWARD_NAMES = (
    "format",
    "soft_format",
    "accuracy",
    "length_penalty",
    "repetition_penalty",
    "code",
    "code_binary",
    "countdown",
    "reasoning_gym",
    "task",
    "reward_model:PATH",
    "remote:URL",
)


def _option(args: GRPOConfig | None, name: str, default: Any) -> Any:
    return getattr(args, name, default) if args is not None else default


def build_reward_func(spec: str | RewardFunc, args: GRPOConfig | None = None) -> RewardFunc:
    """A reward function from a built-in name (configured from ``args``), or a callable as is."""
    if callable(spec):
        return spec
    if not isinstance(spec, str):
        raise ValueError(f"a reward function must be a callable or a name, got {spec!r}")
    if spec == "format":
        from .shaping import format_reward

        return format_reward
    if spec == "soft_format":
        from .shaping import soft_format_reward

        return soft_format_reward
    if spec == "accuracy":
        from .math import make_accuracy_reward

        return make_accuracy_reward(timeout_s=_option(args, "accuracy_timeout", 5.0))
    if spec == "length_penalty":
        from .shaping import make_length_penalty

        max_len = _option(args, "max_completion_length", 256)
        buffer = _option(args, "overlong_buffer_len", None) or max(1, max_len // 4)
        return make_length_penalty(
            max_len, buffer, penalty_factor=_option(args, "overlong_penalty_factor", 1.0)
        )
    if spec == "repetition_penalty":
        from .shaping import make_repetition_penalty

        return make_repetition_penalty(
            ngram_size=_option(args, "repetition_ngram_size", 3),
            max_penalty=_option(args, "repetition_max_penalty", -1.0),
        )
    if spec in ("code", "code_binary"):
        from .code import make_code_reward

        return make_code_reward(
            timeout_s=_option(args, "code_timeout", 5.0), binary=spec == "code_binary"
        )
    if spec in ("countdown", "reasoning_gym", "task"):
        from ..tasks import task_reward_func

        return task_reward_func(spec)
    if spec.startswith("reward_model:"):
        from .model import RewardModel

        return RewardModel(spec.split(":", 1)[1])
    if spec.startswith("remote:"):
        from .remote import RemoteReward

        return RemoteReward(spec.split(":", 1)[1], timeout=_option(args, "remote_timeout", 10.0))
    raise ValueError(
        f"unknown reward function {spec!r}; built-in ones are: {', '.join(REWARD_NAMES)}"
    )
