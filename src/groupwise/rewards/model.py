"""A reward from a sequence-classification checkpoint (a trained reward model), as in TRL.

``RewardModel(path)`` loads any Hugging Face ``AutoModelForSequenceClassification`` checkpoint
(or wraps an already-loaded model and tokenizer) and is a reward function with TRL's signature::

    reward = RewardModel("path/to/reward-model", batch_size=16, device="auto")
    reward(prompts, completions)  # -> [score, ...], one float per completion

What the model reads, per (prompt, completion) pair, with the reward model's own tokenizer:

- a conversational prompt and a tokenizer with a chat template: the chat template applied to
  ``prompt + [assistant completion]`` (``tokenize=False``, no generation prompt; the assistant
  turn is closed), tokenized without adding special tokens (the template holds them), which is
  how TRL's ``RewardTrainer`` shows conversations to a reward model;
- otherwise: prompt text + completion text, concatenated as is (TRL's convention for plain
  text), tokenized with the tokenizer's special tokens (BOS / [CLS] ... [SEP]). A conversational
  prompt without a chat template is flattened to ``"role: content"`` lines first.

The score is ``logits[:, 0]`` (TRL's convention: a reward model has one label; pick another
column with ``label_index``). Inputs longer than ``max_length`` tokens keep their *last* tokens:
the start of the prompt is dropped and the completion, which is what is being judged, is kept
(if the completion alone is longer, its start is dropped too); the tokenizer's special
tokens (e.g. [CLS] / [SEP]) are kept in place.

Batches are padded on the right by this class (the tokenizer's ``padding_side`` is ignored and
never modified), with an attention mask, and sorted by length to waste little compute on pads.
Right padding keeps every real token at the position it has unpadded, so a completion's score
does not depend on what else is in its batch. Models that pool the last non-pad token (Llama,
Qwen, ... ``ForSequenceClassification``) find it with ``config.pad_token_id``: if the checkpoint
has none, it is set from the tokenizer (its pad token, else its EOS token).

The model is frozen: eval mode, ``requires_grad=False``, forward passes under
``torch.inference_mode``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoModelForSequenceClassification,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from ..data.prompts import is_conversational
from ..runtime.distributed import resolve_device
from .basic import completion_text

# tokenizer.model_max_length is a huge sentinel (int(1e30)) when the checkpoint sets none.
_NO_LIMIT = 10**9


def _load_model(path: str, model_kwargs: dict[str, Any]) -> PreTrainedModel:
    local = Path(path).expanduser()
    if local.exists():
        path = str(local)
    elif os.path.isabs(path) or path.startswith((".", "~")):
        # Clearly a filesystem path: don't let from_pretrained take it for a hub id.
        raise FileNotFoundError(f"reward model path {path!r} does not exist")
    try:
        model, info = AutoModelForSequenceClassification.from_pretrained(
            path, output_loading_info=True, **model_kwargs
        )
    except Exception as err:
        raise OSError(
            f"could not load a sequence-classification reward model from {path!r}: {err}"
        ) from err
    missing = sorted(info.get("missing_keys", ()))
    if missing:
        raise ValueError(
            f"the checkpoint at {path!r} is not a trained sequence-classification model: "
            f"weights {missing[:8]}{' ...' if len(missing) > 8 else ''} are missing and would "
            "be randomly initialised, so every score would be noise. (To use it anyway, load "
            "the model yourself and pass it with its tokenizer.)"
        )
    return model


class RewardModel:
    """A reward function scoring each (prompt, completion) with a sequence classifier.

    model: a checkpoint path (or hub id), or a loaded ``PreTrainedModel``.
    tokenizer: the model's tokenizer (object or path); default: loaded from ``model``'s path
        (required when ``model`` is an object).
    batch_size: completions per forward pass.
    max_length: most tokens per input, keeping the last ones (see the module docstring);
        default: the tokenizer's ``model_max_length`` / the model's ``max_position_embeddings``
        when set, else no limit.
    device: where the model runs: ``"cpu"``, ``"cuda:0"``, ``"auto"`` (CUDA if available).
        Default: CPU for a checkpoint path; a loaded model stays where it is.
    label_index: which logit is the score (default 0, TRL's convention).
    name: the function's ``__name__`` (the name in logs), default ``"reward_model"``.
    model_kwargs: extra arguments for ``from_pretrained`` (e.g. ``{"dtype": torch.bfloat16}``).
    """

    def __init__(
        self,
        model: str | os.PathLike | PreTrainedModel,
        tokenizer: str | os.PathLike | PreTrainedTokenizerBase | None = None,
        *,
        batch_size: int = 8,
        max_length: int | None = None,
        device: str | torch.device | None = None,
        label_index: int = 0,
        name: str = "reward_model",
        model_kwargs: dict[str, Any] | None = None,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if max_length is not None and max_length < 1:
            raise ValueError(f"max_length must be >= 1 or None, got {max_length}")
        if isinstance(model, (str, os.PathLike)):
            path = os.fspath(model)
            self.model = _load_model(path, dict(model_kwargs or {}))
            if tokenizer is None:
                tokenizer = path
            if device is None:
                device = "cpu"
        elif isinstance(model, torch.nn.Module):
            if tokenizer is None:
                raise ValueError("RewardModel needs the tokenizer of a model passed as an object")
            self.model = model
        else:
            raise TypeError(f"model must be a path or a PreTrainedModel, got {type(model)}")
        if isinstance(tokenizer, (str, os.PathLike)):
            tokenizer = AutoTokenizer.from_pretrained(os.fspath(Path(tokenizer).expanduser()))
        self.tokenizer: PreTrainedTokenizerBase = tokenizer
        self.batch_size = batch_size
        self.label_index = label_index
        self.__name__ = name

        num_labels = getattr(self.model.config, "num_labels", None)
        if num_labels is not None and not 0 <= label_index < num_labels:
            raise ValueError(
                f"label_index {label_index} is out of range: the model has {num_labels} labels"
            )

        self.model.eval()
        self.model.requires_grad_(False)
        if device is not None:
            self.model.to(resolve_device(device))

        self.pad_token_id = self._ensure_pad_token_id()
        if max_length is None:
            limits = [
                getattr(self.tokenizer, "model_max_length", None),
                getattr(self.model.config, "max_position_embeddings", None),
            ]
            limits = [n for n in limits if isinstance(n, int) and 0 < n < _NO_LIMIT]
            max_length = min(limits) if limits else None
        self.max_length = max_length

    # ------------------------------------------------------------------------------------------
    def _ensure_pad_token_id(self) -> int:
        """The id padding uses, and ``config.pad_token_id`` set so that last-token pooling finds
        the end of each sequence. The tokenizer is never modified."""
        config = self.model.config
        text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
        pad = getattr(text_config, "pad_token_id", None)
        if pad is None:
            pad = getattr(config, "pad_token_id", None)
        if pad is None:
            pad = self.tokenizer.pad_token_id
        if pad is None:
            eos = self.tokenizer.eos_token_id
            if eos is None:
                eos = getattr(text_config, "eos_token_id", None)
            pad = eos[0] if isinstance(eos, (list, tuple)) else eos
        if pad is None:
            pad = 0
        for cfg in {id(config): config, id(text_config): text_config}.values():
            if getattr(cfg, "pad_token_id", None) is None:
                cfg.pad_token_id = pad
        return int(pad)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def text(self, prompt: Any, completion: Any) -> tuple[str, bool]:
        """The text the model reads for one pair, and whether it came from the chat template
        (then it already holds its special tokens)."""
        if is_conversational(prompt):
            if getattr(self.tokenizer, "chat_template", None):
                if is_conversational(completion):
                    reply = list(completion)
                else:
                    reply = [{"role": "assistant", "content": completion_text(completion)}]
                text = self.tokenizer.apply_chat_template(
                    list(prompt) + reply, tokenize=False, add_generation_prompt=False
                )
                return text, True
            lines = "".join(f"{m['role']}: {m['content']}\n" for m in prompt)
            return f"{lines}assistant: {completion_text(completion)}", False
        if isinstance(prompt, str):
            return prompt + completion_text(completion), False
        raise TypeError(f"prompt must be a string or a list of messages, got {type(prompt)}")

    def _truncate(self, text: str, ids: list[int]) -> list[int]:
        """The last ``max_length`` tokens of the content, with the special tokens the tokenizer
        put around it (e.g. [CLS] ... [SEP]) kept."""
        limit = self.max_length
        plain = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        for start in range(len(ids) - len(plain) + 1):
            if ids[start : start + len(plain)] == plain:
                prefix, suffix = ids[:start], ids[start + len(plain) :]
                room = limit - len(prefix) - len(suffix)
                if room > 0:
                    return prefix + plain[-room:] + suffix
                break
        return ids[-limit:]

    def encode(self, prompts: Sequence[Any], completions: Sequence[Any]) -> list[list[int]]:
        """Token ids of each (prompt, completion) pair, truncated to ``max_length``."""
        texts = [self.text(p, c) for p, c in zip(prompts, completions, strict=True)]
        encoded: list[list[int]] = [[] for _ in texts]
        for chat in (True, False):
            index = [i for i, (_, is_chat) in enumerate(texts) if is_chat == chat]
            if not index:
                continue
            batch = [texts[i][0] for i in index]
            ids = self.tokenizer(batch, add_special_tokens=not chat)["input_ids"]
            for i, text, row in zip(index, batch, ids, strict=True):
                row = list(row)
                if self.max_length is not None and len(row) > self.max_length:
                    row = row[-self.max_length :] if chat else self._truncate(text, row)
                encoded[i] = row
        return encoded

    def __call__(
        self, prompts: Sequence[Any], completions: Sequence[Any], **columns: Any
    ) -> list[float | None]:
        if len(prompts) != len(completions):
            raise ValueError(f"{len(prompts)} prompts for {len(completions)} completions")
        encoded = self.encode(prompts, completions)
        scores: list[float | None] = [None] * len(encoded)
        # Longest first, so each batch holds similar lengths; empty inputs get None.
        order = sorted((i for i, ids in enumerate(encoded) if ids), key=lambda i: -len(encoded[i]))
        device = self.device
        with torch.inference_mode():
            for start in range(0, len(order), self.batch_size):
                chunk = order[start : start + self.batch_size]
                width = len(encoded[chunk[0]])
                input_ids = torch.full((len(chunk), width), self.pad_token_id, dtype=torch.long)
                attention_mask = torch.zeros((len(chunk), width), dtype=torch.long)
                for row, i in enumerate(chunk):
                    ids = encoded[i]
                    input_ids[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
                    attention_mask[row, : len(ids)] = 1
                out = self.model(
                    input_ids=input_ids.to(device), attention_mask=attention_mask.to(device)
                )
                logits = out.logits if hasattr(out, "logits") else out[0]
                values = logits[:, self.label_index].float().cpu().tolist()
                for i, value in zip(chunk, values, strict=True):
                    scores[i] = value
        return scores

    def __repr__(self) -> str:
        return (
            f"RewardModel({type(self.model).__name__}, name={self.__name__!r}, "
            f"device={self.device}, batch_size={self.batch_size}, max_length={self.max_length})"
        )
