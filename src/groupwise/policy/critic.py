"""PPO's critic: a decoder backbone (a copy of the policy's, or ``critic_model``'s) with a
scalar value head (:class:`ValueModel`), V(s_t) read from its hidden state at the position whose
policy hidden state predicts completion token t (:func:`completion_values`), and the trained
network that holds it (:class:`Critic`: replicated with DDP under data parallel, its own AdamW
and schedule)."""

from __future__ import annotations

import copy

import torch
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel
from transformers import PreTrainedModel

from ..rollout import Rollout
from ..runtime.distributed import DistributedContext
from ..runtime.models import load_model_and_tokenizer
from ..sections import Sections
from .batches import trimmed_completions
from .optimizer import Trainable

CRITIC_DIR = "critic"


CRITIC_WEIGHTS = "model.safetensors"


CRITIC_CONFIG = "critic_config.json"


class ValueModel(nn.Module):
    """A decoder backbone (no LM head) and a scalar value head on its last hidden state.

    The head is initialised to zero, so V = 0 everywhere at the start (a neutral prior; the head
    then learns first and the backbone follows once the head is non-zero). The head stays in
    float32 whatever the backbone's dtype, so values are not rounded to bf16."""

    def __init__(self, backbone: PreTrainedModel, hidden_size: int) -> None:
        super().__init__()
        self.backbone = backbone
        self.head = nn.Linear(hidden_size, 1)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def forward(self, input_ids: Tensor, attention_mask: Tensor, position_ids: Tensor) -> Tensor:
        """Values [N, L] (float32) at every position of ``input_ids``."""
        hidden = self.backbone(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=False,
        ).last_hidden_state
        with torch.autocast(device_type=hidden.device.type, enabled=False):  # head in float32
            return self.head(hidden.float()).squeeze(-1)


def build_value_model(policy: PreTrainedModel, critic_model: str | None, seed: int) -> ValueModel:
    """A copy of the policy's decoder (critic_model None; with LoRA, of the merged weights), or
    the decoder of ``critic_model`` (a built-in name or path; it must use the policy's tokenizer),
    with a zero value head."""
    if critic_model is None and hasattr(policy, "merge_and_unload"):
        # A LoRA policy (peft): the critic is a plain, fully trained copy of the merged weights.
        backbone = copy.deepcopy(policy).merge_and_unload().get_decoder()
    elif critic_model is None:
        backbone = copy.deepcopy(policy.get_decoder())
    else:
        backbone = load_model_and_tokenizer(critic_model, seed=seed)[0].get_decoder()
        if backbone.config.vocab_size != policy.config.vocab_size:
            raise ValueError(
                f"critic_model {critic_model!r} has a vocabulary of {backbone.config.vocab_size} "
                f"tokens, the policy {policy.config.vocab_size}: the critic must read the "
                "policy's token ids (use a model with the same tokenizer)"
            )
    backbone.requires_grad_(True)
    return ValueModel(backbone, backbone.config.hidden_size)


def completion_values(
    critic: ValueModel | DistributedDataParallel,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    completion_ids: Tensor,
    completion_mask: Tensor,
) -> Tensor:
    """V(s_t) [N, T]: the critic's value at the position whose hidden state predicts completion
    token t, i.e. position ``prompt_len - 1 + t`` of prompt + completion. This mirrors
    ``logprobs.completion_logprobs`` with group_size 1 (same attention mask and position ids),
    so V(s_t) sees exactly the context of pi(o_t | ...). One prompt row per completion row."""
    # Drop left-padding columns shared by every row (as completion_logprobs does).
    used = prompt_mask.any(dim=0).nonzero()
    start = int(used[0]) if used.numel() else 0
    prompt_ids, prompt_mask = prompt_ids[:, start:], prompt_mask[:, start:]
    prompt_len, width = prompt_ids.shape[1], completion_ids.shape[1]
    ids = torch.cat([prompt_ids, completion_ids], dim=1)
    mask = torch.cat([prompt_mask, completion_mask.to(prompt_mask.dtype)], dim=1)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    values = critic(ids, mask, positions)
    # The hidden state at position p predicts token p + 1: V(s_t) is at prompt_len - 1 + t.
    return values[:, prompt_len - 1 : prompt_len - 1 + width]


class Critic:
    """The value model and its trained network (:attr:`network`): replicated with DDP under
    data parallel (which averages its gradients and broadcasts rank 0's weights on
    construction), its own AdamW (``critic_learning_rate``, default ``learning_rate``) and LR
    schedule."""

    def __init__(
        self, model: ValueModel, options: Sections, dist: DistributedContext, device: torch.device
    ) -> None:
        wrapper = None
        if dist.enabled:
            wrapper = DistributedDataParallel(
                model, device_ids=[device.index] if device.type == "cuda" else None
            )
        optimization, lr = options.optimization, options.ppo.critic_learning_rate
        lr = lr if lr is not None else optimization.learning_rate
        self.module, self.wrapper = model, wrapper
        self.network = Trainable(model, wrapper, optimization, dist, lr)

    def values(self, rollout: Rollout, rows: Tensor) -> Tensor:
        """V(s_t) [n, T] for the completions ``rows`` (row indices) of the rollout, with grad if
        enabled (the training forward goes through DDP under data parallel); computed on the
        rows' longest completion and zero-padded back to width T."""
        index = rollout.group_ids[rows]
        completion_ids, completion_mask, width = trimmed_completions(rollout, rows)
        train = torch.is_grad_enabled() and self.wrapper is not None
        values = completion_values(
            self.wrapper if train else self.module,
            rollout.prompt_ids[index],
            rollout.prompt_mask[index],
            completion_ids,
            completion_mask,
        )
        return torch.nn.functional.pad(values, (0, rollout.completion_ids.shape[1] - width))
