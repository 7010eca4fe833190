"""The wiring layer: reward functions by name, configured from a run's ``GRPOConfig``.

This module sits above :mod:`groupwise.config`, :mod:`groupwise.rewards` and
:mod:`groupwise.tasks` and is the only one that knows all three: ``rewards`` and ``tasks`` define
reward functions, ``config`` holds their options, and the name -> function factory lives here.

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
- ``reward_model:PATH``: a sequence-classification checkpoint's score (model.RewardModel)
- ``remote:URL``: an HTTP verifier (remote.RemoteReward)

Options come from the run's config, so one YAML file describes the whole reward.
"""

from __future__ import annotations

from .config import GRPOConfig
from .rewards.basic import RewardFunc

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

# Rewards of a file task (a path, not a built-in task name) when reward_funcs is not given.
FILE_TASK_REWARDS = ("format", "accuracy")


def default_reward_names(args: GRPOConfig) -> list[str]:
    """The run's reward function names: ``reward_funcs``, else the built-in task's default
    rewards, else ``["format", "accuracy"]`` (a file task). A new list each call."""
    if args.reward_funcs is not None:
        return list(args.reward_funcs)
    from .tasks import TASKS, task_reward_funcs

    return task_reward_funcs(args.task) if args.task in TASKS else list(FILE_TASK_REWARDS)


def build_reward_func(spec: str | RewardFunc, args: GRPOConfig | None = None) -> RewardFunc:
    """A reward function from a built-in name (see the module docstring), configured from
    ``args`` (``GRPOConfig()``'s defaults when None), or a callable as is."""
    if callable(spec):
        return spec
    if not isinstance(spec, str):
        raise ValueError(f"a reward function must be a callable or a name, got {spec!r}")
    args = args if args is not None else GRPOConfig()
    if spec == "format":
        from .rewards.shaping import format_reward

        return format_reward
    if spec == "soft_format":
        from .rewards.shaping import soft_format_reward

        return soft_format_reward
    if spec == "accuracy":
        from .rewards.math import make_accuracy_reward

        return make_accuracy_reward(timeout_s=args.accuracy_timeout)
    if spec == "length_penalty":
        from .rewards.shaping import make_length_penalty

        max_len = args.max_completion_length
        buffer = args.overlong_buffer_len or max(1, max_len // 4)  # None: max_len // 4
        return make_length_penalty(max_len, buffer, penalty_factor=args.overlong_penalty_factor)
    if spec == "repetition_penalty":
        from .rewards.shaping import make_repetition_penalty

        return make_repetition_penalty(
            ngram_size=args.repetition_ngram_size, max_penalty=args.repetition_max_penalty
        )
    if spec in ("code", "code_binary"):
        from .rewards.code import make_code_reward

        return make_code_reward(timeout_s=args.code_timeout, binary=spec == "code_binary")
    if spec in ("countdown", "reasoning_gym", "task"):
        from .tasks import task_reward_func

        return task_reward_func(spec)
    if spec.startswith("reward_model:"):
        from .rewards.model import RewardModel

        return RewardModel(spec.split(":", 1)[1])
    if spec.startswith("remote:"):
        from .rewards.remote import RemoteReward

        return RemoteReward(spec.split(":", 1)[1], timeout=args.remote_timeout)
    raise ValueError(
        f"unknown reward function {spec!r}; built-in ones are: {', '.join(REWARD_NAMES)}"
    )


__all__ = ["FILE_TASK_REWARDS", "REWARD_NAMES", "build_reward_func", "default_reward_names"]
