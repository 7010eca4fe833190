"""Environments for multi-turn rollouts: one instance per conversation.

The rollout engine calls ``reset(row)`` with the dataset row, then ``step(message)`` with each
assistant message; the returned :class:`EnvStep` says which messages to append (tool results,
a user's feedback) and whether the conversation is over. ``state()`` reaches the reward
functions as the ``env_state`` column.
"""

from __future__ import annotations

import functools
import inspect
import random
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..data.splits import is_eval_problem
from ..errors import ConfigError
from .calls import parse_tool_calls
from .toolbox import ToolBox, resolved


@dataclass
class EnvStep:
    messages: list[dict[str, Any]]  # observations to append, e.g. [{"role": "tool", ...}]
    done: bool
    tool_calls: int = 0  # calls made in this step (malformed blocks included)
    tool_errors: int = 0  # of which failed (bad JSON, unknown tool, raised, timed out, ...)


class Environment(Protocol):
    def reset(self, row: Mapping[str, Any]) -> None: ...

    def step(self, message: str) -> EnvStep: ...

    def state(self) -> dict[str, Any]: ...


def _tool_message(content: Any, name: str | None) -> dict[str, Any]:
    """A tool turn as TRL's tool loop builds it: the called tool's ``name`` and the value it
    returned (:attr:`ToolResult.content`); a block that did not parse has no name."""
    return {"role": "tool", "content": content} if name is None else {
        "role": "tool", "name": name, "content": content}  # fmt: skip


@dataclass
class _ToolCounts:
    calls: int = 0
    errors: int = 0
    used: list[str] = field(default_factory=list)


class ToolEnvironment:
    """Runs the tool calls of each assistant message; a message without any ends the episode.

    Every ``<tool_call>`` block, well-formed or not, uses one of ``max_tool_calls`` for the
    conversation; blocks beyond it are not run, get ``error: tool call limit (N) reached`` and
    count as errors, and that step ends the conversation (after the messages are fed back).
    Results come in call order, then one error message per malformed block.
    """

    def __init__(self, toolbox: ToolBox, max_tool_calls: int = 8) -> None:
        if max_tool_calls < 1:
            raise ConfigError(f"max_tool_calls must be >= 1, got {max_tool_calls}")
        self.toolbox = toolbox
        self.max_tool_calls = max_tool_calls
        self._counts = _ToolCounts()

    @property
    def schemas(self) -> list[dict[str, Any]]:
        return self.toolbox.schemas

    def reset(self, row: Mapping[str, Any]) -> None:
        self._counts = _ToolCounts()

    def step(self, message: str) -> EnvStep:
        calls, parse_errors = parse_tool_calls(message)
        if not calls and not parse_errors:
            return EnvStep([], done=True)
        counts = self._counts
        limit_text = f"error: tool call limit ({self.max_tool_calls}) reached"
        messages, errors, over_limit = [], 0, False
        for item in [*calls, *parse_errors]:
            name = None if isinstance(item, str) else item.name
            if counts.calls >= self.max_tool_calls:
                content, failed, over_limit = limit_text, True, True
            elif isinstance(item, str):  # a malformed block: its parse error
                content, failed = item, True
            else:
                result = self.toolbox.call(item)
                content, failed = result.content, result.error is not None
                if item.name in self.toolbox.names and item.name not in counts.used:
                    counts.used.append(item.name)
            counts.calls += 1
            errors += failed
            messages.append(_tool_message(content, name))
        counts.errors += errors
        step_calls = len(calls) + len(parse_errors)
        return EnvStep(messages, done=over_limit, tool_calls=step_calls, tool_errors=errors)

    def state(self) -> dict[str, Any]:
        c = self._counts
        return {"tool_calls": c.calls, "tool_errors": c.errors, "tools_used": list(c.used)}


# ------------------------------------------------------------------------------------------------
# Guess the number: a feedback game (the "user" answers higher / lower / correct).

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.S)
_INTEGER = re.compile(r"-?\d+")
NO_NUMBER_REPLY = "reply with a number inside <answer> </answer>"


def read_guess(message: str) -> int | None:
    """The last integer of the last ``<answer>`` block, else of the whole message."""
    answers = _ANSWER.findall(message)
    numbers = _INTEGER.findall(answers[-1] if answers else message)
    return int(numbers[-1]) if numbers else None


