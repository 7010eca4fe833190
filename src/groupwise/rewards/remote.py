"""A reward computed by an HTTP verifier (a sandbox, a judge, a proof checker, ...).

``RemoteReward(url)`` is a reward function with TRL's signature. Each call POSTs one JSON
request for the whole batch::

    {"prompts": [...], "completions": [...], "<column>": [...], ...}

``prompts`` and ``completions`` are sent exactly as TRL passes them: strings for plain-text
prompts, lists of ``{"role", "content"}`` messages for conversations (use the last message's
``content`` for the text). Every dataset column follows under its own name, one value per
completion. TRL's extra arguments that are not dataset columns (``completion_ids``,
``trainer_state``, ``log_extra``, ``log_metric``) are not sent. Values JSON can't hold are
converted: numpy / torch values with ``.tolist()``, sets and tuples as lists, dates as ISO
strings, bytes as UTF-8 text, anything else as ``str(value)``.

The server answers ``200`` with ``{"rewards": [r0, r1, ...]}``: one number or ``null`` per
completion, in order (``null`` and ``NaN`` mean "not applicable" and become None).

Failures never stop training: connection errors, timeouts, HTTP 5xx and 429 are retried
``retries`` times, waiting ``backoff * 2**k`` seconds before retry ``k`` (at most
``max_backoff``; a ``Retry-After`` header in seconds is honoured up to ``max_backoff``). Other
HTTP errors (4xx) and invalid responses (not JSON, no ``rewards`` list, wrong length, values
that are not numbers or null, infinities) are not retried: the same request would get the same
answer. When a batch finally fails, every completion gets None, :attr:`RemoteReward.stats` counts
it and a ``RuntimeWarning`` names the URL and the error. ``timeout`` bounds each socket operation
(connect, each read), so a server that hangs costs about ``timeout * (retries + 1)`` seconds
plus the backoff.

Only the standard library is used (``urllib.request``). Proxies from the environment
(``http_proxy``, ...) are used, except for loopback hosts (``localhost``, ``127.x``, ``::1``),
which are always reached directly.
"""

from __future__ import annotations

import datetime
import http.client
import json
import math
import time
import urllib.error
import urllib.parse
import urllib.request
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

# Keyword arguments TRL passes to reward functions that are not dataset columns.
NOT_COLUMNS = frozenset({"completion_ids", "trainer_state", "log_extra", "log_metric"})
_LOOPBACK = ("localhost", "::1")


