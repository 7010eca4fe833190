"""Rollouts: the engine protocol (:mod:`.base`) and the Hugging Face / torch engine (:mod:`.hf`)."""

from .base import Rollout, RolloutEngine, SamplingParams
from .hf import HFEngine, eos_token_ids, generate, left_pad, sample_next_token

__all__ = [
    "HFEngine",
    "Rollout",
    "RolloutEngine",
    "SamplingParams",
    "eos_token_ids",
    "generate",
    "left_pad",
    "sample_next_token",
]
