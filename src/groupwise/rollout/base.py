"""What a rollout engine returns and the protocol every engine follows.

An engine turns tokenised prompts and a rollout count per prompt into completions
(:class:`Rollout`). The trainer, the PPO trainer and evaluation only see this protocol, so an
engine that samples elsewhere (vLLM) or wraps another one (multi-turn tool use, which marks the
tokens it inserted in ``loss_mask``) needs no change outside its own module.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch


@dataclass
class SamplingParams:
    """How an engine samples a completion. Every field is given: a run's come from its
    ``generation`` options (:func:`groupwise.wiring.rollout.sampling_params`), where their
    defaults are declared; :func:`plain_sampling` is sampling with every filter off."""

    max_completion_length: int
    temperature: float  # <= 0 means greedy (exact argmax)
    top_p: float  # 1 disables top-p
    top_k: int  # 0 disables top-k
    min_p: float  # drop tokens below min_p * the top token's probability (0: off)
    repetition_penalty: float  # HF's / vLLM's penalty on tokens already seen (1: off)

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


def plain_sampling(max_completion_length: int, temperature: float) -> SamplingParams:
    """Sampling from softmax(logits / ``temperature``) (<= 0: greedy), every filter off: no
    top-p, top-k or min-p, no repetition penalty."""
    return SamplingParams(
        max_completion_length, temperature, top_p=1.0, top_k=0, min_p=0.0, repetition_penalty=1.0
    )


@dataclass
class Rollout:
    """Output of an engine. Rows are ordered group by group: row i belongs to prompt
    ``group_ids[i]``; each group's rows are contiguous."""

    prompt_ids: torch.Tensor  # [P, Lp] left-padded
    prompt_mask: torch.Tensor  # [P, Lp]
    completion_ids: torch.Tensor  # [N, T] right-padded with pad_token_id
    completion_mask: torch.Tensor  # [N, T] 1 for generated tokens up to and including EOS
    truncated: torch.Tensor  # [N] bool: hit max_completion_length without EOS
    group_ids: torch.Tensor  # [N] long: index of the prompt this completion answers
    texts: list[str]  # decoded completions (special tokens skipped)
    # [N, T] fp32 log mu(token) of each sampled token, mu being the distribution the engine
    # actually drew it from: softmax(logits / T) restricted to the top-k / top-p set and
    # renormalised (softmax(logits) when greedy); 0 at padding. vLLM's
    # logprobs_mode="processed_logprobs"; the HF engine's hf.token_logprobs. Set when the
    # engine's numerics differ from the trainer's; the trainer then applies rollout correction.
    # Why after top-k / top-p: rollout correction weights each token by pi_old / pi_rollout,
    # an importance ratio, whose denominator must be the behaviour distribution the token was
    # sampled from. The trainer's pi_old is the full softmax(logits / T); with top-k / top-p
    # the ratio is then the kept mass (<= 1), the true off-policy factor of truncated sampling.
    # With top_k = 0 and top_p = 1 (the defaults) both readings coincide.
    sampling_logprobs: torch.Tensor | None = None
    # [N, T] 1 for the tokens the policy wrote and is trained on; 0 for context an engine
    # inserted (tool output) and for padding. Defaults to ``completion_mask``.
    loss_mask: torch.Tensor | None = None
    # Multi-turn engines (rollout/multiturn.py): each row's messages after the prompt (the
    # assistant's turns and the tool / environment replies) and its environment's final state
    # (with ``turns``). Reward functions receive them as completions and the ``env_state``
    # column.
    conversations: list[list[dict[str, str]]] | None = None
    env_states: list[dict[str, Any]] | None = None

    def __post_init__(self) -> None:
        if self.loss_mask is None:
            self.loss_mask = self.completion_mask

    @property
    def lengths(self) -> torch.Tensor:
        return self.completion_mask.sum(dim=1)

    # Host copies, read from the device once per rollout: micro-batch shapes (widths, shared
    # prompt blocks) are decided on the CPU, so no micro-batch waits for the GPU to decide them.
    @functools.cached_property
    def host_lengths(self) -> torch.Tensor:
        """Completion lengths [N] in CPU memory."""
        return self.lengths.cpu()

    @functools.cached_property
    def host_group_ids(self) -> torch.Tensor:
        """``group_ids`` [N] in CPU memory."""
        return self.group_ids.cpu()


PromptIds = Sequence[Sequence[int]]  # tokenised prompts
Counts = int | Sequence[int]  # rollouts: one count for every prompt, or one per prompt
Params = SamplingParams | None  # None: the engine's own (training) sampling parameters
Gen = torch.Generator | None  # None: the engine's own generator
Rows = Sequence[Mapping[str, Any]] | None  # the prompts' dataset rows (environments reset)


