"""A checking wrapper around ``torch.distributed`` for a torchrun rank on CPU (gloo).

:func:`install` makes ``init_distributed`` believe it runs on CUDA while it creates the process
group: ``torch.cuda.is_available`` answers True and ``torch.cuda.set_device`` only records its
index, and ``torch.distributed.init_process_group`` records the backend (and ``device_id``) asked
for, then joins over gloo, the one backend a CPU machine has. All three are restored as soon as
``init_distributed`` returns, so the trainer itself runs on the CPU.

From then on every collective that groupwise issues is checked against the recorded backend as
torch reads it (``BackendConfig`` in torch.distributed.distributed_c10d: ``nccl`` serves only
cuda tensors, ``cpu:gloo,cuda:nccl`` serves cpu and cuda): each tensor's device type must be
served, and object collectives must pickle into host memory (torch's
``_get_object_coll_device``: the CPU when the group has a CPU backend, else a GPU round trip).
Every collective still runs over gloo, so the run goes on past a violation and :func:`write`
reports them all.

In this CPU run every tensor is on the host, so the check asks that a CUDA run's backend serves
host tensors too, which groupwise's counts, flags, metrics and pickled objects are. Tensors a
CUDA run keeps on the GPU (shard_fsdp's parameters, the token count) are held to the same,
stricter test here. Collectives torch issues itself (FSDP2's gathers and reduce-scatters,
DTensor, checkpoint state dicts) are counted, not checked: they run on the mesh's device, the
GPU in a CUDA run; DDP's gradient buckets go through C++ and are not seen at all.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import sys
from pathlib import Path
from typing import Any
from unittest import mock

import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import Backend, BackendConfig

import groupwise
import groupwise.runtime.distributed

GROUPWISE = str(Path(groupwise.__file__).resolve().parent) + os.sep

TENSOR_OPS = (
    "all_reduce",
    "broadcast",
    "reduce",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_single",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "reduce_scatter_single",
    "all_to_all",
    "all_to_all_single",
    "gather",
    "scatter",
)
OBJECT_OPS = ("all_gather_object", "broadcast_object_list", "gather_object", "scatter_object_list")

# What this rank saw: filled by install()'s patches, written by write().
state: dict[str, Any] = {
    "backend": None,  # as init_distributed asked for it
    "device_id": None,
    "set_device": [],
    "calls": collections.Counter(),  # groupwise call site -> count
    "torch_calls": collections.Counter(),  # op issued by torch itself -> count
    "violations": collections.Counter(),  # (op, device, site) -> count
}


def served_devices(backend: str) -> dict[str, str]:
    """Device type -> backend name of a process group created with ``backend``."""
    return {k: str(v) for k, v in BackendConfig(Backend(backend)).get_device_backend_map().items()}


def object_device(backend: str) -> str:
    """The device torch pickles objects into for a group with ``backend``
    (``_get_object_coll_device``)."""
    devices = list(served_devices(backend))
    if len(devices) == 1:
        return devices[0]
    return "cpu" if "cpu" in devices else devices[0]


def barrier_device(backend: str, device_id: torch.device | None) -> str:
    """The device ``dist.barrier()`` runs on in a CUDA run: the bound ``device_id``, else the CPU
    when objects go there, else the current GPU."""
    if device_id is not None:
        return device_id.type
    return "cpu" if object_device(backend) == "cpu" else "cuda"


def _site(frame: Any) -> str | None:
    """The groupwise frames (innermost first) that issued a collective; None when the caller is
    not groupwise code (torch's internals, the rank script)."""
    names = []
    while frame is not None and frame.f_code.co_filename.startswith(GROUPWISE):
        where = frame.f_code.co_filename[len(GROUPWISE) :]
        names.append(f"{where}:{frame.f_code.co_name}")
        frame = frame.f_back
    return " <- ".join(names[:4]) or None


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    return []


def _check(op: str, args: tuple, kwargs: dict, site: str) -> None:
    backend = state["backend"]
    if backend is None:  # init_distributed was not seen: the test reports it
        return
    if op in OBJECT_OPS:
        devices = {object_device(backend)}
        allowed = {"cpu"}  # pickled bytes live in host memory
    elif op == "barrier":
        devices = {barrier_device(backend, state["device_id"])}
        allowed = set(served_devices(backend))
    else:
        values = [*args, *kwargs.values()]
        devices = {t.device.type for v in values for t in _tensors(v)}
        allowed = set(served_devices(backend))
    for device in sorted(devices - allowed):
        state["violations"][(op, device, site)] += 1


def _wrap(op: str, real: Any) -> Any:
    def checked(*args: Any, **kwargs: Any) -> Any:
        site = _site(sys._getframe(1))
        if site is None:
            state["torch_calls"][op] += 1
        else:
            state["calls"][site] += 1
            _check(op, args, kwargs, site)
        return real(*args, **kwargs)

    checked.__wrapped__ = real
    return checked


def install() -> None:
    """Wrap ``init_distributed`` (wherever groupwise imported it) and the collectives."""
    real_init = groupwise.runtime.distributed.init_distributed
    real_init_process_group = dist.init_process_group
    real_is_available = torch.cuda.is_available

    def init_process_group(backend: str | None = None, *args: Any, **kwargs: Any) -> None:
        state["backend"] = backend
        device_id = kwargs.pop("device_id", None)
        if isinstance(device_id, int):
            device_id = torch.device("cuda", device_id)
        state["device_id"] = device_id
        with mock.patch("torch.cuda.is_available", real_is_available):  # a CPU group
            real_init_process_group("gloo", *args, **kwargs)

    def init_distributed(device: str) -> Any:
        with contextlib.ExitStack() as patches:
            patches.enter_context(mock.patch("torch.cuda.is_available", lambda: True))
            patches.enter_context(
                mock.patch("torch.cuda.set_device", lambda i: state["set_device"].append(int(i)))
            )
            patches.enter_context(
                mock.patch("torch.distributed.init_process_group", init_process_group)
            )
            return real_init(device)

    for name, module in list(sys.modules.items()):
        if name == "groupwise" or name.startswith("groupwise."):
            if getattr(module, "init_distributed", None) is real_init:
                module.init_distributed = init_distributed
    for op in (*TENSOR_OPS, *OBJECT_OPS, "barrier"):
        if hasattr(dist, op):
            setattr(dist, op, _wrap(op, getattr(dist, op)))


def _why(op: str, device: str) -> str:
    if op in OBJECT_OPS:
        return f"pickles into {device} memory (a round trip through the GPU)"
    return f"{device} tensors, which {state['backend']!r} does not serve"


def write(folder: str) -> None:
    """This rank's report, ``collectives-<rank>.json`` in ``folder``."""
    device_id = state["device_id"]
    report = {
        "backend": state["backend"],
        "device_id": None if device_id is None else str(device_id),
        "set_device": state["set_device"],
        "calls": dict(state["calls"]),
        "torch_calls": dict(state["torch_calls"]),
        "violations": [
            {"op": op, "device": device, "site": site, "count": n, "why": _why(op, device)}
            for (op, device, site), n in state["violations"].items()
        ],
    }
    path = Path(folder) / f"collectives-{os.environ.get('RANK', '0')}.json"
    path.write_text(json.dumps(report, indent=1))
