import copy
import json
import math

import pytest
import torch
from transformers import AutoModelForCausalLM

from conftest import TargetToken
from conftest import tiny_config as _config
from groupwise import GRPOConfig, GRPOTrainer
from groupwise.policy.logprobs import completion_logprobs
from groupwise.rewards.scoring import RewardFunctionError
from groupwise.rollout import Rollout

ROWS = [{"prompt": f"Say something number {i}", "tag": i} for i in range(16)]


def _learning_curve(tmp_path, learning_rate, seed=0, **overrides):
    return [log["reward"] for log in _learning_logs(tmp_path, learning_rate, seed, **overrides)]


def _learning_logs(tmp_path, learning_rate, seed=0, **overrides):
    args = _config(
        tmp_path,
        seed=seed,
        max_steps=12,
        learning_rate=learning_rate,
        num_generations=8,
        per_device_train_batch_size=16,
        max_completion_length=8,
        temperature=0.1,
        **overrides,
    )
    rows = [{"prompt": "Say something"}] * 4  # one context, so the target is always reachable
    trainer = GRPOTrainer("tiny-random", TargetToken(), rows, args=args)
    trainer.train()
    return trainer.log_history


def test_grpo_learns_target_token(tmp_path):
    rewards = _learning_curve(tmp_path, learning_rate=1e-2)
    start, end = rewards[0], sum(rewards[-4:]) / 4
    assert start < 0.2, rewards
    assert end > 0.8, rewards


def test_bf16_generation_with_rollout_correction_learns(tmp_path):
    # Generation under bf16 autocast, update in fp32: the sampler's log-probs differ from the
    # trainer's by bf16 rounding, the step logs that gap and the correction weights, and GRPO
    # still learns.
    logs = _learning_logs(tmp_path, learning_rate=1e-2, generation_dtype="bfloat16")
    rewards = [log["reward"] for log in logs]
    assert rewards[0] < 0.2 and sum(rewards[-4:]) / 4 > 0.8, rewards
    first = logs[0]
    assert 0 < first["sampling/sampling_logp_difference/mean"] < 0.1, first
    assert (
        first["sampling/sampling_logp_difference/max"]
        >= first["sampling/sampling_logp_difference/mean"]
    )
    assert 0.5 < first["sampling/importance_sampling_ratio/mean"] < 2.0, first


def test_rollout_correction_reweights_the_update(tmp_path):
    # Same seed and rollout; only the correction switch differs, so the gradients differ by the
    # weights (bf16 gaps of 1e-2 nats summed over a sequence move them well away from 1).
    grads = []
    for correction in (True, False):
        args = _config(
            tmp_path / str(correction),
            max_steps=1,
            generation_dtype="bfloat16",
            rollout_correction=correction,
            rollout_correction_mode="sequence_truncate",
            max_grad_norm=1e9,
        )
        trainer = GRPOTrainer("tiny-random", TargetToken(), ROWS, args=args)
        trainer.train()
        log = trainer.log_history[-1]
        assert log["sampling/importance_sampling_ratio/mean"] != 1.0
        grads.append(torch.cat([p.grad.flatten() for p in trainer.model.parameters()]))
    assert not torch.allclose(grads[0], grads[1], rtol=1e-3, atol=0)


def test_no_learning_without_updates(tmp_path):
    # Control for the test above: the same run with a zero learning rate does not improve.
    rewards = _learning_curve(tmp_path, learning_rate=0.0)
    assert max(rewards[-4:]) < 0.3, rewards


def test_beta_zero_never_builds_reference_model(tmp_path, monkeypatch):
    def forbidden(*args, **kwargs):
        raise AssertionError("a reference model copy was made with beta == 0")

    monkeypatch.setattr("groupwise.policy.policy.frozen_copy", forbidden)
    trainer = GRPOTrainer("tiny-random", TargetToken(), ROWS, args=_config(tmp_path, beta=0.0))
    assert trainer.ref_model is None
    trainer.train()
    logs = trainer.log_history
    assert logs[-1]["kl"] == 0.0


