"""The frozen reference policy pi_ref of the KL term (DeepSeekMath eq. 3: beta * KL[pi, pi_ref]).

A full fine-tune keeps a frozen copy of the initial weights, in one of three layouts:

- resident: on the policy's device, beside the policy;
- offloaded (``ref_model_offload``): in pinned CPU memory; each step copies it to the GPU once
  (asynchronously, from page-locked memory), computes every micro-batch's reference log-probs,
  and drops the GPU copy. Nothing is copied back: the weights are frozen;
- sharded (``data_parallel: fsdp``): FSDP2-sharded like the policy, each rank holding 1/N; its
  full weights are gathered once per step for the no-grad forwards.

The copy is made tensor by tensor straight onto its target, so an offloaded reference never
exists twice on the GPU. With LoRA there is no copy at all: the reference is the policy with its
adapter disabled (:class:`groupwise.policy.policy.Policy`).

"Frozen" unless ``sync_ref_model`` (TRL's TR-DPO option) mixes the policy into it every
``ref_model_sync_steps`` optimizer steps (:func:`mix_weights`).
"""

from __future__ import annotations

import contextlib
import copy
import itertools
from collections.abc import Callable, Iterator
from typing import Any

import torch

from ..errors import ConfigError


def frozen_copy(module: torch.nn.Module, device: torch.device, *, pin: bool = False) -> Any:
    """A deep copy of ``module`` with every parameter and buffer copied to ``device`` (pinned
    when ``pin``), no gradients. The module's own tensors are never duplicated where they live:
    ``copy.deepcopy`` finds each one's replacement in its memo. Tied weights stay tied (one
    tensor, one memo entry)."""
    memo: dict[int, Any] = {}
    for tensor in itertools.chain(module.parameters(), module.buffers()):
        if id(tensor) in memo:
            continue
        data = tensor.detach().to(device, copy=True)
        if pin:
            data = data.pin_memory()
        if isinstance(tensor, torch.nn.Parameter):
            data = torch.nn.Parameter(data, requires_grad=False)
        memo[id(tensor)] = data
    clone = copy.deepcopy(module, memo)
    return clone.eval().requires_grad_(False)


@torch.no_grad()
def mix_weights(target: torch.nn.Module, source: torch.nn.Module, alpha: float) -> None:
    """``target <- alpha * source + (1 - alpha) * target``, parameter by parameter, in place:
    TR-DPO's soft reference update (arXiv 2404.09656, eq. 6; TRL's ``SyncRefModelCallback``).
    The two modules have the same architecture (the reference is a copy of the policy); an
    offloaded target is updated where it lives (its CPU copy)."""
    pairs = zip(target.parameters(), source.parameters(), strict=True)
    for mine, theirs in pairs:
        mine.data.mul_(1.0 - alpha).add_(theirs.data.to(mine.device, mine.dtype), alpha=alpha)


class OffloadedWeights:
    """A module whose tensors live in CPU memory and visit ``device`` for a block
    (:meth:`on_device`): one host-to-device copy per tensor per visit, none back."""

    def __init__(self, module: torch.nn.Module, device: torch.device) -> None:
        self.device = device
        tensors = itertools.chain(module.parameters(), module.buffers())
        unique = {id(t): t for t in tensors}  # tied weights: one tensor
        self.tensors = [(t, t.data) for t in unique.values()]
        self.visits = 0  # blocks on the device so far (each one transfer per tensor)

    @contextlib.contextmanager
    def on_device(self) -> Iterator[None]:
        self.visits += 1
        for tensor, host in self.tensors:
            # From pinned memory the copy is asynchronous; kernels that read it queue behind it.
            tensor.data = host.to(self.device, non_blocking=True)
        try:
            yield
        finally:
            for tensor, host in self.tensors:
                tensor.data = host  # frees the device copy


class Reference:
    """The frozen copy of the policy's initial weights (``module``) and :meth:`weights`, the
    block inside which its forwards run.

    ``shard``: the FSDP2 sharding function (``distributed.shard_fsdp`` bound to the run's mesh)
    when the policy is sharded; ``gather``: the matching full-weights context
    (``distributed.fsdp_full_weights``)."""

    def __init__(
        self,
        model: torch.nn.Module,
        device: torch.device,
        *,
        offload: bool = False,
        shard: Callable[[torch.nn.Module], Any] | None = None,
        gather: Callable[[Any], contextlib.AbstractContextManager] | None = None,
    ) -> None:
        if offload and shard is not None:
            raise ConfigError(
                "ref_model_offload with data_parallel=fsdp: the reference is already sharded "
                "over the ranks (1/N of it per GPU); drop ref_model_offload"
            )
        offload = offload and device.type != "cpu"
        target = torch.device("cpu") if offload else device
        self.module = frozen_copy(model, target, pin=offload and torch.cuda.is_available())
        self.offloaded = OffloadedWeights(self.module, device) if offload else None
        self.root = shard(self.module) if shard is not None else None
        self._gather = gather

    def mix_from(self, policy: torch.nn.Module, alpha: float) -> None:
        """The soft update of :func:`mix_weights` from the policy (same layout: both sharded
        alike under FSDP, each rank mixing its own shards)."""
        mix_weights(self.module, policy, alpha)

    @contextlib.contextmanager
    def weights(self) -> Iterator[None]:
        """The full reference weights on the policy's device for the block: moved there
        (offloaded), gathered (sharded), or already there."""
        if self.offloaded is not None:
            with self.offloaded.on_device():
                yield
        elif self.root is not None and self._gather is not None:
            with self._gather(self.root):
                yield
        else:
            yield
