"""The vLLM server engine (``vllm_mode: server``): generation on a vLLM server of its own, on its
own GPUs, while the trainer trains on the others.

The server is vLLM's own OpenAI-compatible server with its RL routes (``VLLM_SERVER_DEV_MODE=1``)
and a weight-transfer backend, started apart from the run (``groupwise vllm-serve MODEL`` starts
it with every flag below; docs/scaling.md):

    VLLM_SERVER_DEV_MODE=1 python -m vllm.entrypoints.openai.api_server --model MODEL \\
        --logprobs-mode processed_logprobs --weight-transfer-config '{"backend": "nccl"}'

vLLM's server rather than TRL's ``trl vllm-serve`` protocol: vLLM's is maintained with vLLM
(weight transfer through its own trainer engines, layerwise reload, pause / resume, weight
versions), needs nothing on the server but vLLM (and groupwise for the CPU build's backend), and
serves any OpenAI client besides; TRL's is a separate server that re-implements the weight
channel on top of vLLM.

Generation. One ``/v1/completions`` request per prompt, given as token ids (never re-tokenised),
with ``n`` = its rollout count, ``logprobs=0`` (the sampled token's log-prob; the server must
run with ``--logprobs-mode processed_logprobs``, checked at connection, so it is the log-prob
under the distribution the token was drawn from, as the colocated engine records) and a seed
drawn from the run's sampling generator: a run samples the same completions whatever else the
server serves, and a resumed run continues the same stream. The requests go out together (the
server batches them) and the replies fill a :class:`~groupwise.rollout.base.Rollout` exactly as
the colocated engine fills one (:func:`~groupwise.rollout.vllm.completions_rollout`).

Weights. After every optimizer step :meth:`VLLMServerEngine.sync` sends the policy's weights
through vLLM's trainer-side weight-transfer engine (:mod:`groupwise.rollout.vllm_transfer`):
``nccl`` broadcasts them GPU to GPU, ``groupwise_safetensors`` hands them over in files on one
host (vLLM's CPU build, or no NCCL). The backend is the one the server was started with (read
from its ``/server_info``); the wire dtype is the server's model dtype. Then the server's prefix
cache is reset (its KV blocks were computed with the old weights).

Under torchrun one rank drives the server: every rank sends its own prompts (the server batches
what the ranks send), rank 0 alone sends the weights (the others join the weight gathering,
which under FSDP is a collective), and every rank waits at a barrier until the server holds
the new weights.

A server that stops answering raises :class:`~groupwise.errors.GenerationServerError`, which
names the server and the route; the run stops there and its last checkpoint is the state to
resume from once the server is back.
"""

from __future__ import annotations

import contextlib
import json
import socket
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase

from ..errors import ConfigError, GenerationServerError, first_line
from .base import Engine, Request, Rollout, SamplingParams
from .vllm import Completion, check_temperature, completions_rollout, import_vllm
from .weight_sync import checkpoint_shapes, checkpoint_weights, unties_embeddings

PROCESSED = "processed_logprobs"
SERVE_HINT = (
    "start it with `groupwise vllm-serve MODEL` (vLLM's server with VLLM_SERVER_DEV_MODE=1, "
    "--logprobs-mode processed_logprobs and a --weight-transfer-config; docs/scaling.md)"
)
MAX_PARALLEL_REQUESTS = 64  # HTTP requests in flight at once; the server batches them


def server_url(base_url: str | None, host: str, port: int) -> str:
    """The server's address: ``base_url`` when given (TRL's ``vllm_server_base_url``), else
    ``http://host:port``."""
    if base_url:
        return base_url.rstrip("/")
    return f"http://{host}:{port}"


