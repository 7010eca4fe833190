"""The Hugging Face / torch rollout engine: batched generation of G completions per prompt with a
shared prompt KV cache.

The prompts of a batch are left-padded and encoded once; the resulting KV cache is repeated G
times along the batch (``repeat_interleave``) so the G completions of a group share one prompt
encoding. Decoding then runs one token at a time for all live sequences; sequences that emit EOS
leave the batch (their cache rows are dropped) at the next check for finished rows (every
``eos_check_every`` tokens, the loop's only host reads), so compute follows the live set.

Sampling avoids ``torch.multinomial`` over the full vocabulary (about 2 ms per sequence per token
on a 2-core CPU with a 49k vocabulary) and instead inverts the CDF with ``searchsorted``.

A ``generate`` the user replaced on the model (a test's ``patch.object(model, "generate", ...)``
scripting completions, a subclass's override) is honoured instead, as in TRL: the completions are
then what ``model.generate`` returns after the prompt, cut after the first EOS
(:func:`replaced_generate`, :func:`generate_with_transformers`).
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from transformers import DynamicCache, PreTrainedModel, PreTrainedTokenizerBase
from transformers.cache_utils import Cache

from ..runtime.kv_cache import (
    cache_keyword,
    forward_with_cache,
    has_recurrent_state,
    returned_cache,
    wrapped_models,
)
from .base import Engine, Request, Rollout, SamplingParams, per_prompt_counts


def seen_tokens(ids: torch.Tensor, mask: torch.Tensor, vocab: int) -> torch.Tensor:
    """[B, V] bool: which vocabulary ids occur among each row's unmasked ``ids`` (the
    repetition penalty's history; padding is not part of it)."""
    counts = torch.zeros((ids.shape[0], vocab), dtype=torch.long, device=ids.device)
    counts.scatter_add_(1, ids, mask.long())
    return counts > 0


def penalised_logits(
    logits: torch.Tensor, params: SamplingParams, seen: torch.Tensor | None
) -> torch.Tensor:
    """The repetition penalty of the CTRL paper as HF's RepetitionPenaltyLogitsProcessor and
    vLLM apply it: the logit of every token already seen (prompt or completion) is divided by
    the penalty when positive, multiplied when negative. ``seen`` [B, V] bool (see
    :func:`seen_tokens`); the logits unchanged when the penalty is 1."""
    if params.repetition_penalty == 1.0:
        return logits
    if seen is None:
        raise ValueError("repetition_penalty needs the tokens seen so far (seen=)")
    penalty = params.repetition_penalty
    scaled = torch.where(logits < 0, logits * penalty, logits / penalty)
    return torch.where(seen, scaled, logits)


def _min_p_drop(probs: torch.Tensor, min_p: float) -> torch.Tensor:
    """HF's MinPLogitsWarper / vLLM's min_p: the tokens below ``min_p`` times the most likely
    token's probability (a ratio, so the same before or after renormalising a subset)."""
    return probs < min_p * probs.max(dim=-1, keepdim=True).values


def sample_next_token(
    logits: torch.Tensor,
    params: SamplingParams,
    generator: torch.Generator | None = None,
    seen: torch.Tensor | None = None,
) -> torch.Tensor:
    """Draw one token per row from softmax(logits / T) restricted by top-k, top-p and min-p
    (in HF's order), after the repetition penalty on the ``seen`` tokens.

    Inverse-CDF sampling: u ~ U[0, total mass); the token is the first index whose cumulative
    probability exceeds u (``searchsorted(..., right=True)``), which picks token i with
    probability p_i and never picks a zero-probability token.
    """
    logits = penalised_logits(logits, params, seen)
    if params.greedy:
        return logits.argmax(dim=-1)
    logits = logits.float() / params.temperature
    vocab = logits.shape[-1]
    index = None  # maps positions in a truncated candidate list back to vocabulary ids
    if 0 < params.top_k < vocab:
        logits, index = torch.topk(logits, params.top_k, dim=-1)  # sorted descending
    if params.top_p < 1.0:
        if index is None:
            logits, index = torch.sort(logits, dim=-1, descending=True)
        probs = torch.softmax(logits, dim=-1)
        # Keep the smallest prefix whose mass reaches top_p (the first token is always kept).
        mass_before = torch.cumsum(probs, dim=-1) - probs
        probs = probs.masked_fill(mass_before >= params.top_p, 0.0)
    else:
        probs = torch.softmax(logits, dim=-1)
    if params.min_p > 0:
        probs = probs.masked_fill(_min_p_drop(probs, params.min_p), 0.0)
    cdf = torch.cumsum(probs, dim=-1)
    u = torch.rand(cdf.shape[0], 1, generator=generator, device=cdf.device) * cdf[:, -1:]
    choice = torch.searchsorted(cdf, u, right=True).clamp_(max=cdf.shape[-1] - 1).squeeze(-1)
    if index is not None:
        choice = index.gather(-1, choice[:, None]).squeeze(-1)
    return choice


