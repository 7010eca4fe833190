"""Bad input gets one clear error naming the culprit (option, file, row, model) and what was
expected: curriculum bin edges, task sizes, chat roles, truncated weights, tokenizers without a
chat template, output folders that cannot be written, and rewards that hang."""

from __future__ import annotations

import copy
import json
import logging
import os
import signal
import time
from pathlib import Path

import pytest

from groupwise.cli import main
from groupwise.config.grpo_config import GRPOConfig
from groupwise.data.prompts import prompt_text
from groupwise.data.rows import load_dataset_rows
from groupwise.data.splits import is_eval_problem
from groupwise.errors import ConfigError, ModelLoadError, OutputDirError, TaskSizeError
from groupwise.rewards.scoring import SLOW_REWARD_WARNING_S, RewardScorer
from groupwise.runtime.models import load_model_and_tokenizer, tiny_random_model
from groupwise.tasks import arithmetic as data_module
from groupwise.tasks import build_task
from groupwise.tasks.arithmetic import arithmetic_dataset, arithmetic_split_size
from groupwise.trainer.records import check_output_dir
from groupwise.wiring.rewards import ScorerOptions, build_scorer

# --- gdro_bin_edges ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("edges", "fragment"),
    [
        ([0.5, 0.2], r"gdro_bin_edges \[0.5, 0.2\] must be strictly increasing \(0.5 is followed"),
        ([0.3, 0.3], r"strictly increasing \(0.3 is followed by 0.3\)"),
        ([0.0, 0.5], r"gdro_bin_edges \[0.0, 0.5\]: \[0.0\] outside \(0, 1\)"),
        ([0.5, 1.2], r"\[1.2\] outside \(0, 1\)"),
    ],
)
def test_bad_bin_edges_name_the_option(edges, fragment):
    with pytest.raises(ConfigError, match=fragment):
        GRPOConfig(curriculum="prompt_gdro", gdro_bin_edges=edges)


def test_good_bin_edges_pass():
    assert GRPOConfig(gdro_bin_edges=[0.25, 0.5, 0.75]).gdro_bin_edges == [0.25, 0.5, 0.75]


# --- num_train_prompts over what a task has ------------------------------------------------------


def test_arithmetic_split_size_by_hand():
    # ops "+", one digit, two operands: the 100 expressions "a + b"; the split is their hash.
    every = [f"{a} + {b}" for a in range(10) for b in range(10)]
    evals = sum(is_eval_problem(e) for e in every)
    assert arithmetic_split_size(1, 2, 2, "+", "eval") == evals
    assert arithmetic_split_size(1, 2, 2, "+", "train") == 100 - evals
    assert arithmetic_split_size(3, 3, 3, "+-*", "train") is None  # too many to count


def test_too_many_train_prompts_names_task_option_and_maximum():
    most = arithmetic_split_size(1, 2, 2, "+-*", "train")
    assert arithmetic_dataset(most, "train")  # exactly the maximum is fine
    start = time.monotonic()
    with pytest.raises(TaskSizeError) as info:
        build_task("arithmetic", 100_000, "train")
    assert time.monotonic() - start < 30  # refused up front, not after drawing for minutes
    message = str(info.value)
    assert f"task 'arithmetic' can generate at most {most} distinct train problems" in message
    assert "num_train_prompts=100000" in message
    assert f"set num_train_prompts to at most {most}" in message
    with pytest.raises(TaskSizeError, match="num_eval_prompts=5000"):
        build_task("arithmetic", 5000, "eval")


def test_too_many_prompts_of_the_mix_names_the_mix():
    with pytest.raises(TaskSizeError) as info:
        build_task("mixed", 5000, "train")
    message = str(info.value)
    assert "task 'mixed'" in message and "num_train_prompts=5000" in message
    assert "arithmetic level 12" in message


def test_exhausted_generator_stops_and_says_about(monkeypatch):
    # Where the space is too large to count, a generator that finds nothing new for
    # STALL_DRAWS draws stops with what it found (here forced on the small "+" space).
    monkeypatch.setattr(data_module, "_COUNTABLE", 0)
    monkeypatch.setattr(data_module, "STALL_DRAWS", 3000)
    arithmetic_split_size.cache_clear()
    try:
        with pytest.raises(TaskSizeError) as info:
            arithmetic_dataset(1000, "train", ops="+")
    finally:
        arithmetic_split_size.cache_clear()
    assert info.value.maximum <= 100 and not info.value.exact
    assert "at most about" in str(info.value)