class ServerClient:
    """JSON over HTTP to the vLLM server; also vLLM's ``VLLMWeightSyncClient`` (the four
    weight-update routes its trainer-side transfer engines drive). Every failure is a
    :class:`~groupwise.errors.GenerationServerError` naming the route."""

    def __init__(self, base_url: str, timeout: float | None = None) -> None:
        self.base_url, self.timeout = base_url.rstrip("/"), timeout

    def call(self, route: str, payload: Any = None, method: str = "POST") -> Any:
        data = None if payload is None else json.dumps(payload).encode()
        request = urllib.request.Request(
            self.base_url + route,
            data=data if method == "POST" else None,
            method=method,
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                body = response.read()
        except urllib.error.HTTPError as err:
            detail = err.read().decode(errors="replace")[:500]
            raise GenerationServerError(
                f"the vLLM server at {self.base_url} refused {method} {route} "
                f"(HTTP {err.code}): {detail}"
            ) from None
        except (urllib.error.URLError, OSError) as err:
            reason = getattr(err, "reason", err)
            raise GenerationServerError(
                f"the vLLM server at {self.base_url} did not answer {method} {route} "
                f"({first_line(reason) if isinstance(reason, BaseException) else reason}): is it "
                "still running?"
            ) from None
        return json.loads(body) if body else None

    def get(self, route: str) -> Any:
        return self.call(route, method="GET")

    def wait_until_up(self, timeout: float) -> None:
        """Poll ``/health`` until the server answers, for at most ``timeout`` seconds (TRL's
        ``vllm_server_timeout``)."""
        import time

        deadline = time.monotonic() + timeout
        while True:
            try:
                self.get("/health")
                return
            except GenerationServerError as err:
                if time.monotonic() >= deadline:
                    raise GenerationServerError(
                        f"no vLLM server answered at {self.base_url} within {timeout:.0f} s "
                        f"(vllm_server_timeout): {err}; {SERVE_HINT}"
                    ) from None
                time.sleep(1.0)

    # vLLM's VLLMWeightSyncClient protocol (its trainer-side transfer engines call these)
    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        self.call("/init_weight_transfer_engine", {"init_info": init_info})

    def start_weight_update(self) -> None:
        self.call("/start_weight_update")

    def update_weights(self, update_info: Any) -> None:
        self.call("/update_weights", {"update_info": update_info})

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        payload = None if weight_version is None else {"weight_version": weight_version}
        self.call("/finish_weight_update", payload)


class VLLMServerEngine(Engine):
    """:class:`~groupwise.rollout.base.RolloutEngine` on a vLLM server (see the module
    docstring). ``client``: the server; ``model_name``: the name it serves the model under;
    ``generator``: the run's sampling generator, which seeds every request; ``transfer``: vLLM's
    trainer-side weight-transfer engine; ``is_sender``: this rank sends the weights and resets
    the server's cache; ``barrier``: waits for every rank (torchrun) after a sync;
    ``weights`` wraps a sync (the policy's full-weights context under FSDP)."""

    records_logprobs = True  # every rollout carries sampling_logprobs: rollout correction is on

    def __init__(
        self,
        client: ServerClient,
        tokenizer: PreTrainedTokenizerBase,
        params: SamplingParams,
        eos_token_ids: Sequence[int],
        *,
        model_name: str,
        device: torch.device,
        generator: torch.Generator,
        transfer: Any,
        max_model_len: int | None,
        is_sender: bool = True,
        barrier: Callable[[], None] = lambda: None,
        weights: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
    ) -> None:
        self.client, self.tokenizer, self.params = client, tokenizer, params
        self.eos_token_ids = sorted(int(i) for i in eos_token_ids)
        self.model_name, self.device, self.generator = model_name, device, generator
        self.transfer, self.max_model_len = transfer, max_model_len
        self.is_sender, self.barrier, self.weights = is_sender, barrier, weights
        self.syncs = 0

    def payload(self, prompt: list[int], count: int, params: SamplingParams, seed: int) -> dict:
        """The ``/v1/completions`` request for one prompt's ``count`` rollouts (greedy asks for
        one, repeated by :meth:`sample`: vLLM refuses greedy sampling with n > 1)."""
        check_temperature(params)
        return {
            "model": self.model_name,
            "prompt": prompt,
            "n": 1 if params.greedy else count,
            "max_tokens": params.max_completion_length,
            "temperature": 0.0 if params.greedy else params.temperature,
            "top_p": params.top_p,
            "top_k": params.top_k if params.top_k > 0 else -1,
            "min_p": params.min_p,
            "repetition_penalty": params.repetition_penalty,
            "logprobs": 0,
            "seed": seed,
            "stop_token_ids": list(self.eos_token_ids),
            "return_token_ids": True,
        }

    def sample(self, request: Request) -> Rollout:
        prompts, counts, params = request.prompt_ids, request.counts, request.params
        generator = request.generator if request.generator is not None else self.generator
        seeds = torch.randint(
            0, 2**31 - 1, (len(prompts),), generator=generator, device=generator.device
        ).tolist()
        longest = max((len(p) for p in prompts), default=0)
        if self.max_model_len is not None and longest >= self.max_model_len:
            raise ConfigError(
                f"a prompt of {longest} tokens does not fit the vLLM server's context length "
                f"{self.max_model_len} (its --max-model-len): set max_prompt_length below it"
            )
        payloads = [
            self.payload(p, c, params, int(s))
            for p, c, s in zip(prompts, counts, seeds, strict=True)
        ]
        with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL_REQUESTS, len(payloads))) as pool:
            replies = list(
                pool.map(lambda body: self.client.call("/v1/completions", body), payloads)
            )
        groups = []
        for p, (reply, count) in enumerate(zip(replies, counts, strict=True)):
            asked = 1 if params.greedy else count
            choices = sorted(reply.get("choices", []), key=lambda c: c["index"])
            if len(choices) != asked:
                raise GenerationServerError(
                    f"the vLLM server returned {len(choices)} completions for prompt {p}, not "
                    f"{asked}"
                )
            group = [parse_choice(choice) for choice in choices]
            groups.append(group * (count if params.greedy else 1))
        return completions_rollout(self.tokenizer, prompts, groups, self.device)

    @torch.no_grad()
    def sync(self, policy: torch.nn.Module) -> None:
        """Send ``policy``'s current weights to the server (vLLM's weight transfer, from rank
        0), reset its prefix cache, and wait for every rank."""
        del policy  # the transfer engine's source reads it
        with self.weights():
            self.transfer.send_weights()
        if self.is_sender:
            self.client.call("/reset_prefix_cache")
        self.barrier()
        self.syncs += 1


