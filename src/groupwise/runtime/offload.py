"""Activation offloading: what autograd saves for the backward waits in pinned host memory.

Inside :class:`OffloadActivations`, every tensor an op saves for its backward passes through a
pack hook (``torch.autograd.graph.saved_tensors_hooks``): a device tensor is copied into a
pinned host buffer and the device copy is released; the backward's unpack hook copies it back.
GPU memory then holds the weights, the optimizer state and one layer's working set, not every
layer's activations (the approach of ``torch.autograd.graph.save_on_cpu(pin_memory=True)``
and torchtune's ``OffloadActivations``). Kept where they are: tensors on the host already,
tensors sharing a parameter's storage (a weight, or a view of it such as the ``W^T`` that a
matmul saves: copying it would move the model, not an activation) and tiny tensors (under
``min_bytes``, where a copy costs more than it frees).

CUDA ordering, without a side stream: both copies are queued on the current stream, so the
device-to-host copy runs before any later kernel can reuse the freed device block (the caching
allocator is stream-ordered), and the host-to-device copy in the backward runs before the
kernels that read it; pinned buffers are only reused once their copy has finished (the caching
host allocator records the stream). Copies therefore do not overlap compute; torchtune's
side-stream variant does, at the cost of cross-stream bookkeeping.

With gradient checkpointing, the checkpointed layers save only their inputs: those are what
goes to the host.
"""

from __future__ import annotations

from typing import Any

import torch


class OffloadActivations(torch.autograd.graph.saved_tensors_hooks):
    """``with OffloadActivations(model): loss = forward(...)``; the backward may run after the
    block ends (the hooks are bound to each saved tensor when it is saved). ``copy_host``: also
    copy tensors that are already on the host (no memory is saved; it runs the same copy path
    on a CPU-only machine, for tests). Counts: ``saved`` tensors seen, ``offloaded`` of them
    (and their ``offloaded_bytes``), ``restored`` in the backward."""

    def __init__(
        self, model: torch.nn.Module, *, min_bytes: int = 1024, copy_host: bool = False
    ) -> None:
        self.parameter_storages = {
            p.untyped_storage().data_ptr() for p in model.parameters() if p.device.type != "meta"
        }
        self.min_bytes, self.copy_host = min_bytes, copy_host
        self.pin = torch.cuda.is_available()  # pinned host memory needs the CUDA driver
        self.saved = self.offloaded = self.restored = self.offloaded_bytes = 0
        super().__init__(self._pack, self._unpack)

    def __enter__(self) -> OffloadActivations:
        super().__enter__()
        return self

    def _keep(self, tensor: torch.Tensor) -> bool:
        if tensor.device.type == "cpu" and not self.copy_host:
            return True
        if tensor.layout != torch.strided or tensor.device.type == "meta":
            return True
        if tensor.untyped_storage().data_ptr() in self.parameter_storages:
            return True
        return tensor.numel() * tensor.element_size() < self.min_bytes

    def _pack(self, tensor: torch.Tensor) -> Any:
        self.saved += 1
        if self._keep(tensor):
            return tensor
        host = torch.empty(tensor.size(), dtype=tensor.dtype, pin_memory=self.pin)
        host.copy_(tensor, non_blocking=self.pin)
        self.offloaded += 1
        self.offloaded_bytes += host.numel() * host.element_size()
        return tensor.device, host

    def _unpack(self, packed: Any) -> torch.Tensor:
        if isinstance(packed, torch.Tensor):
            return packed
        device, host = packed
        self.restored += 1
        return host.to(device, non_blocking=self.pin)
