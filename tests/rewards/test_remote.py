"""RemoteReward against real HTTP servers on 127.0.0.1, started and stopped by each test."""

import json
import re
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from groupwise.rewards import remote
from groupwise.rewards.remote import RemoteReward, parse_rewards


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        pass  # a client that timed out leaves a broken pipe behind; that is the point


class Verifier:
    """A local HTTP server; ``respond(body, count)`` returns (status, JSON-able or bytes,
    headers) for the ``count``-th request, and may block on ``self.release``."""

    def __init__(self, respond):
        self.respond = respond
        self.bodies = []
        self.headers = []
        self.release = threading.Event()
        verifier = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                verifier.headers.append(dict(self.headers))
                verifier.bodies.append(json.loads(raw))
                status, payload, headers = verifier.respond(
                    verifier.bodies[-1], len(verifier.bodies)
                )
                data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                self.send_response(status)
                for key, value in headers.items():
                    self.send_header(key, value)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = _Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/score"
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )
        self.thread.start()

    def close(self):
        self.release.set()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)
        assert not self.thread.is_alive()


@pytest.fixture()
def serve():
    servers = []

    def start(respond):
        servers.append(Verifier(respond))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


def text(completion):
    return completion if isinstance(completion, str) else completion[-1]["content"]


def length_scores(body, count):
    return 200, {"rewards": [len(text(c)) for c in body["completions"]]}, {}


def quick(url, **kwargs):
    return RemoteReward(url, **{"timeout": 2.0, "retries": 2, "backoff": 0.01, **kwargs})


def closed_port_url():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/score"


# ---------------------------------------------------------------------------------------------
def test_round_trip_scores_and_forwards_columns(serve):
    server = serve(length_scores)
    reward = quick(server.url, headers={"Authorization": "Bearer t0ken"})
    completions = ["4", "four", "the answer is 4"]
    scores = reward(
        ["q1", "q2", "q3"],
        completions,
        completion_ids=[[1], [2], [3]],
        answer=["4", "4", "4"],
        difficulty=np.array([1, 2, 3]),
        meta=[{"id": 1}, {"id": 2}, {"id": 3}],
    )
    assert scores == [1.0, 4.0, 15.0] and all(isinstance(s, float) for s in scores)
    (body,) = server.bodies
    assert body == {
        "prompts": ["q1", "q2", "q3"],
        "completions": completions,
        "answer": ["4", "4", "4"],
        "difficulty": [1, 2, 3],
        "meta": [{"id": 1}, {"id": 2}, {"id": 3}],
    }  # completion_ids is TRL's, not a dataset column: not sent
    assert server.headers[0]["Authorization"] == "Bearer t0ken"
    assert server.headers[0]["Content-Type"] == "application/json"
    assert reward.stats == {"requests": 1, "retries": 0, "failures": 0, "last_error": None}
    assert reward.__name__ == "remote_reward"


def test_conversations_are_sent_as_messages(serve):
    server = serve(length_scores)
    prompts = [[{"role": "user", "content": "2+2?"}]] * 2
    completions = [
        [{"role": "assistant", "content": "4"}],
        [{"role": "assistant", "content": "22"}],
    ]
    assert quick(server.url, name="judge")(prompts, completions) == [1.0, 2.0]
    assert server.bodies[0]["prompts"] == prompts
    assert server.bodies[0]["completions"] == completions


def test_nulls_and_nan_mean_not_applicable(serve):
    server = serve(lambda body, count: (200, b'{"rewards": [null, 1, 0.5, NaN]}', {}))
    assert quick(server.url)(["p"] * 4, ["a", "b", "c", "d"]) == [None, 1.0, 0.5, None]


