"""RunLoggers: TensorBoard event files and offline W&B runs read back from disk."""

import json
import struct
import sys
import time
from pathlib import Path

import pytest

from groupwise.trainer.loggers import WANDB_RUN_ID_FILE, MissingLoggerError, RunLoggers, scalars
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
            out["config"].update(_items(record.run.config.update))
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
    assert run["history"] == {
        1: {"reward": 0.25, "kl": 0, "rewards/accuracy_reward/mean": 0.5},
        2: {"reward": 0.5, "rewards/accuracy_reward/mean": 0.75},
        3: {"reward": 1, "kl": 0.125, "rewards/accuracy_reward/mean": 1, "warnings/zero_std": 1},
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
    assert [r["history"] for r in runs] == [{1: {"reward": 0.1}}, {2: {"reward": 0.2}}]
    # A fresh (not resumed) run gets a new id.
    with RunLoggers(tmp_path, ["wandb"], {}) as loggers:
        assert loggers.backends["wandb"].run_id != first_id
