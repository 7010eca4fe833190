"""A rollout's scores: every reward function called robustly on a batch (:func:`call_reward`:
a coroutine awaited from any context, a warning naming a call that runs long, once naming a
function slower than ``slow_call_warning``, ``reward_timeout``), their weighted combination
(:class:`RewardScorer`) and a rollout's rewards with its correctness score
(:class:`RolloutScorer`).

- Each function gets TRL's call ``f(prompts=..., completions=..., completion_ids=..., **columns,
  trainer_state=..., log_extra=..., log_metric=...)``; ``async def`` functions are awaited
  concurrently. ``trainer_state`` is the training run's ``transformers.TrainerState``, from the
  callable the scorer is built with (None outside a trainer); ``log_extra(column, values)`` adds
  a column with one value per completion to the completions log
  (:attr:`RewardScorer.last_extra`); ``log_metric(name, value)`` adds a scalar that the trainer
  logs, averaged over the step (:meth:`RewardScorer.take_metrics`).
- A function that raises is called again completion by completion, so one bad completion costs
  one None, not the batch. Exception types are counted and the first traceback of each function
  is logged once. If more than ``max_failure_fraction`` of a step's completions fail for one
  function, the run stops with :class:`RewardFunctionError` (a broken function should not train
  a model on silence).
- The combined reward is ``sum_j w_j r_j`` over the functions that returned a value; a
  completion for which every function returned None gets NaN (not applicable: no advantage).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import inspect
import json
import logging
import math
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..data.prompts import is_conversational
from ..files import atomic_write_text
from ..rollout import Rollout
from .basic import RewardFunc, correctness_index, reward_func_name

logger = logging.getLogger("groupwise.rewards")


class RewardFunctionError(RuntimeError):
    """A reward function failed or broke its contract; the message names the function."""


def run_coroutine(coro: Any) -> Any:
    """Run a coroutine to completion, also from code that is already inside an event loop
    (e.g. a notebook), where ``asyncio.run`` would refuse."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coro).result()


# A reward call on one batch still running after this many seconds is named in a warning.
# Ten minutes: far beyond a legitimate rule reward or a reward model's batch, and the call is
# not stopped (reward_timeout does that, in a worker thread, which signal-based timeouts inside
# the function cannot use).
SLOW_REWARD_WARNING_S = 600.0


def timeout_error(name: str, timeout: float, n: int) -> RewardFunctionError:
    """The error of a call to reward function ``name`` that ran past ``reward_timeout``."""
    return RewardFunctionError(
        f"reward function {name!r} ran past reward_timeout={timeout:g} s on a batch of {n} "
        "completions; make it faster, give it its own per-completion timeout, or raise "
        "reward_timeout"
    )


