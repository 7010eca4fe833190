"""The policy: the language model being trained, its frozen reference, its forwards and its
weights in and out.

:class:`Policy` composes three parts: the trained network under data parallel
(:class:`~groupwise.policy.optimizer.Trainable`: its DDP wrapper or FSDP2 root, AdamW and LR
schedule), the frozen reference (:class:`~groupwise.policy.reference.Reference`: a copy,
offloaded or not, or the LoRA adapter disabled) and the micro-batched update
(:class:`~groupwise.policy.update.PolicyUpdate`, which runs this policy's forwards). The two
calls of a step:

    inputs = policy.prepare(rollout, advantages, row_weights)  # pi_old (mu > 1), pi_ref (beta > 0)
    stats = policy.update(inputs, loss)                        # one optimizer pass

``loss`` is any callable ``loss(logprobs, micro_batch) -> LossTerms``;
:class:`~groupwise.policy.loss.GRPOLoss` binds a registered loss variant
(:data:`groupwise.algo.losses.LOSSES`) to the run's options.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from torch.nn.parallel import DistributedDataParallel
from transformers import PreTrainedModel

from ..algo.losses import LossTerms, MicroBatch
from ..errors import first_line
from ..rollout import Rollout, RolloutEngine
from ..runtime.distributed import DistributedContext, any_rank
from ..runtime.precision import Precision
from .batching import prompt_blocks, trimmed_completions
from .logprobs import completion_logprobs
from .optimizer import Trainable
from .parallel import LogprobModule, fsdp_full_weights, shard_fsdp
from .reference import Reference
from .update import (
    GenerationBatch,
    PolicyInputs,
    PolicyOptions,
    PolicyUpdate,
    UpdateStats,
)


class Policy:
    """The language model being trained, its reference and its forwards; its network and
    optimizer are :attr:`network`'s, its update :attr:`updater`'s.

    Data parallel (torchrun): with ``data_parallel: ddp`` the training forward goes through
    DistributedDataParallel (constructing it broadcasts rank 0's parameters); with ``fsdp`` the
    model is sharded in place (FSDP2) and no-grad calls of the Hugging Face model run inside
    :meth:`full_weights`.

    ``options`` holds the sections it reads (:class:`~groupwise.policy.update.PolicyOptions`, made by
    ``PolicyOptions.from_sections(config.sections())``)."""

    def __init__(
        self,
        model: PreTrainedModel,
        options: PolicyOptions,
        dist: DistributedContext,
        device: torch.device,
        precision: Precision | None = None,
    ) -> None:
        self.model, self.device, self.options = model, device, options
        self.precision = precision or Precision(weights=torch.float32, autocast=False)
        fsdp = dist.enabled and options.runtime.data_parallel == "fsdp"
        # The frozen reference exists only when the KL term is on (beta > 0). With LoRA it is
        # the same weights with the adapter disabled: no second copy. Copied before the policy
        # is sharded (its parameters then become shards).
        self.reference: Reference | None = None
        if options.loss.beta > 0 and not options.model.use_peft:
            self.reference = Reference(
                model,
                device,
                offload=options.reference.ref_model_offload,
                shard=functools.partial(shard_fsdp, ctx=dist, device=device,
                                        bf16_compute=self.precision.autocast) if fsdp else None,
                gather=fsdp_full_weights if fsdp else None,
            )
        # FSDP shards the model in place (its parameters become DTensor shards), so the
        # optimizer is built afterwards, on the shards.
        wrapper: Any = None
        if fsdp:
            wrapper = shard_fsdp(model, dist, device, bf16_compute=self.precision.autocast)
        elif dist.enabled:
            wrapper = DistributedDataParallel(
                LogprobModule(model),
                device_ids=[device.index] if device.type == "cuda" else None,
            )
        optimization = options.optimization
        self.dist = dist
        self.network = Trainable(
            model, wrapper, optimization, options.batch, dist, optimization.learning_rate,
            after_step=self._sync_reference,
        )  # fmt: skip
        self.updater = PolicyUpdate(self, self.network, options, dist, device)
        self._full_weights_depth = 0

    def _sync_reference(self) -> None:
        """After each optimizer step, with ``sync_ref_model``, TR-DPO's reference update every
        ``ref_model_sync_steps`` optimizer steps (the schedule counts them, across a resume)."""
        reference = self.options.reference
        if reference.sync_ref_model and self.reference is not None:
            if self.scheduler.last_epoch % reference.ref_model_sync_steps == 0:
                self.reference.mix_from(self.model, reference.ref_model_mixup_alpha)

    # -- the update's calls (PolicyUpdate) --------------------------------------------------------
    def micro_batches(self, rollout: Rollout) -> list[Tensor]:
        return self.updater.micro_batches(rollout)

    def prepare(
        self,
        rollout: Rollout,
        advantages: Tensor | None,
        row_weights: Tensor | None = None,
        *,
        need_old: bool | None = None,
        exclude_rows: Tensor | None = None,
    ) -> PolicyInputs:
        return self.updater.prepare(
            rollout, advantages, row_weights, need_old=need_old, exclude_rows=exclude_rows
        )

    def update(
        self,
        inputs: PolicyInputs,
        loss: Callable[[Tensor, MicroBatch], LossTerms],
        also: Sequence[Trainable] = (),
    ) -> UpdateStats:
        return self.updater.update(inputs, loss, also)

    def prepare_generation(
        self, rollout: Rollout, advantages: Tensor, row_weights: Tensor | None = None
    ) -> GenerationBatch:
        return self.updater.prepare_generation(rollout, advantages, row_weights)

    def train_generation(
        self, batch: GenerationBatch, loss: Callable[[Tensor, MicroBatch], LossTerms]
    ) -> UpdateStats:
        return self.updater.train_generation(batch, loss)

    def loss_value(
        self, rollout: Rollout, advantages: Tensor, loss: Callable[[Tensor, MicroBatch], LossTerms]
    ) -> float:
        return self.updater.loss_value(rollout, advantages, loss)

    # -- the network and its optimizer (Trainable) ------------------------------------------------
    @property
    def wrapper(self) -> Any:
        return self.network.wrapper

    @property
    def sharded(self) -> bool:
        return self.network.sharded

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        return self.network.optimizer

    @property
    def scheduler(self) -> torch.optim.lr_scheduler.LambdaLR:
        return self.network.scheduler

    @property
    def learning_rate(self) -> float:
        return self.network.learning_rate

    def step(self) -> None:
        """The optimizer step (then TR-DPO's reference update, with ``sync_ref_model``)."""
        self.network.step()

    def global_sum(self, value: Tensor) -> Tensor:
        return self.network.global_sum(value)

    def optimizer_state_dict(self) -> dict[str, Any]:
        return self.network.optimizer_state_dict()

    def load_optimizer_state_dict(self, state: dict[str, Any]) -> None:
        self.network.load_optimizer_state_dict(state)

    def learn(
        self,
        rollout: Rollout,
        advantages: Tensor,
        row_weights: Tensor | None,
        loss: Callable[[Tensor, MicroBatch], LossTerms],
        engine: RolloutEngine,
    ) -> UpdateStats:
        """One generation batch's whole update: its mini-batches prepared
        (:meth:`prepare_generation`), ``num_iterations`` passes of ``loss``
        (:meth:`train_generation`), then ``engine`` takes the new weights (an engine with its
        own copy, static or vLLM, would otherwise sample from the old policy)."""
        generation = self.prepare_generation(rollout, advantages, row_weights)
        stats = self.train_generation(generation, loss)
        engine.sync(self.model)
        return stats

    @property
    def ref_model(self) -> PreTrainedModel | None:
        """The frozen reference copy (None with LoRA or beta = 0)."""
        return self.reference.module if self.reference is not None else None

    # -- numerics and weights -------------------------------------------------------------------
    def autocast(self) -> contextlib.AbstractContextManager:
        """The training forward's numerics: bf16 autocast in mixed precision, else none."""
        return self.precision.context(self.device)

    @contextlib.contextmanager
    def full_weights(self) -> Iterator[None]:
        """Under FSDP, the full weights for no-grad calls of the Hugging Face model (generation,
        evaluation, old log-probs); a no-op otherwise. Re-entrant."""
        outermost = self.sharded and self._full_weights_depth == 0
        self._full_weights_depth += 1
        try:
            with fsdp_full_weights(self.wrapper) if outermost else contextlib.nullcontext():
                yield
        finally:
            self._full_weights_depth -= 1

    # -- forwards -------------------------------------------------------------------------------
    def logprobs(
        self,
        rollout: Rollout,
        rows: Tensor,
        model: PreTrainedModel | None = None,
        entropy_grad: bool = False,
    ) -> tuple[Tensor, Tensor]:
        """Log-probs and entropies [n, T] of the completions ``rows`` (row indices into the
        rollout) under ``model`` (default: the policy); the entropies carry a gradient only with
        ``entropy_grad``. The forward runs on the rows' own longest completion (padding trimmed
        per micro-batch); the results are padded back to the rollout's width T with zeros."""
        model = self.model if model is None else model
        completion_ids, completion_mask, width = trimmed_completions(rollout, rows)
        # Share the prompt forward across the rows of a prompt: whole groups, or a micro-batch
        # that holds part of one group (micro_batch_rows lays them out so).
        runtime = self.options.runtime
        blocks = prompt_blocks(rollout.host_group_ids[rows], self.options.batch.num_generations)
        share = blocks is not None and not runtime.gradient_checkpointing
        policy_grad = model is self.model and torch.is_grad_enabled()
        if policy_grad and self.sharded:
            # FSDP2 all-gathers each layer in every decoder call, and the shared path makes two
            # (prompt, then completions; one when width is 1): every rank must take the same
            # path for this micro-batch (ranks run equally many, see prepare's padding).
            share = not any_rank(not (share and width > 1), self.dist)
        if share:
            prompts, group_size = blocks
            prompt_ids, prompt_mask = rollout.prompt_ids[prompts], rollout.prompt_mask[prompts]
        else:
            index = rollout.group_ids[rows]
            prompt_ids, prompt_mask = rollout.prompt_ids[index], rollout.prompt_mask[index]
            group_size = 1
        # The policy's forward with gradients goes through the DDP / FSDP wrapper when data
        # parallel; without gradients, FSDP gathers the full weights around the plain call.
        forward = (
            self.wrapper
            if policy_grad and self.wrapper is not None
            else functools.partial(completion_logprobs, model)
        )
        gather = (
            self.full_weights()
            if model is self.model and not policy_grad
            else contextlib.nullcontext()
        )
        temperature = self.options.generation.temperature
        with gather:
            logps, entropy = forward(
                prompt_ids,
                prompt_mask,
                completion_ids,
                completion_mask,
                temperature=temperature if temperature > 0 else 1.0,
                chunk_size=runtime.logprob_chunk_size,
                group_size=group_size,
                impl=runtime.logprob_impl,
                entropy_grad=entropy_grad,
            )
        pad = (0, rollout.completion_ids.shape[1] - width)
        return torch.nn.functional.pad(logps, pad), torch.nn.functional.pad(entropy, pad)

    def reference_logprobs(self, rollout: Rollout, rows: Tensor) -> Tensor:
        """Log-probs under the frozen reference: the adapter-disabled model with LoRA, else the
        reference copy. Call it inside :meth:`reference_weights` (once around a whole batch:
        an offloaded reference visits the device once, a sharded one is gathered once)."""
        if self.options.model.use_peft:
            with self.model.disable_adapter():
                return self.logprobs(rollout, rows)[0]
        assert self.reference is not None
        return self.logprobs(rollout, rows, self.reference.module)[0]

    def reference_weights(self) -> contextlib.AbstractContextManager:
        """The block inside which :meth:`reference_logprobs` runs (with LoRA the policy's own
        weights: under FSDP gathered once for the block)."""
        if self.options.model.use_peft:
            return self.full_weights()
        if self.reference is None:
            return contextlib.nullcontext()
        return self.reference.weights()

    # -- weights in and out ---------------------------------------------------------------------
    def full_state_dict(self) -> dict[str, Tensor] | None:
        """Under FSDP the full model weights on rank 0 (a collective), else None
        (:func:`groupwise.policy.policy.full_state_dict`)."""
        return full_state_dict(self.model, self.sharded)

    def save_pretrained(self, folder: Path, weights: dict[str, Tensor] | None) -> None:
        save_pretrained(self.model, folder, weights)

    def load_weights(self, path: Path) -> None:
        """Load the weights ``save_pretrained`` wrote into ``path`` (the adapter with LoRA);
        :class:`CheckpointMismatch` when they are missing or do not fit."""
        load_weights(
            self.model, path, use_peft=self.options.model.use_peft, sharded=self.sharded
        )


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