class GuessNumberEnvironment:
    """The model guesses ``row["secret"]``; the user replies higher, lower or correct.

    A message without a number is answered with a reminder of the format and uses a guess;
    the game ends when the number is found or after ``max_guesses`` guesses.
    """

    def __init__(self, max_guesses: int = 6) -> None:
        if max_guesses < 1:
            raise ConfigError(f"guess_number: max_guesses must be >= 1, got {max_guesses}")
        self.max_guesses = max_guesses
        self.reset({"secret": 0})

    def reset(self, row: Mapping[str, Any]) -> None:
        if "secret" not in row:
            raise ConfigError("guess_number: each row needs a 'secret' column (an integer)")
        self.secret = int(row["secret"])
        self.low = int(row.get("low", 1))
        self.high = int(row.get("high", 100))
        self.guesses = 0
        self.solved = False

    def step(self, message: str) -> EnvStep:
        if self.solved or self.guesses >= self.max_guesses:
            return EnvStep([], done=True)  # called past the end: nothing more to say
        self.guesses += 1
        guess = read_guess(message)
        if guess is None:
            reply = NO_NUMBER_REPLY
        elif guess == self.secret:
            reply, self.solved = "correct", True
        else:
            reply = "higher" if guess < self.secret else "lower"
        done = self.solved or self.guesses >= self.max_guesses
        return EnvStep([{"role": "user", "content": reply}], done=done)

    def state(self) -> dict[str, Any]:
        return {"solved": self.solved, "guesses": self.guesses, "secret": self.secret}


GUESS_SYSTEM_PROMPT = (
    "You are playing a number guessing game. The user has picked a secret integer. Each turn, "
    "think briefly, then guess one number inside <answer> </answer>, e.g. <answer>50</answer>. "
    "The user replies 'higher' if the secret is larger than your guess, 'lower' if it is "
    "smaller, and 'correct' when you have found it. Find it in as few guesses as possible."
)


def guess_number_dataset(
    num_problems: int,
    split: str = "train",
    seed: int = 0,
    low: int = 1,
    high: int = 100,
) -> list[dict[str, Any]]:
    """Seeded games ``{"prompt", "secret", "low", "high", "difficulty", "task"}``. The secrets
    of the ``train`` and ``eval`` splits never overlap (a secret may repeat within a split)."""
    if split not in ("train", "eval"):
        raise ConfigError(f"guess_number: split must be 'train' or 'eval', got {split!r}")
    if low >= high:
        raise ConfigError(f"guess_number: need low < high, got low={low}, high={high}")
    want_eval = split == "eval"
    pool = [
        n for n in range(low, high + 1) if is_eval_problem(_canonical(n, low, high)) == want_eval
    ]
    if not pool:
        raise ConfigError(f"guess_number: no {split} secrets between {low} and {high}; widen it")
    rng = random.Random(f"guess-{split}-{seed}")
    user = f"I am thinking of a number between {low} and {high}. Guess it."
    return [
        {
            "prompt": [
                {"role": "system", "content": GUESS_SYSTEM_PROMPT},
                {"role": "user", "content": user},
            ],
            "secret": rng.choice(pool),
            "low": low,
            "high": high,
            "difficulty": 1,
            "task": "guess",
        }
        for _ in range(num_problems)
    ]


def _canonical(secret: int, low: int, high: int) -> str:
    return f"guess a number in [{low}, {high}]: {secret}"


def guess_reward(
    prompts: Sequence[Any], completions: Sequence[Any], env_state: Sequence[Any], **kwargs: Any
) -> list[float]:
    """1.0 when the game was won (the environment's state says ``solved``), else 0.0."""
    return [1.0 if state and state.get("solved") else 0.0 for state in env_state]


guess_reward.is_correctness = True  # type: ignore[attr-defined]

ENVIRONMENTS: dict[str, Callable[..., Environment]] = {"guess_number": GuessNumberEnvironment}


