"""TRL's dataset mixture (``trl/scripts/utils.py``, TRL 1.16): :class:`DatasetConfig`,
:class:`DatasetMixtureConfig` and :func:`get_dataset`, with TRL's fields, defaults and meaning,
for scripts that parse ``DatasetMixtureConfig`` next to ``GRPOConfig`` (TRL's grpo.py). A
mixture is given in the ``--config`` YAML file (docs/trl.md "TRL scripts")::

    datasets:
      - path: json
        data_files: train.jsonl
        columns: [prompt, solution]
        fraction: 0.7
      - path: my/other_dataset
        fraction: 0.3
    test_split_size: 0.1
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from ..errors import ConfigError


@dataclass
class DatasetConfig:
    """One dataset of a mixture: ``datasets.load_dataset``'s arguments, the columns kept (None:
    all) and its share of the mixture (``fraction``, set for every dataset or none)."""

    path: str
    name: str | None = None
    data_dir: str | None = None
    data_files: str | list[str] | dict[str, str] | None = None
    split: str = "train"
    columns: list[str] | None = None
    fraction: float | None = None


@dataclass
class DatasetMixtureConfig:
    """TRL's ``DatasetMixtureConfig``: the datasets to mix, streamed or not, and the share held
    out as the ``test`` split (``Dataset.train_test_split``'s ``test_size``; None: no split)."""

    datasets: list[DatasetConfig] = field(default_factory=list)
    streaming: bool = False
    test_split_size: float | None = None

    def __post_init__(self) -> None:
        known = {f.name for f in fields(DatasetConfig)}
        for i, dataset in enumerate(self.datasets):
            if isinstance(dataset, dict):  # from the YAML file
                unknown = sorted(set(dataset) - known)
                if unknown or "path" not in dataset:
                    raise ConfigError(
                        f"datasets[{i}]: expected a mapping with 'path' and any of "
                        f"{sorted(known - {'path'})}, got keys {sorted(dataset)}"
                    )
                self.datasets[i] = DatasetConfig(**dataset)


def mixture_sizes(lengths: list[int], fractions: list[float]) -> list[int]:
    """Rows kept of each dataset (TRL's rule): the fractions normalised to weights ``w_i``, the
    largest mixture size ``N = min_i len_i / w_i`` (over ``w_i > 0``) that samples no dataset
    beyond its length, and ``round(w_i * N)`` rows of each."""
    if any(f < 0 for f in fractions) or sum(fractions) <= 0:
        raise ConfigError(f"datasets' fraction must be >= 0 with a positive sum, got {fractions}")
    weights = [f / sum(fractions) for f in fractions]
    total = min(n / w for n, w in zip(lengths, weights, strict=True) if w > 0)
    return [round(w * total) for w in weights]


def get_dataset(mixture_config: DatasetMixtureConfig) -> Any:
    """TRL's ``get_dataset``: each dataset loaded (``datasets.load_dataset``) and cut to its
    columns, the first :func:`mixture_sizes` rows of each kept when fractions are set, all
    concatenated; a ``DatasetDict`` with ``train`` (and ``test`` with ``test_split_size``)."""
    import datasets

    loaded = []
    for config in mixture_config.datasets:
        dataset = datasets.load_dataset(
            path=config.path, name=config.name, data_dir=config.data_dir,
            data_files=config.data_files, split=config.split,
            streaming=mixture_config.streaming,
        )  # fmt: skip
        if config.columns is not None:
            dataset = dataset.select_columns(config.columns)
        loaded.append(dataset)
    if not loaded:
        raise ValueError("No datasets were loaded from the mixture configuration")
    fractions = [config.fraction for config in mixture_config.datasets]
    if any(f is not None for f in fractions):
        if any(f is None for f in fractions):
            raise ValueError(
                "`fraction` must be set for either all datasets in the mixture or none of them."
            )
        if mixture_config.streaming:
            raise ValueError("Using a dataset `fraction` is not supported with streaming datasets.")
        sizes = mixture_sizes([len(d) for d in loaded], fractions)  # type: ignore[arg-type]
        loaded = [d.select(range(n)) for d, n in zip(loaded, sizes, strict=True)]
    combined = datasets.concatenate_datasets(loaded)
    if mixture_config.test_split_size is not None:
        return combined.train_test_split(test_size=mixture_config.test_split_size)
    return datasets.DatasetDict({"train": combined})
