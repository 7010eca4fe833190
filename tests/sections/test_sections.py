"""The run's options by concern (groupwise.sections): every GRPOConfig field in exactly one
section, each section checking its own fields, the rules across sections in one place."""

from __future__ import annotations

import dataclasses

import pytest

from groupwise.config.grpo_config import GRPOConfig
from groupwise.errors import ConfigError
from groupwise.sections import (
    SECTION_TYPES,
    BatchOptions,
    CurriculumSection,
    LossOptions,
    Sections,
    sections,
)


def test_every_option_is_in_exactly_one_section():
    homes: dict[str, list[str]] = {}
    for kind in SECTION_TYPES:
        for name in kind.field_names():
            homes.setdefault(name, []).append(kind.name)
    options = GRPOConfig.field_names()  # not the parser-only TRL names
    assert [n for n in options if n not in homes] == []
    assert {n: h for n, h in homes.items() if len(h) > 1} == {}
    assert sorted(homes) == sorted(options)  # no section field that is not an option
    assert [f.name for f in dataclasses.fields(Sections)] == [k.name for k in SECTION_TYPES]


def test_sections_carry_the_config_values():
    config = GRPOConfig(loss_type="grpo", beta=0.04, gdro_bin_edges=[0.3, 0.6], num_generations=4,
                        per_device_train_batch_size=8, steps_per_generation=2)  # fmt: skip
    s = config.sections()
    assert s.loss.loss_type == "grpo" and s.loss.beta == 0.04
    assert s.curriculum.gdro_bin_edges == (0.3, 0.6)  # lists become tuples
    assert s.batch.prompts_per_step == config.prompts_per_step == 8 * 2 // 4
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.loss.beta = 0.0  # type: ignore[misc]


def _values(kind, **changes):
    return {**{n: getattr(GRPOConfig(), n) for n in kind.field_names()}, **changes}


def test_a_section_checks_its_own_fields_when_made():
    with pytest.raises(ConfigError, match="delta must be > 1"):
        LossOptions(**_values(LossOptions, delta=0.5))
    with pytest.raises(ConfigError, match="disagree"):  # 8 x 1 rank x 2 = 16, not 24
        BatchOptions(**_values(BatchOptions, steps_per_generation=2, generation_batch_size=24))
    with pytest.raises(ConfigError, match="select_top_up_first must be >= 2"):
        CurriculumSection(**_values(CurriculumSection, select_top_up_first=1))


def test_a_generation_batch_of_part_of_an_optimizer_step_names_the_values_that_fit(monkeypatch):
    # TRL lets an optimizer step span two generation batches; groupwise refuses and says what
    # would be accepted: the generation batch's option, or the accumulation (whole groups).
    def refusal(**changes) -> str:
        with pytest.raises(ConfigError) as info:
            batch = {"per_device_train_batch_size": 8, "num_generations": 4, **changes}
            BatchOptions(**_values(BatchOptions, **batch))
        return str(info.value)

    message = refusal(steps_per_generation=3, gradient_accumulation_steps=2)
    assert message.startswith("steps_per_generation=3 is not a multiple of "
                              "gradient_accumulation_steps=2")  # fmt: skip
    assert message.endswith(
        "use steps_per_generation=2 or steps_per_generation=4, or "
        "gradient_accumulation_steps=1 or gradient_accumulation_steps=3"
    )
    # Below the accumulation there is no smaller multiple; 2 x 8 rows are not whole groups of 16.
    message = refusal(steps_per_generation=3, gradient_accumulation_steps=4, num_generations=16)
    assert message.endswith("use steps_per_generation=4")
    monkeypatch.setenv("WORLD_SIZE", "2")  # 48 completions: 3 micro-batches of 8 x 2 ranks
    message = refusal(generation_batch_size=48, gradient_accumulation_steps=2)
    assert message.startswith("generation_batch_size=48 (3 micro-batches of "
                              "per_device_train_batch_size * ranks = 16)")  # fmt: skip
    assert "use generation_batch_size=32 or generation_batch_size=64, or " in message


def test_the_rules_across_sections_are_checked_with_every_section():
    values = {f.name: getattr(GRPOConfig(), f.name) for f in dataclasses.fields(GRPOConfig)}
    with pytest.raises(ConfigError, match="sync_ref_model=True has nothing to update"):
        sections({**values, "sync_ref_model": True, "beta": 0.0})
    with pytest.raises(ConfigError, match="dynamic_sampling works with algorithm=grpo only"):
        sections({**values, "dynamic_sampling": True, "algorithm": "ppo"})