def parse_choice(choice: dict[str, Any]) -> Completion:
    """A ``/v1/completions`` choice as a :class:`~groupwise.rollout.vllm.Completion`."""
    ids = [int(t) for t in choice.get("token_ids") or []]
    logprobs = (choice.get("logprobs") or {}).get("token_logprobs") or []
    if len(logprobs) != len(ids) or any(v is None for v in logprobs):
        raise GenerationServerError(
            "the vLLM server returned no log-prob for some sampled token (token_ids and "
            "logprobs.token_logprobs differ)"
        )
    return Completion(ids, [float(v) for v in logprobs], choice.get("finish_reason") == "length")


# ----------------------------------------------------------------------------------------------
# Connecting


def server_config(client: ServerClient) -> dict[str, Any]:
    """The server's vLLM config (``/server_info``, mounted with ``VLLM_SERVER_DEV_MODE=1``)."""
    try:
        info = client.get("/server_info?config_format=json")
    except GenerationServerError as err:
        raise GenerationServerError(
            f"{err}: groupwise needs the vLLM server's RL routes; {SERVE_HINT}"
        ) from None
    return info["vllm_config"]


def trainer_address(server: str) -> str:
    """This host's address as the server reaches it (the NCCL rendezvous is opened here)."""
    host = urllib.parse.urlparse(server).hostname or "127.0.0.1"
    if host in ("localhost", "127.0.0.1", "::1"):
        return "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((host, 9))  # no packet is sent: this picks the outgoing interface
        return probe.getsockname()[0]