def test_a_hanging_server_times_out_with_retries(serve):
    def hang(body, count):
        server.release.wait(5)  # much longer than the client's timeout
        return 200, {"rewards": [1.0]}, {}

    server = serve(hang)
    reward = RemoteReward(server.url, timeout=0.2, retries=2, backoff=0.05)
    start = time.monotonic()
    with pytest.warns(RuntimeWarning, match=re.escape(server.url) + ".*timed out"):
        scores = reward(["p"], ["c"])
    elapsed = time.monotonic() - start
    assert scores == [None]
    # 3 attempts of 0.2 s, waits of 0.05 s and 0.1 s in between, plus slack for a busy machine.
    assert 3 * 0.2 <= elapsed < 3 * 0.2 + 0.15 + 1.0
    assert reward.stats["requests"] == 3 and reward.stats["retries"] == 2
    assert reward.stats["failures"] == 1
    assert "timed out" in reward.stats["last_error"]


def test_malformed_json_gives_none_without_retry(serve):
    server = serve(lambda body, count: (200, b"<html>oops</html>", {}))
    reward = quick(server.url)
    with pytest.warns(RuntimeWarning, match=re.escape(server.url) + ".*not JSON"):
        assert reward(["p", "q"], ["a", "b"]) == [None, None]
    assert len(server.bodies) == 1
    assert reward.stats["requests"] == 1 and reward.stats["failures"] == 1
    assert "not JSON" in reward.stats["last_error"]


def test_wrong_number_of_rewards_gives_none(serve):
    server = serve(lambda body, count: (200, {"rewards": [1.0, 2.0]}, {}))
    reward = quick(server.url)
    with pytest.warns(RuntimeWarning, match="2 rewards for 3 completions"):
        assert reward(["p"] * 3, ["a", "b", "c"]) == [None, None, None]
    assert len(server.bodies) == 1 and reward.stats["failures"] == 1


@pytest.mark.parametrize(
    "payload",
    [
        {"rewards": [1.0, "high"]},
        {"rewards": [1.0, True]},
        {"rewards": [1.0, [2.0]]},
        {"scores": [1.0, 2.0]},
        {"rewards": 3.0},
        [1.0, 2.0],
        b'{"rewards": [1.0, Infinity]}',
    ],
)
def test_invalid_rewards_give_none(serve, payload):
    server = serve(lambda body, count: (200, payload, {}))
    reward = quick(server.url)
    with pytest.warns(RuntimeWarning, match="invalid response"):
        assert reward(["p", "q"], ["a", "b"]) == [None, None]
    assert reward.stats["requests"] == 1


def test_503_twice_then_success_is_retried(serve):
    def flaky(body, count):
        if count <= 2:
            return 503, {"error": "busy"}, {}
        return length_scores(body, count)

    server = serve(flaky)
    reward = quick(server.url, retries=3)
    assert reward(["p", "q"], ["ab", "abc"]) == [2.0, 3.0]
    assert len(server.bodies) == 3
    assert reward.stats["requests"] == 3 and reward.stats["retries"] == 2
    assert reward.stats["failures"] == 0
    assert "503" in reward.stats["last_error"]  # the latest failed request, though it recovered


def test_429_is_retried_and_retry_after_is_honoured(serve):
    def limited(body, count):
        if count == 1:
            return 429, {"error": "slow down"}, {"Retry-After": "0.3"}
        return length_scores(body, count)

    server = serve(limited)
    reward = quick(server.url, backoff=0.01)
    start = time.monotonic()
    assert reward(["p"], ["abc"]) == [3.0]
    assert time.monotonic() - start >= 0.3
    assert reward.stats["retries"] == 1 and len(server.bodies) == 2


def test_retries_give_up_after_the_last_attempt(serve):
    server = serve(lambda body, count: (500, b"internal error", {}))
    reward = quick(server.url, retries=1)
    with pytest.warns(RuntimeWarning, match=r"2 attempt\(s\): HTTP 500.*internal error"):
        assert reward(["p"], ["a"]) == [None]
    assert len(server.bodies) == 2 and reward.stats["requests"] == 2


