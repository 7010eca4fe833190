"""A stand-in for the ``vllm`` package, installed into ``sys.modules`` by :func:`install`, so the
vLLM engine runs on a CPU without vLLM.

Only the surface groupwise uses, shaped as vLLM's (``vllm/entrypoints/llm.py``,
``vllm/sampling_params.py``, ``vllm/outputs.py``): ``LLM(model=folder, load_format=..., ...)`` with
``generate(prompts, sampling_params, use_tqdm)``, ``reset_prefix_cache()``, ``sleep(level)`` /
``wake_up(tags)``, ``apply_model(fn)`` and the model at
``llm.llm_engine.model_executor.driver_worker.model_runner.model`` with
``load_weights(iterable of (name, tensor))``; ``SamplingParams``; ``TokensPrompt``;
``RequestOutput`` / ``CompletionOutput`` (``token_ids``, ``logprobs`` as one
``{token_id: Logprob}`` dict per position, ``finish_reason``).

The LLM owns a private model built from the folder's config (``load_format="dummy"``: random
weights, as vLLM's dummy format), so it generates what the policy would only after the weights
were pushed. It samples with groupwise's own decode (``rollout.hf.generate``) and so records the
same processed log-probs. Its prefix cache is simulated: the last-position logits of every
prompt it has encoded are kept, keyed by the prompt's token ids, and served for that prompt's
first token until ``reset_prefix_cache()``; an engine that forgets the reset keeps sampling first
tokens from the old weights.
"""

from __future__ import annotations

import sys
import types
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from groupwise.rollout import SamplingParams as GroupwiseParams
from groupwise.rollout import generate as hf_generate

__version__ = "0.0.0+fake"


@dataclass
class Logprob:
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: list[dict[int, Logprob]] | None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool = True


class TokensPrompt(dict):
    """vLLM's ``TokensPrompt`` is a TypedDict: ``{"prompt_token_ids": [...]}``."""


@dataclass
class SamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # vLLM: 0 or -1 disables top-k
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    max_tokens: int | None = 16
    logprobs: int | None = None
    stop_token_ids: list[int] | None = None
    stop: list[str] | None = None
    seed: int | None = None
    detokenize: bool = True
    extra: dict[str, Any] = field(default_factory=dict)


class PrefixCachedLM(torch.nn.Module):
    """The private model, with the simulated prefix cache on the prefill of a one-prompt batch
    (``rollout.hf.generate`` prefills with ``logits_to_keep=1``)."""

    def __init__(self, lm: torch.nn.Module) -> None:
        super().__init__()
        self.lm = lm
        self.cache: dict[tuple[int, ...], torch.Tensor] = {}
        self.key: tuple[int, ...] | None = None
        self.hits = 0
        self.loaded: list[list[str]] = []  # names of each load_weights call

    @property
    def generation_config(self) -> Any:
        return self.lm.generation_config

    @property
    def config(self) -> Any:
        return self.lm.config

    def forward(self, input_ids: torch.Tensor, **kwargs: Any) -> Any:
        out = self.lm(input_ids=input_ids, **kwargs)
        if "logits_to_keep" in kwargs and self.key is not None:
            if self.key in self.cache:
                self.hits += 1
                out.logits = self.cache[self.key].clone()
            else:
                self.cache[self.key] = out.logits.detach().clone()
        return out

    def load_weights(self, weights: Any) -> set[str]:
        """vLLM models' ``load_weights``: checkpoint names; an unknown name or a wrong shape is an
        error; ``lm_head.weight`` of a tied model is skipped."""
        if "weights" in self.llm.sleeping:
            raise RuntimeError("load_weights while the weights are asleep")
        params = dict(self.lm.named_parameters())
        tied = bool(getattr(self.lm.config, "tie_word_embeddings", False))
        names = []
        for name, tensor in weights:
            names.append(name)
            if tied and name == "lm_head.weight":
                continue
            if name not in params:
                raise KeyError(f"fake vLLM model has no weight {name!r}")
            if tuple(params[name].shape) != tuple(tensor.shape):
                raise ValueError(f"{name}: shape {tuple(tensor.shape)} != {params[name].shape}")
            with torch.no_grad():
                params[name].copy_(tensor)
        self.loaded.append(names)
        return set(names)