def token_logprobs(
    logits: torch.Tensor,
    token: torch.Tensor,
    params: SamplingParams,
    seen: torch.Tensor | None = None,
) -> torch.Tensor:
    """log mu(token) per row, mu being the distribution :func:`sample_next_token` draws from:
    softmax(logits / T) over the top-k / top-p / min-p set, renormalised (softmax(logits) when
    greedy), after the repetition penalty. The same value as vLLM's ``processed_logprobs``
    (rollout/base.py, ``sampling_logprobs``) except with both min_p and top_p set: vLLM drops
    the min_p tokens before top-p, this sampler after it (transformers' order)."""
    logits = penalised_logits(logits, params, seen)
    if params.greedy:
        scaled = logits.float()
    else:
        scaled = logits.float() / params.temperature
        vocab = scaled.shape[-1]
        if 0 < params.top_k < vocab:
            kth = torch.topk(scaled, params.top_k, dim=-1).values[:, -1:]
            scaled = scaled.masked_fill(scaled < kth, float("-inf"))
        if params.top_p < 1.0:
            ordered, index = torch.sort(scaled, dim=-1, descending=True)
            probs = torch.softmax(ordered, dim=-1)
            drop = (torch.cumsum(probs, dim=-1) - probs) >= params.top_p  # sample_next_token's rule
            scaled = scaled.masked_fill(
                torch.zeros_like(drop).scatter(-1, index, drop), float("-inf")
            )
        if params.min_p > 0:
            scaled = scaled.masked_fill(
                _min_p_drop(torch.softmax(scaled, dim=-1), params.min_p), float("-inf")
            )
    return scaled.gather(1, token[:, None]).squeeze(1) - scaled.logsumexp(dim=-1)


def eos_token_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> list[int]:
    ids = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if isinstance(gen_eos, int):
        ids.add(gen_eos)
    elif isinstance(gen_eos, (list, tuple)):
        ids.update(int(i) for i in gen_eos)
    if not ids:
        raise ValueError("the tokenizer has no eos_token_id and the model's generation_config none")
    return sorted(ids)


