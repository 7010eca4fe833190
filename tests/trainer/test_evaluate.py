"""TRL's eval_loss from evaluate(): the GRPO objective without an update, on num_generations
samples per evaluation prompt, from a generator of its own."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from conftest import TargetToken
from conftest import tiny_config as _config
from groupwise import GRPOTrainer
from groupwise.policy.loss import GRPOLoss

ROWS = [{"prompt": f"Say something number {i}"} for i in range(8)]


def test_eval_loss_is_the_kl_term_and_leaves_training_sampling_alone(tmp_path):
    args = _config(tmp_path, beta=0.1, learning_rate=5e-2, max_steps=2,
                   per_device_eval_batch_size=3)  # fmt: skip
    untrained = GRPOTrainer("tiny-random", TargetToken(), ROWS, args=args)
    # The untrained policy is its reference: KL 0, and the grpo term of group-centred
    # advantages averages to 0 over whole groups, so the loss is 0 up to rounding.
    assert untrained.evaluate(ROWS[:5])["eval_loss"] == pytest.approx(0.0, abs=1e-6)
    trainer = GRPOTrainer("tiny-random", TargetToken(), ROWS, args=args)
    trainer.train()
    state = trainer.generator.get_state().clone()
    after = trainer.evaluate(ROWS[:5])["eval_loss"]
    assert torch.equal(state, trainer.generator.get_state())  # training's sampling untouched
    assert after > 1e-6  # the trained policy moved away from its reference
    # The same samples (the evaluation's own seeded generator), beta doubled: the objective is
    # linear in beta and the rest is 0, so the loss doubles. The loss holds its section, fixed
    # when the trainer was made (TRL copies beta at __init__ too), so it is made again.
    doubled = dataclasses.replace(trainer.loss.options, beta=0.2)
    trainer.loss = GRPOLoss(doubled, args.max_completion_length)
    assert trainer.evaluate(ROWS[:5])["eval_loss"] == pytest.approx(2 * after, rel=1e-4)


def test_eval_loss_names_follow_trl_for_a_dict_of_sets(tmp_path):
    trainer = GRPOTrainer("tiny-random", TargetToken(), ROWS, args=_config(tmp_path))
    metrics = trainer.evaluate(eval_dataset={"data1": ROWS[:3], "data2": ROWS[3:6]})
    assert {"eval_data1_loss", "eval_data2_loss"} <= set(metrics)
    assert "eval/data1/reward" in metrics


def test_eval_loss_can_be_switched_off(tmp_path):
    trainer = GRPOTrainer("tiny-random", TargetToken(), ROWS,
                          args=_config(tmp_path, eval_loss=False))  # fmt: skip
    assert "eval_loss" not in trainer.evaluate(ROWS[:3])


def test_evaluations_during_training_log_the_eval_loss(tmp_path):
    args = _config(tmp_path, eval_steps=1, max_steps=2)
    trainer = GRPOTrainer("tiny-random", TargetToken(), ROWS, args=args, eval_dataset=ROWS[:4])
    trainer.train()
    evaluated = [row for row in trainer.log_history if "eval/reward" in row]
    assert len(evaluated) == 2 and all("eval_loss" in row for row in evaluated)


def test_per_device_eval_batch_size_counts_completions_as_in_trl(tmp_path):
    # 8 completions per batch: 8 prompts of one greedy completion each, then the eval_loss's
    # num_generations=4 samples of 2 prompts at a time.
    args = _config(tmp_path, per_device_eval_batch_size=8)
    trainer = GRPOTrainer("tiny-random", TargetToken(), ROWS, args=args)
    calls: list[tuple[int, int]] = []
    generate = trainer.engine.generate

    def counted(ids, n, *rest, **options):
        calls.append((len(ids), n))
        return generate(ids, n, *rest, **options)

    trainer.engine.generate = counted
    assert "eval_loss" in trainer.evaluate(ROWS)
    assert calls == [(8, 1), (2, 4), (2, 4), (2, 4), (2, 4)]
    assert all(prompts * n == 8 for prompts, n in calls)
