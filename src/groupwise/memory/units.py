"""Byte and parameter counts as the planner prints them."""

from __future__ import annotations


def human_bytes(n: float) -> str:
    """Decimal units (GB = 1e9 bytes), as model sizes are quoted (7B x 2 B = 14 GB)."""
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{int(n)} B"


def human_count(n: float) -> str:
    for unit, scale in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.2f}".rstrip("0").rstrip(".") + unit
    return str(int(n))
