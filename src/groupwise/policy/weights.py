"""The policy's weights: copies (a frozen copy made tensor by tensor on its target, weights kept
in host memory that visit the device for a block, TR-DPO's soft mix), and weights in and out (the
full state dict under FSDP, ``save_pretrained``, loading saved weights, with
:class:`CheckpointMismatch` when they do not fit, and tied parameters)."""

from __future__ import annotations

import contextlib
import copy
import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from transformers import PreTrainedModel

from ..errors import first_line


class CheckpointMismatch(ValueError):
    """Saved weights that do not fit the model (the caller names the checkpoint)."""


def full_state_dict(model: torch.nn.Module, sharded: bool) -> dict[str, Tensor] | None:
    """Under FSDP (``sharded``) the full model weights on rank 0, in CPU memory (a collective:
    every rank calls it; the others get an empty dict); None without FSDP (save_pretrained
    reads the model itself)."""
    if not sharded:
        return None
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
    )

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    weights = get_model_state_dict(model, options=options)
    # Tied weights (the LM head) come back as separate copies; save_pretrained would keep
    # both. Drop the duplicates, as a plain save_pretrained does.
    for name, _ in tied_parameter_names(model):
        weights.pop(name, None)
    return weights


def save_pretrained(
    model: PreTrainedModel, folder: Path, weights: dict[str, Tensor] | None
) -> None:
    """``model.save_pretrained(folder)``, of ``weights`` when given (:func:`full_state_dict`)."""
    if weights is None:
        model.save_pretrained(folder)
    else:
        model.save_pretrained(folder, state_dict=weights)


def load_weights(model: PreTrainedModel, path: Path, *, use_peft: bool, sharded: bool) -> None:
    """Load the weights ``save_pretrained`` wrote into ``path`` (the adapter with ``use_peft``;
    each rank keeps its own shards when ``sharded``); :class:`CheckpointMismatch` when they are
    missing or do not fit."""
    from safetensors.torch import load_file

    if use_peft:
        from peft import set_peft_model_state_dict

        file = path / "adapter_model.safetensors"
        if not file.is_file():
            raise CheckpointMismatch(f"{file.name} is missing")
        try:
            adapter = load_file(file)
        except Exception as err:  # noqa: BLE001 - a damaged file is named, not traced
            raise CheckpointMismatch(f"{file.name} cannot be read ({err}): damaged") from err
        result = set_peft_model_state_dict(model, adapter)
        if getattr(result, "unexpected_keys", None):
            raise CheckpointMismatch(
                f"adapter does not match this model ({result.unexpected_keys[:3]} ...)"
            )
        return
    files = sorted(path.glob("model*.safetensors"))
    if not files:
        raise CheckpointMismatch("no model*.safetensors weights")
    weights: dict[str, Tensor] = {}
    for file in files:
        try:
            weights.update(load_file(file))
        except Exception as err:  # noqa: BLE001 - a damaged file is named, not traced
            message = first_line(err)
            raise CheckpointMismatch(
                f"{file.name} cannot be read ({type(err).__name__}: {message}): the file is "
                "damaged; resume from an earlier checkpoint, or start over"
            ) from err
    if sharded:
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_model_state_dict,
        )

        # Every rank read the full weights; each keeps its own shards.
        options = StateDictOptions(full_state_dict=True, strict=False)
        missing, unexpected = set_model_state_dict(model, weights, options=options)
    else:
        missing, unexpected = model.load_state_dict(weights, strict=False)
    tied = {name for name, _ in tied_parameter_names(model)}
    missing = [m for m in missing if m not in tied]
    if missing or unexpected:
        raise CheckpointMismatch(
            f"weights do not match the model (missing {missing[:3]}, "
            f"unexpected {unexpected[:3]})"
        )


def tied_parameter_names(model: torch.nn.Module) -> list[tuple[str, str]]:
    """(name, first name) pairs for parameters that share storage with an earlier one."""
    seen: dict[int, str] = {}
    tied = []
    for name, param in model.named_parameters(remove_duplicate=False):
        key = id(param)
        if key in seen:
            tied.append((name, seen[key]))
        else:
            seen[key] = name
    return tied


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