def tool_call_reward(
    prompts: Sequence[Any], completions: Sequence[Any], env_state: Sequence[Any], **kwargs: Any
) -> list[float | None]:
    """Shaping for tool use: 1.0 when the conversation called a tool and no call failed (bad
    JSON, unknown tool, the tool raised or timed out), else 0.0; None for a single-turn rollout
    (no ``env_state``). Without it a model that rarely calls a tool gets almost no signal to
    call more (verl#1569: turns collapse to 2 without tool-call shaping)."""
    return [
        None
        if not isinstance(state, Mapping)
        else float(state.get("tool_calls", 0) > 0 and state.get("tool_errors", 0) == 0)
        for state in env_state
    ]


# ------------------------------------------------------------------------------------------------
# TRL's environment protocol (GRPOTrainer(environment_factory=...)): an object with
# ``reset(**row)`` (which may return text for the prompt), its public methods as tools and an
# optional ``get_reward()``; one factory, or a dict of them routed by the rows' ``environment``.

# The prompt of a row that has none (the environment owns the data): an empty user turn, which
# reset()'s observation fills (TRL's placeholder).
PLACEHOLDER_PROMPT: list[dict[str, str]] = [{"role": "user", "content": ""}]
# Methods of a TRL environment that are not tools.
_NOT_TOOLS = ("reset", "get_reward")


def is_groupwise_environment(instance: Any) -> bool:
    """groupwise's protocol (``reset(row)``, ``step(message)``, ``state()``) rather than TRL's."""
    return all(callable(getattr(instance, name, None)) for name in ("reset", "step", "state"))


def environment_methods(instance: Any) -> list[Callable[..., Any]]:
    """A TRL environment's tools: its public methods other than reset and get_reward, read on
    the class (as TRL does, so properties are not evaluated), bound to ``instance``."""
    return [
        getattr(instance, name)
        for name, _ in inspect.getmembers(type(instance), predicate=inspect.isfunction)
        if name not in _NOT_TOOLS and not name.startswith("_")
    ]


def _in_process(method: Callable[..., Any]) -> Callable[..., Any]:
    """An environment method as a trusted tool: it runs in the training process, because it
    reads and changes the environment's state (a forked child's changes would be lost)."""

    @functools.wraps(method)
    def tool(**arguments: Any) -> Any:
        return method(**arguments)

    tool.trusted = True  # type: ignore[attr-defined]
    return tool


@dataclass(frozen=True)
class ToolLimits:
    """The bounds of an environment's tool calls: seconds per call (a hung call is killed),
    characters of output kept, calls per conversation, and the duration past which a call is
    reported as slow (None: never). A run's come from its options (``tool_timeout``,
    ``max_tool_output_tokens``, ``max_tool_calls``, ``slow_call_warning``)."""

    timeout_s: float
    max_output_chars: int
    max_tool_calls: int
    slow_call_s: float | None

    def toolbox(self, tools: Sequence[Callable[..., Any]]) -> ToolBox:
        return ToolBox(list(tools), self.timeout_s, self.max_output_chars, self.slow_call_s)


class MethodEnvironment(ToolEnvironment):
    """One TRL environment instance as a groupwise :class:`Environment`: ``reset(row)`` calls
    ``instance.reset(**row)`` (without the routing ``environment`` column or a placeholder
    prompt) and keeps its return value (:attr:`observation`, text for the prompt, or None);
    each assistant message's tool calls run the instance's methods, in process, with the
    limits of :class:`ToolEnvironment`; ``state()`` carries the instance itself
    (``environment``), which reward functions receive as the ``environments`` column."""

    def __init__(
        self, instance: Any, limits: ToolLimits, tools: Sequence[Callable[..., Any]] = ()
    ) -> None:
        methods = [_in_process(m) for m in environment_methods(instance)]
        super().__init__(limits.toolbox([*tools, *methods]), limits.max_tool_calls)
        self.instance = instance
        self.observation: Any = None

    def reset(self, row: Mapping[str, Any]) -> None:
        super().reset(row)
        kwargs = {k: v for k, v in row.items() if k != "environment"}
        if kwargs.get("prompt") == PLACEHOLDER_PROMPT:
            del kwargs["prompt"]
        self.observation = self.instance.reset(**kwargs)

    def state(self) -> dict[str, Any]:
        return {**super().state(), "environment": self.instance}