def left_pad(sequences: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for i, s in enumerate(sequences):
        if s:
            ids[i, width - len(s) :] = torch.tensor(s, dtype=torch.long)
            mask[i, width - len(s) :] = 1
    return ids, mask


def decode_one(
    model: PreTrainedModel,
    token: torch.Tensor,
    attention_mask: torch.Tensor,
    position: torch.Tensor,
    cache: Cache,
) -> tuple[Cache, torch.Tensor]:
    """One decode step through the Hugging Face model: each row's next ``token`` [B] at its
    ``position`` [B] on top of ``cache``; returns the updated cache and the logits [B, V]."""
    out = model(
        input_ids=token[:, None],
        attention_mask=attention_mask,
        position_ids=position[:, None],
        use_cache=True,
        **{cache_keyword(model): cache},
    )
    return returned_cache(out), out.logits[:, -1, :]


def select_cache_rows(cache: Cache, index: torch.Tensor) -> None:
    """Keep (or repeat) the batch rows ``index`` of ``cache``, in place. transformers'
    ``batch_select_indices`` moves only keys and values, so a cache with recurrent layers is
    gathered with ``reorder_cache`` (beam search's reordering, which every layer type
    implements, recurrent states included)."""
    if has_recurrent_state(cache):
        cache.reorder_cache(index)
    else:
        cache.batch_select_indices(index)


def repeat_cache_rows(cache: Cache, rows: int, repeats: int) -> None:
    """Repeat each of the ``rows`` batch rows of ``cache`` ``repeats`` times (row i becomes
    rows i * repeats ... i * repeats + repeats - 1), in place; see :func:`select_cache_rows`."""
    if has_recurrent_state(cache):
        cache.reorder_cache(torch.arange(rows).repeat_interleave(repeats))
    else:
        cache.batch_repeat_interleave(repeats)


def prefill(
    model: PreTrainedModel, ids: torch.Tensor, mask: torch.Tensor
) -> tuple[torch.Tensor, DynamicCache, torch.Tensor]:
    """Encode left-padded sequences in one forward: the last position's logits [B, V], the KV
    cache, and the position of each row's next token [B].

    The cache is built from the model's config, as ``generate()`` builds it, so that hybrid
    models get their recurrent layers (an empty ``DynamicCache()`` holds attention layers only;
    their Mamba mixers then fail on the missing layers). Their left padding is masked by the
    model itself, as under ``generate()``."""
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    logits, cache = forward_with_cache(
        model, ids, mask, positions, DynamicCache(config=model.config)
    )
    return logits, cache, positions[:, -1] + 1


@torch.no_grad()
def generate(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompt_token_ids: list[list[int]],
    num_generations: int | list[int],
    params: SamplingParams,
    generator: torch.Generator | None = None,
    *,
    drop_finished: bool = True,
    return_logprobs: bool = False,
    eos_check_every: int = 1,
) -> Rollout:
    """Generate ``num_generations`` completions for each tokenised prompt (one count for all
    prompts, or one count per prompt: groups of different sizes, as Rollout-GDRO allocates).

    ``drop_finished=False`` keeps finished rows in the batch (decoding tokens that are thrown
    away), as ``transformers.generate`` does; it exists to measure what dropping them saves
    (benchmarks/optimisations.py). Greedy completions are the same either way; sampled ones
    differ, as the kept rows also draw random numbers. ``return_logprobs`` also records the
    sampler's log-prob of every token (``Rollout.sampling_logprobs``: under the distribution it
    was drawn from, after top-k / top-p, :func:`token_logprobs`), which the trainer compares with
    its own when the sampler runs different numerics (bf16 generation).

    ``eos_check_every``: tokens between the host reads of "has every row finished?" (the only
    host syncs of the loop). A row that emitted EOS keeps decoding until the next read, its
    tokens discarded (padding, outside the completion), and is dropped from the batch there.
    Greedy completions are the same for every value; sampled ones draw differently, as the rows
    kept a little longer also draw random numbers (1, the default, draws as the static engine
    with ``eos_check_every=1``)."""
    n_prompts = len(prompt_token_ids)
    check_every = max(1, int(eos_check_every))
    counts = per_prompt_counts(prompt_token_ids, num_generations)
    device = next(model.parameters()).device
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    eos = torch.tensor(eos_token_ids(model, tokenizer), device=device)
    prompt_ids, prompt_mask = left_pad(prompt_token_ids, pad_id)
    prompt_ids, prompt_mask = prompt_ids.to(device), prompt_mask.to(device)
    repeats = torch.tensor(counts, device=device)
    row_prompt = torch.arange(n_prompts, device=device).repeat_interleave(repeats)
    n_rows = int(row_prompt.numel())
    max_new = params.max_completion_length

    was_training = model.training
    model.eval()
    try:
        # 1. Encode each prompt once; only the last position's logits are needed.
        logits, cache, next_pos = prefill(model, prompt_ids, prompt_mask)
        # 2. Share the prompt cache across the group: row r belongs to prompt row_prompt[r].
        if isinstance(num_generations, int):
            repeat_cache_rows(cache, n_prompts, num_generations)
        else:
            select_cache_rows(cache, row_prompt)
        logits, attn, next_pos = logits[row_prompt], prompt_mask[row_prompt], next_pos[row_prompt]
        seen = None  # the repetition penalty's history: prompt, then completion tokens
        if params.repetition_penalty != 1.0:
            seen = seen_tokens(prompt_ids, prompt_mask, logits.shape[-1])[row_prompt]

        tokens = torch.full((n_rows, max_new), pad_id, dtype=torch.long, device=device)
        token_logps = torch.zeros((n_rows, max_new), device=device) if return_logprobs else None
        lengths = torch.zeros(n_rows, dtype=torch.long, device=device)
        finished = torch.zeros(n_rows, dtype=torch.bool, device=device)  # per output row
        live = torch.arange(n_rows, device=device)  # the output row of each batch row
        done = torch.zeros(n_rows, dtype=torch.bool, device=device)  # per batch row: ended
        pad = torch.tensor(pad_id, device=device)
        for t in range(max_new):
            token = sample_next_token(logits, params, generator, seen)
            # Rows that ended earlier write padding and keep their length and log-probs; the
            # row emitting EOS now counts it (no host sync: masks, not indexing).
            tokens[live, t] = torch.where(done, pad, token)
            lengths[live] = torch.where(done, lengths[live], t + 1)
            if token_logps is not None:
                logp = token_logprobs(logits, token, params, seen)
                token_logps[live, t] = logp.masked_fill(done, 0.0)
            if seen is not None:
                seen[torch.arange(token.shape[0], device=device), token] = True
            done = done | torch.isin(token, eos)
            if t == max_new - 1:
                break
            if (t + 1) % check_every == 0:
                n_done = int(done.sum())
                if n_done == done.numel():
                    break
                if drop_finished and n_done > 0:
                    # Drop finished rows from the batch and the cache: compute follows the
                    # live set.
                    finished[live] = done
                    keep = (~done).nonzero().squeeze(-1)
                    live, token, attn, next_pos, done = (
                        x[keep] for x in (live, token, attn, next_pos, done)
                    )
                    seen = None if seen is None else seen[keep]
                    select_cache_rows(cache, keep)
            attn = torch.cat([attn, attn.new_ones(attn.shape[0], 1)], dim=1)
            cache, logits = decode_one(model, token, attn, next_pos, cache)
            next_pos = next_pos + 1
        finished[live] = done
    finally:
        model.train(was_training)

    return finish_rollout(
        tokenizer, prompt_ids, prompt_mask, row_prompt, tokens, lengths, finished, token_logps
    )


def replaced_generate(model: torch.nn.Module) -> bool:
    """Whether the user replaced ``model.generate``: set on the instance (``"generate" in
    vars(model)``: ``patch.object(model, "generate", ...)``, an assignment), or, on the class, a
    ``generate`` that transformers or PEFT did not define (a subclass's override, a patch of
    ``GenerationMixin.generate``). The models a wrapper holds count too: PEFT's base model, DDP's
    ``module``, ``torch.compile``'s original module. The engines then generate through
    ``model.generate`` (TRL's transformers path), which is how TRL's users script completions."""
    for inner in wrapped_models(model):
        if "generate" in vars(inner):
            return True
        defined = getattr(type(inner), "generate", None)
        if defined is not None and not _library_function(defined):
            return True
    return False


def _library_function(fn: object) -> bool:
    module = getattr(fn, "__module__", None) or ""
    return inspect.isfunction(fn) and module.split(".")[0] in ("transformers", "peft")


def generate_options(
    params: SamplingParams, eos_ids: list[int], pad_id: int, max_new_tokens: int
) -> dict[str, Any]:
    """The keyword arguments of ``model.generate`` for the engine's own options: the sampling
    parameters (passed explicitly, so the model's ``generation_config`` defaults do not replace
    them), the token budget, the EOS ids and padding; one returned sequence per input row."""
    options: dict[str, Any] = {
        "max_new_tokens": max_new_tokens,
        "do_sample": not params.greedy,
        "repetition_penalty": params.repetition_penalty,
        "eos_token_id": eos_ids,
        "pad_token_id": pad_id,
        "num_return_sequences": 1,
        "return_dict_in_generate": False,
    }
    if not params.greedy:  # top_k 0, top_p 1 and min_p 0 are "off" for generate() too
        options.update(
            temperature=params.temperature,
            top_k=params.top_k,
            top_p=params.top_p,
            min_p=params.min_p,
        )
    return options


def call_generate(
    model: PreTrainedModel,
    ids: torch.Tensor,
    mask: torch.Tensor,
    options: Mapping[str, Any],
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """The tokens ``model.generate(input_ids=ids, attention_mask=mask, **options)`` returns
    after the input (``ids`` left-padded), [B, T] (T >= 1: a padding column when it returned
    none). ``generate`` draws from torch's global generator; it is seeded from ``generator``
    inside a forked RNG state, so a seeded engine stays reproducible and the global state is
    untouched. The model is in eval mode for the call."""
    seed = int(torch.randint(0, 2**62, (1,), generator=generator).item())
    devices = [ids.device] if ids.device.type == "cuda" else []
    was_training = model.training
    model.eval()
    try:
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(seed)
            sequences = model.generate(input_ids=ids, attention_mask=mask, **options)
    finally:
        model.train(was_training)
    tokens = sequences[:, ids.shape[1] :]
    if tokens.shape[1] == 0:  # nothing generated; keep one padding column
        tokens = tokens.new_full((tokens.shape[0], 1), int(options["pad_token_id"]))
    return tokens


def completion_lengths(
    tokens: torch.Tensor, eos_ids: Sequence[int], pad_id: int | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Where each row of ``model.generate``'s new ``tokens`` [B, T] ends: at its first EOS
    (included), as TRL cuts them; a row without EOS loses its trailing ``pad_id`` tokens (a
    stopping criterion other than EOS ended it, or a scripted ``generate`` padded it) and
    otherwise ran to the token budget T. Returns the lengths [B] and whether each row ended
    (False: it ran to the budget, truncated; a row ending in padding is not, as in TRL)."""
    width = tokens.shape[1]
    is_eos = torch.isin(tokens, torch.tensor(list(eos_ids), device=tokens.device))
    has_eos = is_eos.any(dim=1)
    lengths = torch.full((tokens.shape[0],), width, dtype=torch.long, device=tokens.device)
    finished = has_eos
    if pad_id is not None:
        real = tokens != pad_id
        last_real = width - real.flip(1).long().argmax(dim=1)
        lengths = torch.where(real.any(dim=1), last_real, torch.zeros_like(lengths))
        finished = has_eos | ~real[:, -1]
    lengths = torch.where(has_eos, is_eos.long().argmax(dim=1) + 1, lengths)
    return lengths, finished


@torch.no_grad()
def generate_with_transformers(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompt_token_ids: list[list[int]],
    num_generations: int | list[int],
    params: SamplingParams,
    generate_kwargs: Mapping[str, Any],
    generator: torch.Generator | None = None,
) -> Rollout:
    """The completions of :func:`generate`, decoded by transformers' ``model.generate`` with
    ``generate_kwargs`` (``GenerationConfig`` options the token loop does not implement: beam
    search, length penalty, ...), as TRL's transformers path does; also the path of a
    user-replaced ``generate`` (:func:`replaced_generate`).

    Every completion is one row of the batch (each prompt repeated for its group, one returned
    sequence per row, as TRL batches them), so beam search keeps its best beam per completion.
    The engine's own options hold (:func:`generate_options`); the completions are cut by
    :func:`completion_lengths` (tokens after the first EOS are dropped). No sampler log-probs:
    beam search, or a replaced ``generate``, does not draw each token from one known per-token
    distribution, so the trainer computes pi_old with the policy."""
    counts = per_prompt_counts(prompt_token_ids, num_generations)
    device = next(model.parameters()).device
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    eos_ids = eos_token_ids(model, tokenizer)
    prompt_ids, prompt_mask = left_pad(prompt_token_ids, pad_id)
    prompt_ids, prompt_mask = prompt_ids.to(device), prompt_mask.to(device)
    row_prompt = torch.arange(len(counts), device=device).repeat_interleave(
        torch.tensor(counts, device=device)
    )
    options = generate_options(params, eos_ids, pad_id, params.max_completion_length)
    options.update(generate_kwargs)
    tokens = call_generate(
        model, prompt_ids[row_prompt], prompt_mask[row_prompt], options, generator
    )
    lengths, finished = completion_lengths(tokens, eos_ids, tokenizer.pad_token_id)
    return finish_rollout(
        tokenizer, prompt_ids, prompt_mask, row_prompt, tokens, lengths, finished, None
    )


def finish_rollout(
    tokenizer: PreTrainedTokenizerBase,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    row_prompt: torch.Tensor,
    tokens: torch.Tensor,
    lengths: torch.Tensor,
    finished: torch.Tensor,
    token_logps: torch.Tensor | None,
) -> Rollout:
    """The :class:`Rollout` of a decode loop's buffers: ``tokens`` [N, T] and ``token_logps``
    cut to the longest completion, masked after each row's ``lengths`` (EOS included), and the
    texts decoded from one host copy of the ids."""
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    width = max(int(lengths.max().item()), 1)
    steps = torch.arange(width, device=tokens.device)[None, :]
    completion_mask = (steps < lengths[:, None]).long()
    completion_ids = tokens[:, :width].masked_fill(completion_mask == 0, pad_id)
    sampling_logprobs = None
    if token_logps is not None:
        sampling_logprobs = token_logps[:, :width].masked_fill(completion_mask == 0, 0.0)
    host_ids, host_lengths = completion_ids.cpu(), lengths.cpu()
    texts = tokenizer.batch_decode(
        [row[: int(n)].tolist() for row, n in zip(host_ids, host_lengths, strict=True)],
        skip_special_tokens=True,
    )
    return Rollout(
        prompt_ids=prompt_ids,
        prompt_mask=prompt_mask,
        completion_ids=completion_ids,
        completion_mask=completion_mask,
        truncated=~finished,
        group_ids=row_prompt,
        texts=texts,
        sampling_logprobs=sampling_logprobs,
    )


class HFEngine(Engine):
    """:class:`~groupwise.rollout.base.RolloutEngine` over :func:`generate`: the policy's own
    weights, in place (``sync`` has nothing to copy).

    ``numerics`` wraps every generation: bf16 autocast when generation runs in other numerics
    than the update (``generation_dtype: bfloat16``), in which case ``records_logprobs`` makes the
    rollout carry the sampler's log-probs (rollout correction keys on them). ``weights`` wraps it
    too: under FSDP2 it gathers the full weights around the plain Hugging Face call.
    ``generate_kwargs`` (TRL's ``generation_kwargs`` beyond the sampling options) route every
    generation through transformers' ``generate()`` (:func:`generate_with_transformers`); so does
    a ``generate`` the user replaced on the model (:func:`replaced_generate`, checked at every
    call: ``patch.object(model, "generate", ...)`` after the trainer was built counts). That path
    records no sampler log-probs. ``eos_check_every``: tokens between the token loop's reads
    of "has every row finished?" (:func:`generate`; a run's ``static_eos_check_every``, 1 where
    none is given: a read after every token)."""

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        params: SamplingParams,
        generator: torch.Generator | None = None,
        *,
        numerics: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
        weights: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
        records_logprobs: bool = False,
        generate_kwargs: Mapping[str, Any] | None = None,
        eos_check_every: int = 1,
    ) -> None:
        if generate_kwargs and records_logprobs:
            raise ValueError(
                "generate_kwargs: transformers' generate() records no sampler log-probs, which "
                "records_logprobs asks for"
            )
        self.model, self.tokenizer = model, tokenizer
        self.params, self.generator = params, generator
        self.numerics, self.weights = numerics, weights
        self.records_logprobs = records_logprobs
        self.generate_kwargs = dict(generate_kwargs or {})
        self.eos_check_every = max(1, int(eos_check_every))

    def sample(self, request: Request) -> Rollout:
        """Completions for every prompt (see :class:`~groupwise.rollout.base.RolloutEngine`);
        ``rows`` are not needed."""
        # One count for all prompts when the groups are uniform: the prompt cache is then
        # repeated instead of gathered (cheaper, and the same numbers either way).
        prompt_ids, counts = request.prompt_ids, request.count
        params, generator = request.params, request.generator
        with self.numerics(), self.weights():
            # A user-replaced generate (a patch scripting completions, an override) is honoured
            # as TRL honours it: the rollout is what model.generate returns.
            if self.generate_kwargs or replaced_generate(self.model):
                return generate_with_transformers(
                    self.model,
                    self.tokenizer,
                    [list(p) for p in prompt_ids],
                    counts if isinstance(counts, int) else list(counts),
                    params,
                    self.generate_kwargs,
                    generator,
                )
            return generate(
                self.model,
                self.tokenizer,
                [list(p) for p in prompt_ids],
                counts if isinstance(counts, int) else list(counts),
                params,
                generator,
                return_logprobs=self.records_logprobs,
                eos_check_every=self.eos_check_every,
            )

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def sync(self, policy: torch.nn.Module) -> None:
        """Nothing to do: this engine samples from the policy's own parameters."""
