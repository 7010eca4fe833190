"""groupwise.wiring.rewards, the wiring layer: reward functions by name configured from a
GRPOConfig and the run's default reward names. The import rule it exists for (rewards/ imports
neither the config nor the tasks; the config does not import the tasks) is
tests/system/test_layout.py's."""

import pytest

from groupwise.config.grpo_config import GRPOConfig
from groupwise.rewards import correctness_index, format_reward, reward_func_name
from groupwise.tasks import TASKS
from groupwise.wiring.rewards import REWARD_NAMES, build_reward_func, default_reward_names

BUILT_BY_NAME = [n for n in REWARD_NAMES if ":" not in n]  # not reward_model:PATH, remote:URL


# ---------------------------------------------------------------------------------------------
# build_reward_func
# ---------------------------------------------------------------------------------------------


def test_build_reward_func_by_name():
    assert build_reward_func("format") is format_reward
    assert reward_func_name(build_reward_func("accuracy")) == "accuracy_reward"
    assert reward_func_name(build_reward_func("soft_format")) == "soft_format_reward"
    assert reward_func_name(build_reward_func("length_penalty")) == "length_penalty"
    assert reward_func_name(build_reward_func("code_binary")) == "code_reward_binary"
    assert reward_func_name(build_reward_func("countdown")) == "countdown_reward"
    assert reward_func_name(build_reward_func("task")) == "task_reward"


def test_build_reward_func_callable_passthrough():
    def length_reward(prompts, completions, **kwargs):
        return [float(len(c)) for c in completions]

    assert build_reward_func(length_reward) is length_reward
    assert build_reward_func(length_reward, GRPOConfig()) is length_reward


def test_build_reward_func_unknown_name():
    with pytest.raises(ValueError) as info:
        build_reward_func("fromat")
    assert str(info.value).startswith(
        "reward_funcs: unknown reward function 'fromat'; did you mean 'format'? built-in ones are:"
    )
    assert all(name in str(info.value) for name in REWARD_NAMES)
    with pytest.raises(ValueError, match="callable or a name"):
        build_reward_func(3)


def _length_penalty_at(func, tokens: int) -> float:
    (value,) = func(prompts=["p"], completions=["c"], completion_ids=[[1] * tokens])
    return value


def test_options_come_from_the_config():
    penalty = build_reward_func(
        "length_penalty",
        GRPOConfig(max_completion_length=20, overlong_buffer_len=5, overlong_penalty_factor=2.0),
    )
    assert _length_penalty_at(penalty, 15) == 0.0
    assert _length_penalty_at(penalty, 17) == pytest.approx(-0.8)
    accuracy = build_reward_func("accuracy", GRPOConfig(accuracy_timeout=2.5))
    assert "timeout_s=2.5" in accuracy.__doc__
    remote = build_reward_func("remote:http://127.0.0.1:9/score", GRPOConfig(remote_timeout=3.0))
    assert remote.url == "http://127.0.0.1:9/score" and remote.timeout == 3.0


def test_no_config_means_the_config_defaults():
    # Without args the options are GRPOConfig()'s: max_completion_length 512 (TRL's) and
    # overlong_buffer_len None (= 512 // 4 = 128), so the penalty starts after 384 tokens.
    defaults = GRPOConfig()
    assert defaults.max_completion_length == 512
    penalty = build_reward_func("length_penalty")
    assert _length_penalty_at(penalty, 384) == 0.0
    expected = -(400 - 384) / 128 * defaults.overlong_penalty_factor
    assert _length_penalty_at(penalty, 400) == pytest.approx(expected)
    doc = build_reward_func("accuracy").__doc__
    assert f"timeout_s={defaults.accuracy_timeout}" in doc
    assert build_reward_func("remote:http://127.0.0.1:9").timeout == defaults.remote_timeout


# ---------------------------------------------------------------------------------------------
# default_reward_names
# ---------------------------------------------------------------------------------------------


def test_default_reward_names():
    assert default_reward_names(GRPOConfig()) == ["format", "accuracy"]  # arithmetic
    assert default_reward_names(GRPOConfig(task="python")) == ["code"]
    assert default_reward_names(GRPOConfig(task="countdown")) == ["format", "countdown"]
    assert default_reward_names(GRPOConfig(task="data.jsonl")) == ["format", "accuracy"]
    config = GRPOConfig(task="python", reward_funcs=["soft_format"])
    assert default_reward_names(config) == ["soft_format"]


def test_default_reward_names_is_a_new_list_each_call():
    config = GRPOConfig(reward_funcs=["format"])
    default_reward_names(config).append("extra")
    default_reward_names(GRPOConfig()).append("extra")
    assert config.reward_funcs == ["format"]
    assert default_reward_names(GRPOConfig()) == ["format", "accuracy"]


@pytest.mark.parametrize("task", TASKS)
def test_every_task_has_one_correctness_reward(task):
    funcs = [build_reward_func(n) for n in default_reward_names(GRPOConfig(task=task))]
    flagged = [f for f in funcs if getattr(f, "is_correctness", False)]
    assert len(flagged) == 1
    assert correctness_index(funcs) == funcs.index(flagged[0])


# ---------------------------------------------------------------------------------------------
# The correctness flag on every built-in name
# ---------------------------------------------------------------------------------------------

CORRECTNESS_NAMES = {
    "accuracy", "code", "code_binary", "countdown", "reasoning_gym", "task", "guess",
}  # fmt: skip
SHAPING_NAMES = {"format", "soft_format", "length_penalty", "repetition_penalty", "tool_call"}


def test_every_built_in_name_is_classified():
    assert CORRECTNESS_NAMES | SHAPING_NAMES == set(BUILT_BY_NAME)


@pytest.mark.parametrize("name", BUILT_BY_NAME)
def test_correctness_flag_by_name(name):
    func = build_reward_func(name)
    assert (getattr(func, "is_correctness", False) is True) == (name in CORRECTNESS_NAMES)
