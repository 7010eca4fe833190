"""The policy's AdamW schedule against transformers' schedules, optimizer step by step."""

import pytest
import torch
from transformers import get_scheduler

from groupwise import GRPOConfig
from groupwise.policy.policy import Trainable, lr_factor
from groupwise.runtime.distributed import DistributedContext

# groupwise's lr_scheduler_type -> transformers' scheduler of the same curve (groupwise's
# constant warms up: transformers' constant_with_warmup, docs/trl.md).
HF_NAME = {"constant": "constant_with_warmup", "linear": "linear", "cosine": "cosine"}


def _trainable(schedule: str, warmup: int, max_steps: int, lr: float = 1e-3) -> Trainable:
    args = GRPOConfig(max_steps=max_steps, warmup_steps=warmup, lr_scheduler_type=schedule,
                      learning_rate=lr, weight_decay=0.0)  # fmt: skip
    sections = args.sections()
    module = torch.nn.Linear(2, 1)
    return Trainable(module, None, sections.optimization, sections.batch,
                     DistributedContext(), lr)  # fmt: skip


def test_warmup_starts_from_zero_by_hand():
    # 3 warm-up steps of 10, linear: lr * step / 3 while step < 3, then (10 - step) / 7.
    args = GRPOConfig(max_steps=10, warmup_steps=3, lr_scheduler_type="linear")
    factor = lr_factor(args.sections().optimization, 10)
    assert [factor(s) for s in range(5)] == pytest.approx([0.0, 1 / 3, 2 / 3, 1.0, 6 / 7])
    assert factor(10) == 0.0
    cosine = lr_factor(GRPOConfig(max_steps=10, warmup_steps=2, lr_scheduler_type="cosine")
                       .sections().optimization, 10)  # fmt: skip
    # progress (6 - 2) / 8 = 0.5: 0.5 * (1 + cos(pi / 2)) = 0.5
    assert [cosine(0), cosine(1), cosine(2), cosine(6)] == pytest.approx([0.0, 0.5, 1.0, 0.5])
    constant = lr_factor(GRPOConfig(max_steps=10, warmup_steps=4).sections().optimization, 10)
    assert [constant(s) for s in (0, 1, 3, 4, 9)] == pytest.approx([0.0, 0.25, 0.75, 1.0, 1.0])


@pytest.mark.parametrize("schedule", ["constant", "linear", "cosine"])
@pytest.mark.parametrize("warmup", [0, 1, 3])
def test_each_step_uses_and_reports_transformers_rate(schedule, warmup):
    steps, lr = 9, 1e-3
    trainable = _trainable(schedule, warmup, steps, lr)
    reference = torch.optim.AdamW(torch.nn.Linear(2, 1).parameters(), lr=lr)
    hf = get_scheduler(HF_NAME[schedule], reference, num_warmup_steps=warmup,
                       num_training_steps=steps)  # fmt: skip
    assert trainable.learning_rate == pytest.approx(hf.get_last_lr()[0])  # before any step
    for step in range(steps):
        expected = hf.get_last_lr()[0]  # the rate transformers' step `step` runs at
        used = trainable.optimizer.param_groups[0]["lr"]
        assert used == pytest.approx(expected, abs=1e-15), (schedule, warmup, step)
        if step == 0 and warmup:
            assert used == 0.0  # lr * 0 / warmup
        trainable.module.weight.grad = torch.ones_like(trainable.module.weight)
        trainable.step()
        # what the trainer logs as learning_rate: the rate this step ran at, not the next's
        assert trainable.learning_rate == pytest.approx(expected, abs=1e-15)
        reference.step()
        hf.step()
