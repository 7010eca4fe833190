"""Rollouts: the engine protocol (:mod:`.base`) and the Hugging Face / torch engine (:mod:`.hf`);
the colocated vLLM engine is :mod:`.vllm`, imported only when asked for (it needs vllm)."""

from .base import Engine, Request, Rollout, RolloutEngine, SamplingParams, plain_sampling
from .hf import HFEngine, eos_token_ids, generate, left_pad, sample_next_token, token_logprobs

__all__ = [
    "Engine",
    "HFEngine",
    "Request",
    "Rollout",
    "RolloutEngine",
    "SamplingParams",
    "eos_token_ids",
    "generate",
    "left_pad",
    "plain_sampling",
    "sample_next_token",
    "token_logprobs",
]
