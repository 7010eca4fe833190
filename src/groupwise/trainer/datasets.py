"""The trainer's datasets as given: the checks a training or evaluation set must pass, and
streams (no length) read into the rows a run uses."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ..config.grpo_config import GRPOConfig
from ..errors import ConfigError


def is_indexable(dataset: Any) -> bool:
    return hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__")


def check_dataset(dataset: Sequence[dict[str, Any]], name: str) -> None:
    if not is_indexable(dataset):
        raise TypeError(
            f"{name} must be a list of dict rows, a datasets.Dataset or a "
            f"datasets.IterableDataset, got {type(dataset).__name__}"
        )
    if len(dataset) == 0:
        raise ValueError(f"{name} is empty")
    first = dataset[0]
    if not isinstance(first, dict) or "prompt" not in first:
        raise ValueError(f"{name}: rows must be dicts with a 'prompt' column, got {first!r}")


def check_eval_dataset(dataset: Any, name: str) -> None:
    """An evaluation set, or a dict of them by name (TRL's form); an IterableDataset is read
    when evaluated (its first row is checked now)."""
    if isinstance(dataset, Mapping):
        if not dataset:
            raise ValueError(f"{name} is an empty dict; give at least one dataset")
        for key, part in dataset.items():
            check_eval_dataset(part, f"{name}[{key!r}]")
        return
    if not is_indexable(dataset):
        first = next(iter(dataset), None) if isinstance(dataset, Iterable) else None
        if first is None:
            raise ValueError(f"{name} is empty or not a dataset ({type(dataset).__name__})")
        dataset = [first]
    check_dataset(dataset, name)


def stream_prefix(dataset: Any, args: GRPOConfig, world_size: int) -> Any:
    """A training set without a length (a ``datasets.IterableDataset``, a generator of rows)
    as the rows training will draw: its first generation batches x prompts per batch (every rank's)
    rows, read now, in stream order; training cycles over them when the stream is shorter. As in
    TRL, such a dataset needs ``max_steps``. A sized, indexable dataset is returned as is."""
    if is_indexable(dataset) or not isinstance(dataset, Iterable) or isinstance(dataset, str):
        return dataset
    if args.max_steps < 1:
        raise ConfigError(
            f"train_dataset is a {type(dataset).__name__} (no length), so the number of steps "
            "cannot follow from num_train_epochs: set max_steps (as TRL requires)"
        )
    needed = args.generation_batches * args.prompts_per_step * world_size
    return list(itertools.islice(iter(dataset), needed))


def materialize(dataset: Any) -> Any:
    """An evaluation set without a length (a ``datasets.IterableDataset``) as a list of its
    rows (evaluation reads every row); a sized, indexable one as is."""
    return dataset if is_indexable(dataset) else list(dataset)
