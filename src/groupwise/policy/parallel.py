"""The policy's network under data parallel: DDP's module (:class:`LogprobModule`, the
training forward as one module call, so DistributedDataParallel synchronises every parameter it
used) and FSDP2 sharding (:func:`shard_fsdp`: each decoder layer one unit, the wrapper the root
holding the embeddings, final norm and LM head; :func:`fsdp_full_weights` gathers the full
weights for the Hugging Face model's no-grad calls: generation, evaluation, old log-probs).
With LoRA the base weights are sharded frozen and only the adapters train."""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist

from ..runtime.distributed import DistributedContext


class LogprobModule(torch.nn.Module):
    """The policy's training forward (completion log-probs) as one module call, so that
    DistributedDataParallel sees it and synchronises the gradients of every parameter used."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        from .logprobs import completion_logprobs

        return completion_logprobs(self.model, *args, **kwargs)


def _decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    get_decoder = getattr(model, "get_decoder", None)
    decoder = get_decoder() if callable(get_decoder) else None
    layers = getattr(decoder, "layers", None)
    if not isinstance(layers, torch.nn.ModuleList):
        raise ValueError(
            f"data_parallel=fsdp: cannot find the decoder layers of {type(model).__name__} "
            "(expected model.get_decoder().layers)"
        )
    return list(layers)


def shard_fsdp(
    model: torch.nn.Module,
    ctx: DistributedContext,
    device: torch.device,
    bf16_compute: bool = False,
) -> Any:
    """FSDP2: ``fully_shard`` every decoder layer, then a :class:`LogprobModule` around ``model``
    as the root (embeddings, final norm, LM head). ``model``'s parameters become DTensor shards
    in place (build the optimizer afterwards). Returns the root wrapper.

    ``bf16_compute`` (mixed precision): the shards stay in their own dtype (fp32 master weights,
    updated by AdamW) while every all-gather casts them to bf16, so a gathered layer costs half
    the memory and traffic, and gradients are reduce-scattered in fp32 so the sum over ranks
    loses nothing (FSDP2's ``MixedPrecisionPolicy``)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    # Every rank starts from rank 0's weights, as DistributedDataParallel's broadcast does.
    for tensor in itertools.chain(model.parameters(), model.buffers()):
        dist.broadcast(tensor.data, src=0)
    mesh = init_device_mesh(device.type, (ctx.world_size,))
    policy = MixedPrecisionPolicy()  # the parameters' own dtype throughout
    if bf16_compute:
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in _decoder_layers(model):
        fully_shard(layer, mesh=mesh, mp_policy=policy)
    root = fully_shard(LogprobModule(model), mesh=mesh, mp_policy=policy)
    # The root is otherwise chosen lazily by the first FSDP module to run forward; generation
    # (which bypasses the wrapper) would make a decoder layer its own root.
    root._get_fsdp_state()._lazy_init()
    return root


@contextlib.contextmanager
def fsdp_full_weights(root: Any) -> Iterator[None]:
    """Every FSDP unit under ``root`` unsharded for the block (no-grad use only: generation,
    evaluation, old/reference log-probs): the Hugging Face model can be called directly, and
    layers are gathered once rather than on every decoding step. Resharded on exit, so the
    optimizer's updates to the shards are what the next forward gathers."""
    from torch.distributed.fsdp import FSDPModule

    units = [m for m in root.modules() if isinstance(m, FSDPModule)]
    layers = [m for m in units if m is not root]
    for unit in layers:
        unit.set_reshard_after_forward(False, recurse=False)
    try:
        for unit in units:
            unit.unshard()
        yield
    finally:
        for unit in units:
            unit.reshard()
        for unit in layers:
            unit.set_reshard_after_forward(True, recurse=False)
