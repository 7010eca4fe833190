"""``groupwise vllm-serve MODEL``: a vLLM server for ``vllm_mode: server`` runs.

It is vLLM's own OpenAI-compatible server (``python -m vllm.entrypoints.openai.api_server``,
which this command becomes), started the way a groupwise run needs it:

- ``VLLM_SERVER_DEV_MODE=1``: the RL routes (weight transfer, ``/server_info``,
  ``/reset_prefix_cache``);
- ``--logprobs-mode processed_logprobs``: each sampled token's log-prob under the distribution it
  was drawn from (temperature, top-k / top-p applied), what rollout correction divides by;
- ``--weight-transfer-config``: ``nccl`` with vLLM's CUDA build, ``groupwise_safetensors``
  (files on one host) with its CPU build, unless ``--weight-transfer`` names one.

Every other argument goes to vLLM as given (``--tensor-parallel-size 2``, ``--dtype bfloat16``,
``--max-model-len 4096``, ``--gpu-memory-utilization 0.9``, ``--port 8000``, ...).
"""

from __future__ import annotations

import json
import os
import sys

USAGE = """usage: groupwise vllm-serve MODEL [--weight-transfer nccl|groupwise_safetensors]
                            [vLLM server options ...]

Starts vLLM's OpenAI-compatible server on MODEL (a local folder or a hub id) for a run with
--generation_engine vllm --vllm_mode server: its RL routes on (VLLM_SERVER_DEV_MODE=1),
--logprobs-mode processed_logprobs, and a weight transfer (--weight-transfer: nccl on GPUs,
groupwise_safetensors on vLLM's CPU build or without NCCL; default: by the installed vLLM).
Other options are vLLM's own (python -m vllm.entrypoints.openai.api_server --help), e.g.
  CUDA_VISIBLE_DEVICES=0 groupwise vllm-serve Qwen/Qwen3-1.7B --port 8000 --max-model-len 4096
then, on the other GPUs:
  CUDA_VISIBLE_DEVICES=1 groupwise train ... --generation_engine vllm --vllm_mode server
"""

OWNED = ("--logprobs-mode", "--weight-transfer-config", "--model")


def server_command(model: str, backend: str, extra: list[str]) -> list[str]:
    """The vLLM server's command line."""
    return [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        model,
        "--logprobs-mode",
        "processed_logprobs",
        "--weight-transfer-config",
        json.dumps({"backend": backend}),
        *extra,
    ]


def parse(argv: list[str]) -> tuple[str, str | None, list[str]]:
    """MODEL, the ``--weight-transfer`` backend (None: by the installed vLLM) and the options
    passed on to vLLM; ValueError for what this command sets itself."""
    if not argv or argv[0].startswith("-"):
        raise ValueError("give the model first: groupwise vllm-serve MODEL [options]")
    model, rest, backend = argv[0], [], None
    args = iter(argv[1:])
    for arg in args:
        name = arg.split("=", 1)[0]
        if name == "--weight-transfer":
            backend = arg.split("=", 1)[1] if "=" in arg else next(args, None)
            if backend not in ("nccl", "groupwise_safetensors"):
                raise ValueError(
                    f"--weight-transfer {backend}: expected nccl or groupwise_safetensors"
                )
        elif name in OWNED:
            raise ValueError(f"{name} is set by groupwise vllm-serve (see --help)")
        else:
            rest.append(arg)
    return model, backend, rest


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0
    try:
        model, backend, extra = parse(argv)
    except ValueError as err:
        print(f"groupwise vllm-serve: {err}\n\n{USAGE}", file=sys.stderr)
        return 2
    if backend is None:
        try:
            from ..rollout.vllm import cpu_build, import_vllm

            import_vllm()
        except Exception as err:  # noqa: BLE001 - the install hint, without a traceback
            print(f"groupwise vllm-serve: {err}", file=sys.stderr)
            return 1
        backend = "groupwise_safetensors" if cpu_build() else "nccl"
    command = server_command(model, backend, extra)
    print("[groupwise] " + " ".join(command), flush=True)
    env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1"}
    os.execve(sys.executable, command, env)  # the server replaces this process
