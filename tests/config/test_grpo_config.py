"""Tests for groupwise.config.grpo_config: defaults, typed loading from dicts/YAML/CLI strings,
validation."""

import dataclasses
from typing import Any

import pytest

from groupwise.config.grpo_config import GRPOConfig, coerce, parse_cli_overrides
from groupwise.config.trl import TRL_IGNORED, TRL_TRANSLATED
from groupwise.errors import ConfigError

# ---------------------------------------------------------------------------------------------
# Defaults
# ---------------------------------------------------------------------------------------------


def test_defaults_are_trls():
    # TRL's GRPOConfig defaults (tests/config/test_trl_parity.py compares every field).
    config = GRPOConfig()
    assert config.beta == 0.0
    assert config.loss_type == "dapo"
    assert config.use_bias_correction_kl is True
    assert (config.max_steps, config.num_train_epochs) == (-1, 3.0)
    assert (config.lr_scheduler_type, config.gradient_checkpointing) == ("linear", True)
    assert (config.logging_steps, config.save_steps, config.max_completion_length) == (10, 500, 512)
    assert config.scale_rewards == "group"
    assert config.epsilon == 0.2
    assert config.epsilon_high is None
    assert config.num_generations == 8
    assert config.reward_funcs is None  # the task's own rewards (build.default_reward_names)
    assert config.reward_weights is None


def test_steps_properties():
    # 4 * 3 = 12 completions per step; 12 / 4 = 3 prompts per step.
    config = GRPOConfig(
        num_generations=4, per_device_train_batch_size=4, gradient_accumulation_steps=3
    )
    assert config.completions_per_step == 12
    assert config.prompts_per_step == 3


# ---------------------------------------------------------------------------------------------
# from_dict: type coercion of command-line strings
# ---------------------------------------------------------------------------------------------


def test_from_dict_coerces_cli_strings():
    config = GRPOConfig.from_dict(
        {
            "max_steps": "5",
            "learning_rate": "1e-5",
            "beta": "0",
            "few_shot": "false",
            "eval_on_start": "true",
            "gradient_checkpointing": "yes",
            "model": "my-model",
            "epsilon_high": "0.28",
            "max_prompt_length": "none",
            "reward_funcs": "format,accuracy",
            "reward_weights": "[0.2, 1.0]",
        }
    )
    assert config.max_steps == 5 and type(config.max_steps) is int
    assert config.learning_rate == 1e-5 and type(config.learning_rate) is float
    assert config.beta == 0.0 and type(config.beta) is float
    assert config.few_shot is False
    assert config.eval_on_start is True
    assert config.gradient_checkpointing is True
    assert config.model == "my-model"
    assert config.epsilon_high == 0.28
    assert config.max_prompt_length is None
    assert config.reward_funcs == ["format", "accuracy"]
    assert config.reward_weights == [0.2, 1.0]
    assert all(type(w) is float for w in config.reward_weights)


@pytest.mark.parametrize(
    "raw, expected",
    [
        ("true", True),
        ("True", True),
        ("1", True),
        ("on", True),
        ("false", False),
        ("FALSE", False),
        ("0", False),
        ("no", False),
        ("off", False),
        (True, True),
        (False, False),
    ],
)
def test_bool_coercion(raw, expected):
    assert GRPOConfig.from_dict({"few_shot": raw}).few_shot is expected


def test_list_coercion_variants():
    # Comma-separated strings are stripped item by item.
    assert GRPOConfig.from_dict({"reward_funcs": " format , accuracy "}).reward_funcs == [
        "format",
        "accuracy",
    ]
    # Comma-separated floats.
    assert GRPOConfig.from_dict({"reward_weights": "0.5,2"}).reward_weights == [0.5, 2.0]
    # Real lists (as YAML gives them) with ints become floats.
    assert GRPOConfig.from_dict({"reward_weights": [1, 2]}).reward_weights == [1.0, 2.0]
    # "null" for an Optional.
    assert GRPOConfig.from_dict({"reward_weights": "null"}).reward_weights is None
    assert GRPOConfig.from_dict({"epsilon_high": None}).epsilon_high is None


def test_int_field_accepts_integral_float_and_rejects_others():
    assert GRPOConfig.from_dict({"max_steps": 7.0}).max_steps == 7
    with pytest.raises(ConfigError, match=r"'max_steps' expects an integer, got 7\.5"):
        GRPOConfig.from_dict({"max_steps": 7.5})
    with pytest.raises(ConfigError, match=r"'max_steps' expects an integer, got True"):
        GRPOConfig.from_dict({"max_steps": True})


