"""The static engine's decode step replayed as a CUDA graph.

On a GPU a small model's decode step is bound by kernel launches rather than arithmetic: the
step runs some 25-30 kernels per layer (the ops of :func:`~groupwise.rollout.static.forward`),
and at decode's few rows each does about as much work as its launch costs (compiling the step,
which fuses them, made it 1.65x faster on one H200: docs/gpu.md). A CUDA graph records the
step's kernels once and replays them with one launch (the technique vLLM and SGLang use for
decoding; PyTorch's ``torch.cuda.CUDAGraph``). A graph replays
fixed device addresses, so everything the step reads or writes lives in static buffers
(:class:`StepBuffers`) that are filled in place and never reallocated while their graph lives:

- the KV cache, the valid-slot mask, the token, its position and its cache slot are the
  step's inputs; the engine writes the prefilled cache into the buffers and each step's token,
  position and slot are copied in before the replay (the slot is a tensor, so one graph serves
  every step of a rollout);
- the logits are the graph's output, overwritten by the next replay (the engine has sampled
  from them by then, on the same stream);
- the weights are the engine's own copy, refreshed by ``copy_`` into the same storage
  (:meth:`~groupwise.rollout.static_weights.DecoderWeights.load`), or the policy's own layers,
  which the optimizer updates in place, so a graph outlives weight syncs.

One graph per (rows, slots) shape; slots are rounded up to a multiple of ``slot_bucket`` (the
extra slots are never valid, so attention gives them no weight) so prompts of nearby lengths
share a graph, and at most ``max_graphs`` shapes are kept (each holds its own KV cache);
:meth:`DecodeGraphs.release` drops them all, which the engine does when a rollout ends, so the
KV buffers and the graphs' memory pools never sit through the update (a capture costs about
three decode steps, under 1% of a rollout of hundreds of tokens). A capture that fails (an op
that cannot be captured, such as a kernel with a host sync) is logged once and the step runs
eagerly on the same buffers from then on. Before a
capture the step runs ``warmup`` times on a side stream (cuBLAS workspaces, a compiled step's
compilation and autotuning happen outside the capture, as PyTorch's CUDA-graph notes require);
those runs write the same keys, values and valid flag the first replay writes, so they leave the
rollout unchanged. With ``capture=False`` the "graph" is a direct call of the step on the same
buffers: the CPU path, which runs the same arithmetic through the same buffers (tests).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

logger = logging.getLogger(__name__)

DecodeStep = Callable[..., Tensor]  # (weights, token, position, cache_k, cache_v, slot, valid)


@dataclass
class StepBuffers:
    """The static tensors of one captured shape (see the module docstring)."""

    cache_k: Tensor  # [layers, rows, kv_heads, slots, head_dim]
    cache_v: Tensor
    valid: Tensor  # [rows, slots] bool: the slots a query may attend to
    token: Tensor  # [rows] the token being fed
    position: Tensor  # [rows] its RoPE position
    slot: Tensor  # [1] its cache slot
    logits: Tensor | None = None  # [rows, vocab] fp32, the step's output
    graph: Any = None  # torch.cuda.CUDAGraph once captured


class DecodeGraphs:
    """The decode step ``step`` through captured CUDA graphs (``capture=False``: direct calls on
    the same static buffers). :meth:`buffers` gives a rollout its buffers, then each call copies
    the step's token, position and slot in and replays."""

    def __init__(
        self,
        step: DecodeStep,
        *,
        capture: bool = True,
        slot_bucket: int = 64,
        max_graphs: int = 2,
        warmup: int = 2,
    ) -> None:
        if capture and not torch.cuda.is_available():
            raise ValueError("CUDA graphs need a CUDA device (capture=False calls the step)")
        self.step, self.capture = step, capture
        self.slot_bucket, self.max_graphs, self.warmup = slot_bucket, max_graphs, warmup
        self._shapes: OrderedDict[tuple[int, ...], StepBuffers] = OrderedDict()
        self._current: StepBuffers | None = None
        self.captures = 0  # graphs captured so far (one per new shape)
        self.capture_error: str | None = None  # why capture failed, once it has

    def slots(self, needed: int) -> int:
        """``needed`` cache slots rounded up to the bucket, so nearby lengths share a graph."""
        return -(-needed // self.slot_bucket) * self.slot_bucket

    def buffers(
        self, cache_shape: tuple[int, ...], dtype: torch.dtype, device: torch.device
    ) -> StepBuffers:
        """The static buffers for a KV cache of ``cache_shape`` [layers, rows, kv_heads, slots,
        head_dim] (made on the first request of the shape, reused after), most recent last; the
        oldest shape beyond ``max_graphs`` is dropped with its graph."""
        key = (*cache_shape, str(dtype), str(device))
        if key in self._shapes:
            self._shapes.move_to_end(key)
        else:
            rows, slots = cache_shape[1], cache_shape[3]
            self._shapes[key] = StepBuffers(
                cache_k=torch.zeros(cache_shape, dtype=dtype, device=device),
                cache_v=torch.zeros(cache_shape, dtype=dtype, device=device),
                valid=torch.zeros((rows, slots), dtype=torch.bool, device=device),
                token=torch.zeros(rows, dtype=torch.long, device=device),
                position=torch.zeros(rows, dtype=torch.long, device=device),
                slot=torch.zeros(1, dtype=torch.long, device=device),
            )
            while len(self._shapes) > self.max_graphs:
                self._shapes.popitem(last=False)
        self._current = self._shapes[key]
        return self._current

    def __call__(
        self,
        w: Any,
        token: Tensor,
        position: Tensor,
        cache_k: Tensor,
        cache_v: Tensor,
        slot: Tensor,
        valid: Tensor,
    ) -> Tensor:
        """One decode step on the current buffers: fp32 logits [rows, vocab], a static tensor
        the next call overwrites."""
        buf = self._current
        if buf is None or cache_k is not buf.cache_k or cache_v is not buf.cache_v:
            raise RuntimeError("the graphed decode step runs on the buffers buffers() gave")
        if valid is not buf.valid:
            raise RuntimeError("the graphed decode step runs on the valid mask buffers() gave")
        buf.token.copy_(token)
        buf.position.copy_(position)
        buf.slot.copy_(slot)
        if not self.capture:
            out = self._run(w, buf)
            if buf.logits is None:
                buf.logits = torch.empty_like(out)
            return buf.logits.copy_(out)
        if buf.graph is None:
            try:
                self._capture_graph(w, buf)
            except RuntimeError as error:  # run eagerly from now on, on the same buffers
                self.capture, self.capture_error = False, str(error).splitlines()[0]
                logger.warning(
                    "CUDA graph capture of the static engine's decode step failed (%s); "
                    "decoding eagerly (slower per token, same tokens)",
                    self.capture_error,
                )
                return self(w, token, position, cache_k, cache_v, slot, valid)
        buf.graph.replay()
        return buf.logits

    def release(self) -> None:
        """Drop every shape's buffers and graph (their memory returns to the allocator); the
        next :meth:`buffers` call makes them again."""
        self._shapes.clear()
        self._current = None

    def _run(self, w: Any, buf: StepBuffers) -> Tensor:
        return self.step(w, buf.token, buf.position, buf.cache_k, buf.cache_v, buf.slot, buf.valid)

    def _capture_graph(self, w: Any, buf: StepBuffers) -> None:
        """Warm up on a side stream, then record the step into a new graph (not run: the replay
        that follows runs it)."""
        current = torch.cuda.current_stream(buf.token.device)
        side = torch.cuda.Stream(buf.token.device)
        side.wait_stream(current)
        with torch.cuda.stream(side):
            for _ in range(self.warmup):
                self._run(w, buf)
        current.wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        # thread_local: CUDA work of other threads (reward workers, loggers) during the capture
        # is not an error, as it is under the default "global" mode.
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            buf.logits = self._run(w, buf)
        buf.graph = graph
        self.captures += 1


__all__ = ["DecodeGraphs", "StepBuffers"]
