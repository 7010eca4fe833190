"""The train / eval split of generated tasks, a function of a problem's text alone (so the two
never overlap, whatever the random seed or size), and ``STALL_DRAWS``: how many draws without a new
problem mean a generator has found its whole space."""

from __future__ import annotations

import hashlib


def is_eval_problem(text: str, eval_fraction: float = 0.25) -> bool:
    """Whether a problem (by its canonical text) belongs to the eval split. The split is a
    function of the text alone, so train and eval never overlap, whatever seeds or sizes."""
    digest = hashlib.sha256(text.encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < eval_fraction


def check_split(split: str) -> bool:
    """True for ``eval``, False for ``train``; ValueError otherwise."""
    if split not in ("train", "eval"):
        raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
    return split == "eval"


# A generator that draws this many problems in a row without a new one has (all but surely)
# exhausted its space: the set of distinct problems it has found is its size.
STALL_DRAWS = 50_000