def test_beta_positive_uses_frozen_reference(tmp_path):
    trainer = GRPOTrainer(
        "tiny-random", TargetToken(), ROWS, args=_config(tmp_path, beta=0.04, max_steps=3)
    )
    assert trainer.ref_model is not None
    before = copy.deepcopy(trainer.ref_model.state_dict())
    trainer.train()
    logs = trainer.log_history
    assert logs[0]["kl"] == pytest.approx(0.0, abs=1e-7)  # policy == reference at step 1
    assert logs[-1]["kl"] > 0.0  # the policy has moved away from the reference
    for name, tensor in trainer.ref_model.state_dict().items():
        assert torch.equal(tensor, before[name]), name
    assert all(not p.requires_grad for p in trainer.ref_model.parameters())


def test_multiple_iterations_use_old_logprobs(tmp_path):
    # two generation batches of three passes: max_steps counts the 6 optimizer steps
    args = _config(tmp_path, num_iterations=3, max_steps=6, epsilon=0.01, learning_rate=5e-2)
    trainer = GRPOTrainer("tiny-random", TargetToken(), ROWS, args=args)
    trainer.train()
    logs = trainer.log_history
    # Passes 2 and 3 see ratios != 1, so with a tight clip some tokens are clipped.
    assert any(log["clip_ratio/region_mean"] > 0 for log in logs)
    assert trainer.scheduler.last_epoch == 2 * 3  # one optimizer step per pass


@pytest.mark.parametrize("loss_type", ["grpo", "dapo", "dr_grpo"])
def test_micro_batches_give_same_update_as_one_batch(tmp_path, loss_type):
    # Micro-batches of 4 rows (shared prompt) or 2 rows (per-row prompts), length-sorted or in
    # rollout order, accumulate the same gradient as one batch of 8 rows: grpo/dr_grpo weigh
    # micro-batches by rows, dapo by tokens. EOS is the most likely token about a third of the
    # time (bias on the LM head), so completions have different lengths and sorting matters.
    grads = []
    for micro, accum, by_length in ((8, 1, True), (4, 2, True), (2, 4, True), (2, 4, False)):
        args = _config(
            tmp_path / f"{micro}-{accum}-{by_length}",
            per_device_train_batch_size=micro,
            gradient_accumulation_steps=accum,
            group_by_length=by_length,
            max_steps=1,
            learning_rate=1e-3,
            max_grad_norm=1e9,
            loss_type=loss_type,
        )
        trainer = GRPOTrainer("tiny-random", TargetToken(), ROWS, args=args)
        _favour_eos(trainer.model, trainer.tokenizer.eos_token_id)
        trainer.train()
        log = trainer.log_history[-1]
        # The test needs completions of different lengths.
        assert log["completions/min_length"] < log["completions/max_length"], log
        grads.append(torch.cat([p.grad.flatten() for p in trainer.model.parameters()]))
    scale = grads[0].abs().max()
    assert scale > 0
    for other in grads[1:]:
        # fp32 summation order differs (micro-batch shapes, trimmed widths): ~1e-6 of the scale.
        assert (other - grads[0]).abs().max() <= 1e-5 * scale


def _favour_eos(model, eos_id: int) -> None:
    with torch.no_grad():
        head = model.get_output_embeddings()
        head.weight[eos_id] = head.weight.mean(dim=0)
        if head.bias is None:
            head.bias = torch.nn.Parameter(torch.zeros(head.weight.shape[0]))
        head.bias[eos_id] = 10.0  # exp(10) ~ half the summed mass of 49k near-zero logits


