"""Operating a run: NaN steps are skipped and stop the run when repeated, warnings reach
events.jsonl, TensorBoard gets the metrics, the loss-is-zero note appears once."""

import json

import pytest
import torch

import groupwise.policy.loss as grpo_loss_module
from conftest import tiny_config
from groupwise import GRPOConfig, GRPOTrainer
from groupwise.trainer.checkpoints import TrainingStopped

ROWS = [{"prompt": f"Add {i} and {i + 1}.", "answer": str(2 * i + 1)} for i in range(12)]


def _reward(completions, answer, **kwargs):
    return [float(a in c) + len(c) / 40 for c, a in zip(completions, answer, strict=True)]


def _args(tmp_path, **overrides) -> GRPOConfig:
    return tiny_config(tmp_path, **{"max_steps": 4, "max_completion_length": 5, **overrides})


def _nan_on_steps(monkeypatch, trainer, steps):
    real = grpo_loss_module.policy_loss

    def policy_loss(*args, **kwargs):
        loss, metrics = real(*args, **kwargs)
        if trainer.global_step + 1 in steps:  # global_step is bumped after the update
            loss = loss * float("nan")
        return loss, metrics

    monkeypatch.setattr(grpo_loss_module, "policy_loss", policy_loss)


def _events(tmp_path):
    path = tmp_path / "run" / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_nonfinite_step_is_skipped_and_logged(tmp_path, monkeypatch):
    trainer = GRPOTrainer("tiny-random", _reward, ROWS, args=_args(tmp_path, max_steps=1))
    _nan_on_steps(monkeypatch, trainer, {2})
    trainer.train()  # step 1
    after_one = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    adam_steps = [s["step"].item() for s in trainer.optimizer.state.values()]
    trainer.args.max_steps = 2
    trainer.train()  # step 2: NaN loss
    for name, value in trainer.model.state_dict().items():
        assert torch.equal(value, after_one[name]), name  # the update was skipped
    assert [s["step"].item() for s in trainer.optimizer.state.values()] == adam_steps
    assert trainer.log_history[-1]["nonfinite_step"] == 1.0
    trainer.args.max_steps = 3
    trainer.train()  # step 3 is fine again and updates
    assert any(not torch.equal(v, after_one[k]) for k, v in trainer.model.state_dict().items())
    kinds = [(e["step"], e["kind"]) for e in _events(tmp_path)]
    assert (2, "nan_step") in kinds


def test_repeated_nonfinite_steps_stop_with_a_good_checkpoint(tmp_path, monkeypatch):
    trainer = GRPOTrainer(
        "tiny-random", _reward, ROWS, args=_args(tmp_path, max_steps=6, max_bad_steps=2)
    )
    _nan_on_steps(monkeypatch, trainer, {2, 3, 4, 5, 6})
    with pytest.raises(TrainingStopped, match="2 steps in a row"):
        trainer.train()
    assert trainer.global_step == 3
    saved = tmp_path / "run" / "checkpoint-3"
    assert (saved / "model.safetensors").is_file()
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())
    assert [e["step"] for e in _events(tmp_path) if e["kind"] == "nan_step"] == [2, 3]


def test_warnings_reach_events_file(tmp_path):
    # Every group has one reward value (a constant reward): the zero-variance warning fires
    # after warn_zero_std_steps steps, and the loss-is-zero note once.
    def constant(completions, **kwargs):
        return [1.0] * len(completions)

    args = _args(tmp_path, max_steps=3, warn_zero_std_steps=2)
    GRPOTrainer("tiny-random", constant, ROWS, args=args).train()
    events = _events(tmp_path)
    assert [(e["step"], e["kind"]) for e in events if e["kind"] == "zero_std"] == [(2, "zero_std")]
    assert "num_generations" in next(e["message"] for e in events if e["kind"] == "zero_std")


def test_loss_zero_note_once(tmp_path):
    GRPOTrainer("tiny-random", _reward, ROWS, args=_args(tmp_path, max_steps=3)).train()
    notes = [e for e in _events(tmp_path) if e["kind"] == "info"]
    assert len(notes) == 1 and "loss" in notes[0]["message"]


def test_tensorboard_gets_the_metrics(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    args = _args(tmp_path, max_steps=2, report_to=["tensorboard"])
    trainer = GRPOTrainer("tiny-random", _reward, ROWS, args=args)
    trainer.train()
    history = trainer.log_history
    acc = EventAccumulator(str(tmp_path / "run" / "tensorboard"))
    acc.Reload()
    events = acc.Scalars("reward")
    assert [e.step for e in events] == [1, 2]
    assert [e.value for e in events] == pytest.approx([h["reward"] for h in history], rel=1e-6)


def test_completions_printed_as_a_table(tmp_path, capsys):
    args = _args(tmp_path, max_steps=1, log_completions_steps=1, num_completions_to_print=1)
    GRPOTrainer("tiny-random", _reward, ROWS, args=args).train()
    out = capsys.readouterr().out
    assert "advantage" in out and "answer:" in out