def test_number_fields_parse_strings_as_their_own_type():
    parsed = GRPOConfig.from_dict({"max_steps": "7", "beta": "0.5", "temperature": 2})
    assert (parsed.max_steps, parsed.beta, parsed.temperature) == (7, 0.5, 2.0)
    assert type(parsed.max_steps) is int and type(parsed.temperature) is float
    with pytest.raises(ConfigError, match=r"'max_steps' expects an integer, got '7\.5'"):
        GRPOConfig.from_dict({"max_steps": "7.5"})
    with pytest.raises(ConfigError, match=r"'beta' expects a number, got 'high'"):
        GRPOConfig.from_dict({"beta": "high"})


def test_float_field_rejects_bool():
    with pytest.raises(ConfigError, match=r"'beta' expects a number, got True"):
        GRPOConfig.from_dict({"beta": True})


def test_str_field_rejects_non_string():
    with pytest.raises(ConfigError, match=r"'model' expects a string, got 3"):
        GRPOConfig.from_dict({"model": 3})


@pytest.mark.parametrize(
    "name, value, expected_type",
    [
        ("max_steps", "abc", "an integer"),
        ("beta", "x", "a number"),
        ("few_shot", "maybe", "true or false"),
        ("max_prompt_length", "abc", "int | None"),
        ("reward_weights", "[0.2, oops]", "list[float] | None"),
    ],
)
def test_ill_typed_value_names_field_and_type(name, value, expected_type):
    with pytest.raises(ConfigError) as info:
        GRPOConfig.from_dict({name: value})
    message = str(info.value)
    assert f"option {name!r}" in message
    assert f"expects {expected_type}" in message
    assert repr(value) in message


def test_unknown_option_suggests_the_three_closest_names_not_all():
    import difflib

    with pytest.raises(ConfigError) as info:
        GRPOConfig.from_dict({"max_step": "5"}, source="my.yaml")
    message = str(info.value)
    assert message.startswith("my.yaml: unknown option 'max_step'")
    assert "did you mean 'max_steps'?" in message
    names = [*GRPOConfig.field_names(), *TRL_TRANSLATED, *TRL_IGNORED]
    close = difflib.get_close_matches("max_step", names, n=3)
    assert len(close) == 3 and all(repr(name) in message for name in close)
    # The rest of the ~190 options are not listed; help lists them with their meanings.
    assert "'num_generations'" not in message and "disable_tqdm" not in message
    assert "groupwise train --help" in message and len(message) < 300


def test_unknown_option_without_close_match_has_no_suggestion():
    with pytest.raises(ConfigError) as info:
        GRPOConfig.from_dict({"zzzzzzzz": 1})
    assert "unknown option 'zzzzzzzz'" in str(info.value)
    assert "did you mean" not in str(info.value)


def test_coerce_unsupported_type():
    with pytest.raises(ConfigError, match="unsupported type"):
        coerce("1", set, "x")


def test_coerce_a_mapping():
    assert coerce("{enable_thinking: false}", dict, "x") == {"enable_thinking": False}
    assert coerce({"a": 1}, dict[str, Any] | None, "x") == {"a": 1}
    with pytest.raises(ConfigError, match="expects a mapping"):
        coerce("[1]", dict, "x")


# ---------------------------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------------------------


def test_bad_choice_lists_valid_values():
    with pytest.raises(ConfigError) as info:
        GRPOConfig(loss_type="ppo")
    assert str(info.value) == (
        "loss_type='ppo' is not one of "
        "['grpo', 'bnpo', 'dapo', 'dr_grpo', 'cispo', 'luspo', 'sapo', 'vespo']"
    )
    with pytest.raises(ConfigError, match=r"scale_rewards='std' is not one of"):
        GRPOConfig(scale_rewards="std")


def test_all_valid_choices_accepted():
    for loss_type in ("grpo", "bnpo", "dapo", "dr_grpo"):
        assert GRPOConfig(loss_type=loss_type).loss_type == loss_type
    for scale in ("group", "batch", "none"):
        assert GRPOConfig(scale_rewards=scale).scale_rewards == scale
    assert GRPOConfig(device="cuda:1").device == "cuda:1"
    with pytest.raises(ConfigError, match="device="):
        GRPOConfig(device="tpu")


def test_completions_per_step_must_be_multiple_of_num_generations():
    # 6 * 1 = 6 completions, not a multiple of 4.
    with pytest.raises(ConfigError) as info:
        GRPOConfig(num_generations=4, per_device_train_batch_size=6)
    message = str(info.value)
    assert "6 * 1 = 6" in message
    assert "multiple of num_generations (4)" in message
    # 6 * 2 = 12 is a multiple of 4.
    config = GRPOConfig(
        num_generations=4, per_device_train_batch_size=6, gradient_accumulation_steps=2
    )
    assert config.prompts_per_step == 3


def test_reward_weights_length_mismatch():
    with pytest.raises(ConfigError) as info:
        GRPOConfig(reward_funcs=["format", "accuracy"], reward_weights=[1.0])
    assert "reward_weights has 1 entries but reward_funcs has 2" in str(info.value)
    assert GRPOConfig(reward_weights=[0.5, 1.0]).reward_weights == [0.5, 1.0]


