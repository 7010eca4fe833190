"""The curricula's typed options (read from a GRPOConfig, validated, errors naming the option) and
the GDRO step diagnostics computed by hand."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from groupwise.config.grpo_config import GRPOConfig
from groupwise.curriculum import (
    GDROOptions,
    PromptGDROCurriculum,
    RolloutGDROCurriculum,
    SelectCurriculum,
    SelectOptions,
)
from groupwise.curriculum.diagnostics import step_metrics
from groupwise.errors import ConfigError


def test_gdro_options_read_from_a_config_or_its_dict():
    config = GRPOConfig(curriculum="rollout_gdro", gdro_bin_edges=[0.3, 0.6], gdro_eta=0.4, seed=4)
    options = GDROOptions.from_config(config)
    assert options == GDROOptions.from_config(config.to_dict())
    assert options.gdro_bin_edges == (0.3, 0.6) and options.gdro_eta == 0.4
    assert (options.curriculum, options.num_generations, options.seed) == ("rollout_gdro", 8, 4)
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.gdro_window = 3  # type: ignore[misc]
    # The curriculum takes the typed options as they are, or reads them from the config's dict.
    typed = RolloutGDROCurriculum.from_options(options)
    assert typed.classifier.edges == [0.3, 0.6] and typed.classifier.num_states == 4
    assert typed.prompt_gdro.eta == typed.rollout_gdro.eta == 0.4
    assert typed.rollout_gdro.generator.initial_seed() == 4
    assert typed.state_dict() == RolloutGDROCurriculum.from_options(config.to_dict()).state_dict()


def test_select_options_read_from_a_config():
    config = GRPOConfig(curriculum="select", select_rule="legacy", select_keep=0.3, seed=9)
    options = SelectOptions.from_config(config)
    assert options == SelectOptions.from_config(config.to_dict())
    cur = SelectCurriculum.from_options(options)
    assert (cur.rule, cur.oversample, cur.keep, cur.mean) == ("legacy", 2, 0.3, 8)


def test_options_missing_a_field_name_it():
    options = GRPOConfig(curriculum="prompt_gdro").to_dict()
    del options["gdro_window"]
    with pytest.raises(ConfigError, match="lack gdro_window"):
        PromptGDROCurriculum.from_options(options)


@pytest.mark.parametrize(
    ("option", "value", "why"),
    [
        ("gdro_gamma", 1.5, r"in \[0, 1\]"),
        ("gdro_ema_beta", 0.0, r"in \(0, 1\]"),
        ("gdro_eta", -0.1, ">= 0"),
        ("gdro_weight_cap", 0.0, "> 0"),
        ("gdro_hysteresis", -0.05, ">= 0"),
        ("gdro_unseen", "never", "is not one of"),
        ("select_rule", "best", "is not one of"),
    ],
)
def test_config_refuses_bad_curriculum_options_naming_them(option, value, why):
    # The ranges the adversaries and the classifier accept: refused when the config is made,
    # not when the curriculum is built (where the message named no option).
    with pytest.raises(ConfigError, match=f"{option}.*{why}"):
        GRPOConfig(curriculum="prompt_gdro", **{option: value})


def test_prompt_gdro_needs_rollout_bounds_around_the_mean():
    # Prompt-GDRO's curriculum also runs Rollout-GDRO's bandits (their mu is logged), which need
    # rollout_min <= num_generations <= rollout_max: refused by the config, naming the options.
    with pytest.raises(ConfigError, match="prompt_gdro .*rollout_min <= num_generations"):
        GRPOConfig(curriculum="prompt_gdro", num_generations=16, per_device_train_batch_size=16)
    config = GRPOConfig(
        curriculum="prompt_gdro", num_generations=16, per_device_train_batch_size=16, rollout_max=16
    )
    assert PromptGDROCurriculum.from_options(config.to_dict()).mean_budget == 16
    # Without a curriculum the bounds do not matter.
    GRPOConfig(num_generations=16, per_device_train_batch_size=16)


def test_step_metrics_by_hand():
    # Bins 0 and 1, the unseen state 2 (empty). Prompts: bin 0 with 2 and 4 rollouts, bin 1
    # with 2; rewards per row [1, 0], [1, 1, 0, 0], [1, 1].
    metrics = step_metrics(
        bins=[0, 0, 1],
        counts=[2, 4, 2],
        row_bins=np.array([0, 0, 0, 0, 0, 0, 1, 1]),
        reward=np.array([1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 1.0]),
        bin_weights=np.array([0.5, 0.3, 0.2]),
        held_out=[0.25, 0.16, 0.0],
        mean_budget=4,
        num_bins=2,
        state_names=["0", "1", "unseen"],
        mu=0.7,
    )
    expected = {
        "curriculum/prompts_bin_0": 2.0,
        "curriculum/rollouts_bin_0": 6.0,
        "curriculum/weight_bin_0": 0.5,
        "curriculum/prompts_bin_1": 1.0,
        "curriculum/rollouts_bin_1": 2.0,
        "curriculum/weight_bin_1": 0.3,
        "curriculum/prompts_bin_unseen": 0.0,
        "curriculum/rollouts_bin_unseen": 0.0,
        "curriculum/weight_bin_unseen": 0.2,
        # shares (2/3, 1/3), sigma (0.5, 0), mean rollouts per prompt (3, 2): eq. 33
        "curriculum/wse": 2 / 3 * 0.5 / math.sqrt(3),
        "curriculum/wse_uniform": 2 / 3 * 0.5 / 2,
        # every prompt its own stratum of share 1/3: eq. 28 and eq. 33 with sigma = sqrt(v)
        "curriculum/var_proxy": (0.25 / 2 + 0.16 / 4) / 3,
        "curriculum/var_proxy_uniform": (0.25 + 0.16) / 4 / 3,
        "curriculum/wse_heldout": (0.5 / math.sqrt(2) + 0.4 / 2) / 3,
        "curriculum/wse_heldout_uniform": (0.5 + 0.4) / 2 / 3,
        # eq. 32 over bins 0-1: mu_data = 1/3, mu_weight = 0.3 / 0.8
        "curriculum/mu_data": 1 / 3,
        "curriculum/mu_weight": 0.375,
        "curriculum/lead_lag": 0.375 - 1 / 3,
        "curriculum/mu": 0.7,
    }
    assert metrics.keys() == expected.keys()
    for key, value in expected.items():
        assert metrics[key] == pytest.approx(value, abs=1e-12), key