def test_logprobs_trim_padding_per_micro_batch(tmp_path, monkeypatch):
    # A rollout of width 6 whose selected rows are at most 3 tokens long: the forward sees 3
    # columns, and the log-probs equal those computed on the full padded width.
    args = _config(tmp_path, num_generations=2)
    trainer = GRPOTrainer("tiny-random", TargetToken(), ROWS, args=args)
    lengths = torch.tensor([3, 2, 6, 5, 1, 3])
    mask = (torch.arange(6)[None, :] < lengths[:, None]).long()
    ids = torch.randint(5, 100, (6, 6), generator=torch.Generator().manual_seed(0)) * mask
    prompt_ids = torch.tensor([[0, 7, 8, 9], [10, 11, 12, 13], [0, 0, 14, 15]])
    prompt_mask = (prompt_ids != 0).long()
    rollout = Rollout(
        prompt_ids, prompt_mask, ids, mask, lengths == 6, torch.tensor([0, 0, 1, 1, 2, 2]), []
    )
    widths = []

    def recording(model, p_ids, p_mask, c_ids, c_mask, **kw):
        widths.append(c_ids.shape[1])
        return completion_logprobs(model, p_ids, p_mask, c_ids, c_mask, **kw)

    monkeypatch.setattr("groupwise.policy.policy.completion_logprobs", recording)
    rows = torch.tensor([4, 5, 0, 1])
    with torch.no_grad():
        logps, entropy = trainer.policy.logprobs(rollout, rows)
        reference, ref_entropy = completion_logprobs(
            trainer.model, prompt_ids[[2, 0]], prompt_mask[[2, 0]], ids[rows], mask[rows],
            group_size=2,
        )  # fmt: skip
    assert widths == [3]
    assert logps.shape == (4, 6)
    torch.testing.assert_close(logps, reference, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(entropy, ref_entropy, atol=1e-5, rtol=1e-5)
    assert (logps[:, 3:] == 0).all() and (logps * mask[rows] != 0).sum() == mask[rows].sum()


def test_metrics_logged_and_model_saved(tmp_path):
    args = _config(tmp_path, max_steps=2, save_steps=1)
    trainer = GRPOTrainer("tiny-random", [TargetToken(), "format"], ROWS, args=args)
    trainer.train()
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [1, 2]
    for key in (
        "reward",
        "reward_std",
        "frac_reward_zero_std",
        "rewards/target_token/mean",
        "rewards/format_reward/mean",
        "completions/mean_length",
        "completions/min_length",
        "completions/max_length",
        "completions/clipped_ratio",
        "kl",
        "clip_ratio/low_mean",
        "clip_ratio/high_mean",
        "clip_ratio/region_mean",
        "entropy",
        "learning_rate",
        "time/generation",
        "time/scoring",
        "time/update",
        "time/planning",
        "tokens_per_second",
        "perf/total_num_tokens",
        "perf/throughput",
    ):
        assert key in lines[-1] and math.isfinite(lines[-1][key]), key
    assert (tmp_path / "run" / "checkpoint-1" / "config.json").exists()
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "run")
    ids = torch.tensor([[1, 5, 9, 13]])
    trainer.model.eval()
    torch.testing.assert_close(loaded(ids).logits, trainer.model(ids).logits)
    assert (tmp_path / "run" / "tokenizer_config.json").exists()
    assert not [p for p in (tmp_path / "run").iterdir() if p.name.startswith(".save-")]


def test_dataset_columns_reach_reward_function(tmp_path):
    seen = {}

    def spy(prompts, completions, tag, **kwargs):
        seen["tags"] = list(tag)
        seen["prompts"] = list(prompts)
        return [float(t) for t in tag]

    trainer = GRPOTrainer("tiny-random", spy, ROWS, args=_config(tmp_path, max_steps=1))
    trainer.train()
    logs = trainer.log_history
    tags = seen["tags"]
    assert len(tags) == 8 and tags[:4] == [tags[0]] * 4 and tags[4:] == [tags[4]] * 4
    assert seen["prompts"][0] == ROWS[tags[0]]["prompt"]
    assert logs[0]["frac_reward_zero_std"] == 1.0  # reward constant within each group


