"""The optimizer and its schedule: AdamW by TRL's ``optim`` names (bitsandbytes' 8-bit AdamW
against torch's AdamW, paged ones refused off CUDA) and the LR schedule against transformers'
schedules, optimizer step by step."""

import functools

import bitsandbytes as bnb
import pytest
import torch
from transformers import get_scheduler

from groupwise import GRPOConfig
from groupwise.errors import ConfigError
from groupwise.policy.optimizer import (
    OPTIMIZERS,
    Trainable,
    build_optimizer,
    check_optim_device,
    lr_factor,
)
from groupwise.runtime.distributed import DistributedContext
from groupwise.sections.run import OPTIM_CHOICES

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


def _ten_steps(optim: str | type, start: torch.Tensor, grads: list[torch.Tensor]):
    param = torch.nn.Parameter(start.clone())
    hyper = dict(lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
    make = functools.partial(build_optimizer, optim) if isinstance(optim, str) else optim
    opt = make([param], **hyper)
    for grad in grads:
        param.grad = grad.clone()
        opt.step()
    return param.detach(), opt.state[param]


def test_adamw8bit_follows_torch_adamw():
    # 64 x 128 = 8192 elements: above bitsandbytes' min_8bit_size (4096), so the states are
    # 8-bit block-wise. Ten steps of the same gradients from the same start.
    torch.manual_seed(0)
    start = torch.randn(64, 128)
    grads = [torch.randn(64, 128) for _ in range(10)]
    torch_adamw, _ = _ten_steps("adamw_torch", start, grads)
    eight_bit, state = _ten_steps("adamw_8bit", start, grads)
    assert state["state1"].dtype == torch.uint8 and state["state2"].dtype == torch.uint8
    # bitsandbytes' 32-bit AdamW with the same hyper-parameters is torch's, to fp32 rounding:
    # the options mean the same thing; what differs below is the 8-bit states alone.
    full, _ = _ten_steps(bnb.optim.AdamW32bit, start, grads)
    torch.testing.assert_close(full, torch_adamw, rtol=0, atol=1e-6)
    gap, moved = (eight_bit - torch_adamw).abs(), (torch_adamw - start).abs()
    # Measured: the largest gap 0.0024 (2.4% of the 0.1 that ten steps of lr can move a weight),
    # the mean gap 1.2% of the mean distance moved. Tolerances: 5% and 2%.
    assert gap.max() < 0.05 * 10 * 1e-2, gap.max()
    assert gap.mean() < 0.02 * moved.mean(), (gap.mean(), moved.mean())


def test_optim_names_are_the_choices_and_transformers_names():
    from transformers.training_args import OptimizerNames

    assert set(OPTIMIZERS) == set(OPTIM_CHOICES)
    assert set(OPTIMIZERS) <= {name.value for name in OptimizerNames}
    param = torch.nn.Parameter(torch.zeros(4))
    kinds = {
        name: type(build_optimizer(name, [param], 1e-3, (0.9, 0.999), 1e-8, 0.0)).__name__
        for name in OPTIMIZERS
    }
    assert kinds == {
        "adamw_torch": "AdamW", "adamw_torch_fused": "AdamW", "adamw_bnb_8bit": "AdamW8bit",
        "adamw_8bit": "AdamW8bit", "paged_adamw_8bit": "PagedAdamW8bit",
        "paged_adamw_32bit": "PagedAdamW32bit",
    }  # fmt: skip


def test_paged_optimizers_are_refused_off_cuda():
    with pytest.raises(ConfigError, match="optim=paged_adamw_8bit needs a CUDA GPU"):
        check_optim_device("paged_adamw_8bit", torch.device("cpu"))
    check_optim_device("adamw_8bit", torch.device("cpu"))
    check_optim_device("paged_adamw_32bit", torch.device("cuda"))
