"""Data parallelism over ``torch.distributed`` (``torchrun --nproc_per_node N -m groupwise train``).

Each rank generates for its own share of the step's prompts, so a group never straddles two
ranks and group statistics stay local (``scale_rewards: batch`` all-gathers the rewards for its
batch std). Gradients are averaged by DistributedDataParallel; the loss weights are chosen so
the average equals the single-process gradient of the global batch (token-normalised losses
all-reduce the token count). Metrics are averaged across ranks; only rank 0 writes files.

``data_parallel: fsdp`` shards instead of replicating (FSDP2 ``fully_shard``): each decoder layer
is one unit, and the :class:`~groupwise.policy.parallel.LogprobModule` wrapper is the root,
holding the embeddings, final norm and LM head, which its forward all-gathers. Generation and
other no-grad forwards call the Hugging Face model directly, so they run inside
:func:`~groupwise.policy.parallel.fsdp_full_weights`. With LoRA the base weights are sharded
frozen and only the adapters train. This module holds the processes and their collectives; the
wrapping is :mod:`groupwise.policy.parallel`'s.

With a curriculum every rank observes the global batch (:func:`concat_over_ranks`), so its state
stays identical on every rank; Rollout-GDRO gives ranks different numbers of rows, so losses are
normalised by the global row count and FSDP ranks equalise their micro-batch count
(:func:`max_over_ranks`). PPO wraps the critic in DDP too.

On CUDA the process group has two backends (:func:`backend_for`): NCCL for the tensors on the
GPU (gradients, sharded weights, the token count) and gloo for the host ones (counts, flags,
metrics, pickled objects), which NCCL refuses.
"""

from __future__ import annotations

import atexit
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from ..errors import ConfigError


def resolve_device(name: str | torch.device | None) -> torch.device:
    """The device a run (or a reward model) names: ``"auto"`` or None is CUDA when there is
    one, else the CPU; a CUDA device asked for on a machine without CUDA is refused."""
    if name is None or name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(
            f"device={str(name)!r} was asked for but CUDA is not available on this machine; "
            "use device: auto or cpu"
        )
    return device


@dataclass(frozen=True)
class DistributedContext:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def backend_for(device_type: str) -> str:
    """The process group's backend for a run on ``device_type``.

    On CUDA, ``"cpu:gloo,cuda:nccl"``: torch sends each collective to the backend of its
    tensors' device (``BackendConfig`` and ``ProcessGroup`` in
    torch.distributed.distributed_c10d), so DDP's and FSDP2's collectives run on NCCL while host
    tensors, which NCCL alone refuses, go to gloo; object collectives pickle into host memory
    (``_get_object_coll_device`` picks the CPU when the group has a CPU backend) instead of
    copying every gather to the GPU and back."""
    return "cpu:gloo,cuda:nccl" if device_type == "cuda" else "gloo"


