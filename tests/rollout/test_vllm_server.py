"""The vLLM server engine's parts that need no vLLM: its HTTP client against a local HTTP server
(errors name the server and the route), the parsing of a completion, the server's address, and
``groupwise vllm-serve``'s command line. The engine itself runs against a real vLLM server in
test_vllm_server_real.py."""

from __future__ import annotations

import http.server
import json
import socket
import threading

import pytest

from groupwise.cli.vllm_serve import parse, server_command
from groupwise.errors import GenerationServerError
from groupwise.rollout.vllm_server import ServerClient, parse_choice, served_untied, server_url


class Handler(http.server.BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802 - http.server's name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path == "/echo":
            self._reply(200, {"got": body})
        else:
            self._reply(400, {"error": "bad request for " + self.path})

    def _reply(self, code, payload):
        data = json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture()
def local_server():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_the_client_posts_json_and_reads_the_reply(local_server):
    assert ServerClient(local_server).call("/echo", {"n": 2}) == {"got": {"n": 2}}


def test_a_refused_request_names_the_server_the_route_and_the_reply(local_server):
    with pytest.raises(GenerationServerError) as caught:
        ServerClient(local_server).call("/update_weights", {"update_info": {}})
    message = str(caught.value)
    assert local_server in message and "POST /update_weights" in message
    assert "HTTP 400" in message and "bad request for /update_weights" in message


def test_a_server_that_is_gone_gives_an_error_not_a_traceback():
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    with pytest.raises(GenerationServerError, match=r"did not answer POST /v1/completions .*still"):
        ServerClient(url).call("/v1/completions", {})
    with pytest.raises(GenerationServerError, match=r"no vLLM server answered .* within 1 s"):
        ServerClient(url).wait_until_up(timeout=1.0)


def test_a_choice_becomes_a_completion():
    choice = {
        "token_ids": [5, 6, 2],
        "logprobs": {"token_logprobs": [-0.5, -1.0, -0.25]},
        "finish_reason": "stop",
    }
    completion = parse_choice(choice)
    assert completion.token_ids == [5, 6, 2] and completion.logprobs == [-0.5, -1.0, -0.25]
    assert not completion.truncated
    assert parse_choice({**choice, "finish_reason": "length"}).truncated
    with pytest.raises(GenerationServerError, match="no log-prob for some sampled token"):
        parse_choice({**choice, "logprobs": {"token_logprobs": [-0.5]}})


def test_the_servers_address():
    assert server_url(None, "0.0.0.0", 8000) == "http://0.0.0.0:8000"
    assert server_url("http://gpu-box:9000/", "0.0.0.0", 8000) == "http://gpu-box:9000"


def test_an_untied_served_model_is_read_from_its_folder(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"tie_word_embeddings": False}))
    assert served_untied({"model": str(tmp_path)})
    (tmp_path / "config.json").write_text(json.dumps({"tie_word_embeddings": True}))
    assert not served_untied({"model": str(tmp_path)})
    assert not served_untied({"model": "org/some-hub-id"})  # cannot be read: not untied


def test_vllm_serve_sets_what_a_run_needs_and_passes_the_rest():
    model, backend, extra = parse(["m", "--port", "9000", "--weight-transfer", "nccl"])
    assert (model, backend, extra) == ("m", "nccl", ["--port", "9000"])
    command = server_command(model, backend, extra)
    assert command[1:5] == ["-m", "vllm.entrypoints.openai.api_server", "--model", "m"]
    assert command[5:9] == [
        "--logprobs-mode", "processed_logprobs", "--weight-transfer-config", '{"backend": "nccl"}'
    ]  # fmt: skip
    assert command[-2:] == ["--port", "9000"]
    assert parse(["m", "--weight-transfer=groupwise_safetensors"])[1] == "groupwise_safetensors"
    with pytest.raises(ValueError, match="--logprobs-mode is set by groupwise vllm-serve"):
        parse(["m", "--logprobs-mode", "raw_logprobs"])
    with pytest.raises(ValueError, match="expected nccl or groupwise_safetensors"):
        parse(["m", "--weight-transfer", "ipc"])
    with pytest.raises(ValueError, match="give the model first"):
        parse(["--port", "9000"])