def call_reward(
    func: RewardFunc,
    name: str,
    kwargs: dict[str, Any],
    timeout: float | None = None,
    slow_warning_s: float | None = SLOW_REWARD_WARNING_S,
) -> Any:
    """``func(**kwargs)``, within ``timeout`` seconds when one is set: the call runs in a
    daemon thread and one that runs past it is a RewardFunctionError naming the function
    (the thread cannot be killed; it is left to finish or to end with the process). An
    awaitable result is returned as is (under ``timeout``, wrapped in ``asyncio.wait_for``)."""
    if timeout is None:
        return _call_watched(func, name, kwargs, slow_warning_s)
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["value"] = func(**kwargs)
        except BaseException as err:  # noqa: BLE001 - re-raised in the caller's thread
            outcome["error"] = err

    thread = threading.Thread(target=target, name=f"reward-{name}", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise timeout_error(name, timeout, len(kwargs.get("completions", [])))
    if "error" in outcome:
        raise outcome["error"]
    out = outcome.get("value")
    if inspect.isawaitable(out):
        return asyncio.wait_for(out, timeout)
    return out


def _call_watched(
    func: RewardFunc, name: str, kwargs: dict[str, Any], slow_warning_s: float | None
) -> Any:
    """``func(**kwargs)`` in the calling thread (so rewards that time themselves out with
    signals, as math-verify does, keep working), with a warning naming the function if
    it is still running after ``slow_warning_s`` seconds: a hung reward is then named."""
    if slow_warning_s is None:
        return func(**kwargs)
    n = len(kwargs.get("completions", []))
    timer = threading.Timer(
        slow_warning_s,
        logger.warning,
        (
            "reward function %r has been running for %g s on a batch of %d completions; if "
            "it hangs, set reward_timeout: S to stop the run naming it after S seconds",
            name,
            slow_warning_s,
            n,
        ),
    )
    timer.daemon = True
    timer.start()
    try:
        return func(**kwargs)
    finally:
        timer.cancel()


# A reward function whose one call took longer than this is named, once, with the time it took
# (the slow_call_warning option's default; tools.toolbox holds the same default for tools, and
# neither package imports the other).
SLOW_CALL_WARNING_S = 5.0


__all__ = [
    "SLOW_CALL_WARNING_S",
    "SLOW_REWARD_WARNING_S",
    "RewardFunctionError",
    "RewardScorer",
    "run_coroutine",
]

logger = logging.getLogger("groupwise.rewards")


def _warn_once(seen: set[str], key: str, message: str, *args: Any) -> None:
    """Log ``message % args`` as a warning unless ``key`` is already in ``seen`` (then add it):
    a problem of every batch would otherwise be repeated at every step."""
    if key not in seen:
        seen.add(key)
        logger.warning(message, *args)


_UNSCORED = "<all functions>"  # the once-only key of the "no reward at all" warning


def _short(value: Any, limit: int = 200) -> Any:
    """A value for a log line: long text cut to ``limit`` characters."""
    if isinstance(value, str) and len(value) > limit:
        return value[:limit] + "..."
    return value


class RewardScorer:
    """Calls reward functions on a batch and combines them with weights (state: failure counts)."""

    def __init__(
        self,
        funcs: Sequence[RewardFunc],
        weights: Sequence[float] | None = None,
        max_failure_fraction: float = 0.5,
        timeout: float | None = None,
        slow_warning_s: float | None = SLOW_REWARD_WARNING_S,
        slow_call_s: float | None = SLOW_CALL_WARNING_S,
        trainer_state: Callable[[], Any] | None = None,
    ) -> None:
        if not funcs:
            raise ValueError("at least one reward function is needed")
        weights = list(weights) if weights is not None else [1.0] * len(funcs)
        if len(weights) != len(funcs):
            raise ValueError(f"{len(weights)} reward weights for {len(funcs)} reward functions")
        if not 0.0 <= max_failure_fraction <= 1.0:
            raise ValueError(f"max_failure_fraction must be in [0, 1], got {max_failure_fraction}")
        self.funcs = list(funcs)
        self.names = [reward_func_name(f) for f in self.funcs]
        self.weights = torch.tensor(weights, dtype=torch.float32)
        self.max_failure_fraction = max_failure_fraction
        if timeout is not None and not timeout > 0:
            raise ValueError(f"timeout must be > 0 seconds or None, got {timeout}")
        self.timeout = timeout
        self.slow_warning_s, self.slow_call_s = slow_warning_s, slow_call_s
        self._slow_logged: set[str] = set()
        self.error_counts: dict[str, Counter] = {name: Counter() for name in self.names}
        self._traceback_logged: set[str] = set()
        self.nan_counts: Counter = Counter()
        self._nan_logged: set[str] = set()
        self._all_none_logged: set[str] = set()
        # TRL's trainer_state reward kwarg: what this returns when a batch is scored (None
        # without one: the functions get None, as outside a trainer).
        self.trainer_state = trainer_state
        self.pending_metrics: dict[str, list[float]] = {}
        self.last_extra: dict[str, list[Any]] = {}  # log_extra's columns of the last call
        self._extra_logged: set[str] = set()

    # ------------------------------------------------------------------------------------------
    def _check_values(self, name: str, values: Any, n: int) -> list[float | None]:
        if not isinstance(values, (list, tuple)) or len(values) != n:
            got = f"{len(values)} values" if isinstance(values, (list, tuple)) else repr(values)
            raise RewardFunctionError(
                f"reward function {name!r} must return a list of {n} floats or None, got {got}"
            )
        checked: list[float | None] = []
        for i, value in enumerate(values):
            if value is None:
                checked.append(None)
                continue
            try:
                number = float(value)
            except (TypeError, ValueError):
                raise RewardFunctionError(
                    f"reward function {name!r} returned {value!r} for completion {i}; "
                    "expected a float or None"
                ) from None
            if math.isinf(number):
                raise RewardFunctionError(
                    f"reward function {name!r} returned {number} for completion {i}; a reward "
                    "must be a finite float (return None where the reward does not apply)"
                )
            if math.isnan(number):
                self.nan_counts[name] += 1
                _warn_once(
                    self._nan_logged,
                    name,
                    "reward function %r returned NaN for completion %d; NaN counts as None "
                    "(not applicable), return None for that instead (logged once)",
                    name,
                    i,
                )
            checked.append(None if math.isnan(number) else number)
        return checked

    def _check_applies(self, name: str, values: list[float | None]) -> None:
        """Warn, by name, the first time a function gives no reward to any completion of a
        step (every value None or NaN): usually a missing dataset column or a broken parser."""
        if values and all(v is None for v in values) and name not in self._all_none_logged:
            self._all_none_logged.add(name)
            logger.warning(
                "reward function %r returned None (or NaN) for all %d completions of a step: it "
                "gives no signal; check that the dataset has the columns it reads and that it "
                "can parse the completions (logged once)",
                name,
                len(values),
            )

    def _record_failure(self, name: str, err: BaseException) -> None:
        self.error_counts[name][type(err).__name__] += 1
        if name not in self._traceback_logged:
            self._traceback_logged.add(name)
            logger.warning(
                "reward function %r raised; the completion gets None (logged once):\n%s",
                name,
                "".join(traceback.format_exception(type(err), err, err.__traceback__)),
            )

    def log_metric(self, name: str, value: float) -> None:
        """TRL's ``log_metric`` reward kwarg: a scalar for this step's logs (averaged)."""
        self.pending_metrics.setdefault(str(name), []).append(float(value))

    def take_metrics(self) -> dict[str, float]:
        """The mean of each metric ``log_metric`` received since the last call, and forget them."""
        pending, self.pending_metrics = self.pending_metrics, {}
        return {name: sum(values) / len(values) for name, values in pending.items() if values}

    def _shared(self, extra: dict[str, list[Any]]) -> dict[str, Any]:
        """The kwargs every function gets whole (never split per completion)."""

        def log_extra(column: str, values: Sequence[Any]) -> None:
            extra.setdefault(str(column), []).extend(values)

        state = self.trainer_state() if self.trainer_state is not None else None
        return {"trainer_state": state, "log_extra": log_extra, "log_metric": self.log_metric}

    def _keep_extra(self, extra: dict[str, list[Any]], n: int) -> dict[str, list[Any]]:
        """log_extra's columns that hold one value per completion; another length (e.g. a
        function that logged and then raised, and was called again per completion) is dropped,
        with a warning once per column."""
        kept = {}
        for column, values in extra.items():
            if len(values) == n:
                kept[column] = values
            else:
                _warn_once(
                    self._extra_logged,
                    column,
                    "log_extra(%r, ...) received %d values for a batch of %d completions; the "
                    "column is left out of the completions log (logged once)",
                    column,
                    len(values),
                    n,
                )
        return kept

    def _call_one_by_one(
        self,
        func: RewardFunc,
        name: str,
        kwargs: dict[str, Any],
        n: int,
        shared: dict[str, Any] | None = None,
    ):
        values: list[Any] = []
        failures = 0
        for i in range(n):
            single = {k: [v[i]] for k, v in kwargs.items()} | (shared or {})
            start = time.perf_counter()
            try:
                result = call_reward(func, name, single, self.timeout, self.slow_warning_s)
                if inspect.isawaitable(result):
                    result = run_coroutine(result)
                self._note_time(name, time.perf_counter() - start, 1)
                values.extend(self._check_values(name, result, 1))
            except RewardFunctionError:
                raise
            except Exception as err:  # noqa: BLE001 - any failure of user code is isolated
                self._record_failure(name, err)
                values.append(None)
                failures += 1
        if n and failures / n > self.max_failure_fraction:
            kinds = ", ".join(f"{k} x{v}" for k, v in self.error_counts[name].items())
            raise RewardFunctionError(
                f"reward function {name!r} failed on {failures} of {n} completions this step "
                f"(more than max_failure_fraction={self.max_failure_fraction}); errors so far: "
                f"{kinds}. The first traceback was logged to the 'groupwise.rewards' logger."
            )
        return values

    def _call_all(
        self, kwargs: dict[str, Any], n: int, shared: dict[str, Any] | None = None
    ) -> list[list[float | None]]:
        results: list[Any] = [None] * len(self.funcs)
        failed: list[int] = []
        pending: dict[int, Any] = {}
        for j, func in enumerate(self.funcs):
            start = time.perf_counter()
            try:
                out = call_reward(func, self.names[j], kwargs | (shared or {}), self.timeout,
                                  self.slow_warning_s)  # fmt: skip
            except RewardFunctionError:
                raise
            except Exception:  # noqa: BLE001 - retried completion by completion below
                failed.append(j)
                continue
            if inspect.isawaitable(out):
                pending[j] = out
            else:
                self._note_time(self.names[j], time.perf_counter() - start, n)
                results[j] = out
        if pending:

            async def timed(name: str, awaitable: Any) -> Any:
                start = time.perf_counter()
                out = await awaitable
                self._note_time(name, time.perf_counter() - start, n)
                return out

            async def gather() -> list[Any]:
                calls = [timed(self.names[j], out) for j, out in pending.items()]
                return await asyncio.gather(*calls, return_exceptions=True)

            for j, out in zip(pending, run_coroutine(gather()), strict=True):
                if isinstance(out, asyncio.TimeoutError):
                    raise timeout_error(self.names[j], float(self.timeout or 0), n)
                if isinstance(out, Exception):
                    failed.append(j)
                else:
                    results[j] = out
        columns: list[list[float | None]] = []
        for j, name in enumerate(self.names):
            if j in failed:
                columns.append(self._call_one_by_one(self.funcs[j], name, kwargs, n, shared))
            else:
                columns.append(self._check_values(name, results[j], n))
        return columns

    def _note_time(self, name: str, seconds: float, n: int) -> None:
        """Name a reward function whose call took longer than ``slow_call_s``, once."""
        if self.slow_call_s is not None and seconds > self.slow_call_s:
            _warn_once(self._slow_logged, name,
                       "reward function %r took %.1f s on a batch of %d completions (more than "
                       "slow_call_warning=%g s); every step waits for it: make it faster, or set "
                       "reward_timeout to stop a call that runs too long (logged once)",
                       name, seconds, n, self.slow_call_s)  # fmt: skip

    # ------------------------------------------------------------------------------------------
    def __call__(
        self,
        prompts: Sequence[Any],
        completions: Sequence[Any],
        completion_ids: Sequence[Sequence[int]] | None = None,
        **columns: Sequence[Any],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rewards [N] (weighted sum; NaN where every function returned None) and the
        per-function rewards [N, F] (NaN for None)."""
        n = len(completions)
        kwargs: dict[str, Any] = {"prompts": list(prompts), "completions": list(completions)}
        if completion_ids is not None:
            kwargs["completion_ids"] = list(completion_ids)
        for key, values in columns.items():
            if len(values) != n:
                raise ValueError(f"column {key!r} has {len(values)} values for {n} completions")
            kwargs[key] = list(values)
        per_func = torch.full((n, len(self.funcs)), float("nan"))
        extra: dict[str, list[Any]] = {}
        columns_out = self._call_all(kwargs, n, self._shared(extra))
        self.last_extra = self._keep_extra(extra, n)
        for j, values in enumerate(columns_out):
            self._check_applies(self.names[j], values)
            for i, value in enumerate(values):
                if value is not None:
                    per_func[i, j] = value
        rewards = torch.nansum(per_func * self.weights, dim=1)
        unscored = torch.isnan(per_func).all(dim=1)
        rewards[unscored] = float("nan")
        if unscored.any():
            self._warn_unscored(kwargs, int(unscored.nonzero()[0, 0]), int(unscored.sum()))
        return rewards, per_func

    def _warn_unscored(self, kwargs: dict[str, list[Any]], first: int, count: int) -> None:
        """Say (once, with the first such row's inputs, in TRL's words) that a completion got no
        reward at all: it then takes no part in its group's advantage."""
        if _UNSCORED in self._nan_logged:  # said once already: skip building the row
            return
        row = {key: _short(values[first]) for key, values in kwargs.items()}
        _warn_once(
            self._nan_logged,
            _UNSCORED,
            "All reward functions returned None for the following kwargs: %s (%d completion(s) of "
            "this step). Such a completion gets no reward and no advantage; make sure at least "
            "one reward function returns a value for every row (logged once).",
            row,
            count,
        )

    def error_summary(self) -> dict[str, int]:
        """Total failures per function so far (for logging)."""
        return {name: sum(counts.values()) for name, counts in self.error_counts.items()}

    def manifest(self) -> list[dict[str, Any]]:
        """One record per function, in order: ``{"name", "weight", "is_correctness"}``, where
        ``is_correctness`` marks the function :func:`correctness_index` picks (at most one)."""
        correct = correctness_index(self.funcs)
        return [
            {"name": name, "weight": float(weight), "is_correctness": j == correct}
            for j, (name, weight) in enumerate(zip(self.names, self.weights.tolist(), strict=True))
        ]

    def write_manifest(self, path: str | Path) -> None:
        """:meth:`manifest` as JSON at ``path`` (the run's ``rewards.json``, which ``groupwise
        report`` reads), written atomically (:func:`groupwise.files.atomic_write_text`)."""
        atomic_write_text(path, json.dumps(self.manifest(), indent=1) + "\n")


def score_rollout(
    scorer: RewardScorer, rows: Sequence[dict[str, Any]], rollout: Rollout
) -> tuple[torch.Tensor, torch.Tensor]:
    """Score a rollout's completions with TRL's call convention: prompts and completions
    (conversational when the prompts are: for a multi-turn rollout the whole conversation after
    the prompt, assistant turns and tool / environment messages, so the built-in rewards read
    the last message), ``completion_ids``, every dataset column by name (the union of the rows'
    keys; a row without a column passes None) and, for a multi-turn rollout, ``env_state``
    (each conversation's final environment state)."""
    group_ids = rollout.group_ids.tolist()
    prompts = [rows[g]["prompt"] for g in group_ids]
    completions: list[Any]
    if not is_conversational(rows[0]["prompt"]):
        completions = list(rollout.texts)
    elif rollout.conversations is not None:
        completions = [[dict(m) for m in c] for c in rollout.conversations]
    else:
        completions = [[{"role": "assistant", "content": t}] for t in rollout.texts]
    keys = list(dict.fromkeys(k for row in rows for k in row if k != "prompt"))
    columns = {key: [rows[g].get(key) for g in group_ids] for key in keys}
    if rollout.env_states is not None:
        columns["env_state"] = list(rollout.env_states)
        if any("environment" in state for state in rollout.env_states):
            # TRL's environment_factory: each rollout's environment instance (TRL's keyword)
            columns["environments"] = [s.get("environment") for s in rollout.env_states]
    completion_ids = [
        row[: int(n)].tolist()
        for row, n in zip(rollout.completion_ids, rollout.lengths, strict=True)
    ]
    return scorer(prompts, completions, completion_ids, **columns)


@dataclass
class Scores:
    """A rollout's rewards: the weighted total [N] (NaN where every function returned None),
    each function's [N, F] (NaN for None), and the correctness score [N]: the column of the
    reward that declares correctness, or the total when none does."""

    rewards: torch.Tensor
    per_func: torch.Tensor
    correctness: torch.Tensor
    # Columns reward functions logged with TRL's log_extra, one value per completion.
    extra: dict[str, list[Any]] = dataclasses.field(default_factory=dict)


class RolloutScorer:
    """The run's reward functions, called on a rollout with the dataset rows' columns."""

    def __init__(self, funcs: Sequence[RewardFunc], weights: Sequence[float], **kwargs: Any):
        self.funcs = list(funcs)
        self.names = [reward_func_name(f) for f in self.funcs]
        self.combine = RewardScorer(self.funcs, list(weights), **kwargs)
        # The first function that declares itself the correctness signal (``is_correctness``):
        # the curriculum's "correct", the monitor's accuracy.
        self.correctness_index = correctness_index(self.funcs)

    @property
    def correctness_name(self) -> str | None:
        j = self.correctness_index
        return self.names[j] if j is not None else None

    def __call__(self, rows: Sequence[dict[str, Any]], rollout: Rollout) -> Scores:
        rewards, per_func = score_rollout(self.combine, rows, rollout)
        j = self.correctness_index
        correctness = per_func[:, j] if j is not None else rewards
        return Scores(rewards, per_func, correctness, dict(self.combine.last_extra))

    def state_dict(self) -> dict[str, Any]:
        stats = {}
        for name, func in zip(self.names, self.funcs, strict=True):
            value = getattr(func, "stats", None)
            if dataclasses.is_dataclass(value) and not isinstance(value, type):
                stats[name] = dataclasses.asdict(value)
            elif isinstance(value, dict):
                stats[name] = dict(value)
        errors = {k: dict(v) for k, v in self.combine.error_counts.items()}
        return {"reward_errors": errors, "reward_stats": stats}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for name, counts in state.get("reward_errors", {}).items():
            self.combine.error_counts[name] = type(self.combine.error_counts[name])(counts)
        for name, func in zip(self.names, self.funcs, strict=True):
            saved = state.get("reward_stats", {}).get(name)
            current = getattr(func, "stats", None)
            if saved is None or current is None:
                continue
            if isinstance(current, dict):
                current.update(saved)
            else:
                for key, value in saved.items():
                    setattr(current, key, value)

    def logs(self, per_func: torch.Tensor) -> dict[str, float]:
        """Per reward function: mean, std, fraction None, errors and the function's own
        counters (remote failures, sandbox timeouts, ...)."""
        logs: dict[str, float] = {}
        errors = self.combine.error_summary()
        for j, name in enumerate(self.names):
            column = per_func[:, j]
            valid = column[~torch.isnan(column)]
            logs[f"rewards/{name}/mean"] = float(valid.mean()) if valid.numel() else math.nan
            logs[f"rewards/{name}/std"] = float(valid.std()) if valid.numel() > 1 else 0.0
            logs[f"rewards/{name}/frac_none"] = 1.0 - valid.numel() / max(column.numel(), 1)
            logs[f"rewards/{name}/errors"] = errors[name]
            stats = getattr(self.funcs[j], "stats", None)
            if dataclasses.is_dataclass(stats) and not isinstance(stats, type):
                stats = dataclasses.asdict(stats)
            if isinstance(stats, dict):
                for key, value in stats.items():
                    if isinstance(value, (int, float)) and not isinstance(value, bool):
                        logs[f"rewards/{name}/{key}"] = float(value)
        return logs
