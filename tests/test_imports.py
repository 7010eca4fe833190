"""The user's own reward functions, tools and environments named in a config or on the command
line: ``module:function`` and ``path/to/file.py:function`` (groupwise.imports)."""

import json
import sys
from pathlib import Path

import pytest

from groupwise.cli import main
from groupwise.errors import ConfigError
from groupwise.imports import import_callable, is_import_spec
from groupwise.wiring.rewards import build_reward_func
from groupwise.wiring.rollout import resolve_environment

TINY = [
    "--model", "tiny-random", "--max_steps", "1", "--num_generations", "2",
    "--per_device_train_batch_size", "2", "--max_completion_length", "4",
    "--num_train_prompts", "4", "--num_eval_prompts", "0", "--disable_tqdm", "true",
]  # fmt: skip

REWARDS = '''
def short(prompts, completions, **columns):
    return [1.0 if len(str(c)) < 1000 else 0.0 for c in completions]

calls = []

def counted(prompts, completions, **columns):
    calls.append(len(completions))
    return [0.5] * len(completions)

NOT_A_FUNCTION = 3
'''


@pytest.fixture()
def reward_file(tmp_path: Path) -> Path:
    path = tmp_path / "my_rewards.py"
    path.write_text(REWARDS)
    return path


def test_specs_are_recognised():
    assert is_import_spec("mymodule:short") and is_import_spec("a/b/rewards.py:short")
    assert is_import_spec("pkg.sub:fn")
    for spec in ("format", "accuracy", "x:", ":f", "a:b-c", "reward_model"):
        assert not is_import_spec(spec), spec


def test_a_reward_from_a_file_and_from_a_module(reward_file: Path, monkeypatch):
    fn = build_reward_func(f"{reward_file}:short")
    assert fn(["p"], ["a", "b"]) == [1.0, 1.0]
    monkeypatch.syspath_prepend(str(reward_file.parent))
    assert build_reward_func("my_rewards:short")(["p"], ["x"]) == [1.0]
    # The same file named twice is one module (its state is shared, not re-run).
    assert import_callable(f"{reward_file}:counted", "reward_funcs") is import_callable(
        f"{reward_file}:counted", "reward_funcs"
    )


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("no_such_module_qq:f", "reward_funcs: 'no_such_module_qq:f': cannot import module"),
        ("{dir}/missing.py:f", "file '{dir}/missing.py' does not exist"),
        ("{file}:nope", "has no function 'nope'"),
        ("{file}:NOT_A_FUNCTION", "'NOT_A_FUNCTION' in file '{file}' is a int, not a function"),
    ],
)
def test_bad_specs_name_the_option_and_the_spec(reward_file: Path, spec, message):
    spec = spec.format(dir=reward_file.parent, file=reward_file)
    message = message.format(dir=reward_file.parent, file=reward_file)
    with pytest.raises(ConfigError) as raised:
        build_reward_func(spec)
    assert message in str(raised.value)
    assert "reward_funcs" in str(raised.value)


def test_a_file_that_fails_to_run_is_named(tmp_path: Path):
    broken = tmp_path / "broken.py"
    broken.write_text("raise RuntimeError('no config here')\n")
    with pytest.raises(ConfigError, match=r"running '.*broken.py' failed \(RuntimeError: no conf"):
        build_reward_func(f"{broken}:f")
    assert not any(name.startswith("groupwise_user_broken") for name in sys.modules)


def test_an_environment_factory_from_a_file(tmp_path: Path):
    path = tmp_path / "envs.py"
    path.write_text("class Env:\n    pass\n\ndef make():\n    return Env()\n")
    assert type(resolve_environment(f"{path}:make")()).__name__ == "Env"
    with pytest.raises(ConfigError, match="environment: .*has no function 'other'"):
        resolve_environment(f"{path}:other")


def test_train_takes_a_reward_from_a_file_on_the_command_line(reward_file: Path, tmp_path):
    out = tmp_path / "run"
    argv = ["train", *TINY, "--output_dir", str(out), "--reward_funcs", f"{reward_file}:counted"]
    assert main(argv) == 0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    step = next(r for r in rows if "reward" in r)
    assert step["reward"] == pytest.approx(0.5)
    assert "rewards/counted/mean" in step