def environment_reward(env_type: type) -> Callable[..., list[float | None]]:
    """The reward function of an environment class that owns its reward (``get_reward``): each
    rollout whose environment is of that class gets its ``get_reward()`` (awaited when it is a
    coroutine), the others None (skipped, as TRL's). Named after the class."""

    def reward(environments: Sequence[Any], **kwargs: Any) -> list[float | None]:
        values: list[float | None] = []
        for env in environments:
            if type(env) is not env_type:
                values.append(None)
                continue
            values.append(resolved(env.get_reward()))
        return values

    reward.__name__ = env_type.__name__
    reward.__qualname__ = env_type.__name__
    return reward


class EnvironmentFactories:
    """TRL's ``environment_factory``: one factory (every row uses it) or ``{name: factory}``
    (each row names its environment in an ``environment`` column, and its prompt shows only that
    environment's tools). Each environment is probed once here (reset must exist; its methods are
    the tools), and instances are reused across steps: a batch draws from a pool per name and
    builds more only when it needs more at once ("construct once, reset often", as TRL)."""

    def __init__(
        self,
        factory: Callable[[], Any] | Mapping[str, Callable[[], Any]],
        limits: ToolLimits,
        tools: Sequence[Callable[..., Any]] = (),
    ) -> None:
        self.multiple = isinstance(factory, Mapping)
        self.factories: dict[str | None, Callable[[], Any]] = (
            dict(factory) if isinstance(factory, Mapping) else {None: factory}
        )
        if not self.factories:
            raise ConfigError("environment_factory: the dict of environments is empty")
        self.limits, self.extra_tools = limits, list(tools)
        self.pools: dict[str | None, list[MethodEnvironment]] = {}
        self.tools: dict[str | None, list[Callable[..., Any]]] = {}
        self.schemas: dict[str | None, list[dict[str, Any]]] = {}
        reward_types: list[type] = []
        for name, make in self.factories.items():
            env = self._build(name, make)
            if not callable(getattr(env.instance, "reset", None)):
                raise ConfigError(
                    f"environment_factory{'' if name is None else f'[{name!r}]'}: "
                    f"{type(env.instance).__name__} has no reset method; an environment needs "
                    "reset(**row) and its tools as documented public methods"
                )
            self.pools[name] = [env]
            self.tools[name] = [*tools, *environment_methods(env.instance)]
            self.schemas[name] = env.schemas
            kind = type(env.instance)
            if callable(getattr(env.instance, "get_reward", None)) and kind not in reward_types:
                reward_types.append(kind)
        self.reward_funcs = [environment_reward(kind) for kind in reward_types]
        self.last: list[Any] | None = None  # the last batch's instances, one per rollout

    def _build(self, name: str | None, make: Callable[[], Any]) -> MethodEnvironment:
        return MethodEnvironment(make(), self.limits, self.extra_tools)

    @property
    def all_tools(self) -> list[Callable[..., Any]]:
        """Every environment's tools (each once), as TRL's ``trainer.tools``."""
        seen: list[Callable[..., Any]] = []
        for tools in self.tools.values():
            seen += [t for t in tools if t not in seen]
        return seen

    def name_of(self, row: Mapping[str, Any]) -> str | None:
        """The environment a row uses (None: the single one); unknown names are refused."""
        if not self.multiple:
            return None
        name = row.get("environment")
        if name not in self.factories:
            raise ConfigError(
                f"a row has environment={name!r}, which is not among the environments given to "
                f"environment_factory: {list(self.factories)}"
            )
        return name

    def take(
        self, rows: Sequence[Mapping[str, Any]], counts: Sequence[int]
    ) -> list[MethodEnvironment]:
        """One environment per rollout (``counts[p]`` for row p), reset from its row."""
        names = [self.name_of(row) for row in rows]
        used: dict[str | None, int] = {}
        envs = []
        for row, name, count in zip(rows, names, counts, strict=True):
            pool = self.pools[name]
            for _ in range(count):
                index = used.get(name, 0)
                if index == len(pool):
                    pool.append(self._build(name, self.factories[name]))
                used[name] = index + 1
                env = pool[index]
                env.reset(row)
                envs.append(env)
        self.last = [env.instance for env in envs]
        return envs