def connect_vllm_server(
    model: torch.nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    params: SamplingParams,
    eos_token_ids: Sequence[int],
    *,
    device: torch.device,
    generator: torch.Generator,
    base_url: str,
    timeout: float,
    group_port: int,
    rank: int = 0,
    barrier: Callable[[], None] = lambda: None,
    weights: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
) -> VLLMServerEngine:
    """The engine on the vLLM server at ``base_url`` (waited for up to ``timeout`` seconds),
    its weight transfer initialised (``group_port``: the NCCL rendezvous port, TRL's
    ``vllm_group_port``) and the policy's weights sent once. Refuses a server without the RL
    routes, without processed log-probs or without a weight-transfer backend."""
    import_vllm()
    from vllm.distributed.weight_transfer.base import ParamMeta
    from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory

    from . import vllm_transfer

    vllm_transfer.register()
    client = ServerClient(base_url)
    client.wait_until_up(timeout)
    config = server_config(client)
    model_config = config.get("model_config") or {}
    if model_config.get("logprobs_mode") != PROCESSED:
        raise ConfigError(
            f"the vLLM server at {base_url} records {model_config.get('logprobs_mode')!r} "
            f"log-probs; rollout correction needs the sampled distribution's: restart it with "
            f"--logprobs-mode {PROCESSED} ({SERVE_HINT})"
        )
    backend = (config.get("weight_transfer_config") or {}).get("backend")
    if not backend:
        raise ConfigError(
            f"the vLLM server at {base_url} has no weight transfer: restart it with "
            '--weight-transfer-config \'{"backend": "nccl"}\' (GPUs) or '
            f'\'{{"backend": "{vllm_transfer.BACKEND}"}}\' (one host, no NCCL)'
        )
    if unties_embeddings(model) and not served_untied(model_config):
        raise ConfigError(
            "the policy's LM head computes with other weights than its embedding (a head "
            "trained apart, or LoRA on one of them), so the vLLM server must serve the model "
            "untied: serve a local copy whose config.json sets tie_word_embeddings: false"
        )
    models = client.get("/v1/models")["data"]
    served = models[0]
    dtype = getattr(torch, str(model_config.get("dtype", "bfloat16")).removeprefix("torch."))
    metadata = [ParamMeta(name, dtype, shape) for name, shape in checkpoint_shapes(model)]
    source = vllm_transfer.PolicyWeights(lambda: checkpoint_weights(model, dtype), metadata)
    init_info: Any
    if backend == vllm_transfer.BACKEND:
        init_info = vllm_transfer.SafetensorsTrainerInitInfo(
            rank=rank, directory=vllm_transfer.default_directory()
        )
    elif backend == "nccl":
        from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo

        world = int(client.get("/get_world_size")["world_size"]) if rank == 0 else 0
        init_info = NCCLTrainerInitInfo(
            master_address=trainer_address(base_url),
            master_port=group_port,
            world_size=world + 1,  # the trainer's sender, then the server's workers
            rank=rank,
        )
    else:
        raise ConfigError(
            f"the vLLM server at {base_url} uses the weight-transfer backend {backend!r}; "
            f"groupwise sends weights with 'nccl' or '{vllm_transfer.BACKEND}'"
        )
    transfer = WeightTransferTrainerFactory.trainer_init(init_info, client=client, source=source)
    engine = VLLMServerEngine(
        client,
        tokenizer,
        params,
        eos_token_ids,
        model_name=served["id"],
        device=device,
        generator=generator,
        transfer=transfer,
        max_model_len=served.get("max_model_len"),
        is_sender=rank == 0,
        barrier=barrier,
        weights=weights,
    )
    engine.sync(model)
    return engine


def served_untied(model_config: dict[str, Any]) -> bool:
    """Whether the server's model is a local folder whose config unties the LM head from the
    embedding (the server's ``/server_info`` does not say; its model folder does)."""
    config = Path(str(model_config.get("model", ""))) / "config.json"
    try:
        return json.loads(config.read_text()).get("tie_word_embeddings") is False
    except (OSError, ValueError):
        return False