def _jsonable(value: Any) -> Any:
    """``json.dumps`` fallback for values JSON has no type for."""
    if hasattr(value, "tolist"):  # numpy arrays and scalars, torch tensors
        return value.tolist()
    if isinstance(value, (set, frozenset)):
        return sorted(value, key=repr)
    if isinstance(value, (datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", errors="replace")
    return str(value)


def _is_loopback(host: str | None) -> bool:
    return host is not None and (host in _LOOPBACK or host.startswith("127."))


class _RequestFailed(Exception):
    def __init__(self, message: str, retryable: bool, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retryable = retryable
        self.retry_after = retry_after


def _retry_after(headers: Any) -> float | None:
    value = headers.get("Retry-After") if headers is not None else None
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        return None  # absent, or an HTTP date: use the exponential backoff
    return seconds if math.isfinite(seconds) and seconds >= 0 else None


def parse_rewards(data: bytes, n: int) -> list[float | None]:
    """The rewards in a response body; ValueError says what is wrong with it."""
    try:
        body = json.loads(data)
    except ValueError as err:  # JSONDecodeError and UnicodeDecodeError
        snippet = data[:80].decode("utf-8", errors="replace")
        raise ValueError(f"response is not JSON ({err}): {snippet!r}") from None
    if not isinstance(body, dict) or not isinstance(body.get("rewards"), list):
        raise ValueError(f'response must be a JSON object with a "rewards" list, got {body!r:.80}')
    values = body["rewards"]
    if len(values) != n:
        raise ValueError(f"response has {len(values)} rewards for {n} completions")
    rewards: list[float | None] = []
    for i, value in enumerate(values):
        if value is None:
            rewards.append(None)
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            number = float(value)
            if math.isinf(number):
                raise ValueError(f"reward {i} is {number}; rewards must be finite or null")
            rewards.append(None if math.isnan(number) else number)
        else:
            raise ValueError(f"reward {i} is {value!r}; rewards must be numbers or null")
    return rewards


class RemoteReward:
    """A reward function that asks an HTTP server to score each batch (see the module docs).

    url: the endpoint (``http://`` or ``https://``) that receives the POST.
    timeout: seconds for each socket operation of one request.
    retries: extra attempts after a retryable failure (0: a single attempt).
    backoff: seconds before the first retry, doubling for each further one.
    name: the function's ``__name__`` (the name in logs).
    headers: extra HTTP headers, e.g. ``{"Authorization": "Bearer ..."}``.
    max_backoff: the longest wait between attempts, ``Retry-After`` included.

    ``stats`` counts, over the object's life: ``requests`` (HTTP requests sent, retries
    included), ``retries``, ``failures`` (batches that got None), and ``last_error`` (the
    message of the latest failed request, or None).
    """

    def __init__(
        self,
        url: str,
        timeout: float = 10.0,
        retries: int = 3,
        backoff: float = 0.5,
        name: str = "remote_reward",
        headers: Mapping[str, str] | None = None,
        max_backoff: float = 30.0,
    ) -> None:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"RemoteReward needs an http:// or https:// URL, got {url!r}")
        if not timeout > 0:
            raise ValueError(f"timeout must be > 0, got {timeout}")
        if retries < 0 or backoff < 0 or max_backoff < 0:
            raise ValueError(
                f"retries, backoff and max_backoff must be >= 0, got {retries}, {backoff}, "
                f"{max_backoff}"
            )
        self.url = url
        self.timeout = float(timeout)
        self.retries = int(retries)
        self.backoff = float(backoff)
        self.max_backoff = float(max_backoff)
        self.headers = {
            "Content-Type": "application/json",
            "Accept": "application/json",
            "User-Agent": "groupwise-remote-reward",
            **dict(headers or {}),
        }
        self.__name__ = name
        self.stats: dict[str, Any] = {
            "requests": 0,
            "retries": 0,
            "failures": 0,
            "last_error": None,
        }
        handlers = [urllib.request.ProxyHandler({})] if _is_loopback(parts.hostname) else []
        self._opener = urllib.request.build_opener(*handlers)

    # ------------------------------------------------------------------------------------------
    def payload(
        self, prompts: Sequence[Any], completions: Sequence[Any], **columns: Any
    ) -> dict[str, Any]:
        """The JSON object sent for a batch (before encoding)."""
        body: dict[str, Any] = {"prompts": list(prompts), "completions": list(completions)}
        for key, values in columns.items():
            if key in NOT_COLUMNS:
                continue
            is_list = isinstance(values, Sequence) and not isinstance(values, (str, bytes))
            body[key] = list(values) if is_list else values
        return body

    def _post(self, data: bytes) -> bytes:
        request = urllib.request.Request(self.url, data=data, headers=self.headers, method="POST")
        try:
            with self._opener.open(request, timeout=self.timeout) as response:
                return response.read()
        except urllib.error.HTTPError as err:
            try:
                detail = err.read(200).decode("utf-8", errors="replace").strip()
            except Exception:  # noqa: BLE001 - the status is what matters
                detail = ""
            finally:
                err.close()
            message = f"HTTP {err.code} {err.reason}" + (f": {detail}" if detail else "")
            retryable = err.code == 429 or err.code >= 500
            raise _RequestFailed(message, retryable, _retry_after(err.headers)) from None
        except urllib.error.URLError as err:
            raise _RequestFailed(f"{type(err.reason).__name__}: {err.reason}", True) from None
        except (OSError, http.client.HTTPException) as err:  # timeouts, resets, bad status lines
            raise _RequestFailed(f"{type(err).__name__}: {err}", True) from None
        except ValueError as err:  # e.g. http.client.InvalidURL: retrying can't help
            raise _RequestFailed(f"{type(err).__name__}: {err}", False) from None

    def _delay(self, retry: int, retry_after: float | None) -> float:
        delay = self.backoff * 2**retry
        if retry_after is not None:
            delay = max(delay, retry_after)
        return min(delay, self.max_backoff)

    def _fail(self, n: int, error: str, attempts: int) -> list[float | None]:
        self.stats["failures"] += 1
        self.stats["last_error"] = error
        warnings.warn(
            f"{self.__name__}: POST {self.url} failed after {attempts} attempt(s): {error}; "
            f"the {n} completions of this batch get None",
            RuntimeWarning,
            stacklevel=3,
        )
        return [None] * n

    def __call__(
        self, prompts: Sequence[Any], completions: Sequence[Any], **columns: Any
    ) -> list[float | None]:
        n = len(completions)
        if n == 0:
            return []
        try:
            data = json.dumps(
                self.payload(prompts, completions, **columns), default=_jsonable
            ).encode("utf-8")
        except (TypeError, ValueError) as err:  # e.g. a circular reference
            return self._fail(n, f"could not encode the batch as JSON: {err}", 0)
        attempts = 0
        while True:
            attempts += 1
            self.stats["requests"] += 1
            try:
                body = self._post(data)
            except _RequestFailed as err:
                error, retryable, retry_after = str(err), err.retryable, err.retry_after
            else:
                try:
                    return parse_rewards(body, n)
                except ValueError as err:
                    error, retryable, retry_after = f"invalid response: {err}", False, None
            self.stats["last_error"] = error
            if not retryable or attempts > self.retries:
                return self._fail(n, error, attempts)
            self.stats["retries"] += 1
            time.sleep(self._delay(attempts - 1, retry_after))

    def __repr__(self) -> str:
        return (
            f"RemoteReward({self.url!r}, timeout={self.timeout}, retries={self.retries}, "
            f"backoff={self.backoff}, name={self.__name__!r})"
        )
