"""RunLoggers: TensorBoard event files and offline W&B runs read back from disk.

W&B only ever runs offline or disabled here: the ``wandb_env`` fixture sets ``WANDB_MODE``
(wandb reads its environment once per process, so the fixture also resets wandb's state)."""

import json
import struct
import sys
import time
from pathlib import Path

import pytest

from groupwise.trainer.loggers import (
    WANDB_RUN_ID_FILE,
    MissingLoggerError,
    RunLoggers,
    markdown_table,
    scalars,
)
from groupwise.trainer.monitor import TrainingWarning

ROWS = [
    {"step": 1, "reward": 0.25, "kl": 0.0, "rewards/accuracy_reward/mean": 0.5, "note": "text"},
    {"step": 2, "reward": 0.5, "kl": float("nan"), "rewards/accuracy_reward/mean": 0.75},
    {"step": 3, "reward": 1.0, "kl": 0.125, "rewards/accuracy_reward/mean": 1.0, "flag": True},
]


def test_scalars_keeps_finite_numbers_only():
    got = scalars({"step": 4, "a": 1, "b": 2.5, "c": float("nan"), "d": float("inf"), "e": "x"})
    assert got == {"a": 1.0, "b": 2.5}
    assert scalars({"ok": True, "none": None, "list": [1.0]}) == {}


def test_no_backend_is_a_no_op(tmp_path):
    with RunLoggers(tmp_path / "run", None, {}) as loggers:
        loggers.log(ROWS[0], 1)
        loggers.log_warning(TrainingWarning(1, "info", "x"))
    assert list((tmp_path / "run").iterdir()) == []


def test_unknown_backend_is_an_error(tmp_path):
    with pytest.raises(ValueError, match=r"unknown logger\(s\) \['mlflow'\].*tensorboard"):
        RunLoggers(tmp_path, ["tensorboard", "mlflow"], {})
    assert not (tmp_path / "tensorboard").exists()  # checked before anything is opened


@pytest.mark.parametrize(
    ("backend", "module"), [("tensorboard", "torch.utils.tensorboard"), ("wandb", "wandb")]
)
def test_missing_package_names_the_extra(tmp_path, monkeypatch, backend, module):
    monkeypatch.setitem(sys.modules, module, None)  # makes `import module` fail
    with pytest.raises(MissingLoggerError, match=rf"pip install 'groupwise\[{backend}\]'"):
        RunLoggers(tmp_path, [backend], {})


def test_a_failing_backend_closes_the_ones_already_open(tmp_path, monkeypatch):
    from groupwise.trainer import loggers as module

    closed = []
    monkeypatch.setattr(module.TensorBoardLogger, "close", lambda self: closed.append(True))
    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(MissingLoggerError):
        RunLoggers(tmp_path, ["tensorboard", "wandb"], {})
    assert closed == [True]