def test_backoff_doubles_up_to_max_backoff(serve, monkeypatch):
    delays = []
    monkeypatch.setattr(remote.time, "sleep", delays.append)
    server = serve(lambda body, count: (503, b"down", {}))
    reward = RemoteReward(server.url, timeout=2.0, retries=4, backoff=0.01, max_backoff=0.05)
    with pytest.warns(RuntimeWarning, match=r"5 attempt\(s\)"):
        assert reward(["p"], ["a"]) == [None]
    assert delays == pytest.approx([0.01, 0.02, 0.04, 0.05])
    # A long Retry-After is capped by max_backoff too.
    delays.clear()
    server = serve(lambda body, count: (429, b"later", {"Retry-After": "100"}))
    reward = RemoteReward(server.url, timeout=2.0, retries=1, backoff=0.01, max_backoff=0.05)
    with pytest.warns(RuntimeWarning, match="HTTP 429"):
        reward(["p"], ["a"])
    assert delays == pytest.approx([0.05])


def test_400_is_not_retried(serve):
    server = serve(lambda body, count: (400, {"error": "no answer column"}, {}))
    reward = quick(server.url, retries=3)
    with pytest.warns(RuntimeWarning, match=re.escape(server.url) + ".*HTTP 400"):
        assert reward(["p", "q"], ["a", "b"]) == [None, None]
    assert len(server.bodies) == 1
    assert reward.stats == {
        "requests": 1,
        "retries": 0,
        "failures": 1,
        "last_error": 'HTTP 400 Bad Request: {"error": "no answer column"}',
    }


def test_connection_refused_gives_none_after_retries():
    url = closed_port_url()
    reward = RemoteReward(url, timeout=1.0, retries=2, backoff=0.01)
    start = time.monotonic()
    with pytest.warns(RuntimeWarning, match=re.escape(url) + ".*refused"):
        assert reward(["p", "q"], ["a", "b"]) == [None, None]
    assert time.monotonic() - start < 1.0
    assert reward.stats["requests"] == 3 and reward.stats["retries"] == 2
    assert reward.stats["failures"] == 1


def test_recovers_on_the_next_batch(serve):
    healthy = {"up": False}

    def sometimes(body, count):
        return length_scores(body, count) if healthy["up"] else (503, b"down", {})

    server = serve(sometimes)
    reward = quick(server.url, retries=0)
    with pytest.warns(RuntimeWarning):
        assert reward(["p"], ["abc"]) == [None]
    healthy["up"] = True
    assert reward(["p"], ["abc"]) == [3.0]
    assert reward.stats["failures"] == 1 and reward.stats["requests"] == 2


def test_loopback_ignores_proxies_from_the_environment(serve, monkeypatch):
    dead_proxy = closed_port_url().removesuffix("/score")
    for key in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY"):
        monkeypatch.setenv(key, dead_proxy)
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("NO_PROXY", raising=False)
    server = serve(length_scores)
    assert quick(server.url, retries=0)(["p"], ["ab"]) == [2.0]


def test_empty_batch_sends_nothing(serve):
    server = serve(length_scores)
    reward = quick(server.url)
    assert reward([], []) == []
    assert server.bodies == [] and reward.stats["requests"] == 0


def test_unencodable_batch_gives_none():
    reward = quick(closed_port_url())
    loop = []
    loop.append(loop)
    with pytest.warns(RuntimeWarning, match="could not encode"):
        assert reward(["p"], ["a"], meta=[loop]) == [None]
    assert reward.stats["requests"] == 0 and reward.stats["failures"] == 1


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="http"):
        RemoteReward("ftp://example.com/score")
    with pytest.raises(ValueError, match="timeout"):
        RemoteReward("http://127.0.0.1:1/", timeout=0)
    with pytest.raises(ValueError, match="retries"):
        RemoteReward("http://127.0.0.1:1/", retries=-1)


def test_parse_rewards_directly():
    assert parse_rewards(b'{"rewards": [1, 2.5, null]}', 3) == [1.0, 2.5, None]
    with pytest.raises(ValueError, match="1 rewards for 2"):
        parse_rewards(b'{"rewards": [1]}', 2)
