"""TRL's dataset mixture (groupwise.config.trl_datasets): the sizes TRL's rule gives, worked by
hand, and get_dataset on local parquet folders."""

from __future__ import annotations

import pandas as pd
import pytest

from groupwise import ConfigError, DatasetMixtureConfig, get_dataset
from groupwise.config.trl_datasets import DatasetConfig, mixture_sizes


def test_mixture_sizes_by_hand():
    # Weights 0.25 / 0.75: N = min(100 / 0.25, 90 / 0.75) = 120 -> 30 and 90 rows.
    assert mixture_sizes([100, 90], [1, 3]) == [30, 90]
    # Equal shares of 4 and 6 rows: N = min(8, 12) = 8 -> 4 and 4.
    assert mixture_sizes([4, 6], [0.5, 0.5]) == [4, 4]
    # A zero share takes no rows and does not cap N.
    assert mixture_sizes([10, 0], [1.0, 0.0]) == [10, 0]
    with pytest.raises(ConfigError, match="fraction"):
        mixture_sizes([1, 2], [0.0, 0.0])


def _folder(path, n, start=0):
    path.mkdir()
    pd.DataFrame({"prompt": [f"p{start + i}" for i in range(n)],
                  "extra": list(range(n))}).to_parquet(path / "train.parquet")  # fmt: skip
    return str(path)


def test_get_dataset_mixes_cuts_columns_and_splits(tmp_path):
    a, b = _folder(tmp_path / "a", 4), _folder(tmp_path / "b", 6, start=100)
    mixture = DatasetMixtureConfig(datasets=[  # dicts, as the YAML file gives them
        {"path": a, "columns": ["prompt"], "fraction": 0.5},
        {"path": b, "columns": ["prompt"], "fraction": 0.5},
    ])  # fmt: skip
    assert isinstance(mixture.datasets[1], DatasetConfig)
    mixed = get_dataset(mixture)
    # The first 4 rows of each (N = min(4 / 0.5, 6 / 0.5) = 8), in order, as one train split.
    assert list(mixed) == ["train"] and mixed["train"].column_names == ["prompt"]
    assert mixed["train"]["prompt"] == ["p0", "p1", "p2", "p3", "p100", "p101", "p102", "p103"]
    # All rows without fractions; a held-out test share.
    both = [DatasetConfig(path=a), DatasetConfig(path=b)]
    whole = get_dataset(DatasetMixtureConfig(datasets=both, test_split_size=0.2))
    assert (len(whole["train"]), len(whole["test"])) == (8, 2)


def test_get_dataset_refusals(tmp_path):
    a = _folder(tmp_path / "a", 2)
    with pytest.raises(ValueError, match="for either all datasets"):
        get_dataset(DatasetMixtureConfig(datasets=[DatasetConfig(a, fraction=0.5),
                                                   DatasetConfig(a)]))  # fmt: skip
    with pytest.raises(ValueError, match="streaming"):
        get_dataset(DatasetMixtureConfig(datasets=[DatasetConfig(a, fraction=1.0)],
                                         streaming=True))  # fmt: skip
    with pytest.raises(ValueError, match="No datasets"):
        get_dataset(DatasetMixtureConfig())
    with pytest.raises(ConfigError, match=r"datasets\[0\]: expected a mapping with 'path'"):
        DatasetMixtureConfig(datasets=[{"paht": a}])