# --- TensorBoard --------------------------------------------------------------------------------
def _tensorboard(path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(path), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return acc


def _scalar_series(acc, tag):
    return [(e.step, e.value) for e in acc.Scalars(tag)]


def test_tensorboard_scalars_and_warnings(tmp_path):
    with RunLoggers(tmp_path, ["tensorboard"], {"lr": 1e-5}) as loggers:
        for row in ROWS:
            loggers.log(row, row["step"])
        loggers.log_warning(TrainingWarning(3, "kl_blowup", "KL is 5 at step 3"))
        loggers.log_warning({"step": 3, "kind": "info", "message": "loss is ~0"})
        loggers.log_warning(3, "nan_step", "loss was not finite")  # the trainer's call
    acc = _tensorboard(tmp_path / "tensorboard")
    assert set(acc.Tags()["scalars"]) == {"reward", "kl", "rewards/accuracy_reward/mean"}
    assert _scalar_series(acc, "reward") == [(1, 0.25), (2, 0.5), (3, 1.0)]
    assert _scalar_series(acc, "kl") == [(1, 0.0), (3, 0.125)]  # NaN skipped
    assert _scalar_series(acc, "rewards/accuracy_reward/mean") == [(1, 0.5), (2, 0.75), (3, 1.0)]
    (text,) = acc.Tensors("warnings/kl_blowup/text_summary")
    assert text.step == 3
    assert text.tensor_proto.string_val[0].decode() == "KL is 5 at step 3"
    assert {"warnings/info/text_summary", "warnings/nan_step/text_summary"} <= set(
        acc.Tags()["tensors"]
    )


def test_tensorboard_resume_hides_steps_after_the_checkpoint(tmp_path):
    with RunLoggers(tmp_path, ["tensorboard"], {}) as loggers:
        for step in range(1, 5):
            loggers.log({"reward": 1.0}, step)
    # Resumed from checkpoint-2: steps 3-4 of the first run are replaced by the new ones.
    with RunLoggers(tmp_path, ["tensorboard"], {}, resume=True, resume_step=2) as loggers:
        for step in range(3, 6):
            loggers.log({"reward": 2.0}, step)
    acc = _tensorboard(tmp_path / "tensorboard")
    assert _scalar_series(acc, "reward") == [(1, 1.0), (2, 1.0), (3, 2.0), (4, 2.0), (5, 2.0)]


# --- W&B (offline) ------------------------------------------------------------------------------
WANDB_VARIABLES = ("WANDB_MODE", "WANDB_DIR", "WANDB_PROJECT", "WANDB_NAME", "WANDB_RUN_ID",
                   "WANDB_RESUME", "WANDB_ENTITY", "WANDB_API_KEY")  # fmt: skip


@pytest.fixture(autouse=True)
def wandb_env(monkeypatch):
    """Offline W&B without console capture, git, code or system-metrics sampling, and none of
    the caller's W&B variables; wandb's per-process state reset before and after."""
    import wandb

    for name in WANDB_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WANDB_MODE", "offline")
    for name in ("WANDB_SILENT", "WANDB_DISABLE_GIT", "WANDB_DISABLE_CODE",
                 "WANDB_X_DISABLE_STATS", "WANDB_X_DISABLE_MACHINE_INFO"):  # fmt: skip
        monkeypatch.setenv(name, "true")
    monkeypatch.setenv("WANDB_CONSOLE", "off")
    wandb.teardown()
    yield
    if wandb.run is not None:
        wandb.run.finish()
    wandb.teardown()


def wandb_records(path: Path):
    """The protobuf records of a ``run-<id>.wandb`` file: a 7-byte W&B header, then LevelDB-log
    framing (32 KiB blocks; each chunk has a CRC, a length and a FULL/FIRST/MIDDLE/LAST type)."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, pending = 7, b""
    while pos + 7 <= len(data):
        if 32768 - pos % 32768 < 7:  # a block's tail too short for a header is padding
            pos += 32768 - pos % 32768
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        pending += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL or LAST: a whole record
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def _items(items):
    return {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in items}


def read_wandb_run(run_dir: Path) -> dict:
    """Run id, name, config, history rows by step and the last summary value of every key."""
    (path,) = run_dir.glob("run-*.wandb")
    out: dict = {"history": {}, "summary": {}, "config": {}, "exit": False}
    for record in wandb_records(path):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            out["id"], out["name"] = record.run.run_id, record.run.display_name
            out["project"] = record.run.project
            out["config"].update(_items(record.run.config.update))
        elif kind == "config":
            out["config"].update(_items(record.config.update))
        elif kind == "history":
            row = _items(record.history.item)
            out["history"][row["_step"]] = {k: v for k, v in row.items() if not k.startswith("_")}
        elif kind == "summary":
            out["summary"].update(_items(record.summary.update))
        elif kind == "exit":
            out["exit"] = True
    return out


def _offline_runs(output_dir):
    """Every offline run under output_dir, read once W&B's background process has written it:
    ``run.finish()`` returns before the last records reach the file (about 10-20 ms later here),
    so wait for each file's exit record."""
    runs = []
    for run_dir in sorted((output_dir / "wandb").glob("offline-run-*")):
        deadline = time.monotonic() + 30
        while True:
            try:
                run = read_wandb_run(run_dir)
            except Exception:  # the file is missing or ends in a record being written
                run = {"exit": False}
            if run["exit"] or time.monotonic() > deadline:
                break
            time.sleep(0.02)
        assert run["exit"], f"{run_dir}: no exit record after 30 s"
        runs.append(run)
    return runs


def test_wandb_offline_history_config_and_warnings(tmp_path):
    with RunLoggers(tmp_path, ["wandb"], {"learning_rate": 1e-5, "beta": 0.0}, "demo") as loggers:
        run_id = loggers.backends["wandb"].run_id
        for row in ROWS:
            loggers.log(row, row["step"])
        loggers.log_warning(TrainingWarning(3, "zero_std", "nothing is being learned"))
    assert (tmp_path / WANDB_RUN_ID_FILE).read_text().strip() == run_id
    (run_dir,) = (tmp_path / "wandb").glob("offline-run-*")
    assert run_dir.name.endswith(run_id)
    (run,) = _offline_runs(tmp_path)
    assert (run["id"], run["name"]) == (run_id, "demo")
    assert run["config"]["learning_rate"] == 1e-5 and run["config"]["beta"] == 0.0
    assert run["project"] == "huggingface"  # WandbCallback's default project
    step = "train/global_step"  # every row carries it, as the HF Trainer's
    assert run["history"] == {
        1: {"reward": 0.25, "kl": 0, "rewards/accuracy_reward/mean": 0.5, step: 1},
        2: {"reward": 0.5, "rewards/accuracy_reward/mean": 0.75, step: 2},
        3: {
            "reward": 1,
            "kl": 0.125,
            "rewards/accuracy_reward/mean": 1,
            "warnings/zero_std": 1,
            step: 3,
        },
    }
    assert run["summary"]["warning_messages"] == "step 3 [zero_std] nothing is being learned"


def test_wandb_resume_continues_the_same_run(tmp_path):
    with RunLoggers(tmp_path, ["wandb"], {}) as loggers:
        first_id = loggers.backends["wandb"].run_id
        loggers.log({"reward": 0.1}, 1)
    with RunLoggers(tmp_path, ["wandb"], {}, resume=True) as loggers:
        assert loggers.backends["wandb"].run_id == first_id
        loggers.log({"reward": 0.2}, 2)
    # Each init writes its own offline-run-<time>-<id> folder; order them by their steps.
    runs = sorted(_offline_runs(tmp_path), key=lambda r: [*r["history"]])
    assert [r["id"] for r in runs] == [first_id, first_id]
    step = "train/global_step"
    assert [r["history"] for r in runs] == [{1: {"reward": 0.1, step: 1}},
                                           {2: {"reward": 0.2, step: 2}}]  # fmt: skip
    # A fresh (not resumed) run gets a new id.
    with RunLoggers(tmp_path, ["wandb"], {}) as loggers:
        assert loggers.backends["wandb"].run_id != first_id


def test_wandb_follows_its_environment_and_run_name(tmp_path, monkeypatch):
    # WandbCallback's setup: project from WANDB_PROJECT, the run named run_name, files where
    # WANDB_DIR says (wandb reads it), not under output_dir.
    monkeypatch.setenv("WANDB_PROJECT", "my-project")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "elsewhere"))
    (tmp_path / "elsewhere").mkdir()
    with RunLoggers(tmp_path / "out", ["wandb"], {"beta": 0.04}, run_name="my-run") as loggers:
        loggers.log({"reward": 0.5}, 1)
    assert not (tmp_path / "out" / "wandb").exists()
    (run,) = _offline_runs(tmp_path / "elsewhere")
    assert (run["project"], run["name"]) == ("my-project", "my-run")
    assert run["config"]["beta"] == 0.04
    assert (tmp_path / "out" / WANDB_RUN_ID_FILE).read_text().strip() == run["id"]