def test_none_rewards_are_not_applicable(tmp_path):
    def half_none(prompts, completions, **kwargs):
        return [None if i % 2 else 1.0 for i in range(len(completions))]

    def all_none(prompts, completions, **kwargs):
        return [None] * len(completions)

    trainer = GRPOTrainer(
        "tiny-random", [half_none, all_none], ROWS, args=_config(tmp_path, max_steps=1)
    )
    rows = ROWS[:2]
    from groupwise.data.prompts import tokenize_prompts
    from groupwise.rollout import generate

    rollout = generate(
        trainer.model,
        trainer.tokenizer,
        tokenize_prompts([r["prompt"] for r in rows], trainer.tokenizer, None),
        4,
        trainer.sampling,
    )
    rewards, per_func = trainer.score(rows, rollout)
    assert torch.isnan(per_func[:, 1]).all()
    assert rewards[0] == 1.0 and torch.isnan(rewards[1])


def test_reward_function_errors_name_the_function(tmp_path):
    def broken(prompts, completions, **kwargs):
        raise KeyError("oops")

    def short(prompts, completions, **kwargs):
        return [1.0]

    cases = (
        (broken, "'broken' failed on 8 of 8 completions"),
        (short, "'short' must return a list"),
    )
    for func, message in cases:
        args = _config(tmp_path / func.__name__, max_steps=1)
        trainer = GRPOTrainer("tiny-random", func, ROWS, args=args)
        with pytest.raises(RewardFunctionError, match=message):
            trainer.train()


def test_policy_schedule_spans_the_epochs_max_steps(tmp_path):
    # max_steps=-1 is made concrete for the dataset before the policy reads its sections:
    # 16 rows / (8 completions / 4 per group = 2 prompts per generation batch) = 8 batches,
    # x 2 passes = max_steps 16 optimizer steps, over which the linear schedule decays to 0.
    args = _config(tmp_path, max_steps=-1, num_train_epochs=1, num_iterations=2,
                   lr_scheduler_type="linear")  # fmt: skip
    trainer = GRPOTrainer("tiny-random", TargetToken(), ROWS, args=args)
    options = trainer.policy.options
    assert options.optimization.max_steps == trainer.args.max_steps == 16
    assert (options.batch, options.loss, options.runtime) == (
        trainer.options.batch, trainer.options.loss, trainer.options.runtime
    )
    factor = trainer.policy.network.scheduler.lr_lambdas[0]
    assert [factor(s) for s in (0, 8, 16)] == [1.0, 0.5, 0.0]


def test_evaluate_greedy_is_deterministic(tmp_path):
    rows = [{"prompt": r["prompt"], "answer": "7"} for r in ROWS[:4]]
    trainer = GRPOTrainer(
        "tiny-random", ["format", "accuracy"], rows, args=_config(tmp_path), eval_dataset=rows
    )
    first, second = trainer.evaluate(), trainer.evaluate()
    assert first == second
    assert first["eval/num_prompts"] == 4
    assert first["eval/rewards/accuracy_reward/mean"] == 0.0  # a random model never answers 7


def test_an_overwrite_leaves_no_metrics_of_the_earlier_run(tmp_path):
    # An overwrite removes the earlier run's artefacts (all of them, and says so), so no file
    # left in the folder describes a different model.
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 99}\n')
    (run / "metrics-20260101-000000.jsonl").write_text('{"step": 98}\n')
    args = _config(tmp_path, max_steps=1, overwrite_output_dir=True)  # else refused
    GRPOTrainer("tiny-random", TargetToken(), ROWS, args=args).train()
    steps = [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1]
    assert list(run.glob("metrics-*.jsonl")) == []


def test_periodic_eval_logs_pass_at_k_per_difficulty(tmp_path):
    from groupwise.tasks.arithmetic import arithmetic_dataset

    rows = arithmetic_dataset(4, "eval", max_operands=3)
    args = _config(
        tmp_path,
        reward_funcs=["format", "accuracy"],
        eval_num_generations=2,
        max_steps=1,
        eval_on_start=True,
        max_completion_length=3,
    )
    trainer = GRPOTrainer("tiny-random", ["format", "accuracy"], rows, args=args, eval_dataset=rows)
    result = trainer.evaluate()
    for key in ("eval/pass@1", "eval/pass@2", "eval/mean@2", "eval/format_rate"):
        assert result[key] == 0.0, key  # a random model: nothing correct, nothing formatted
    levels = {row["difficulty"] for row in rows}
    assert {f"eval/difficulty_{lv}/pass@2" for lv in levels} <= set(result)
    assert sum(result[f"eval/difficulty_{lv}/num_prompts"] for lv in levels) == 4