def test_cli_refuses_too_many_train_prompts(tmp_path, capsys, monkeypatch):
    def no_model(*args, **kwargs):
        raise AssertionError("the model must not load")

    monkeypatch.setattr("groupwise.wiring.model.load_model_and_tokenizer", no_model)
    argv = ["train", "--num_train_prompts", "100000", "--output_dir", str(tmp_path / "run")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "num_train_prompts=100000" in err and "Traceback" not in err


# --- chat roles ----------------------------------------------------------------------------------


def test_unknown_chat_role_names_the_row_and_the_roles(tmp_path):
    path = tmp_path / "d.jsonl"
    good = {"prompt": [{"role": "user", "content": "1+1?"}], "answer": "2"}
    bad = {"prompt": [{"role": "human", "content": "2+2?"}], "answer": "4"}
    path.write_text(json.dumps(good) + "\n" + json.dumps(bad) + "\n")
    with pytest.raises(ValueError) as info:
        load_dataset_rows(str(path))
    message = str(info.value)
    assert f"{path}:2" in message and "'human'" in message
    assert "system, user, assistant, tool" in message
    rows, report = load_dataset_rows(str(path), on_invalid="skip")
    assert len(rows) == 1 and report.skipped["unknown role"] == 1


# --- weights and tokenizer -----------------------------------------------------------------------


def test_truncated_safetensors_names_the_file(tmp_path, tokenizer):
    folder = tmp_path / "model"
    tiny_random_model(seed=0).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    weights = folder / "model.safetensors"
    with open(weights, "r+b") as handle:
        handle.truncate(os.path.getsize(weights) // 2)
    with pytest.raises(ModelLoadError) as info:
        load_model_and_tokenizer(str(folder))
    message = str(info.value)
    assert str(weights) in message and "incomplete or corrupt" in message


def test_tokenizer_without_chat_template_names_model_and_fixes(tokenizer):
    plain = copy.deepcopy(tokenizer)
    plain.chat_template = None
    plain.name_or_path = "my/base-model"
    with pytest.raises(ModelLoadError) as info:
        prompt_text([{"role": "user", "content": "hi"}], plain)
    message = str(info.value)
    assert "'my/base-model'" in message and "no chat template" in message
    assert "tokenizer.chat_template" in message and "plain-text prompts" in message
    assert prompt_text("Q: hi\nA:", plain) == "Q: hi\nA:"  # plain prompts need no template


# --- output_dir ----------------------------------------------------------------------------------


def test_output_dir_under_a_file_is_refused(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    with pytest.raises(OutputDirError, match=r"a-file is a file, not a folder"):
        check_output_dir(blocker / "run", None, False)


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux /proc")
def test_output_dir_where_writes_fail_is_refused():
    # /proc refuses new files even to root, whose permission bits os.access trusts.
    with pytest.raises(OutputDirError, match=r"output_dir='/proc/groupwise-run'"):
        check_output_dir("/proc/groupwise-run", None, False)


def test_cli_checks_output_dir_before_loading_the_model(tmp_path, capsys, monkeypatch):
    def no_model(*args, **kwargs):
        raise AssertionError("the model must not load")

    monkeypatch.setattr("groupwise.wiring.model.load_model_and_tokenizer", no_model)
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    assert main(["train", "--output_dir", str(blocker / "run"), "--max_steps", "1"]) == 2
    err = capsys.readouterr().err
    assert "output_dir=" in err and "not a folder" in err and "Traceback" not in err


# --- rewards that hang ---------------------------------------------------------------------------


def test_slow_reward_is_named_in_a_warning(caplog):
    def slow_reward(prompts, completions, **kwargs):
        time.sleep(0.6)
        return [1.0] * len(completions)

    scorer = RewardScorer([slow_reward], slow_warning_s=0.1)
    with caplog.at_level(logging.WARNING, logger="groupwise.rewards"):
        rewards, _ = scorer(["p"], ["a"])
    assert rewards.tolist() == [1.0]  # warned, not stopped
    assert "'slow_reward' has been running for 0.1 s" in caplog.text
    assert "reward_timeout" in caplog.text


def test_default_slow_warning_and_signal_timeouts_still_work():
    # The default watch keeps the reward in the calling thread: rewards that time themselves
    # out with signal.alarm (math-verify does) would fail in a worker thread.
    def alarmed(prompts, completions, **kwargs):
        old = signal.signal(signal.SIGALRM, lambda *a: None)
        signal.signal(signal.SIGALRM, old)
        return [0.5] * len(completions)

    scorer = build_scorer([alarmed], ScorerOptions.from_sections(GRPOConfig().sections()))
    assert scorer.combine.slow_warning_s == SLOW_REWARD_WARNING_S == 600.0
    rewards, _ = scorer.combine(["p"], ["a"])
    assert rewards.tolist() == [0.5]
