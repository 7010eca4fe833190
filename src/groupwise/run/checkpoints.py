"""Saving and restoring a run's weights and checkpoints.

The folder format (atomic ``checkpoint-<step>``, manifest, rotation, RNG states, the resume
config check) is :mod:`groupwise.checkpoint`'s; the trainer decides what its state is
(``Trainer.state_dict`` / ``load_checkpoint``). This module is the glue between them: the
collectives a save needs under data parallel, the model and tokenizer files, the weights read
back into the policy.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from transformers import PreTrainedTokenizerBase

from .. import checkpoint as ckpt
from .. import console
from ..distributed import DistributedContext, all_gather_objects, barrier
from ..errors import first_line
from ..files import staged_files
from ..models import record_adapter_base
from ..policy import CheckpointMismatch, Policy


class Checkpoints:
    """``adapter_base``: the base a saved LoRA adapter names (None: PEFT's own record, from a
    loaded model)."""

    def __init__(
        self,
        output_dir: Path,
        dist: DistributedContext,
        policy: Policy,
        tokenizer: PreTrainedTokenizerBase,
        adapter_base: str | None,
    ) -> None:
        self.output_dir, self.dist, self.policy = output_dir, dist, policy
        self.tokenizer, self.adapter_base = tokenizer, adapter_base

    def save_weights(self, folder: Path, weights: dict[str, torch.Tensor] | None) -> None:
        """The model (or LoRA adapter) in Hugging Face format, an adapter naming a base that
        groupwise can load (a built-in name, an absolute path or a hub id)."""
        with console.quiet_transformers_bars():  # no "Writing model shards" bar per save
            self.policy.save_pretrained(folder, weights)
        if self.adapter_base is not None:
            record_adapter_base(folder, self.adapter_base)

    def save_model(self, target: Path) -> Path:
        """Model and tokenizer into ``target`` through a temporary folder (see
        ``Trainer.save_model``); every rank calls it under FSDP, rank 0 writes."""
        weights = self.policy.full_state_dict()
        if not self.dist.is_main and self.policy.sharded:
            return target
        with staged_files(target) as tmp:
            self.save_weights(tmp, weights)
            self.tokenizer.save_pretrained(tmp)
        return target

    def rng_states(self, generators: dict[str, torch.Generator]) -> list[dict[str, Any]]:
        """Every rank's RNG states (a collective under data parallel). They travel as
        torch.save bytes: all_gather_object cannot carry tensors between CPU processes."""
        buffer = io.BytesIO()
        torch.save(ckpt.rng_state(generators), buffer)
        blobs = all_gather_objects(buffer.getvalue(), self.dist)
        return [torch.load(io.BytesIO(blob), weights_only=True) for blob in blobs]

    def save(self, step: int, state: dict[str, Any], keep: int | None) -> Path:
        """Write ``checkpoint-<step>`` (weights, tokenizer, ``state``) atomically and keep the
        newest ``keep`` (save_total_limit). Every rank calls it: gathering FSDP's weights is a
        collective."""
        weights = self.policy.full_state_dict()

        def write(folder: Path) -> None:
            self.save_weights(folder, weights)
            self.tokenizer.save_pretrained(folder)
            torch.save(state, folder / ckpt.STATE_FILE)

        path = self.output_dir / f"{ckpt.PREFIX}{step}"
        if self.dist.is_main:
            path = ckpt.write_checkpoint(self.output_dir, step, write)
            ckpt.rotate_checkpoints(self.output_dir, keep)
        barrier(self.dist)
        return path

    def read(self, path: Path, config: dict[str, Any]) -> dict[str, Any]:
        """Checkpoint ``path``'s training state, refused when its config differs from
        ``config`` in options that change training; its weights are loaded into the policy."""
        state = ckpt.read_training_state(path)
        ckpt.check_resume_config(state["config"], config, path)
        try:
            self.policy.load_weights(path)
        except CheckpointMismatch as err:
            raise ckpt.CheckpointError(f"checkpoint {path}: {err}") from None
        except (OSError, ValueError, RuntimeError, SafetensorError) as err:
            raise ckpt.CheckpointError(
                f"checkpoint {path}: the model weights cannot be read ({type(err).__name__}: "
                f"{first_line(err)}); resume from an earlier checkpoint, or start over"
            ) from err
        return state

    def restore_rng(
        self, path: Path, states: list[dict[str, Any]], generators: dict[str, torch.Generator]
    ) -> list[str]:
        """This rank's RNG states from a checkpoint written by as many processes; returns a
        note for each generator that could not be restored."""
        if len(states) != self.dist.world_size:
            raise ckpt.CheckpointError(
                f"checkpoint {path} was written by {len(states)} process(es); resume it with "
                f"the same number (this run has {self.dist.world_size})"
            )
        return ckpt.set_rng_state(states[self.dist.rank], generators)