def _always_one(prompts, completions, **kwargs):  # pays everything: not a correctness signal
    return [1.0] * len(completions)


def _never_right(prompts, completions, **kwargs):
    return [0.0] * len(completions)


_never_right.is_correctness = True


def test_the_reward_marked_is_correctness_drives_curriculum_monitor_and_rewards_json(tmp_path):
    args = _config(tmp_path, max_steps=1, curriculum="prompt_gdro", reward_weights=[1.0, 2.0])
    trainer = GRPOTrainer("tiny-random", [_always_one, _never_right], ROWS, args=args)
    assert trainer.monitor.correctness_reward == "_never_right"
    seen = []
    observe = trainer.curriculum.observe

    def spy(plan, outcome):
        correct = outcome.correctness > trainer.curriculum.correct_threshold
        seen.extend(correct.tolist())
        return observe(plan, outcome)

    trainer.curriculum.observe = spy
    trainer.train()
    # The total reward is 1.0 > gdro_correct_threshold everywhere; the flagged reward says 0.
    assert len(seen) == 8 and not any(seen)
    # The run records its rewards next to config.yaml, for groupwise report.
    run = tmp_path / "run"
    assert json.loads((run / "rewards.json").read_text()) == [
        {"name": "_always_one", "weight": 1.0, "is_correctness": False},
        {"name": "_never_right", "weight": 2.0, "is_correctness": True},
    ]
    assert not [p.name for p in run.iterdir() if p.name.endswith(".tmp")]
    # Built-in names: the accuracy reward; no flagged function: None (the total reward).
    built_in = GRPOTrainer("tiny-random", ["format", "accuracy"], ROWS, args=_config(tmp_path))
    assert built_in.monitor.correctness_reward == "accuracy_reward"
    unflagged = GRPOTrainer("tiny-random", [_always_one], ROWS, args=_config(tmp_path))
    assert unflagged.monitor.correctness_reward is None


def test_a_run_records_run_json_and_its_report_leads_with_held_out_accuracy(tmp_path):
    from groupwise.report import build_report

    # beta 0 (tiny_config's): the report leaves the KL out and says why.
    args = _config(tmp_path, eval_on_start=True, eval_steps=1, per_device_eval_batch_size=4)
    trainer = GRPOTrainer("tiny-random", TargetToken(), ROWS, args=args, eval_dataset=ROWS[:4])
    trainer.train()
    run = tmp_path / "run"
    info = json.loads((run / "run.json").read_text())
    assert info["device"] == "cpu" and info["world_size"] == 1 and info["dtype"] == "float32"
    assert info["precision"] == "fp32" and info["finished"] and info["wall_time_s"] > 0
    assert info["groupwise_version"] not in ("", None)
    defaults = GRPOConfig()
    assert info["defaults"]["learning_rate"] == defaults.learning_rate  # changed: 1e-2
    assert info["defaults"]["loss_type"] == defaults.loss_type  # changed: grpo
    assert "beta" not in info["defaults"]  # 0.0 is the default: unchanged
    assert "model" not in info["defaults"]
    page = build_report(run, dpi=30).read_text()
    top = page.split('<section id="headline">')[1].split("</section>")[0]
    # No reward is marked as correctness: the eval reward, before training and after each step.
    assert "Held-out reward (no accuracy metric logged): <b>" in top
    assert "before training → step 2, 3 evaluations" in top
    assert "groupwise " + info["groupwise_version"] in top and "device cpu" in top
    assert "kl (beta 0)" in page
    config = page.split('<section id="config">')[1].split("<details>")[0]
    assert f"<tr><td>learning_rate</td><td><code>{defaults.learning_rate}</code>" in config


