"""The multi-turn engine: conversations with tools and environments, on the token engine.

    prompt -> the policy writes a turn (until EOS, a stop string such as ``</tool_call>``, or
              the token budget) -> the conversation's environment reads it (runs the tool calls,
              or replies as a game would) -> its reply is rendered by the chat template and
              appended as context -> the policy writes the next turn ... until the environment
              says done, ``max_turns`` turns were written, or the budget is spent.

One :class:`~groupwise.rollout.base.Rollout` row is one whole conversation: ``completion_ids``
holds every token after the prompt (the policy's and the inserted ones, in order),
``completion_mask`` all of them, and ``loss_mask`` only the policy's: inserted tokens are context
for the log-probs and take no part in the loss, KL or entropy. The trainer, the curriculum,
evaluation and checkpoints see an ordinary rollout.

Decoding is batched over all conversations and continues from the KV cache after each turn: the
inserted tokens are one forward over the cache (left-padded across rows; pad positions are
masked), so no turn re-encodes the conversation (``reencode=True`` does, as the baseline that
benchmarks/multiturn_cache.py measures). Turns are synchronous: a row whose turn ended waits, fed
masked pads, until every row's turn has ended; a row whose conversation is over leaves the batch
at once.

A ``generate`` the user replaced on the model (:func:`~groupwise.rollout.hf.replaced_generate`:
a test's ``patch.object(model, "generate", ...)`` scripting turns, an override) is honoured as
in TRL's tool loop: each turn is one ``model.generate`` call on the conversations still going
(the first on every prompt x rollout row, later ones only on the rows whose environment
continued), each re-encoded left-padded; a turn is the tokens after the input, up to its first
EOS (or stop string, or budget); the rest is dropped. That path records no sampler log-probs.

On the vLLM engine (:func:`converse_by_turns`) each turn is likewise one request per
conversation still going, given as token ids (prompt and conversation so far): vLLM's prefix
cache holds the KV of what earlier requests encoded (its full blocks), so re-encoding mostly
encodes the inserted reply. vLLM stops the turn at EOS, at a stop string (its own check on the
detokenised text) or at the conversation's remaining budget, and records each sampled token's
log-prob as it does for single-turn rollouts. Its tokens then go through the same checks as the
HF engine's, one by one: the turn ends at the same token as there, and what vLLM wrote after it
is dropped. Inserted tokens get log-prob 0 and ``loss_mask`` 0 on both engines.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from transformers import DynamicCache, PreTrainedModel, PreTrainedTokenizerBase

from ..data.prompts import is_conversational, prompt_text
from ..errors import ConfigError
from ..runtime.kv_cache import forward_with_cache, has_recurrent_state
from ..tools.calls import assistant_message, assistant_text, content_text
from ..tools.environment import PLACEHOLDER_PROMPT, EnvironmentFactories
from ..tools.prompting import prompt_text_with_tools
from .base import Engine, Request, Rollout, SamplingParams
from .hf import (
    HFEngine,
    call_generate,
    completion_lengths,
    decode_one,
    eos_token_ids,
    generate_options,
    left_pad,
    prefill,
    replaced_generate,
    sample_next_token,
    select_cache_rows,
    token_logprobs,
)

if TYPE_CHECKING:  # hints only (the environment protocol lives with the tools)
    from ..tools import Environment
    from .vllm import VLLMEngine

_SENTINEL = "\x00GROUPWISE-TURN\x00"


class TurnRenderer:
    """The text inserted between two policy turns: the end of the assistant's turn, the
    environment's messages and the next assistant header, exactly as the chat template renders
    them (the difference of two renderings, as verl's agent loop does). Templates that refuse a
    ``tool`` role get the tool output as a ``user`` message wrapped in ``<tool_response>`` (the
    Qwen/Hermes convention); prompts without a chat template get that wrapping as plain text."""

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        conversational: bool,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        self.tokenizer, self.template_kwargs = tokenizer, dict(template_kwargs or {})
        self.conversational = conversational and tokenizer.chat_template is not None
        eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
        self.eos_texts = [tokenizer.decode([i]) for i in eos]

    def __call__(self, messages: Sequence[Mapping[str, str]], ended_with_eos: bool) -> str:
        if not self.conversational:
            return "".join(_plain(m) for m in messages)
        text = self._delta(messages)
        if ended_with_eos:  # the policy already wrote the end-of-turn token
            for eos in self.eos_texts:
                if eos and text.startswith(eos):
                    return text[len(eos) :]
        return text

    def _delta(self, messages: Sequence[Mapping[str, str]]) -> str:
        head = [{"role": "user", "content": "?"}, {"role": "assistant", "content": _SENTINEL}]
        try:
            full = self._render(head + [dict(m) for m in messages])
        except Exception:  # noqa: BLE001 - a template without a tool role: Hermes wrapping
            full = self._render(head + [_as_user(m) for m in messages])
        return full[full.index(_SENTINEL) + len(_SENTINEL) :]

    def _render(self, conversation: list[dict[str, str]]) -> str:
        text = self.tokenizer.apply_chat_template(
            conversation, add_generation_prompt=True, tokenize=False, **self.template_kwargs
        )
        if _SENTINEL not in text:
            raise ValueError("the chat template dropped the assistant message")
        return text


def _as_user(message: Mapping[str, str]) -> dict[str, str]:
    if message.get("role") == "tool":
        wrapped = f"<tool_response>\n{message['content']}\n</tool_response>"
        return {"role": "user", "content": wrapped}
    return dict(message)


def _plain(message: Mapping[str, str]) -> str:
    if message.get("role") == "tool":
        return f"\n<tool_response>\n{message['content']}\n</tool_response>\n"
    return f"\n{message['content']}\n"


def conversation_text(messages: Sequence[Mapping[str, Any]]) -> str:
    """A conversation as one readable string (completion tables, the report, plain-prompt
    rewards): the assistant's turns as written, other messages as ``[role] content`` lines."""
    lines = [f"[{m['role']}] {content_text(m['content'])}" for m in messages]
    return "\n".join(assistant_text(m) if m["role"] == "assistant" else line
                     for m, line in zip(messages, lines, strict=True))  # fmt: skip


@dataclass
class TurnLimits:
    """A conversation's bounds: a run's ``max_turns`` and ``max_tool_output_tokens`` options,
    and the strings that end a turn besides EOS (the interaction's)."""

    max_turns: int  # assistant turns per conversation
    max_observation_tokens: int  # each inserted message's content is cut to this
    stop_strings: tuple[str, ...] = ()  # end a turn here, as EOS does (e.g. "</tool_call>")


@dataclass
class _Conversation:
    env: Environment
    tokens: list[int] = field(default_factory=list)  # everything after the prompt
    trained: list[int] = field(default_factory=list)  # 1: the policy wrote it
    logps: list[float] = field(default_factory=list)
    messages: list[dict[str, str]] = field(default_factory=list)
    turn_start: int = 0
    turns: int = 0
    finished: bool = False
    truncated: bool = False
    pending: list[int] = field(default_factory=list)  # tokens to insert at the turn boundary

    def append(self, token: int, logp: float) -> None:
        self.tokens.append(token)
        self.trained.append(1)
        self.logps.append(logp)


class _StopMatcher:
    """Whether a turn ends at a stop string: tokens whose text contains a stop string's last
    character trigger a decode of the turn's tail (decoding every token would cost more)."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, stop_strings: Sequence[str]) -> None:
        self.tokenizer, self.stops = tokenizer, tuple(s for s in stop_strings if s)
        last = {s[-1] for s in self.stops}
        self.triggers: set[int] = set()
        if self.stops:
            vocab = tokenizer.get_vocab()
            texts = tokenizer.batch_decode([[i] for i in vocab.values()])
            self.triggers = {i for i, t in zip(vocab.values(), texts, strict=True)
                             if any(c in t for c in last)}  # fmt: skip
        self.tail = max((len(s) for s in self.stops), default=0)  # characters, >= tokens

    def __call__(self, turn: Sequence[int]) -> bool:
        if not self.stops or turn[-1] not in self.triggers:
            return False
        text = self.tokenizer.decode(list(turn[-self.tail :]))
        return any(s in text for s in self.stops)


class _Conversations:
    """One conversation per row (``counts[p]`` rows for prompt ``p``; ``envs`` one per row,
    already reset) and the two steps every way of writing turns shares, so each ends a turn at
    the same token: :meth:`write` appends a token the policy wrote, :meth:`end_turn` hands the
    turn to the environment and inserts its reply."""

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        prompt_token_ids: list[list[int]],
        counts: list[int],
        envs: list[Environment],
        render: TurnRenderer,
        limits: TurnLimits,
        budget: int,
        eos: set[int],
        stop: _StopMatcher,
    ) -> None:
        if len(counts) != len(prompt_token_ids) or any(c < 1 for c in counts):
            raise ValueError(f"need one count >= 1 per prompt, got {counts}")
        self.row_prompt = [p for p, c in enumerate(counts) for _ in range(c)]
        self.convs = [_Conversation(env) for env in envs]
        if len(self.convs) != len(self.row_prompt):
            raise ValueError(
                f"{len(self.convs)} environments for {len(self.row_prompt)} conversations"
            )
        self.tokenizer, self.render, self.limits = tokenizer, render, limits
        self.budget, self.eos, self.stop = budget, eos, stop
        self.timing = {"env_s": 0.0, "insert_s": 0.0}

    def end_turn(self, r: int, reason: str) -> None:
        """The turn of row ``r`` ended (eos | stop | budget): record it, ask the environment."""
        c, tokenizer, limits = self.convs[r], self.tokenizer, self.limits
        c.turns += 1
        text = tokenizer.decode(c.tokens[c.turn_start :], skip_special_tokens=True)
        c.messages.append(assistant_message(text))  # tool calls parsed, as TRL's rewards get
        if reason == "budget":
            c.finished = c.truncated = True
            return
        start = time.perf_counter()
        step = c.env.step(text)
        self.timing["env_s"] += time.perf_counter() - start
        if step.done or c.turns >= limits.max_turns:
            c.finished = True
            return
        shown = [_cut(m, tokenizer, limits.max_observation_tokens) for m in step.messages]
        text = self.render(shown, reason == "eos")
        inserted = tokenizer(text, add_special_tokens=False)["input_ids"]
        if len(c.tokens) + len(inserted) >= self.budget:  # no room left to answer
            c.finished = c.truncated = True
            return
        # The conversation keeps a list a tool returned as is (TRL's rewards read it) unless
        # it was cut; everything else as shown.
        c.messages.extend(_kept(m, s) for m, s in zip(step.messages, shown, strict=True))
        # The turn's last token was sampled but not fed yet: it goes in first.
        c.pending = [*c.tokens[-1:], *inserted]
        c.tokens.extend(inserted)
        c.trained.extend([0] * len(inserted))
        c.logps.extend([0.0] * len(inserted))
        c.turn_start = len(c.tokens)

    def write(self, r: int, token: int, logp: float) -> bool:
        """Append the policy's ``token`` to row ``r``; True when it ended the turn."""
        c = self.convs[r]
        c.append(token, logp)
        if token in self.eos:
            reason = "eos"
        elif self.stop(c.tokens[c.turn_start :]):
            reason = "stop"
        elif len(c.tokens) >= self.budget:
            reason = "budget"
        else:
            return False
        self.end_turn(r, reason)
        return True


@torch.no_grad()
def converse(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompt_token_ids: list[list[int]],
    counts: list[int],
    envs: list[Environment],
    render: TurnRenderer,
    params: SamplingParams,
    limits: TurnLimits,
    generator: torch.Generator | None = None,
    *,
    return_logprobs: bool = False,
    reencode: bool = False,
    stop_matcher: _StopMatcher | None = None,
) -> tuple[Rollout, dict[str, float]]:
    """Run one conversation per row (``counts[p]`` rows for prompt ``p``; ``envs`` one per row,
    already reset). ``params.max_completion_length`` bounds every conversation's tokens after
    the prompt. Returns the rollout and timing (seconds in the environments, in inserting)."""
    device = next(model.parameters()).device
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    eos = set(eos_token_ids(model, tokenizer))
    budget = params.max_completion_length
    stop = stop_matcher or _StopMatcher(tokenizer, limits.stop_strings)
    talk = _Conversations(tokenizer, prompt_token_ids, counts, envs, render, limits, budget, eos,
                          stop)  # fmt: skip
    convs, row_prompt, timing = talk.convs, talk.row_prompt, talk.timing
    write, end_turn = talk.write, talk.end_turn

    prompt_ids, prompt_mask = left_pad(prompt_token_ids, pad_id)
    prompt_ids, prompt_mask = prompt_ids.to(device), prompt_mask.to(device)
    was_training = model.training
    model.eval()
    try:
        if replaced_generate(model):
            # TRL's tool loop: each turn is ONE model.generate call on the conversations still
            # going (prompt and conversation so far, left-padded); a turn's tokens end at its
            # EOS, stop string or budget, and what generate returned after that is dropped.
            eos_ids = sorted(eos)
            while rows := [r for r, c in enumerate(convs) if not c.finished]:
                sequences = [prompt_token_ids[row_prompt[r]] + convs[r].tokens for r in rows]
                ids, mask = left_pad(sequences, pad_id)
                options = generate_options(
                    params, eos_ids, pad_id, max(budget - len(convs[r].tokens) for r in rows)
                )
                if stop.stops:
                    options.update(stop_strings=list(stop.stops), tokenizer=tokenizer)
                new = call_generate(model, ids.to(device), mask.to(device), options, generator)
                lengths, _ = completion_lengths(new, eos_ids, tokenizer.pad_token_id)
                for r, turn, n in zip(rows, new.tolist(), lengths.tolist(), strict=True):
                    for token in turn[:n]:
                        if write(r, token, 0.0):
                            break
                    else:  # generate ended the turn short of EOS, a stop string and the budget
                        end_turn(r, "stop")
                    convs[r].pending = []  # every turn re-encodes the conversation
            # No sampler log-probs: the trainer computes pi_old with the policy.
            return _assemble(convs, row_prompt, prompt_ids, prompt_mask, pad_id, False), timing
        # Encode each prompt once and share its cache across the prompt's rows.
        live = torch.arange(len(row_prompt), device=device)  # batch position -> row
        logits, cache, attn, next_pos = _prefill(
            model, prompt_ids, prompt_mask, torch.tensor(row_prompt, device=device)
        )
        while live.numel():
            # 1. Decode until every live row has ended its turn.
            writing = torch.ones(live.numel(), dtype=torch.bool, device=device)
            while True:
                token = sample_next_token(logits, params, generator)
                token = torch.where(writing, token, torch.full_like(token, pad_id))
                logp = None
                if return_logprobs:
                    logp = token_logprobs(logits, token, params).tolist()
                for b, (r, t, w) in enumerate(
                    zip(live.tolist(), token.tolist(), writing.tolist(), strict=True)
                ):
                    if w and write(r, t, logp[b] if logp is not None else 0.0):
                        writing[b] = False
                # Conversations that are over leave the batch (and the cache) at once.
                keep = [b for b, r in enumerate(live.tolist()) if not convs[r].finished]
                if len(keep) < live.numel():
                    index = torch.tensor(keep, dtype=torch.long, device=device)
                    live, writing, token = live[index], writing[index], token[index]
                    attn, next_pos = attn[index], next_pos[index]
                    if keep:
                        select_cache_rows(cache, index)
                if not keep or not bool(writing.any()):
                    break
                attn = torch.cat([attn, writing.long()[:, None]], dim=1)
                cache, logits = decode_one(model, token, attn, next_pos, cache)
                next_pos = next_pos + writing.long()
            if live.numel() == 0:
                break
            # 2. Insert every waiting row's context in one forward over the cache (or, as the
            # baseline, re-encode each conversation from its prompt).
            start = time.perf_counter()
            rows = live.tolist()
            if reencode:
                sequences = [prompt_token_ids[row_prompt[r]] + convs[r].tokens for r in rows]
                ids, mask = left_pad(sequences, pad_id)
                logits, cache, attn, next_pos = _prefill(model, ids.to(device), mask.to(device))
            else:
                logits, attn, next_pos = _insert(
                    model, cache, attn, next_pos, [convs[r].pending for r in rows], pad_id
                )
            for r in rows:
                convs[r].pending = []
            timing["insert_s"] += time.perf_counter() - start
    finally:
        model.train(was_training)
    return _assemble(convs, row_prompt, prompt_ids, prompt_mask, pad_id, return_logprobs), timing


def converse_by_turns(
    engine: VLLMEngine,
    prompt_token_ids: list[list[int]],
    counts: list[int],
    envs: list[Environment],
    render: TurnRenderer,
    params: SamplingParams,
    limits: TurnLimits,
    generator: torch.Generator | None = None,
    *,
    stop_matcher: _StopMatcher | None = None,
) -> tuple[Rollout, dict[str, float]]:
    """:func:`converse` on the vLLM engine (see the module docstring): each turn is one
    :meth:`~groupwise.rollout.vllm.VLLMEngine.continue_turns` call on the conversations still
    going. ``generator`` (evaluation) seeds every row's turn; without one vLLM samples from its
    own random state."""
    tokenizer = engine.tokenizer
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    budget = params.max_completion_length
    stop = stop_matcher or _StopMatcher(tokenizer, limits.stop_strings)
    eos = set(engine.eos_token_ids)
    talk = _Conversations(tokenizer, prompt_token_ids, counts, envs, render, limits, budget, eos,
                          stop)  # fmt: skip
    while rows := [r for r, c in enumerate(talk.convs) if not c.finished]:
        # Each conversation re-encoded from its prompt: vLLM's prefix cache holds the KV of
        # the conversation's earlier requests, so mostly the inserted reply is encoded.
        sequences = [prompt_token_ids[talk.row_prompt[r]] + talk.convs[r].tokens for r in rows]
        budgets = [budget - len(talk.convs[r].tokens) for r in rows]
        seeds: list[int | None] = [None] * len(rows)
        if generator is not None:
            drawn = torch.randint(
                0, 2**31 - 1, (len(rows),), generator=generator, device=generator.device
            )
            seeds = [int(s) for s in drawn.tolist()]
        turns = engine.continue_turns(sequences, budgets, params, stop.stops, seeds)
        for r, (tokens, logps, _) in zip(rows, turns, strict=True):
            # The HF engine's checks end the turn, so both engines end it at the same token;
            # what vLLM wrote after that is dropped.
            for token, logp in zip(tokens, logps, strict=True):
                if talk.write(r, token, logp):
                    break
            else:  # vLLM ended the turn short of EOS, a stop string and the budget
                talk.end_turn(r, "stop")
    prompt_ids, prompt_mask = left_pad(prompt_token_ids, pad_id)
    device = engine.device
    prompt_ids, prompt_mask = prompt_ids.to(device), prompt_mask.to(device)
    rollout = _assemble(talk.convs, talk.row_prompt, prompt_ids, prompt_mask, pad_id, True)
    return rollout, talk.timing


def _prefill(
    model: PreTrainedModel,
    ids: torch.Tensor,
    mask: torch.Tensor,
    rows: torch.Tensor | None = None,
) -> tuple[torch.Tensor, DynamicCache, torch.Tensor, torch.Tensor]:
    """:func:`~groupwise.rollout.hf.prefill`, plus the attention mask; with ``rows``, batch row
    i continues sequence rows[i]."""
    logits, cache, next_pos = prefill(model, ids, mask)
    if has_recurrent_state(cache):
        # Rows waiting for others decode masked padding and tool replies are inserted
        # left-padded: attention skips masked positions, a recurrent (Mamba) state does not.
        raise ConfigError(
            f"multi-turn rollouts do not support {type(model).__name__}: its cache holds "
            "recurrent (Mamba / linear-attention) layers, which masked padding in the middle of "
            "a sequence would change; use a model with attention layers only"
        )
    if rows is not None:
        select_cache_rows(cache, rows)
        logits, mask, next_pos = logits[rows], mask[rows], next_pos[rows]
    return logits, cache, mask, next_pos


def _insert(
    model: PreTrainedModel,
    cache: DynamicCache,
    attn: torch.Tensor,
    next_pos: torch.Tensor,
    pending: list[list[int]],
    pad_id: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Append each row's ``pending`` tokens to its cache in one forward: left-padded so that
    every row's last position is real (one logits row each); pad positions are masked."""
    device = attn.device
    ids, mask = left_pad(pending, pad_id)
    ids, mask = ids.to(device), mask.to(device)
    lengths = mask.sum(dim=1)
    # Position of each real token: next_pos, next_pos + 1, ...; pads get any (masked) value.
    offsets = (mask.cumsum(dim=1) - 1).clamp(min=0)
    positions = next_pos[:, None] + offsets
    attn = torch.cat([attn, mask], dim=1)
    logits, _ = forward_with_cache(model, ids, attn, positions, cache)
    return logits, attn, next_pos + lengths


def _cut(message: Mapping[str, Any], tokenizer: PreTrainedTokenizerBase, limit: int) -> dict:
    """The message as shown to the model: its content as text (:func:`content_text`), cut to
    ``limit`` tokens (a marker says how much was cut); a tool's ``name`` is kept."""
    content = content_text(message.get("content", ""))
    shown = {"role": str(message.get("role", "user"))}
    if "name" in message:
        shown["name"] = str(message["name"])
    ids = tokenizer(content, add_special_tokens=False)["input_ids"]
    if len(ids) > limit:
        content = f"{tokenizer.decode(ids[:limit])} ... [cut {len(ids) - limit} tokens]"
    return {**shown, "content": content}


def _kept(message: Mapping[str, Any], shown: dict[str, str]) -> dict[str, Any]:
    """What the conversation records of an inserted message: a tool's returned list as is when
    the model was shown all of it, else the message as shown."""
    whole = shown["content"] == content_text(message["content"])
    return {**shown, "content": message["content"]} if whole else shown


def _assemble(
    convs: list[_Conversation],
    row_prompt: list[int],
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    pad_id: int,
    return_logprobs: bool,
) -> Rollout:
    n = len(convs)
    width = max(max((len(c.tokens) for c in convs), default=1), 1)
    ids = torch.full((n, width), pad_id, dtype=torch.long)
    mask = torch.zeros((n, width), dtype=torch.long)
    trained = torch.zeros((n, width), dtype=torch.long)
    logps = torch.zeros((n, width)) if return_logprobs else None
    for i, c in enumerate(convs):
        k = len(c.tokens)
        ids[i, :k] = torch.tensor(c.tokens, dtype=torch.long)
        mask[i, :k] = 1
        trained[i, :k] = torch.tensor(c.trained, dtype=torch.long)
        if logps is not None:
            logps[i, :k] = torch.tensor(c.logps)
    device = prompt_ids.device
    states = []
    for c in convs:
        state = dict(c.env.state())
        state.setdefault("turns", c.turns)
        states.append(state)
    return Rollout(
        prompt_ids=prompt_ids,
        prompt_mask=prompt_mask,
        completion_ids=ids.to(device),
        completion_mask=mask.to(device),
        truncated=torch.tensor([c.truncated for c in convs], device=device),
        group_ids=torch.tensor(row_prompt, dtype=torch.long, device=device),
        texts=[conversation_text(c.messages) for c in convs],
        sampling_logprobs=None if logps is None else logps.to(device),
        loss_mask=trained.to(device),
        conversations=[c.messages for c in convs],
        env_states=states,
    )


class MultiTurnEngine(Engine):
    """:class:`~groupwise.rollout.base.RolloutEngine` that runs conversations: it wraps the
    token engine (:class:`~groupwise.rollout.hf.HFEngine`: its model, numerics, weights and
    generator; or :class:`~groupwise.rollout.vllm.VLLMEngine`, which writes each turn whole)
    and builds one environment per conversation with ``make_env()``, reset from the
    conversation's dataset row. ``tools`` are the tool schemas the prompts show the model (None:
    none), with their worked examples when ``examples`` (the run's ``tool_examples``). A
    ``generate`` the user replaced on the model writes the turns (see the module docstring)."""

    def __init__(
        self,
        engine: HFEngine | VLLMEngine,
        make_env: Callable[[], Environment],
        limits: TurnLimits,
        *,
        tools: list[dict[str, Any]] | None,
        examples: bool,
        reencode: bool = False,
        template_kwargs: Mapping[str, Any] | None = None,
        environments: EnvironmentFactories | None = None,
    ) -> None:
        self.engine, self.make_env, self.limits = engine, make_env, limits
        self.template_kwargs = dict(template_kwargs or {})  # TRL's chat_template_kwargs
        # TRL's environment_factory: the environments (and their tools) come from the rows
        self.environments = environments
        self.tools, self.examples, self.reencode = tools, examples, reencode
        self.stop = _StopMatcher(engine.tokenizer, limits.stop_strings)
        self.timing: dict[str, float] = {}

    def prompt_text(self, prompt: Any) -> str:
        """A prompt's text with the tools shown (:mod:`groupwise.tools.prompting`)."""
        tokenizer, kwargs = self.engine.tokenizer, self.template_kwargs
        if not self.tools:
            return prompt_text(prompt, tokenizer, kwargs)
        return prompt_text_with_tools(prompt, tokenizer, self.tools, self.examples, kwargs)

    @property
    def params(self) -> SamplingParams:
        return self.engine.params

    @property
    def device(self) -> torch.device:
        return self.engine.device

    @property
    def generator(self) -> torch.Generator | None:
        return self.engine.generator

    def sample(self, request: Request) -> Rollout:
        """One conversation per rollout; ``rows`` (the prompts' dataset rows) reset the
        environments. Without rows the environments are reset from ``{}``."""
        prompt_ids, counts, rows = request.prompt_ids, request.counts, request.rows
        params, generator = request.params, request.generator
        envs: list[Any] = []
        own_prompts: list[list[int]] | None = None  # one per rollout, when a group's differ
        if self.environments is not None:
            rows = rows if rows is not None else [{"prompt": PLACEHOLDER_PROMPT}] * len(counts)
            envs = self.environments.take(rows, counts)
            prompt_ids, own_prompts = self._environment_prompts(rows, counts, envs)
        for p, count in enumerate(counts if self.environments is None else ()):
            for _ in range(count):
                env = self.make_env()
                env.reset(rows[p] if rows is not None else {})
                envs.append(env)
        engine = self.engine
        # Replies are rendered by the chat template when the prompts are conversations.
        render = TurnRenderer(
            engine.tokenizer,
            rows is None or is_conversational(rows[0]["prompt"]),
            self.template_kwargs,
        )
        prompts = [list(p) for p in prompt_ids] if own_prompts is None else own_prompts
        rollouts = counts if own_prompts is None else [1] * len(own_prompts)
        if isinstance(engine, HFEngine):
            with engine.numerics(), engine.weights():
                rollout, self.timing = converse(
                    engine.model,
                    engine.tokenizer,
                    prompts,
                    rollouts,
                    envs,
                    render,
                    params,
                    self.limits,
                    generator,
                    return_logprobs=engine.records_logprobs,
                    reencode=self.reencode,
                    stop_matcher=self.stop,
                )
        else:  # vLLM writes each turn; it holds its own copy of the weights
            rollout, self.timing = converse_by_turns(
                engine, prompts, rollouts, envs, render, params, self.limits, generator,
                stop_matcher=self.stop,
            )  # fmt: skip
        if own_prompts is not None:
            rollout = share_group_prompts(rollout, own_prompts, counts, engine.tokenizer)
        return rollout

    def _environment_prompts(
        self, rows: Sequence[Mapping[str, Any]], counts: Sequence[int], envs: Sequence[Any]
    ) -> tuple[list[list[int]], list[list[int]] | None]:
        """TRL's environment prompts: each rollout's row prompt (an empty user turn when it has
        none) with only its environment's tools shown and, when ``reset`` returned text, that
        text appended to the last message. Returns one prompt per row and None when every
        row's rollouts got the same text; else the rows' prompts and one prompt per rollout
        (TRL allows a row's environments to reset to different text, e.g. a random board)."""
        assert self.environments is not None
        tokenizer = self.engine.tokenizer
        shared: list[list[int]] = []
        own: list[list[int]] = []
        start = 0
        for row, count in zip(rows, counts, strict=True):
            schemas = self.environments.schemas[self.environments.name_of(row)]
            texts: dict[str, list[int]] = {}  # the same reset text is rendered once
            for env in envs[start : start + count]:
                key = repr(env.observation)
                if key not in texts:
                    row_prompt = row.get("prompt", PLACEHOLDER_PROMPT)
                    prompt = with_observation(row_prompt, env.observation)
                    if schemas:
                        text = prompt_text_with_tools(
                            prompt, tokenizer, schemas, self.examples, self.template_kwargs
                        )
                    else:
                        text = prompt_text(prompt, tokenizer, self.template_kwargs)
                    texts[key] = list(tokenizer(text, add_special_tokens=False)["input_ids"])
                own.append(texts[key])
            shared.append(own[start])
            start += count
        if all(ids == shared[group] for group, ids in zip(_row_groups(counts), own, strict=True)):
            return shared, None
        return shared, own

    def sync(self, policy: torch.nn.Module) -> None:
        self.engine.sync(policy)


def _row_groups(counts: Sequence[int]) -> list[int]:
    """The group (row) of each rollout, for ``counts[p]`` rollouts of row p."""
    return [p for p, count in enumerate(counts) for _ in range(count)]


def share_group_prompts(
    rollout: Rollout,
    prompts: Sequence[Sequence[int]],
    counts: Sequence[int],
    tokenizer: PreTrainedTokenizerBase,
) -> Rollout:
    """A rollout run with one prompt per conversation (``prompts``, one group each) as groups
    of ``counts[p]`` rollouts: a group's prompt is the tokens its rollouts' prompts share (the
    row's prompt up to where the reset texts differ), and the rest of each rollout's prompt
    leads its completion as context (in the completion mask, not the loss mask, no sampler
    log-prob), so every rollout is scored on exactly the tokens it was generated from while
    the group keeps one prompt for the reward baseline."""
    groups = _row_groups(counts)
    if len(groups) != len(prompts):
        raise ValueError(f"{len(prompts)} prompts for {len(groups)} rollouts")
    shared: list[list[int]] = []
    start = 0
    for count in counts:
        members = [list(p) for p in prompts[start : start + count]]
        start += count
        n = 0
        while all(len(p) > n and p[n] == members[0][n] for p in members):
            n += 1
        if n == 0:
            raise ConfigError(
                "environment reset() returned different text for the rollouts of one row and "
                "their prompts share no leading token, so the group has no common prompt; give "
                "the rows a prompt (or a chat template) that comes before the reset text"
            )
        shared.append(members[0][:n])
    tails = [list(p[len(shared[g]) :]) for p, g in zip(prompts, groups, strict=True)]
    lengths = rollout.host_lengths.tolist()
    n_rows = len(tails)
    width = max(max(len(t) + n for t, n in zip(tails, lengths, strict=True)), 1)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    device = rollout.completion_ids.device
    ids = torch.full((n_rows, width), pad_id, dtype=torch.long, device=device)
    mask = torch.zeros((n_rows, width), dtype=torch.long, device=device)
    trained = torch.zeros_like(mask)
    logps = None
    if rollout.sampling_logprobs is not None:
        logps = torch.zeros((n_rows, width), device=device)
    assert rollout.loss_mask is not None
    for i, (tail, n) in enumerate(zip(tails, lengths, strict=True)):
        k = len(tail)
        ids[i, :k] = torch.tensor(tail, dtype=torch.long)
        ids[i, k : k + n] = rollout.completion_ids[i, :n]
        mask[i, : k + n] = 1
        trained[i, k : k + n] = rollout.loss_mask[i, :n]
        if logps is not None:
            logps[i, k : k + n] = rollout.sampling_logprobs[i, :n]
    prompt_ids, prompt_mask = left_pad(shared, pad_id)
    return dataclasses.replace(
        rollout,
        prompt_ids=prompt_ids.to(device),
        prompt_mask=prompt_mask.to(device),
        completion_ids=ids,
        completion_mask=mask,
        group_ids=torch.tensor(groups, dtype=torch.long, device=device),
        sampling_logprobs=logps,
        loss_mask=trained,
    )


def with_observation(prompt: Any, observation: Any) -> Any:
    """``prompt`` with an environment's reset text appended to its last message (a string
    prompt: to the string), as TRL does; the prompt itself when there is none."""
    if observation is None:
        return prompt
    if isinstance(prompt, str):
        return prompt + str(observation)
    last = prompt[-1]
    return [*prompt[:-1], {**last, "content": f"{last['content']}{observation}"}]
