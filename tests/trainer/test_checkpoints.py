"""Checkpoints: atomic writes, rotation, verification, and exact resume after SIGTERM / SIGKILL."""

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from conftest import tiny_config
from groupwise import GRPOConfig, GRPOTrainer
from groupwise.errors import ConfigError
from groupwise.trainer import checkpoints as ckpt
from groupwise.trainer.records import clear_earlier_run

# Keys whose values depend on the wall clock; everything else must match bitwise.
TIMING_KEYS = ("time/", "tokens_per_second", "generation_tokens_per_second", "perf/throughput")


def _without_timing(row: dict) -> dict:
    return {k: v for k, v in row.items() if not k.startswith(TIMING_KEYS)}


# --- the folder mechanics -------------------------------------------------------------------
def _write_files(names):
    def write(folder: Path) -> None:
        for name in names:
            (folder / name).write_text(name * 10)

    return write


def test_write_checkpoint_has_manifest_and_replaces_atomically(tmp_path):
    path = ckpt.write_checkpoint(tmp_path, 3, _write_files(["a.txt", ckpt.STATE_FILE]))
    assert path == tmp_path / "checkpoint-3"
    manifest = ckpt.verify_checkpoint(path)
    hashes = {name: ckpt.file_sha256(path / name) for name in ("a.txt", ckpt.STATE_FILE)}
    assert manifest == {
        "step": 3,
        "files": {"a.txt": 50, ckpt.STATE_FILE: 10 * 17},
        "sha256": hashes,
    }

    def crash(folder: Path) -> None:
        (folder / "a.txt").write_text("half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        ckpt.write_checkpoint(tmp_path, 3, crash)
    # The earlier checkpoint of that step is intact and no temporary folder is left behind.
    assert (path / "a.txt").read_text() == "a.txt" * 10
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint-3"]


def test_stale_temporary_folder_is_not_a_checkpoint(tmp_path):
    ckpt.write_checkpoint(tmp_path, 1, _write_files([ckpt.STATE_FILE]))
    (tmp_path / ".tmp-checkpoint-2-abc").mkdir()  # a save killed half way
    assert ckpt.latest_checkpoint(tmp_path) == tmp_path / "checkpoint-1"
    ckpt.write_checkpoint(tmp_path, 3, _write_files([ckpt.STATE_FILE]))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-1", "checkpoint-3"]


def test_verify_names_the_missing_or_truncated_file(tmp_path):
    path = ckpt.write_checkpoint(tmp_path, 5, _write_files(["model.safetensors", ckpt.STATE_FILE]))
    (path / "model.safetensors").write_text("x")
    with pytest.raises(ckpt.CheckpointError, match="model.safetensors has 1 bytes"):
        ckpt.verify_checkpoint(path)
    (path / "model.safetensors").unlink()
    with pytest.raises(ckpt.CheckpointError, match="model.safetensors is missing"):
        ckpt.verify_checkpoint(path)
    (path / ckpt.MANIFEST_FILE).unlink()
    with pytest.raises(ckpt.CheckpointError, match="checkpoint.json is missing"):
        ckpt.verify_checkpoint(path)
    with pytest.raises(ckpt.CheckpointError, match="does not exist"):
        ckpt.verify_checkpoint(tmp_path / "checkpoint-9")


def test_rotation_keeps_the_newest(tmp_path):
    for step in (2, 10, 4, 8):
        ckpt.write_checkpoint(tmp_path, step, _write_files([ckpt.STATE_FILE]))
    removed = ckpt.rotate_checkpoints(tmp_path, 2)
    assert sorted(p.name for p in removed) == ["checkpoint-2", "checkpoint-4"]
    assert [s for s, _ in ckpt.checkpoint_dirs(tmp_path)] == [8, 10]
    assert ckpt.rotate_checkpoints(tmp_path, None) == []


def test_rng_state_round_trip():
    gen = torch.Generator().manual_seed(7)
    state = ckpt.rng_state({"g": gen})
    first = (random.random(), np.random.rand(), torch.rand(2), torch.rand(2, generator=gen))
    ckpt.set_rng_state(state, {"g": gen})
    second = (random.random(), np.random.rand(), torch.rand(2), torch.rand(2, generator=gen))
    assert first[0] == second[0] and first[1] == second[1]
    assert torch.equal(first[2], second[2]) and torch.equal(first[3], second[3])


def test_trajectory_changes_ignore_safe_fields():
    a = GRPOConfig(max_steps=5).to_dict()
    b = GRPOConfig(max_steps=50, logging_steps=3, learning_rate=2e-6, beta=0.04).to_dict()
    assert ckpt.trajectory_changes(a, b) == ["beta: 0.0 -> 0.04", "learning_rate: 1e-06 -> 2e-06"]
    with pytest.raises(ConfigError, match="learning_rate: 1e-06 -> 2e-06"):
        ckpt.check_resume_config(a, b, Path("ck"))


# --- in-process trainer checkpoints ---------------------------------------------------------
ROWS = [{"prompt": f"Add {i} and {i + 1}.", "answer": str(2 * i + 1)} for i in range(12)]


def _reward(completions, answer, **kwargs):
    return [float(a in c) + 0.1 * len(c) / 20 for c, a in zip(completions, answer, strict=True)]


def _args(tmp_path, **overrides) -> GRPOConfig:
    run = {"max_steps": 4, "beta": 0.04, "max_completion_length": 5, "save_steps": 2}
    return tiny_config(tmp_path, **{**run, **overrides})


def test_checkpoint_holds_everything_and_resume_refuses_changed_config(tmp_path):
    trainer = GRPOTrainer("tiny-random", _reward, ROWS, args=_args(tmp_path, save_total_limit=1))
    trainer.train()
    run = tmp_path / "run"
    assert [s for s, _ in ckpt.checkpoint_dirs(run)] == [4]  # save_total_limit=1
    state = torch.load(run / "checkpoint-4" / ckpt.STATE_FILE, weights_only=True)
    assert state["global_step"] == 4 and len(state["log_history"]) == 4
    assert state["optimizer"]["state"], "optimizer moments are saved"
    assert state["sampler"]["epoch"] == 1 and len(state["sampler"]["order"]) == 12 - 8
    assert len(state["rng"]) == 1  # one entry per rank
    assert set(state["rng"][0]) >= {"python", "numpy", "torch", "generators"}

    changed = _args(tmp_path, learning_rate=5e-3, max_steps=6, resume_from_checkpoint="auto")
    other = GRPOTrainer("tiny-random", _reward, ROWS, args=changed)
    with pytest.raises(ConfigError, match=r"learning_rate: 0.01 -> 0.005"):
        other.train()

    (run / "checkpoint-4" / ckpt.STATE_FILE).unlink()
    again = GRPOTrainer(
        "tiny-random", _reward, ROWS, args=_args(tmp_path, resume_from_checkpoint="auto")
    )
    with pytest.raises(ckpt.CheckpointError, match="training_state.pt is missing"):
        again.train()


def test_memory_options_may_change_on_resume_and_math_options_may_not():
    """A run that ran out of memory resumes with checkpointing or offloading turned on."""
    from groupwise import GRPOConfig

    saved = GRPOConfig(gradient_checkpointing=False, activation_offloading=False).to_dict()
    now = {**saved, "gradient_checkpointing": True, "activation_offloading": True}
    assert ckpt.trajectory_changes(saved, now) == []
    assert ckpt.trajectory_changes(saved, {**now, "beta": 0.5}) == ["beta: 0.0 -> 0.5"]


def test_resume_continues_exactly_in_process(tmp_path):
    full = GRPOTrainer("tiny-random", _reward, ROWS, args=_args(tmp_path / "a", max_steps=4))
    full.train()
    half = GRPOTrainer("tiny-random", _reward, ROWS, args=_args(tmp_path / "b", max_steps=2))
    half.train()
    # max_steps may change on resume; it continues from checkpoint-2 to step 4.
    rest = GRPOTrainer(
        "tiny-random",
        _reward,
        ROWS,
        args=_args(tmp_path / "b", max_steps=4, resume_from_checkpoint="auto"),
    )
    assert rest.global_step == 0
    rest.train()
    assert rest.global_step == 4
    for (name, p), q in zip(full.model.named_parameters(), rest.model.parameters(), strict=True):
        assert torch.equal(p, q), name
    a = [_without_timing(r) for r in full.log_history]
    b = [_without_timing(r) for r in rest.log_history]
    assert a == b
    lines = (tmp_path / "b" / "run" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [1, 2, 3, 4]


def test_completions_table_is_logged(tmp_path):
    args = _args(tmp_path, max_steps=2, log_completions_steps=1, completions_sample_size=1)
    GRPOTrainer("tiny-random", _reward, ROWS, args=args).train()
    records = [
        json.loads(line)
        for line in (tmp_path / "run" / "completions.jsonl").read_text().splitlines()
    ]
    assert [r["step"] for r in records] == [1, 2]
    for record in records:
        assert record["answer"] in {row["answer"] for row in ROWS}
        assert len(record["completions"]) == 4
        rewards = [c["reward"] for c in record["completions"]]
        advantages = [c["advantage"] for c in record["completions"]]
        assert all(set(c["rewards"]) == {"_reward"} for c in record["completions"])
        assert abs(sum(advantages)) < 1e-4  # group-relative: zero mean within the group
        mean = sum(rewards) / 4
        std = (sum((r - mean) ** 2 for r in rewards) / 3) ** 0.5
        for r, a in zip(rewards, advantages, strict=True):
            assert a == pytest.approx((r - mean) / (std + 1e-4), abs=1e-4)


# --- a separate process killed with SIGTERM, then SIGKILL -----------------------------------
def _train_cmd(output_dir: Path, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "groupwise", "train",
        "--model", "tiny-random", "--task", "arithmetic", "--num_train_prompts", "24",
        "--num_eval_prompts", "0", "--max_steps", "7", "--save_steps", "1",
        "--num_generations", "4", "--per_device_train_batch_size", "8",
        "--max_completion_length", "6", "--learning_rate", "1e-2", "--beta", "0.04",
        "--seed", "3", "--disable_tqdm", "true", "--output_dir", str(output_dir),
        "--logging_steps", "1", "--loss_type", "grpo", "--use_bias_correction_kl", "false",
        "--lr_scheduler_type", "constant", "--gradient_checkpointing", "false", *extra,
    ]  # fmt: skip


def _env() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def _run_until(cmd: list[str], output_dir: Path, step: int, sig: int) -> int:
    """Start ``cmd``, wait until checkpoint-<step> exists, send ``sig``; the exit code."""
    proc = subprocess.Popen(cmd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.time() + 300
    while not (output_dir / f"checkpoint-{step}").exists():
        if proc.poll() is not None or time.time() > deadline:
            out = proc.stdout.read().decode()
            proc.kill()
            raise AssertionError(f"never reached checkpoint-{step}:\n{out}")
        time.sleep(0.05)
    proc.send_signal(sig)
    proc.wait(timeout=300)
    return proc.returncode


@pytest.mark.slow
@pytest.mark.parametrize(
    "extra", [(), ("--tools", "calculator", "--max_turns", "2")], ids=["single_turn", "tools"]
)
def test_run_killed_then_resumed_is_bitwise_identical(tmp_path, extra):
    ref_dir, run_dir = tmp_path / "ref", tmp_path / "run"
    # The uninterrupted reference runs beside the interrupted run (each process has one thread;
    # they share nothing but the machine).
    ref_log = tmp_path / "ref.log"
    with ref_log.open("w") as log:
        reference = subprocess.Popen(
            _train_cmd(ref_dir, *extra), env=_env(), stdout=log, stderr=subprocess.STDOUT
        )
    try:
        # SIGTERM: the step finishes, a checkpoint is written, the process exits 128 + 15.
        code = _run_until(_train_cmd(run_dir, *extra), run_dir, 2, signal.SIGTERM)
        assert code == 128 + signal.SIGTERM
        # SIGKILL: no chance to save; the newest complete checkpoint is used.
        _run_until(_train_cmd(run_dir, *extra, "--resume"), run_dir, 4, signal.SIGKILL)
        done = subprocess.run(
            _train_cmd(run_dir, *extra, "--resume"), env=_env(), capture_output=True, text=True
        )
        assert done.returncode == 0, done.stdout + done.stderr
        assert "resumed from" in done.stdout + done.stderr
        assert reference.wait(timeout=600) == 0, ref_log.read_text()
    finally:
        reference.kill()  # only when the test failed before the reference finished
        reference.wait()

    ref = load_file(ref_dir / "model.safetensors")
    got = load_file(run_dir / "model.safetensors")
    assert ref.keys() == got.keys()
    for name in ref:
        assert torch.equal(ref[name], got[name]), name
    rows = [
        [
            _without_timing(json.loads(line))
            for line in (d / "metrics.jsonl").read_text().splitlines()
        ]
        for d in (ref_dir, run_dir)
    ]
    assert [r["step"] for r in rows[1]] == list(range(1, 8))
    assert rows[0] == rows[1]


@pytest.mark.parametrize(
    "curriculum, allocator",
    [("prompt_gdro", "sqrt"), ("rollout_gdro", "sqrt"), ("rollout_gdro", "bandit")],
)
def test_resume_with_curriculum_is_exact(tmp_path, curriculum, allocator):
    extra = dict(
        curriculum=curriculum,
        rollout_allocator=allocator,  # bandit: sampled arms, a generator in the checkpoint
        gdro_signal="failure_rate",
        gdro_share_normalize=False,  # failure_rate with share normalisation is refused
        rollout_min=2,
        rollout_max=6,
    )
    full = GRPOTrainer("tiny-random", _reward, ROWS, args=_args(tmp_path / "a", **extra))
    full.train()
    GRPOTrainer(
        "tiny-random", _reward, ROWS, args=_args(tmp_path / "b", max_steps=2, **extra)
    ).train()
    rest = GRPOTrainer(
        "tiny-random",
        _reward,
        ROWS,
        args=_args(tmp_path / "b", resume_from_checkpoint="auto", **extra),
    )
    rest.train()
    assert rest.curriculum.state_dict() == full.curriculum.state_dict()
    for (name, p), q in zip(full.model.named_parameters(), rest.model.parameters(), strict=True):
        assert torch.equal(p, q), name
    a = [_without_timing(r) for r in full.log_history]
    assert a == [_without_timing(r) for r in rest.log_history]
    assert any(k.startswith("curriculum/") for k in a[-1])


def test_option_added_after_the_checkpoint_counts_as_its_default():
    saved = GRPOConfig().to_dict()
    del saved["data_parallel"]  # a checkpoint written before the option existed
    assert ckpt.trajectory_changes(saved, GRPOConfig().to_dict()) == []
    changed = GRPOConfig(data_parallel="fsdp").to_dict()
    assert ckpt.trajectory_changes(saved, changed) == ["data_parallel: 'ddp' -> 'fsdp'"]


def test_overwrite_clears_the_run_record_with_the_rest(tmp_path):
    # run.json (version, device, dates, wall time) describes the earlier run: it goes with it.
    for name in ("run.json", "rewards.json", "config.yaml", "notes.txt"):
        (tmp_path / name).write_text("{}")
    assert clear_earlier_run(tmp_path) == ["config.yaml", "rewards.json", "run.json"]
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]
