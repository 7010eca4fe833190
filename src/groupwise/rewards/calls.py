"""Calling one reward function on a batch: awaiting a coroutine from any context, a warning
naming a call that runs long, and ``reward_timeout``, past which the call is an error naming the
function. :class:`~groupwise.rewards.scoring.RewardScorer` calls every function through
:func:`call_reward`."""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import logging
import threading
from typing import Any

from .basic import RewardFunc

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
