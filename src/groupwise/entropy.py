"""The entropy bonus of the GRPO objective, with Skywork-OR1's adaptive coefficient (TRL's
``entropy_coef`` / ``use_adaptive_entropy`` options and names).

With the bonus the objective to minimise is

    L = L_policy - c * H                                                                   (1)

where H is the mean per-token entropy of the policy over the tokens the policy term trains on
(every completion token; with ``top_entropy_quantile`` the high-entropy ones), whatever the
``loss_type``: the bonus is not rescaled to a loss type's own normalisation, so ``c`` means the
same for every loss. Over a global batch spread across micro-batches and ranks, micro-batch k's
part is its own token mean H_k weighted by its share of the batch's completion tokens, so
without a token mask the parts add up to exactly the batch's token mean.

Adaptive control (Skywork-OR1, arXiv 2505.22312, Sec. 3.2): after each optimizer step, with H
the entropy measured over that step's tokens (every micro-batch, every rank),

    c <- min(c + delta, c_max)   if H <= target
    c <- max(c - delta, c_min)   otherwise                                                 (2)

and the next step applies c only while the last measured H is at or below the target, so a
policy already above its target entropy gets no push (the first step, with nothing measured
yet, applies none, as TRL does).                                                          (3)
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .distributed import DistributedContext, all_reduce_sum
from .sections import LossOptions


def adapt_entropy_coef(
    coef: float,
    entropy: float,
    *,
    target: float,
    delta: float,
    coef_min: float,
    coef_max: float,
) -> float:
    """Eq. 2: the coefficient after an optimizer step that measured ``entropy`` (nats/token)."""
    if entropy <= target:
        return min(coef + delta, coef_max)
    return max(coef - delta, coef_min)


def entropy_bonus(entropies: Tensor, keep: Tensor, share: float | Tensor) -> Tensor:
    """Micro-batch k's part of ``H`` in Eq. 1: the mean entropy over its ``keep`` tokens [n, T]
    times ``share``, its weight in the global batch (a 0-d tensor keeps the GPU unsynced)."""
    keep = keep.to(entropies.dtype)
    return (entropies * keep).sum() / keep.sum().clamp(min=1) * share


class EntropyControl:
    """The run's entropy coefficient: fixed (``entropy_coef``), or adapted after every optimizer
    step (Eqs. 2-3) from the token entropy the micro-batches of that step report."""

    def __init__(
        self,
        coef: float,
        *,
        adaptive: bool = False,
        target: float = 0.2,
        delta: float = 0.005,
        coef_min: float = 0.0,
        coef_max: float = 1.0,
    ) -> None:
        self.coef, self.adaptive = float(coef), adaptive
        self.target, self.delta = target, delta
        self.coef_min, self.coef_max = coef_min, coef_max
        self.last_entropy = math.inf  # Eq. 3: nothing measured yet
        self._window: Tensor | None = None  # [entropy sum, token count] of this optimizer step

    @classmethod
    def from_options(cls, loss: LossOptions) -> EntropyControl | None:
        """The control of a run's loss section (TRL's option names); None when there is no
        bonus."""
        if loss.entropy_coef == 0.0 and not loss.use_adaptive_entropy:
            return None
        return cls(
            loss.entropy_coef,
            adaptive=loss.use_adaptive_entropy,
            target=loss.entropy_target,
            delta=loss.entropy_coef_delta,
            coef_min=loss.entropy_coef_min,
            coef_max=loss.entropy_coef_max,
        )

    @property
    def applied(self) -> float:
        """The coefficient this optimizer step's micro-batches apply (Eq. 3)."""
        if self.adaptive and self.last_entropy > self.target:
            return 0.0
        return self.coef

    def observe(self, entropies: Tensor, keep: Tensor) -> None:
        """Add a micro-batch's entropies over its ``keep`` tokens to this step's measurement
        (device tensors: nothing is read until :meth:`step`)."""
        if not self.adaptive:
            return
        keep = keep.to(entropies.dtype)
        stats = torch.stack([(entropies.detach() * keep).sum(), keep.sum()]).double()
        self._window = stats if self._window is None else self._window + stats

    def step(self, dist: DistributedContext) -> None:
        """After an optimizer step: the step's token entropy over every rank, then Eq. 2. Every
        rank calls it (the sum is a collective)."""
        if not self.adaptive or self._window is None:
            return
        total, count = all_reduce_sum(self._window, dist).tolist()
        self._window = None
        if count == 0 or not math.isfinite(total):
            return  # nothing measured (or a skipped, non-finite step): keep the coefficient
        entropy = total / count
        self.coef = adapt_entropy_coef(
            self.coef,
            entropy,
            target=self.target,
            delta=self.delta,
            coef_min=self.coef_min,
            coef_max=self.coef_max,
        )
        self.last_entropy = entropy

    def logs(self) -> dict[str, float]:
        return {"entropy_coef": self.coef}

    def state_dict(self) -> dict[str, float]:
        return {"entropy_coef": self.coef, "last_entropy": self.last_entropy}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.coef = float(state["entropy_coef"])
        self.last_entropy = float(state["last_entropy"])