class LLM:
    """The fake ``vllm.LLM``. ``instances`` holds every one made (tests look them up)."""

    instances: list[LLM] = []

    def __init__(self, model: str, **kwargs: Any) -> None:
        self.model_path, self.kwargs = model, kwargs
        dtype = getattr(torch, kwargs.get("dtype") or "float32")
        config = AutoConfig.from_pretrained(model)
        if kwargs.get("load_format") == "dummy":
            torch.manual_seed(12345)  # weights unrelated to the policy's
            lm = AutoModelForCausalLM.from_config(config, dtype=dtype)
        else:
            lm = AutoModelForCausalLM.from_pretrained(model, dtype=dtype)
        lm.eval()
        self.model = PrefixCachedLM(lm)
        self.model.llm = self
        self.tokenizer = AutoTokenizer.from_pretrained(model)
        self.generator = torch.Generator().manual_seed(int(kwargs.get("seed") or 0))
        self.resets = 0
        self.sleeping: set[str] = set()
        self.events: list[str] = []
        runner = types.SimpleNamespace(model=self.model)
        executor = types.SimpleNamespace(driver_worker=types.SimpleNamespace(model_runner=runner))
        self.llm_engine = types.SimpleNamespace(model_executor=executor)
        LLM.instances.append(self)

    def generate(
        self, prompts: Any, sampling_params: Any = None, use_tqdm: bool = True
    ) -> list[RequestOutput]:
        if self.sleeping:
            raise RuntimeError(f"generate while asleep ({sorted(self.sleeping)})")
        self.events.append("generate")
        if not isinstance(sampling_params, list):
            sampling_params = [sampling_params] * len(prompts)
        outputs = []
        for i, (prompt, sp) in enumerate(zip(prompts, sampling_params, strict=True)):
            ids = list(prompt["prompt_token_ids"])
            params = GroupwiseParams(
                max_completion_length=sp.max_tokens,
                temperature=sp.temperature,
                top_p=sp.top_p,
                top_k=max(sp.top_k, 0),
                min_p=sp.min_p,
                repetition_penalty=sp.repetition_penalty,
            )
            # vLLM stops at the model's EOS and at stop_token_ids.
            config = self.model.lm.generation_config
            eos = config.eos_token_id
            eos = [eos] if isinstance(eos, int) else list(eos or [])
            config.eos_token_id = sorted(set(eos) | set(sp.stop_token_ids or []))
            generator = self.generator
            if sp.seed is not None:
                generator = torch.Generator().manual_seed(sp.seed)
            self.model.key = tuple(ids)
            try:
                rollout = hf_generate(
                    self.model, self.tokenizer, [ids], sp.n, params, generator,
                    return_logprobs=True,
                )  # fmt: skip
            finally:
                self.model.key = None
            completions = []
            for j in range(sp.n):
                length = int(rollout.completion_mask[j].sum())
                tokens = rollout.completion_ids[j, :length].tolist()
                logps = rollout.sampling_logprobs[j, :length].tolist()
                completions.append(
                    CompletionOutput(
                        index=j,
                        text="",
                        token_ids=tokens,
                        cumulative_logprob=sum(logps),
                        logprobs=None
                        if sp.logprobs is None
                        else [
                            {t: Logprob(lp, rank=1)} for t, lp in zip(tokens, logps, strict=True)
                        ],
                        finish_reason="length" if bool(rollout.truncated[j]) else "stop",
                    )
                )
            outputs.append(RequestOutput(str(i), None, ids, completions))
        return outputs

    def reset_prefix_cache(self) -> bool:
        self.model.cache.clear()
        self.resets += 1
        self.events.append("reset_prefix_cache")
        return True

    def sleep(self, level: int = 1) -> None:
        self.sleeping = {"weights", "kv_cache"}
        self.events.append(f"sleep({level})")

    def wake_up(self, tags: list[str] | None = None) -> None:
        self.sleeping -= set(tags) if tags else {"weights", "kv_cache"}
        self.events.append(f"wake_up({tags})")

    def apply_model(self, func: Any) -> list[Any]:
        return [func(self.model)]


def install(monkeypatch: Any) -> types.ModuleType:
    """Put this module in ``sys.modules`` as ``vllm`` for the test (``monkeypatch`` undoes it)."""
    LLM.instances.clear()
    module = sys.modules[__name__]
    monkeypatch.setitem(sys.modules, "vllm", module)
    return module
