"""Weights from the trainer to a vLLM server, through vLLM's own weight-transfer API.

vLLM (0.32) moves weights from a trainer into running inference workers with a pair of
engines per backend: a trainer-side one (``TrainerWeightTransferEngine``: ``trainer_init`` once,
``send_weights`` after each optimizer step) and a worker-side one inside the server
(``WeightTransferEngine``), driven over the server's RL routes (``/init_weight_transfer_engine``,
``/start_weight_update``, ``/update_weights``, ``/finish_weight_update``) by vLLM's
``HTTPVLLMWeightSyncClient``. The worker loads what it receives with vLLM's layerwise reload
(``initialize_layerwise_reload`` at the start, the model's ``load_weights`` per chunk,
``finalize_layerwise_reload`` at the end: q/k/v and gate/up fused, kernels repacked).

Two backends serve groupwise:

- ``nccl`` (vLLM's own): the trainer is rank 0 of an NCCL group with the server's workers and
  broadcasts every tensor from its GPU; the choice wherever trainer and server have GPUs, on one
  host or several.
- ``safetensors`` (this module's): the trainer writes one decoder layer at a time into a
  safetensors file in a directory both processes see (``/dev/shm`` by default: memory, not disk)
  and posts its path; the worker reads it and deletes nothing (the trainer does, once the
  worker has loaded it). No NCCL, no GPU: the backend for vLLM's CPU build, and a fallback on one
  host. A worker only loads files whose path lies under the directory it was initialised with.

vLLM finds the ``safetensors`` backend through groupwise's ``vllm.general_plugins`` entry point
(:func:`register`), which vLLM loads in every one of its processes when groupwise is installed
in the server's environment.

This module imports vLLM at the top: it is imported only by vLLM's plugin loader and by the
server engine (:mod:`groupwise.rollout.vllm_server`), both where vLLM is installed.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch
from vllm.distributed.weight_transfer.base import (
    ParamMeta,
    TrainerInitInfo,
    TrainerWeightTransferEngine,
    VLLMWeightSyncClient,
    WeightSource,
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)
from vllm.distributed.weight_transfer.factory import (
    WeightTransferEngineFactory,
    WeightTransferTrainerFactory,
)

from .vllm import layer_chunks, refresh_tied_lm_head

BACKEND = "groupwise_safetensors"


def default_directory() -> str:
    """Where weight files go by default: ``/dev/shm`` (a memory file system) when the host has
    one, else the temporary directory."""
    return "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()


# ----------------------------------------------------------------------------------------------
# The trainer's weights as a vLLM WeightSource


class PolicyWeights(WeightSource):
    """The policy's weights as vLLM's trainer engines read them: ``weights()`` yields
    ``(checkpoint name, tensor)`` pairs (:func:`groupwise.rollout.weight_sync.checkpoint_weights`:
    LoRA merged, the tied head once), each pass fresh; ``metadata`` (names, wire dtypes, full
    shapes) is what a pass yields, declared without gathering anything (NCCL sizes its receive
    buffers from it)."""

    def __init__(
        self, weights: Callable[[], Iterator[tuple[str, torch.Tensor]]], metadata: list[ParamMeta]
    ) -> None:
        self._weights, self._metadata = weights, metadata

    def metadata(self) -> list[ParamMeta]:
        return list(self._metadata)

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        return self._weights()


# ----------------------------------------------------------------------------------------------
# The safetensors backend, worker side (inside the vLLM server)


@dataclass
class SafetensorsInitInfo(WeightTransferInitInfo):
    directory: str  # the only directory the worker reads weight files from


@dataclass
class SafetensorsUpdateInfo(WeightTransferUpdateInfo):
    path: str  # one safetensors file: some of the model's tensors, checkpoint names


class SafetensorsWorkerEngine(WeightTransferEngine[SafetensorsInitInfo, SafetensorsUpdateInfo]):
    """Loads the files a trainer posts with vLLM's layerwise reload; after the last one, a tied
    LM head packed by the CPU build is repacked from the new embedding
    (:func:`~groupwise.rollout.vllm.refresh_tied_lm_head`)."""

    init_info_cls = SafetensorsInitInfo
    update_info_cls = SafetensorsUpdateInfo
    supports_draft_weight_update = False
    directory: Path | None = None

    def init_transfer_engine(self, init_info: SafetensorsInitInfo) -> None:
        directory = Path(init_info.directory).resolve()
        if not directory.is_dir():
            raise ValueError(
                f"safetensors weight transfer: directory {init_info.directory} does not exist on "
                "the vLLM server's host (the trainer and the server must share it)"
            )
        self.directory = directory

    def start_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        initialize_layerwise_reload(self.model)

    def update_weights(self, update_info: dict[str, Any]) -> None:
        # The base class ends with torch.accelerator.synchronize(), which raises on a CPU-only
        # torch; this load is synchronous on every device.
        self.receive_weights(self.parse_update_info(update_info))

    def receive_weights(self, update_info: SafetensorsUpdateInfo) -> None:
        from safetensors.torch import load_file

        if self.directory is None:
            raise RuntimeError("safetensors weight transfer was not initialised")
        path = Path(update_info.path).resolve()
        if self.directory not in path.parents:
            raise ValueError(
                f"safetensors weight transfer: {update_info.path} is not under the directory "
                f"the transfer was initialised with ({self.directory})"
            )
        self.model.load_weights(load_file(path).items())

    def finish_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        finalize_layerwise_reload(self.model, self.model_config)
        refresh_tied_lm_head(self.model)

    def shutdown(self) -> None:
        self.directory = None


# ----------------------------------------------------------------------------------------------
# The safetensors backend, trainer side


@dataclass
class SafetensorsTrainerInitInfo(TrainerInitInfo):
    backend: ClassVar[str] = BACKEND
    directory: str = field(default_factory=default_directory)


class SafetensorsTrainerEngine(TrainerWeightTransferEngine[SafetensorsTrainerInitInfo]):
    """Writes the policy one decoder layer at a time (:func:`~groupwise.rollout.vllm.layer_chunks`)
    into a file, posts it, and deletes it once the worker has loaded it: at most one layer is on
    the file system at a time. Ranks other than the sender only iterate the weights (under FSDP
    gathering them is a collective every rank joins)."""

    init_info_cls = SafetensorsTrainerInitInfo

    def __init__(
        self,
        *,
        client: VLLMWeightSyncClient,
        source: WeightSource | None = None,
        is_sender: bool = True,
        directory: str,
    ) -> None:
        super().__init__(client=client, source=source, is_sender=is_sender)
        self.directory = Path(directory)

    @classmethod
    def trainer_init(
        cls,
        init_info: SafetensorsTrainerInitInfo,
        *,
        client: VLLMWeightSyncClient,
        source: WeightSource | None = None,
    ) -> SafetensorsTrainerEngine:
        if source is None:
            raise ValueError("the safetensors weight transfer needs a WeightSource")
        engine = cls(
            client=client,
            source=source,
            is_sender=init_info.is_sender,
            directory=init_info.directory,
        )
        if engine.is_sender:
            engine.directory.mkdir(parents=True, exist_ok=True)
            client.init_weight_transfer_engine({"directory": str(engine.directory.resolve())})
        return engine

    def send_weights(self) -> None:
        from safetensors.torch import save_file

        assert self.source is not None
        if not self.is_sender:
            for _ in self.source:
                pass
            return
        self.client.start_weight_update()
        prefix = f"groupwise-weights-{os.getpid()}-"
        for index, chunk in enumerate(layer_chunks(iter(self.source))):
            path = self.directory / f"{prefix}{index}.safetensors"
            tensors = {name: tensor.detach().contiguous().cpu() for name, tensor in chunk}
            save_file(tensors, str(path))
            del tensors, chunk
            try:
                self.client.update_weights({"path": str(path.resolve())})
            finally:
                path.unlink(missing_ok=True)
        self.client.finish_weight_update()


def register() -> None:
    """Register the ``safetensors`` backend with vLLM's worker-side and trainer-side factories
    (vLLM's general-plugin hook; safe to call again)."""
    for factory, engine in (
        (WeightTransferEngineFactory, SafetensorsWorkerEngine),
        (WeightTransferTrainerFactory, SafetensorsTrainerEngine),
    ):
        try:
            factory.register_engine(BACKEND, engine)
        except ValueError:  # registered already (the plugin hook runs once per vLLM process)
            pass
