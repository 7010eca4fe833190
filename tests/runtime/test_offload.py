"""Activation offloading (runtime/offload.py, the ``activation_offloading`` option): saved
activations go through the hooks (counted by hand for a small network), weights stay put, the
values and gradients do not change, and the update uses it with and without gradient
checkpointing."""

import pytest
import torch

from conftest import tiny_config
from groupwise import GRPOConfig, GRPOTrainer
from groupwise.errors import ConfigError
from groupwise.policy import update
from groupwise.runtime.offload import OffloadActivations


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(64, 64, bias=False), torch.nn.Tanh(), torch.nn.Linear(64, 64, bias=False)
    )


def _grads(model, x, hooks=None):
    model.zero_grad()
    with hooks if hooks is not None else torch.enable_grad():
        loss = model(x).square().sum()
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters()]


def test_saved_activations_go_to_the_host_and_back_by_hand():
    model, x = _mlp(), torch.randn(8, 64)
    expected_loss, expected = _grads(model, x)
    with OffloadActivations(model, copy_host=True) as hooks:  # entered: the counts
        loss = model(x).square().sum()
    model.zero_grad()
    assert hooks.restored == 0
    loss.backward()  # after the block: the hooks are bound to each saved tensor
    grads = [p.grad.clone() for p in model.parameters()]
    # Saved for the backward: x (for W1's gradient), tanh's output, the second matmul's input
    # (the same values, saved by another op), W2^T (for the input's gradient: a view of a
    # weight, kept) and square's input: 5 saved, 4 activations of 8 x 64 fp32 = 2,048 bytes.
    assert (hooks.saved, hooks.offloaded, hooks.offloaded_bytes) == (5, 4, 4 * 2048)
    assert hooks.restored == 4  # every offloaded tensor came back for the backward
    assert torch.equal(loss, expected_loss)
    for got, want in zip(grads, expected, strict=True):
        assert torch.equal(got, want)


def test_host_tensors_weights_and_tiny_tensors_stay_where_they_are():
    model, x = _mlp(), torch.randn(8, 64)
    on_cpu = OffloadActivations(model)  # CPU: nothing to offload, every tensor passes through
    _grads(model, x, on_cpu)
    assert on_cpu.saved == 5 and on_cpu.offloaded == on_cpu.restored == 0
    small = OffloadActivations(model, copy_host=True, min_bytes=4096)  # 2,048-byte activations
    _grads(model, x, small)
    assert small.saved == 5 and small.offloaded == 0
    assert OffloadActivations(model).pin == torch.cuda.is_available()  # pinning needs CUDA


def _zero_reward(completions, **kwargs):
    return [0.0] * len(completions)


def _trainer(tmp_path, name, **options):
    args = tiny_config(tmp_path / name, beta=0.0, per_device_train_batch_size=4,
                       gradient_accumulation_steps=2, **options)  # fmt: skip
    rows = [{"prompt": f"Add {i} and {i + 1}."} for i in range(8)]
    trainer = GRPOTrainer("tiny-random", _zero_reward, rows, args=args)
    grads = []
    trainer.policy.network.step = lambda: grads.append(
        [p.grad.clone() for p in trainer.policy.model.parameters()]
    )
    return trainer, grads


@pytest.mark.parametrize("checkpointing", [False, True])
def test_update_with_offloading_is_identical_and_uses_the_hooks(
    tmp_path, monkeypatch, checkpointing
):
    plain, plain_grads = _trainer(tmp_path, "plain", gradient_checkpointing=checkpointing)
    offload, offload_grads = _trainer(
        tmp_path, "offload", gradient_checkpointing=checkpointing, activation_offloading=True
    )
    made = []

    class Counted(OffloadActivations):
        def __init__(self, model, **kwargs):
            super().__init__(model, copy_host=True, **kwargs)  # the copy path, on CPU
            made.append(self)

    monkeypatch.setattr("groupwise.policy.update.OffloadActivations", Counted)
    rollout = plain.engine.generate(plain.prompts.next().prompt_ids, 4)
    advantages = torch.randn(8, generator=torch.Generator().manual_seed(0))
    stats = {}
    for name, trainer in (("plain", plain), ("offload", offload)):
        inputs = update.prepare(trainer.policy, rollout, advantages, None)
        stats[name] = update.update(trainer.policy, inputs, trainer.loss)
    assert len(made) == 2  # one per micro-batch of the offloading policy, none for the other
    for hooks in made:
        assert hooks.offloaded > 0 and hooks.restored == hooks.offloaded
    assert stats["offload"].sums == stats["plain"].sums
    for got, want in zip(offload_grads[0], plain_grads[0], strict=True):
        assert torch.equal(got, want)


def test_options_must_be_booleans():
    for name in ("padding_free", "activation_offloading"):
        with pytest.raises(ConfigError, match=f"{name} must be true or false, got 'yes'"):
            GRPOConfig(**{name: "yes"})
    assert GRPOConfig(activation_offloading=True).sections().runtime.activation_offloading