def test_wandb_without_run_name_lets_wandb_name_the_run(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_NAME", "from-the-environment")
    with RunLoggers(tmp_path, ["wandb"], {}) as loggers:
        loggers.log({"reward": 0.5}, 1)
    (run,) = _offline_runs(tmp_path)
    assert run["name"] == "from-the-environment"  # not the output folder's name


def test_wandb_logs_into_the_run_the_caller_opened(tmp_path):
    import wandb

    outer = wandb.init(project="mine", name="outer", dir=str(tmp_path))
    outer.log({"before": 1.0}, step=10)  # the caller's own counter is ahead of the trainer's
    with RunLoggers(tmp_path / "out", ["wandb"], {"learning_rate": 0.1}, "ignored") as loggers:
        assert loggers.backends["wandb"].run is outer
        loggers.log({"reward": 0.25}, 1)
        loggers.log({"reward": 0.5}, 2)
    assert wandb.run is outer  # closing the trainer's loggers leaves the caller's run open
    outer.log({"after": 1.0})
    outer.finish()
    assert (tmp_path / "out" / WANDB_RUN_ID_FILE).read_text().strip() == outer.id
    assert not (tmp_path / "out" / "wandb").exists()
    (run,) = _offline_runs(tmp_path)
    assert (run["id"], run["name"]) == (outer.id, "outer")  # run_name does not rename it
    assert run["config"]["learning_rate"] == 0.1  # the options go into the caller's run
    rows = [run["history"][s] for s in sorted(run["history"])]
    # Nothing dropped: the trainer's rows go at W&B's next steps, placed by train/global_step.
    assert rows == [
        {"before": 1, "reward": 0.25, "train/global_step": 1},
        {"reward": 0.5, "train/global_step": 2},
        {"after": 1, "train/global_step": 2},  # step_sync carries the x axis forward
    ]


def test_wandb_mode_disabled_is_honoured(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "disabled")
    with RunLoggers(tmp_path, ["wandb"], {"beta": 0.0}, "demo") as loggers:
        assert loggers.backends["wandb"].run.settings.mode == "disabled"
        loggers.log({"reward": 0.5}, 1)
        loggers.log_warning(1, "info", "a note")
        loggers.log_table("completions", ["step", "completion"], [[1, "x"]], 1)
    assert not (tmp_path / "wandb").exists()  # nothing written, nothing sent


def test_wandb_run_id_from_the_environment_wins(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_RUN_ID", "fixedid01")
    with RunLoggers(tmp_path, ["wandb"], {}) as loggers:
        loggers.log({"reward": 0.5}, 1)
    (run,) = _offline_runs(tmp_path)
    assert run["id"] == "fixedid01"
    assert (tmp_path / WANDB_RUN_ID_FILE).read_text().strip() == "fixedid01"


# --- tables (log_completions) -------------------------------------------------------------------
COLUMNS = ["step", "prompt", "completion", "accuracy_reward", "advantage"]
TABLE = [[2, "1+1?", "2", 1.0, 0.5], [2, "1+1?", "a | b\nc", None, -0.5]]


def test_markdown_table_by_hand():
    assert markdown_table(COLUMNS, TABLE) == (
        "| step | prompt | completion | accuracy_reward | advantage |\n"
        "|---|---|---|---|---|\n"
        "| 2 | 1+1? | 2 | 1 | 0.5 |\n"
        "| 2 | 1+1? | a \\| b<br>c | null | -0.5 |"
    )


def test_tables_go_to_wandb_and_tensorboard(tmp_path):
    with RunLoggers(tmp_path, ["tensorboard", "wandb"], {}) as loggers:
        loggers.log({"reward": 0.5}, 2)
        loggers.log_table("completions", COLUMNS, TABLE, 2)
    acc = _tensorboard(tmp_path / "tensorboard")
    (text,) = acc.Tensors("completions/text_summary")
    assert text.step == 2
    assert text.tensor_proto.string_val[0].decode() == markdown_table(COLUMNS, TABLE)
    (run_dir,) = (tmp_path / "wandb").glob("offline-run-*")
    (run,) = _offline_runs(tmp_path)
    row = run["history"][2]  # the same W&B step as the step's metrics
    # a table's history entry is a reference (flattened) to its file under files/media/table
    assert row["reward"] == 0.5 and row["completions/_type"] == "table-file"
    table = json.loads((run_dir / "files" / row["completions/path"]).read_text())
    assert table["columns"] == COLUMNS
    assert table["data"] == TABLE
