"""A corpus of bad inputs and faults, run through ``groupwise.cli.main`` as a new user would:
each must end with a non-zero exit and one clear message naming the file or option, never a
Python traceback, and nothing the user has may be lost."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from groupwise.cli import main

# A run that is as cheap as a run can be (tiny-random, one step, 2 completions of 4 tokens).
TINY = [
    "--model", "tiny-random", "--max_steps", "1", "--num_generations", "2",
    "--per_device_train_batch_size", "2", "--max_completion_length", "4",
    "--num_train_prompts", "4", "--num_eval_prompts", "0", "--disable_tqdm", "true",
]  # fmt: skip


def _write(path: Path, data: str | bytes) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, bytes):
        path.write_bytes(data)
    else:
        path.write_text(data, encoding="utf-8")
    return str(path)


def _train(tmp: Path, *extra: str) -> list[str]:
    return ["train", *TINY, "--output_dir", str(tmp / "run"), *extra]


GOOD_ROWS = '{"prompt": "1+1?", "answer": "2"}\n{"prompt": "2+2?", "answer": "4"}\n'

# (case id, argv from a tmp folder, text the error message must contain)
Case = tuple[str, Callable[[Path], list[str]], str]
CASES: list[Case] = [
    # --- numbers --------------------------------------------------------------------------
    ("temperature-nan", lambda t: _train(t, "--temperature", "nan"), "temperature"),
    ("temperature-inf", lambda t: _train(t, "--temperature", "inf"), "temperature"),
    ("temperature-zero", lambda t: _train(t, "--temperature", "0"), "temperature"),
    ("temperature-negative", lambda t: _train(t, "--temperature", "-1"), "temperature"),
    ("top_p-zero", lambda t: _train(t, "--top_p", "0"), "top_p"),
    ("top_p-nan", lambda t: _train(t, "--top_p", "nan"), "top_p"),
    ("top_p-above-1", lambda t: _train(t, "--top_p", "1.5"), "top_p"),
    ("beta-negative", lambda t: _train(t, "--beta", "-0.1"), "beta"),
    ("beta-nan", lambda t: _train(t, "--beta", "nan"), "beta"),
    ("beta-inf", lambda t: _train(t, "--beta", "inf"), "beta"),
    ("learning_rate-inf", lambda t: _train(t, "--learning_rate", "inf"), "learning_rate"),
    ("learning_rate-nan", lambda t: _train(t, "--learning_rate", "nan"), "learning_rate"),
    ("epsilon-nan", lambda t: _train(t, "--epsilon", "nan"), "epsilon"),
    ("epsilon_high-inf", lambda t: _train(t, "--epsilon_high", "inf"), "epsilon_high"),
    ("max_grad_norm-nan", lambda t: _train(t, "--max_grad_norm", "nan"), "max_grad_norm"),
    ("adam_beta1-above-1", lambda t: _train(t, "--adam_beta1", "1.5"), "adam_beta1"),
    ("reward_weights-nan", lambda t: _train(t, "--reward_weights", "nan,1"), "reward_weights"),
    ("max_steps-text", lambda t: _train(t, "--max_steps", "many"), "max_steps"),
    ("unknown-option", lambda t: _train(t, "--temprature", "1"), "temperature"),
    # --- config file ----------------------------------------------------------------------
    ("config-missing", lambda t: ["train", str(t / "nope.yaml")], "nope.yaml"),
    ("config-bad-yaml", lambda t: ["train", _write(t / "c.yaml", "a: [1\n")], "c.yaml"),
    # --- rewards --------------------------------------------------------------------------
    ("reward-unknown", lambda t: _train(t, "--reward_funcs", "acuracy"), "acuracy"),
    (
        "reward-weights-count",
        lambda t: _train(t, "--reward_weights", "1,2,3"),
        "reward_weights",
    ),
    # --- models ---------------------------------------------------------------------------
    ("model-typo", lambda t: _train(t, "--model", "tiny-randm"), "tiny-random"),
    ("model-missing-path", lambda t: _train(t, "--model", str(t / "nomodel")), "nomodel"),
    (
        "model-bad-config",
        lambda t: _train(t, "--model", str(Path(_write(t / "m" / "config.json", "{")).parent)),
        "config.json",
    ),
    # --- data files -----------------------------------------------------------------------
    ("data-missing", lambda t: _train(t, "--task", str(t / "none.jsonl")), "none.jsonl"),
    ("data-bad-json", lambda t: _train(t, "--task", _write(t / "d.jsonl", "{oops\n")), "d.jsonl:1"),
    (
        "data-no-prompt-column",
        lambda t: _train(t, "--task", _write(t / "d.jsonl", '{"question": "x", "answer": 1}\n')),
        "prompt",
    ),
    ("data-empty", lambda t: _train(t, "--task", _write(t / "d.jsonl", "")), "d.jsonl"),
    (
        "data-not-utf8",
        lambda t: _train(t, "--task", _write(t / "d.jsonl", GOOD_ROWS.encode() + b'{"prompt":'
                                             b' "caf\xe9", "answer": "1"}\n')),
        "d.jsonl:3",
    ),
    (
        "data-csv-no-header",
        lambda t: _train(t, "--task", _write(t / "d.csv", "")),
        "d.csv",
    ),
    (
        "data-empty-answer",
        lambda t: _train(t, "--task", _write(t / "d.jsonl", '{"prompt": "x", "answer": ""}\n')),
        "d.jsonl:1",
    ),
    (
        "data-no-answer-for-accuracy",
        lambda t: _train(t, "--task", _write(t / "d.jsonl", '{"prompt": "1+1?"}\n')),
        "answer",
    ),
    (
        "data-bad-template",
        lambda t: _train(
            t, "--task", _write(t / "d.jsonl", GOOD_ROWS), "--prompt_template", "{question}"
        ),
        "prompt_template",
    ),
    ("eval-task-missing", lambda t: _train(
        t, "--task", _write(t / "d.jsonl", GOOD_ROWS), "--eval_task", str(t / "e.jsonl")
    ), "e.jsonl"),
    ("arithmetic-bad-ops", lambda t: _train(t, "--ops", "/"), "ops"),
    (
        "long-prompts-error",
        lambda t: _train(t, "--long_prompts", "error", "--max_prompt_length", "3"),
        "max_prompt_length",
    ),
    # --- output folders -------------------------------------------------------------------
    ("output_dir-empty", lambda t: ["train", *TINY, "--output_dir", ""], "output_dir"),
    (
        "output_dir-is-a-file",
        lambda t: ["train", *TINY, "--output_dir", _write(t / "afile", "x")],
        "afile",
    ),
    # --- resume / devices -----------------------------------------------------------------
    (
        "resume-missing-path",
        lambda t: _train(t, "--resume_from_checkpoint", str(t / "ck")),
        "ck",
    ),
    ("device-cuda-absent", lambda t: _train(t, "--device", "cuda"), "device"),
    # --- eval -----------------------------------------------------------------------------
    (
        "eval-model-missing",
        lambda t: ["eval", "--model", str(t / "nomodel"), "--num_eval_prompts", "2"],
        "nomodel",
    ),
    (
        "eval-ks-over-n",
        lambda t: ["eval", *TINY, "--eval_num_generations", "2", "--eval_ks", "8",
                   "--output_dir", str(t / "ev")],
        "eval_ks",
    ),
]


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    # A hub that cannot be reached must not be retried (CI machines have no network).
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("GROUPWISE_DEBUG", raising=False)


def _run(argv: list[str], capsys) -> tuple[int, str]:
    try:
        code = main(argv)
    except SystemExit as exit_:  # pragma: no cover - main returns its code
        code = exit_.code if isinstance(exit_.code, int) else 1
    except Exception as err:  # noqa: BLE001 - a raised exception is a traceback for the user
        pytest.fail(f"main raised {type(err).__name__}: {err} (the user sees a traceback)")
    captured = capsys.readouterr()
    return code, captured.err


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_one_clear_error(case: Case, tmp_path: Path, capsys) -> None:
    _, build, expected = case
    code, err = _run(build(tmp_path), capsys)
    assert code != 0
    assert "Traceback" not in err
    assert "groupwise: error:" in err
    assert expected in err, err


def test_corpus_is_large() -> None:
    assert len(CASES) >= 40