def test_the_loop_cadence_by_hand():
    from groupwise.trainer.loop import Cadence

    # logging_steps=3 of max_steps=10: every third step and the last; completions every 4;
    # eval_steps=4: steps 4 and 8 in the loop (step 10's evaluation follows the loop, as would
    # step 12's at max_steps=12); save_steps=5: 5 and 10.
    cadence = Cadence(GRPOConfig(max_steps=10, logging_steps=3, log_completions_steps=4,
                                 eval_steps=4, save_steps=5))  # fmt: skip
    steps = range(1, 11)
    assert [s for s in steps if cadence.log(s - 1, s)] == [3, 6, 9, 10]
    assert [s for s in steps if cadence.log_completions(s - 1, s)] == [4, 8]
    assert [s for s in steps if cadence.evaluate(s - 1, s)] == [4, 8]
    assert [s for s in steps if cadence.save(s - 1, s)] == [5, 10]
    assert cadence.evaluates()
    cadence.args.max_steps = 8  # read at each step: a change counts at once
    assert [s for s in range(1, 9) if cadence.evaluate(s - 1, s)] == [4]
    never = Cadence(GRPOConfig(max_steps=4, eval_steps=0, save_steps=0, log_completions_steps=0))
    assert not any(
        never.evaluate(s - 1, s) or never.save(s - 1, s) or never.log_completions(s - 1, s)
        for s in range(1, 5)
    )
    assert not never.evaluates()


def test_the_loop_cadence_counts_optimizer_steps_inside_a_generation_batch():
    """Steps are optimizer steps (TRL's); a generation batch of num_iterations=3 trains three,
    so the loop asks about (0, 3], (3, 6], ...: an interval's multiple inside a batch acts at
    the batch's end, and a run of max_steps=10 ends with a batch that trains one step."""
    from groupwise.trainer.loop import Cadence

    cadence = Cadence(GRPOConfig(max_steps=10, logging_steps=2, eval_steps=4, save_steps=5))
    batches = [(0, 3), (3, 6), (6, 9), (9, 10)]
    assert [b for b in batches if cadence.log(*b)] == [(0, 3), (3, 6), (6, 9), (9, 10)]
    assert [b for b in batches if cadence.evaluate(*b)] == [(3, 6), (6, 9)]
    assert [b for b in batches if cadence.save(*b)] == [(3, 6), (9, 10)]
    assert Cadence.due(4, 0, 3) is False and Cadence.due(4, 3, 4) is True
    assert Cadence.due(0, 0, 100) is False


def test_log_completions_logs_a_sample_at_each_logged_step_as_trl_does():
    """TRL's log_completions=True logs a sample every logging_steps; log_completions_steps, when
    given, sets its own cadence."""
    from groupwise.trainer.loop import Cadence

    trl_style = Cadence(GRPOConfig(max_steps=10, logging_steps=3, log_completions=True))
    assert [s for s in range(1, 11) if trl_style.log_completions(s - 1, s)] == [3, 6, 9, 10]
    own = Cadence(GRPOConfig(max_steps=10, logging_steps=3, log_completions=True,
                             log_completions_steps=4))  # fmt: skip
    assert [s for s in range(1, 11) if own.log_completions(s - 1, s)] == [4, 8]
    off = Cadence(GRPOConfig(max_steps=10, logging_steps=3))
    assert not any(off.log_completions(s - 1, s) for s in range(1, 11))


@pytest.mark.parametrize("log_completions", [True, False])
def test_log_completions_keeps_the_last_steps_completions(tmp_path, log_completions):
    # The records are told log_completions once; each step's batch then keeps its samples.
    args = _config(tmp_path, max_steps=1, log_completions=log_completions)
    trainer = GRPOTrainer("tiny-random", TargetToken(), ROWS, args=args)
    trainer.train()
    rows, texts, rewards = trainer.records.last_batch[:3]
    samples = trainer.records.last_samples
    assert len(samples) == (len(texts) if log_completions else 0)
    for sample, text, reward in zip(samples, texts, rewards.tolist(), strict=False):
        assert sample["completion"] == text and sample["reward"] == reward
        assert sample["prompt"] in [row["prompt"] for row in rows]