@pytest.mark.parametrize("top_p", [0.0, -0.1, 1.5])
def test_top_p_out_of_range(top_p):
    with pytest.raises(ConfigError, match=r"top_p must be in \(0, 1\]"):
        GRPOConfig(top_p=top_p)


def test_top_p_upper_bound_inclusive():
    assert GRPOConfig(top_p=1.0).top_p == 1.0


def test_num_generations_below_two():
    with pytest.raises(ConfigError, match="num_generations must be >= 2"):
        GRPOConfig(num_generations=1, per_device_train_batch_size=8)
    with pytest.raises(ConfigError, match="num_generations must be >= 1"):
        GRPOConfig(num_generations=0)


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        ({"beta": -0.1}, "beta must be >= 0"),
        ({"max_steps": 0}, "max_steps must be >= 1"),
        ({"temperature": -1.0}, "temperature must be > 0"),
        ({"max_prompt_length": 0}, "max_prompt_length must be >= 1 or null"),
        ({"epsilon_high": -0.2}, "epsilon_high must be >= 0"),
        ({"reward_funcs": []}, "reward_funcs must name at least one"),
    ],
)
def test_other_validation_errors(kwargs, fragment):
    with pytest.raises(ConfigError, match=fragment):
        GRPOConfig(**kwargs)


def test_from_dict_validates_too():
    with pytest.raises(ConfigError, match="loss_type='x'"):
        GRPOConfig.from_dict({"loss_type": "x"})


# ---------------------------------------------------------------------------------------------
# YAML
# ---------------------------------------------------------------------------------------------


def test_yaml_round_trip(tmp_path):
    original = GRPOConfig(
        max_steps=7,
        beta=0.0,
        learning_rate=3e-6,
        reward_weights=[0.5, 2.0],
        max_prompt_length=None,
        few_shot=False,
        loss_type="dr_grpo",
        epsilon_high=0.28,
    )
    path = tmp_path / "config.yaml"
    original.to_yaml(path)
    loaded = GRPOConfig.from_yaml(path)
    assert loaded == original
    assert loaded.max_steps == 7
    assert loaded.reward_weights == [0.5, 2.0]
    assert loaded.max_prompt_length is None
    assert loaded.loss_type == "dr_grpo"


def test_yaml_overrides_win(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("max_steps: 10\nbeta: 0.1\nlearning_rate: 1e-5\n", encoding="utf-8")
    config = GRPOConfig.from_yaml(path, overrides={"max_steps": "3"})
    assert config.max_steps == 3  # the override
    assert config.beta == 0.1  # from YAML
    assert config.learning_rate == 1e-5  # YAML reads 1e-5 as a string; coerced to float
    assert config.seed == 42  # default


def test_empty_yaml_gives_defaults(tmp_path):
    path = tmp_path / "empty.yaml"
    path.write_text("", encoding="utf-8")
    assert GRPOConfig.from_yaml(path) == GRPOConfig()


def test_yaml_missing_file_names_path(tmp_path):
    path = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError) as info:
        GRPOConfig.from_yaml(path)
    assert str(path) in str(info.value)
    assert "does not exist" in str(info.value)