def test_cispo_upper_clip_comes_from_the_loss_section():
    # cispo's epsilon_high is its weight cap: 5.0 when not given (TRL's docs, ScaleRL)
    assert GRPOConfig(loss_type="cispo").sections().loss.effective_epsilon_high == 5.0
    assert GRPOConfig(epsilon=0.3).sections().loss.effective_epsilon_high == 0.3
    # PPO has no loss variants: its clip is epsilon_high, else epsilon, whatever loss_type says
    assert GRPOConfig(loss_type="cispo").sections().loss.clip_epsilon_high == 0.2
    loss = GRPOConfig(loss_type="cispo", epsilon_high=2.0).sections().loss
    assert loss.clip_epsilon_high == loss.effective_epsilon_high == 2.0
    assert GRPOConfig(epsilon_high=0.28).sections().loss.clip_epsilon_high == 0.28


def test_the_curricula_options_are_made_of_the_curriculum_sections_fields():
    from groupwise.sections import GDROFields, SelectFields
    from groupwise.sections.curriculum import GDROOptions, SelectOptions

    def names(kind):
        return {f.name for f in dataclasses.fields(kind)}

    run_wide = {"curriculum", "num_generations", "seed"}
    assert issubclass(GDROOptions, GDROFields) and issubclass(SelectOptions, SelectFields)
    assert names(GDROOptions) == names(GDROFields) | run_wide
    assert names(SelectOptions) == names(SelectFields) | run_wide
    # the section: both field groups, the curriculum's name and the top-up the step reads
    assert set(CurriculumSection.field_names()) == (
        names(GDROFields) | names(SelectFields) | {"curriculum", "select_top_up",
                                                    "select_top_up_first"}
    )  # fmt: skip


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"max_prompt_length": 0}, "max_prompt_length must be >= 1 or null, got 0"),
        ({"save_total_limit": 0}, "save_total_limit must be >= 1 or null, got 0"),
        ({"reward_timeout": 0.0}, "reward_timeout must be > 0 seconds or null, got 0.0"),
        ({"code_timeout": -1.0}, "code_timeout must be > 0 seconds, got -1.0"),
        ({"top_p": 0.0}, r"top_p must be in \(0, 1\], got 0.0"),
        ({"adam_beta2": 1.0}, r"adam_beta2 must be in \[0, 1\), got 1.0"),
        ({"select_top_up_first": 1}, r"select_top_up_first must be >= 2 \(a group of one"),
    ],
)
def test_range_errors_name_the_option_its_range_and_the_value(changes, message):
    with pytest.raises(ConfigError, match=message):
        GRPOConfig(**changes)


def test_a_section_group_holds_the_sections_named_by_its_fields():
    from groupwise.policy.policy import PolicyOptions
    from groupwise.wiring.rewards import ScorerOptions
    from groupwise.wiring.rollout import EngineOptions

    s = GRPOConfig(max_completion_length=24, seed=5).sections()
    engine = EngineOptions.from_sections(s)
    assert engine.generation is s.generation and engine.runtime.seed == 5
    scorer = ScorerOptions.from_sections(s)
    assert scorer.rewards is s.rewards and scorer.generation.max_completion_length == 24
    assert PolicyOptions.from_sections(s).loss is s.loss


@pytest.mark.parametrize(
    ("loss_type", "level", "warns"),
    [
        ("grpo", "sequence", False),  # GSPO's own setup
        ("luspo", "sequence", False),  # length weighting is LUSPO's purpose
        ("sapo", "sequence", False),
        ("bnpo", "sequence", True),
        ("dr_grpo", "sequence", True),
        ("dapo", "sequence", True),
        ("cispo", "sequence", True),
        ("dapo", "token", False),
    ],
)
def test_sequence_ratio_with_a_token_summed_loss_warns(caplog, loss_type, level, warns):
    import logging

    from groupwise.policy.loss import GRPOLoss

    options = LossOptions(
        **_values(LossOptions, loss_type=loss_type, importance_sampling_level=level)
    )
    with caplog.at_level(logging.WARNING, logger="groupwise.loss"):
        GRPOLoss(options, max_completion_length=8)
    assert ("weights each sequence by its completion length" in caplog.text) == warns
