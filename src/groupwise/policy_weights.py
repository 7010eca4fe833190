"""The trained weights in and out: what ``save_pretrained`` writes (under FSDP the full weights,
gathered to rank 0) and loading them back with a clear error when they do not fit."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor
from transformers import PreTrainedModel

from .errors import first_line


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