def test_yaml_non_mapping_names_path(tmp_path):
    path = tmp_path / "list.yaml"
    path.write_text("- 1\n- 2\n", encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        GRPOConfig.from_yaml(path)
    assert str(info.value).startswith(f"{path}: expected a mapping")


def test_yaml_invalid_syntax_names_path(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("max_steps: [1, 2\n", encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        GRPOConfig.from_yaml(path)
    assert str(info.value).startswith(f"{path}: not valid YAML")


def test_yaml_unknown_option_names_path(tmp_path):
    path = tmp_path / "typo.yaml"
    path.write_text("betta: 0.1\n", encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        GRPOConfig.from_yaml(path)
    assert str(info.value).startswith(f"{path}: unknown option 'betta' (did you mean 'beta'?)")


# ---------------------------------------------------------------------------------------------
# parse_cli_overrides
# ---------------------------------------------------------------------------------------------


def test_cli_space_and_equals_forms():
    assert parse_cli_overrides(["--max_steps", "5", "--beta=0"]) == {"max_steps": "5", "beta": "0"}


def test_cli_bare_flag_followed_by_option_is_true():
    assert parse_cli_overrides(["--few_shot", "--max_steps", "5"]) == {
        "few_shot": "true",
        "max_steps": "5",
    }


def test_cli_bare_flag_at_end_is_true():
    assert parse_cli_overrides(["--max_steps", "5", "--eval_on_start"]) == {
        "max_steps": "5",
        "eval_on_start": "true",
    }


def test_cli_dashes_become_underscores():
    argv = ["--max-steps", "5", "--learning-rate=0.001", "--eval-on-start"]
    assert parse_cli_overrides(argv) == {
        "max_steps": "5",
        "learning_rate": "0.001",
        "eval_on_start": "true",
    }


def test_cli_negative_value_after_space_is_a_value():
    assert parse_cli_overrides(["--temperature", "-1"]) == {"temperature": "-1"}


def test_cli_value_keeps_dashes_after_space():
    assert parse_cli_overrides(["--model", "my-model"]) == {"model": "my-model"}


def test_cli_equals_value_keeps_dashes():
    assert parse_cli_overrides(
        ["--model=my-model", "--learning_rate=1e-5", "--output-dir=runs/my-run"]
    ) == {"model": "my-model", "learning_rate": "1e-5", "output_dir": "runs/my-run"}


def test_cli_last_occurrence_wins():
    assert parse_cli_overrides(["--seed", "1", "--seed", "2"]) == {"seed": "2"}


@pytest.mark.parametrize(
    "argv, bad", [(["max_steps", "5"], "max_steps"), (["--"], "--"), (["--seed", "1", "2"], "2")]
)
def test_cli_bad_token(argv, bad):
    with pytest.raises(ConfigError) as info:
        parse_cli_overrides(argv)
    assert str(info.value) == f"expected an option like --name value, got {bad!r}"


def test_cli_overrides_feed_from_dict():
    overrides = parse_cli_overrides(
        ["--max-steps", "5", "--reward_funcs=format", "--reward-weights", "[2.0]", "--few_shot"]
    )
    config = GRPOConfig.from_dict(overrides)
    assert config.max_steps == 5
    assert config.reward_funcs == ["format"]
    assert config.reward_weights == [2.0]
    assert config.few_shot is True


def test_the_options_given_are_recorded(tmp_path):
    # is_set tells an option given at its default value from one left at its default.
    assert not GRPOConfig().is_set("max_steps")
    assert GRPOConfig(max_steps=100).is_set("max_steps")
    assert GRPOConfig("tiny-random").is_set("model")  # positional, too
    assert GRPOConfig(num_train_epochs=2).is_set("max_steps")  # TRL: max_steps=-1 (epochs)
    path = tmp_path / "c.yaml"
    path.write_text("max_steps: 100\n")
    assert GRPOConfig.from_yaml(path).is_set("max_steps")
    path.write_text("beta: 0.0\n")
    from_file = GRPOConfig.from_yaml(path, {"seed": "3"})
    assert (from_file.is_set("beta"), from_file.is_set("seed")) == (True, True)
    assert not from_file.is_set("max_steps")
    cli = GRPOConfig.from_dict(parse_cli_overrides(["--max_steps", "100"]), "command line")
    assert cli.is_set("max_steps")
    assert "explicit_options" not in cli.to_dict()  # never in config.yaml
    # Copies: replace() adds the names it changes; for_dataset() goes through it.
    copied = from_file.replace(seed=4)
    assert copied.is_set("seed") and copied.is_set("beta") and not copied.is_set("max_steps")
    epochs = GRPOConfig(num_train_epochs=1, save_strategy="epoch", per_device_train_batch_size=8)
    resolved = epochs.for_dataset(num_rows=4)
    assert resolved is not epochs and resolved.is_set("save_steps")
    assert not resolved.is_set("beta")
    # dataclasses.replace passes every visible field back: only a changed value counts as given.
    assert not dataclasses.replace(from_file).is_set("max_steps")
    assert dataclasses.replace(from_file, max_steps=7).is_set("max_steps")


def test_eval_strategy_without_eval_steps_reads_back_as_trls_default_no():
    """TrainingArguments' eval_strategy defaults to "no", and GRPO scripts test it before they
    index a test split; groupwise's "steps" with eval_steps 0 evaluates nothing during training
    either, so it reads back as "no", with the same schedule."""
    default = GRPOConfig()
    assert (default.eval_strategy, default.eval_steps) == ("no", 0)
    assert default.for_dataset(64).eval_steps == 0
    every = GRPOConfig(eval_steps=5)
    assert (every.eval_strategy, every.for_dataset(64).eval_steps) == ("steps", 5)
    trl_style = GRPOConfig(eval_strategy="steps", logging_steps=3)  # TRL: eval_steps = logging
    assert (trl_style.eval_strategy, trl_style.eval_steps) == ("steps", 3)
    assert GRPOConfig(eval_strategy="epoch", max_steps=4).eval_strategy == "epoch"
    # The line of TRL's grpo.py and open-r1's grpo.py, on a dataset with no test split:
    splits = {"train": ["row"]}
    eval_dataset = splits["test"] if default.eval_strategy != "no" else None
    assert eval_dataset is None