def per_prompt_counts(prompts: PromptIds, counts: Counts) -> list[int]:
    """One rollout count per prompt (``counts`` is one for every prompt, or one per prompt);
    ValueError for a missing or non-positive count or an empty prompt."""
    per_prompt = [counts] * len(prompts) if isinstance(counts, int) else list(counts)
    if len(per_prompt) != len(prompts) or any(c < 1 for c in per_prompt):
        raise ValueError(f"need one count >= 1 per prompt, got {counts}")
    if any(len(p) == 0 for p in prompts):
        raise ValueError("empty prompt: every prompt must have at least one token")
    return per_prompt


@dataclass(frozen=True)
class Request:
    """One ``generate`` call, checked and with the engine's defaults filled in: what an
    :class:`Engine` samples (:meth:`Engine.sample`)."""

    prompt_ids: list[list[int]]  # tokenised prompts, none empty
    counts: list[int]  # one rollout count >= 1 per prompt
    params: SamplingParams
    generator: torch.Generator | None
    rows: Sequence[Mapping[str, Any]] | None  # the prompts' dataset rows, when given

    @property
    def count(self) -> int | list[int]:
        """One count for all prompts when the groups are uniform (then a prompt's cache can be
        repeated instead of gathered), else ``counts``."""
        if self.counts and all(c == self.counts[0] for c in self.counts):
            return self.counts[0]
        return list(self.counts)


@runtime_checkable
class RolloutEngine(Protocol):
    """Samples completions from the current policy.

    ``generate(prompt_ids, counts, params, generator, rows)``: ``counts`` is one rollout count
    for every prompt or one per prompt; ``params``/``generator`` default to the engine's own
    (training) ones; ``rows`` are the prompts' dataset rows, which a multi-turn engine resets its
    environments from (a token engine ignores them). ``sync(policy)`` is called after every
    optimizer step, so an engine holding its own copy of the weights (vLLM) can refresh them.

    Any class with these two methods is an engine; one derived from :class:`Engine` writes only
    ``sample`` (and ``sync``) and inherits ``generate``."""

    def generate(
        self,
        prompt_ids: PromptIds,
        counts: Counts,
        params: Params = None,
        generator: Gen = None,
        rows: Rows = None,
    ) -> Rollout:
        """An :class:`Engine`'s completions: ValueError for a missing or non-positive count or an
        empty prompt (:func:`per_prompt_counts`), else its :meth:`Engine.sample` of the
        :class:`Request` with its own params and generator where none are given."""
        if not isinstance(self, Engine):
            raise NotImplementedError(
                f"{type(self).__name__} is a rollout engine: define generate(), or derive it "
                "from groupwise.rollout.Engine and define sample()"
            )
        prompts = [[int(t) for t in p] for p in prompt_ids]
        return self.sample(
            Request(
                prompts,
                per_prompt_counts(prompts, counts),
                self.params if params is None else params,
                self.generator if generator is None else generator,
                rows,
            )
        )

    def sync(self, policy: torch.nn.Module) -> None: ...


class Engine(RolloutEngine):
    """Base of the built-in engines: the shared ``generate`` checks the call and fills in the
    engine's own ``params`` and ``generator`` (None: the sampler's own random state), then hands
    the :class:`Request` to ``sample``."""

    params: SamplingParams
    generator: torch.Generator | None = None

    def sample(self, request: Request) -> Rollout:
        """The completions of a checked request."""
        raise NotImplementedError(f"{type(self).__name__} must define sample()")


def select_prompts(rollout: Rollout, prompts: torch.Tensor) -> tuple[Rollout, torch.Tensor]:
    """The part of ``rollout`` answering ``prompts`` (group indices, ascending): a Rollout of
    those groups (group ids renumbered 0..len(prompts)-1) and its rows' indices in ``rollout``."""
    group_ids = rollout.group_ids.cpu()
    renumber = torch.full((rollout.prompt_ids.shape[0],), -1, dtype=torch.long)
    renumber[prompts] = torch.arange(prompts.numel())
    rows = torch.nonzero(renumber[group_ids] >= 0).flatten()

    def take(x: torch.Tensor | None, index: torch.Tensor) -> torch.Tensor | None:
        return None if x is None else x[index.to(x.device)]

    part = Rollout(
        prompt_ids=take(rollout.prompt_ids, prompts),
        prompt_mask=take(rollout.prompt_mask, prompts),
        completion_ids=take(rollout.completion_ids, rows),
        completion_mask=take(rollout.completion_mask, rows),
        truncated=take(rollout.truncated, rows),
        group_ids=renumber[group_ids[rows]].to(rollout.group_ids.device),
        texts=[rollout.texts[i] for i in rows.tolist()],
        sampling_logprobs=take(rollout.sampling_logprobs, rows),
        loss_mask=take(rollout.loss_mask, rows),
        conversations=pick(rollout.conversations, rows),
        env_states=pick(rollout.env_states, rows),
    )
    return part, rows


def pick(values: list | None, rows: torch.Tensor) -> list | None:
    """The entries of a per-row list (None stays None) at ``rows``."""
    return None if values is None else [values[i] for i in rows.tolist()]
