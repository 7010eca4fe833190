"""max_steps, the step cadences and global_step count optimizer steps, as TRL's do: a
generation batch that trains several (num_iterations > 1, or steps_per_generation above the
accumulation) advances global_step by that many, and the run's last batch stops at max_steps."""

from __future__ import annotations

import pytest
import torch

from conftest import tiny_config
from groupwise import GRPOTrainer
from groupwise.policy import update


def _count_optimizer_steps(trainer, monkeypatch) -> list[int]:
    """Each optimizer step the policy takes, recorded as the global_step before its batch."""
    taken: list[int] = []
    step = trainer.policy.network.step

    def counted() -> None:
        taken.append(trainer.global_step)
        step()

    monkeypatch.setattr(trainer.policy.network, "step", counted)
    return taken


def _generations(monkeypatch) -> list[int]:
    calls: list[int] = []
    learn = update.learn

    def counted(*args, **kwargs):
        calls.append(1)
        return learn(*args, **kwargs)

    monkeypatch.setattr(update, "learn", counted)
    return calls


def _trainer(tmp_path, **overrides) -> GRPOTrainer:
    args = tiny_config(tmp_path, save_steps=0, logging_steps=1, **overrides)
    return GRPOTrainer(model="tiny-random", reward_funcs=lambda completions, **kw: [0.0] * len(
        completions), args=args, train_dataset=[{"prompt": f"q{i}"} for i in range(8)])


@pytest.mark.parametrize(
    "options",
    [
        {"num_iterations": 2},
        # 2 mini-batches of 4 completions per generation batch of 8
        {"per_device_train_batch_size": 4, "steps_per_generation": 2},
    ],
    ids=["num_iterations=2", "steps_per_generation=2"],
)
def test_max_steps_counts_optimizer_steps(tmp_path, monkeypatch, options):
    """max_steps=4 with two optimizer steps per generation batch: 2 generation batches, 4
    optimizer steps, global_step 4 (TRL's count; a step used to be a generation batch, which
    trained 8)."""
    trainer = _trainer(tmp_path, max_steps=4, **options)
    assert trainer.args.optimizer_steps_per_step == 2
    taken, generations = _count_optimizer_steps(trainer, monkeypatch), _generations(monkeypatch)
    result = trainer.train()
    assert len(taken) == 4 and len(generations) == 2
    assert result.global_step == 4 and trainer.state.global_step == 4
    logged = [row["step"] for row in trainer.log_history if "train_runtime" not in row]
    assert logged == [2, 4]  # logging_steps 1: every generation batch


def test_the_last_generation_batch_stops_at_max_steps(tmp_path, monkeypatch):
    """max_steps=3 with num_iterations=2: the second batch trains one pass of two (TRL stops
    inside a generation batch at max_steps)."""
    trainer = _trainer(tmp_path, max_steps=3, num_iterations=2)
    taken, generations = _count_optimizer_steps(trainer, monkeypatch), _generations(monkeypatch)
    trainer.train()
    assert taken == [0, 0, 2] and len(generations) == 2
    assert trainer.global_step == 3


def test_the_schedule_spans_max_steps_optimizer_steps(tmp_path):
    """A linear schedule over max_steps=4 optimizer steps (2 generation batches of 2): the rates
    of the four steps are 1, 3/4, 1/2, 1/4 of the peak, as transformers' linear schedule."""
    trainer = _trainer(tmp_path, max_steps=4, num_iterations=2, lr_scheduler_type="linear",
                       learning_rate=1e-3)  # fmt: skip
    rates = []
    step = trainer.policy.network.step

    def recorded() -> None:
        step()
        rates.append(trainer.policy.network.learning_rate)

    trainer.policy.network.step = recorded
    trainer.train()
    assert rates == pytest.approx([1e-3, 0.75e-3, 0.5e-3, 0.25e-3])


def test_epochs_count_optimizer_steps(tmp_path):
    """num_train_epochs=1 over 8 prompts at 2 prompts per generation batch: 4 batches, each of
    num_iterations=2 optimizer steps, so max_steps = 8 and one epoch is 8 steps."""
    trainer = _trainer(tmp_path, max_steps=-1, num_train_epochs=1, num_iterations=2)
    assert trainer.args.max_steps == 8
    assert trainer.steps_per_epoch == 8


def test_a_run_resumed_from_a_checkpoint_inside_its_count_ends_bitwise_equal(tmp_path):
    """Checkpoints named by optimizer steps (save_steps=2 with two per generation batch:
    checkpoint-2, -4, -6); resuming from checkpoint-2 ends with the uninterrupted run's
    weights, bit for bit."""
    from conftest import first_token_parity

    rows = [{"prompt": f"q{i}"} for i in range(8)]

    def run(folder, resume=None):
        args = tiny_config(folder, max_steps=6, num_iterations=2, save_steps=2, logging_steps=1,
                           resume_from_checkpoint=resume)  # fmt: skip
        trainer = GRPOTrainer("tiny-random", first_token_parity, rows, args=args)
        trainer.train()
        return trainer

    whole = run(tmp_path / "whole")
    names = sorted(p.name for p in (tmp_path / "whole" / "run").glob("checkpoint-*"))
    assert names == ["checkpoint-2", "checkpoint-4", "checkpoint-6"]
    resumed = run(tmp_path / "whole", resume=str(tmp_path / "whole" / "run" / "checkpoint-2"))
    assert resumed.global_step == 6
    for (name, p), q in zip(whole.model.named_parameters(), resumed.model.parameters(),
                            strict=True):  # fmt: skip
        assert torch.equal(p, q), name
