"""groupwise.curriculum.scope: when the GDRO curricula are uniform GRPO by construction, and the
start-time warnings that say so."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from conftest import gdro_options, tiny_config
from groupwise import GRPOConfig, GRPOTrainer
from groupwise.algo.grpo import sequence_surrogate
from groupwise.curriculum import GlobalRows, PromptBatch, PromptGDROCurriculum
from groupwise.curriculum.scope import (
    CurriculumWarning,
    difficulty_levels,
    gdro_start_warnings,
    pg_loss_is_centred,
    planned_per_prompt,
)


def loss_of(**options):
    return GRPOConfig(model="tiny-random", **options).sections().loss


def test_planned_per_prompt_by_hand():
    # 50 steps x 4 prompts / 192 prompts = 200 / 192; two ranks draw twice as many.
    assert planned_per_prompt(192, 50, 4) == pytest.approx(200 / 192)
    assert planned_per_prompt(192, 50, 4, world_size=2) == pytest.approx(400 / 192)
    assert planned_per_prompt(48, 150, 4) == pytest.approx(12.5)


class Columns:
    """A columnar dataset (Hugging Face style): read by column, never row by row."""

    def __init__(self, columns: dict) -> None:
        self.columns = columns
        self.column_names = list(columns)

    def __getitem__(self, key):
        if isinstance(key, str):
            return self.columns[key]
        raise AssertionError("read by row")

    def __len__(self) -> int:
        return len(next(iter(self.columns.values())))


def test_difficulty_levels_counts_distinct_values_up_to_two():
    rows = [{"prompt": "a", "difficulty": 12}, {"prompt": "b", "difficulty": 12}]
    assert difficulty_levels(rows) == 1
    assert difficulty_levels(rows + [{"prompt": "c", "difficulty": 22}]) == 2
    assert difficulty_levels([{"prompt": "a"}, {"prompt": "b", "difficulty": None}]) == 0
    assert difficulty_levels([{"difficulty": float("nan")}, {"difficulty": 1}]) == 1
    assert difficulty_levels(Columns({"prompt": ["a", "b"], "difficulty": [1, 2]})) == 2
    assert difficulty_levels(Columns({"prompt": ["a", "b"]})) == 0


@pytest.mark.parametrize(
    ("options", "centred"),
    [
        ({}, True),  # grpo: -A_i
        ({"loss_type": "bnpo"}, True),
        ({"loss_type": "dr_grpo"}, True),
        ({"loss_type": "dapo"}, True),
        ({"loss_type": "luspo"}, True),
        ({"importance_sampling_level": "sequence"}, True),  # GSPO: ratio 1 as well
        ({"loss_type": "cispo"}, False),  # -A_i log pi
        ({"loss_type": "vespo"}, False),
        ({"loss_type": "sapo"}, False),  # -2 A / tau, tau 1.0 for A > 0 and 1.05 for A < 0
        ({"loss_type": "sapo", "sapo_temperature_neg": 1.0}, True),
    ],
)
def test_pg_loss_is_centred_matches_the_signal_of_random_groups(options, centred):
    loss = loss_of(**options)
    assert pg_loss_is_centred(loss) is centred
    # Cross-check on other draws: group-centred advantages of 3 groups of 4, random log-probs and
    # lengths, pi_old = pi. The signal's group means are 0 exactly when the probe says so.
    gen = torch.Generator().manual_seed(1)
    logprobs = -4.0 * torch.rand((12, 7), generator=gen, dtype=torch.float64)
    lengths = torch.randint(1, 8, (12,), generator=gen)
    mask = torch.arange(7)[None, :] < lengths[:, None]
    rewards = torch.tensor([1, 0, 0, 0, 1, 1, 0, 1, 0, 0, 1, 0], dtype=torch.float64)
    groups = rewards.view(3, 4)
    adv = ((groups - groups.mean(1, keepdim=True)) / groups.std(1, keepdim=True)).view(-1)
    signal = sequence_surrogate(
        logprobs, None, adv, mask, loss_type=loss.loss_type, epsilon_low=loss.epsilon,
        epsilon_high=loss.effective_epsilon_high,
        importance_sampling_level=loss.importance_sampling_level,
        variant_options=loss.variant_options(),
    )  # fmt: skip
    group_means = signal.view(3, 4).mean(1).abs()
    assert (bool((group_means < 1e-12).all())) is centred


def test_prompt_gdro_weights_stay_equal_on_the_centred_signal_and_move_otherwise():
    # The real curriculum, two bins of prompts (a level prior splits them), fed the on-policy
    # pg_loss signal (-A_i) for a few steps: every bin weight stays equal, so every row weight is
    # 1 (uniform GRPO). Fed -A_i log pi (cispo's on-policy signal), the weights move apart.
    def weights_after(signal_of) -> list[float]:
        gdro = PromptGDROCurriculum(
            gdro_options(curriculum="prompt_gdro", num_generations=4, seed=0, gdro_num_bins=4,
                         gdro_unseen="difficulty", gdro_window=0)
        )  # fmt: skip
        rng = np.random.default_rng(0)
        for step in range(5):
            rows = [{"difficulty": 1}, {"difficulty": 1}, {"difficulty": 2}, {"difficulty": 2}]
            batch = PromptBatch(list(range(4 * step, 4 * step + 4)), slice(0, 4), rows, [[0]] * 4)
            plan = gdro.plan(batch)
            prompt = [j for j in range(4) for _ in range(4)]
            p = [0.9, 0.9, 0.2, 0.2]
            correct = [float(rng.random() < p[j]) for j in prompt]
            c = np.array(correct).reshape(4, 4)
            std = c.std(1, ddof=1, keepdims=True)
            adv = np.where(std > 0, (c - c.mean(1, keepdims=True)) / np.where(std > 0, std, 1), 0)
            loss = signal_of(adv.reshape(-1), rng)
            gdro.observe_global(plan, GlobalRows(prompt, correct, loss.tolist(), correct))
        final = gdro.plan(PromptBatch([100, 101, 102, 103], slice(0, 4), rows, [[0]] * 4))
        assert len(set(final.bins)) == 2  # the level prior did split them
        return list(final.weights)

    assert weights_after(lambda adv, rng: -adv) == [1.0, 1.0, 1.0, 1.0]
    moved = weights_after(lambda adv, rng: -adv * -rng.uniform(0.5, 3.0, adv.shape))
    assert max(moved) - min(moved) > 1e-3


BASE = dict(
    curriculum="prompt_gdro", gdro_signal="pg_loss", gdro_unseen="unseen", pool_size=192,
    levels=3, max_steps=50, prompts_per_step=4, world_size=1,
    optimizer_steps_per_generation=1, num_iterations=1, signal_centred=True,
)  # fmt: skip


def test_pg_loss_at_one_step_per_generation_warns_uniform():
    (message,) = gdro_start_warnings(**BASE)
    assert "exactly uniform GRPO" in message and "gdro_signal: failure_rate" in message
    # It is uniform however many revisits or levels: the signal itself is 0 in every bin.
    assert gdro_start_warnings(**{**BASE, "pool_size": 8, "gdro_unseen": "difficulty"})
    # Off-policy rows (several mini-batches, or a second pass) or a variant whose signal is not
    # centred give the adversary a signal: no such warning (here the pool is small enough).
    for change in ({"optimizer_steps_per_generation": 4}, {"num_iterations": 2},
                   {"signal_centred": False}, {"gdro_signal": "failure_rate"}):  # fmt: skip
        assert gdro_start_warnings(**{**BASE, "pool_size": 16, **change}) == []


def test_few_revisits_warn_with_the_fix_that_fits_the_pool():
    # 50 x 4 / 192: each prompt planned 1.04 times.
    for curriculum in ("prompt_gdro", "rollout_gdro"):
        (message,) = gdro_start_warnings(
            **{**BASE, "curriculum": curriculum, "gdro_signal": "failure_rate"}
        )
        assert f"curriculum={curriculum} can barely act" in message
        assert "planned about 1.04 times" in message
        assert "gdro_unseen: difficulty" in message  # the pool has levels
        assert "max_steps >= 144" in message  # 3 x 192 / 4
    (plain,) = gdro_start_warnings(**{**BASE, "curriculum": "rollout_gdro", "levels": 0})
    assert "gdro_unseen: difficulty" not in plain and "smaller pool" in plain
    (one_level,) = gdro_start_warnings(
        **{**BASE, "curriculum": "rollout_gdro", "levels": 1, "gdro_unseen": "difficulty"}
    )
    assert "fewer than two difficulty levels" in one_level
    (hardest,) = gdro_start_warnings(**{**BASE, "curriculum": "rollout_gdro", "gdro_unseen":
                                        "hardest"})  # fmt: skip
    assert "(bin 0)" in hardest


def test_no_warning_where_the_curriculum_can_act():
    rollout = {**BASE, "curriculum": "rollout_gdro"}
    # The level prior acts from the first step whose levels were seen.
    assert gdro_start_warnings(**{**rollout, "gdro_unseen": "difficulty"}) == []
    # Three appearances a prompt (two revisits): 144 steps x 4 / 192.
    assert gdro_start_warnings(**{**rollout, "max_steps": 144}) == []
    assert gdro_start_warnings(**{**rollout, "max_steps": 143})  # 2.98 appearances
    # Two ranks draw twice the prompts per step.
    assert gdro_start_warnings(**{**rollout, "max_steps": 72, "world_size": 2}) == []
    assert gdro_start_warnings(**{**rollout, "curriculum": "select"}) == []
    assert gdro_start_warnings(**{**rollout, "curriculum": "none"}) == []


ROWS = [{"prompt": f"Add {i} and {i + 1}.", "answer": str(2 * i + 1), "difficulty": i % 3}
        for i in range(12)]  # fmt: skip


def curriculum_warnings(tmp_path, **overrides) -> list[str]:
    args = tiny_config(tmp_path, **overrides)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        GRPOTrainer("tiny-random", "accuracy", ROWS, args=args)
    return [str(w.message) for w in caught if issubclass(w.category, CurriculumWarning)]


def test_the_trainer_warns_at_start(tmp_path):
    # 2 steps of 2 prompts over 12 prompts: each planned a third of a time.
    (message,) = curriculum_warnings(tmp_path, curriculum="rollout_gdro")
    assert "curriculum=rollout_gdro can barely act" in message
    assert "gdro_unseen: difficulty" in message
    (uniform,) = curriculum_warnings(tmp_path, curriculum="prompt_gdro")
    assert "exactly uniform GRPO" in uniform


def test_the_trainer_is_silent_where_the_curriculum_can_act(tmp_path):
    assert curriculum_warnings(tmp_path, curriculum="rollout_gdro", gdro_unseen="difficulty") == []
    # 18 steps x 2 prompts / 12 = 3 appearances a prompt; failure_rate needs no off-policy rows.
    assert curriculum_warnings(
        tmp_path, curriculum="prompt_gdro", gdro_signal="failure_rate",
        gdro_share_normalize=False, max_steps=18,
    ) == []  # fmt: skip
    assert curriculum_warnings(tmp_path) == []  # no curriculum