def init_distributed(device: str) -> DistributedContext:
    """Join the process group that torchrun describes in the environment (WORLD_SIZE > 1);
    a plain ``python`` run is a world of one and touches nothing.

    ``device`` is the run's (``auto``, ``cpu``, ``cuda`` or ``cuda:N``). On CUDA each rank works
    on ``cuda:LOCAL_RANK`` whatever N says: every rank reads the same config, and one index
    would put them all on one GPU."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size <= 1:
        return DistributedContext()
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    if not dist.is_initialized():
        device_type = "cuda" if device == "auto" else device.split(":")[0]
        # device=cuda without CUDA: resolve_device reports it next, in its words.
        cuda = device_type == "cuda" and torch.cuda.is_available()
        options: dict[str, Any] = {}
        if cuda:
            torch.cuda.set_device(local_rank)
            # The rank's one GPU (init_process_group's device_id): NCCL connects now, so a
            # broken setup fails here rather than at the first collective, and dist.barrier()
            # knows its device.
            options["device_id"] = torch.device("cuda", local_rank)
        dist.init_process_group(backend=backend_for("cuda" if cuda else "cpu"), **options)
        atexit.register(leave_process_group)
    return DistributedContext(rank=rank, world_size=world_size, local_rank=local_rank)


def leave_process_group() -> None:
    """Destroy the process group that :func:`init_distributed` joined, at interpreter exit.

    Left to the interpreter's teardown, the group's C++ objects (gloo's worker threads, the
    store's client) are torn down in no set order with the rest of the runtime, and a rank can
    abort there (``terminate called without an active exception``, SIGABRT) after its run
    finished and saved, so torchrun reports the job failed. ``destroy_process_group`` shuts the
    backends down while the interpreter is whole (on CUDA it also lets NCCL finish pending work,
    as torch asks of every program that ends). Registered with ``atexit``, so a script that
    builds a trainer under torchrun gets it too; a script that destroyed the group itself is
    left alone."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


# Host numbers (max_over_ranks, any_rank, reduce_metrics, the counts callers build with
# torch.tensor) travel as CPU tensors, served by gloo under the CUDA backend (backend_for): a few
# bytes over TCP, where NCCL would add a copy to the GPU and a read back (a stream sync) for a
# value the host holds already. all_reduce_sum keeps its argument's device, so a count still on
# the GPU (a mask's sum) is reduced there by NCCL, with no sync.


def all_reduce_sum(value: torch.Tensor, ctx: DistributedContext) -> torch.Tensor:
    if ctx.enabled:
        value = value.clone()
        dist.all_reduce(value, op=dist.ReduceOp.SUM)
    return value


def max_over_ranks(value: int, ctx: DistributedContext) -> int:
    """The largest ``value`` of any rank, on every rank."""
    if not ctx.enabled:
        return value
    tensor = torch.tensor([value], dtype=torch.int64)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return int(tensor.item())


def any_rank(flag: bool, ctx: DistributedContext) -> bool:
    """True on every rank when ``flag`` is true on at least one (keeps ranks in lock-step)."""
    if not ctx.enabled:
        return flag
    value = torch.tensor([1.0 if flag else 0.0])
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item() > 0)


def all_gather_objects(value: Any, ctx: DistributedContext) -> list[Any]:
    if not ctx.enabled:
        return [value]
    out: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(out, value)
    return out


def concat_over_ranks(columns: tuple[list, ...], ctx: DistributedContext) -> tuple[list, ...]:
    """Every rank's per-row lists, each column concatenated in rank order: the same tuple on
    every rank. Values travel pickled, so floats arrive bit for bit."""
    if not ctx.enabled:
        return columns
    gathered = all_gather_objects(columns, ctx)
    return tuple([x for part in gathered for x in part[j]] for j in range(len(columns)))


_MIN_KEYS = ("completions/min_length", "sampling/importance_sampling_ratio/min")
_MAX_KEYS = (
    "completions/max_length",
    "sampling/sampling_logp_difference/max",
    "sampling/importance_sampling_ratio/max",
)


def reduce_metrics(logs: dict[str, float], ctx: DistributedContext) -> dict[str, float]:
    """Average every numeric metric over ranks (min/max lengths take the min/max; "step" is
    shared). Every rank logs the same keys in the same order."""
    if not ctx.enabled:
        return logs
    keys = [k for k, v in logs.items() if k != "step" and isinstance(v, (int, float))]
    values = torch.tensor([float(logs[k]) for k in keys], dtype=torch.float64)
    means = values.clone()
    dist.all_reduce(means, op=dist.ReduceOp.SUM)
    means /= ctx.world_size
    mins, maxs = values.clone(), values.clone()
    dist.all_reduce(mins, op=dist.ReduceOp.MIN)
    dist.all_reduce(maxs, op=dist.ReduceOp.MAX)
    out = dict(logs)
    for i, key in enumerate(keys):
        if key in _MIN_KEYS:
            out[key] = float(mins[i])
        elif key in _MAX_KEYS:
            out[key] = float(maxs[i])
        else:
            out[key] = float(means[i])
    return out






def barrier(ctx: DistributedContext) -> None:
    if ctx.enabled:
        dist.barrier()








