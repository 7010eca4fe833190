"""TrainingMonitor: each failure-mode rule on hand-made metric sequences, with its boundaries,
the cooldown/re-arm logic, bad-step counting and an exact resume through state_dict."""

import json

import pytest

from groupwise.config.grpo_config import GRPOConfig
from groupwise.trainer.monitor import MonitorThresholds, TrainingMonitor, TrainingWarning


def row(step, **changes):
    """A healthy training step; keyword names use __ for / (completions__mean_length)."""
    logs = {
        "step": step,
        "reward": 0.5,
        "frac_reward_zero_std": 0.2,
        "rewards/format_reward/mean": 0.9,
        "rewards/accuracy_reward/mean": 0.5,
        "completions/mean_length": 50.0,
        "loss": 0.02,
        "kl": 0.01,
        "entropy": 0.6,
        "grad_norm": 1.0,
    }
    logs.update({key.replace("__", "/"): value for key, value in changes.items()})
    return logs


def run(monitor, rows):
    """All warnings of a sequence of rows, as (step, kind) pairs."""
    return [(w.step, w.kind) for r in rows for w in monitor.update(r)]


def test_healthy_run_is_silent():
    assert run(TrainingMonitor(), [row(s) for s in range(1, 101)]) == []


def test_thresholds_from_config_and_overrides():
    args = GRPOConfig(warn_kl_max=0.5, warn_zero_std_steps=7, max_bad_steps=2)
    t = TrainingMonitor(args, cooldown_steps=4).thresholds
    assert (t.kl_max, t.zero_std_steps, t.max_bad_steps, t.cooldown_steps) == (0.5, 7, 2, 4)
    assert t.zero_std_fraction == 0.9 and t.entropy_min == 0.05
    assert TrainingMonitor(entropy_min=0.1).thresholds.entropy_min == 0.1
    assert TrainingMonitor(MonitorThresholds(kl_max=3.0), kl_window=2).thresholds.kl_window == 2
    with pytest.raises(ValueError, match="length_window"):
        MonitorThresholds(length_window=1)


# --- zero_std -----------------------------------------------------------------------------------
def test_zero_std_fires_after_n_consecutive_steps():
    monitor = TrainingMonitor()
    warnings = [monitor.update(row(s, frac_reward_zero_std=0.95)) for s in range(1, 7)]
    assert [len(w) for w in warnings] == [0, 0, 0, 0, 1, 0]
    w = warnings[4][0]
    assert (w.step, w.kind) == (5, "zero_std")
    assert "nothing is being learned" in w.message and "curriculum=select" in w.message
    assert "dynamic_sampling=true" in w.message and "Easier prompts" in w.message
    # rollout_gdro buys about 1.00-1.04x informative groups (docs/benchmarks.md): not advised.
    assert "rollout_gdro" not in w.message
    assert "0.95" in w.message and "5 steps" in w.message


def test_zero_std_boundaries():
    # Exactly at the fraction is not above it.
    assert run(TrainingMonitor(), [row(s, frac_reward_zero_std=0.9) for s in range(1, 30)]) == []
    # A healthy step restarts the count: 4 bad, 1 good, 4 bad never reaches 5.
    fracs = [0.95] * 4 + [0.5] + [0.95] * 4
    rows = [row(s, frac_reward_zero_std=f) for s, f in enumerate(fracs, 1)]
    assert run(TrainingMonitor(), rows) == []
    assert run(TrainingMonitor(zero_std_steps=4), rows) == [(4, "zero_std"), (9, "zero_std")]


# --- cooldown and re-arming --------------------------------------------------------------------
def test_persistent_condition_refires_only_after_cooldown():
    rows = [row(s, frac_reward_zero_std=1.0) for s in range(1, 50)]
    assert run(TrainingMonitor(), rows) == [(5, "zero_std"), (25, "zero_std"), (45, "zero_std")]
    assert run(TrainingMonitor(cooldown_steps=10), rows[:30]) == [
        (5, "zero_std"),
        (15, "zero_std"),
        (25, "zero_std"),
    ]


def test_cooldown_counts_steps_not_calls():
    # With logging every 10 steps the monitor sees steps 10, 20, ...: 20 steps apart re-fires.
    rows = [row(s, entropy=0.01) for s in range(10, 100, 10)]
    assert run(TrainingMonitor(entropy_warmup_steps=0), rows) == [
        (10, "entropy_collapse"),
        (30, "entropy_collapse"),
        (50, "entropy_collapse"),
        (70, "entropy_collapse"),
        (90, "entropy_collapse"),
    ]


def test_rearms_after_clearing_for_rearm_steps():
    low, ok = 0.01, 0.5
    #              1    2    3    4    5   6   7    8   9   10  11
    entropies = [ok, ok, ok, low, ok, low, ok, ok, ok, low, low]
    rows = [row(s, entropy=e) for s, e in enumerate(entropies, 1)]
    # Fires at 4; clear for 1 step is not enough (6 silent); clear for 3 steps re-arms (10).
    assert run(TrainingMonitor(), rows) == [(4, "entropy_collapse"), (10, "entropy_collapse")]
    # rearm_steps=1: any clear step re-arms (the literal "cleared and re-triggered").
    assert run(TrainingMonitor(rearm_steps=1), rows) == [
        (4, "entropy_collapse"),
        (6, "entropy_collapse"),
        (10, "entropy_collapse"),
    ]


def test_kinds_fire_independently_in_a_fixed_order():
    rows = [row(s, entropy=0.01, kl=2.0, frac_reward_zero_std=1.0) for s in range(1, 6)]
    assert run(TrainingMonitor(), rows) == [
        (1, "kl_blowup"),
        (4, "entropy_collapse"),
        (5, "zero_std"),
    ]


# --- entropy_collapse ---------------------------------------------------------------------------
def test_entropy_collapse_after_warmup_and_boundary():
    monitor = TrainingMonitor()
    warnings = [monitor.update(row(s, entropy=0.02)) for s in range(1, 6)]
    assert [len(w) for w in warnings] == [0, 0, 0, 1, 0]  # steps 1-3 are the base model's
    message = warnings[3][0].message
    assert "0.02" in message and "0.05" in message
    assert all(word in message for word in ("learning_rate", "temperature", "beta"))
    # Exactly at the minimum is not below it.
    assert run(TrainingMonitor(), [row(s, entropy=0.05) for s in range(1, 20)]) == []


# --- kl_blowup ----------------------------------------------------------------------------------
def test_kl_above_max():
    assert run(TrainingMonitor(), [row(1, kl=1.0)]) == []
    monitor = TrainingMonitor()
    (w,) = monitor.update(row(1, kl=1.5))
    assert w.kind == "kl_blowup" and "1.5" in w.message and "beta" in w.message


def test_kl_fast_growth_above_floor():
    # 0.01 -> 0.2 in 5 steps (20x) while above the 0.1 floor.
    kls = [0.01, 0.02, 0.04, 0.06, 0.1, 0.2]
    monitor = TrainingMonitor()
    got = [w for s, kl in enumerate(kls, 1) for w in monitor.update(row(s, kl=kl))]
    assert [(w.step, w.kind) for w in got] == [(6, "kl_blowup")]
    assert "20.0x in 5 steps" in got[0].message
    # 50x growth that stays under the floor is the normal start of training.
    tiny = [0.001, 0.002, 0.005, 0.01, 0.02, 0.05]
    assert run(TrainingMonitor(), [row(s, kl=kl) for s, kl in enumerate(tiny, 1)]) == []
    # Above the floor but only 9x.
    slow = [0.02, 0.05, 0.08, 0.1, 0.15, 0.18]
    assert run(TrainingMonitor(), [row(s, kl=kl) for s, kl in enumerate(slow, 1)]) == []
    # beta = 0: KL is always 0 and never warns.
    assert run(TrainingMonitor(), [row(s, kl=0.0) for s in range(1, 30)]) == []


# --- length_hacking -----------------------------------------------------------------------------
ACC = "accuracy_reward"  # the correctness reward the trainer names for the built-in accuracy


def acc_monitor(**thresholds):
    return TrainingMonitor(correctness_reward=ACC, **thresholds)


def _length_rows(lengths, accuracy, reward=0.5, correctness=True):
    rows = []
    for s, (n, a) in enumerate(zip(lengths, accuracy, strict=True), 1):
        r = row(s, completions__mean_length=n, reward=reward)
        if correctness:
            r["rewards/accuracy_reward/mean"] = a
        else:
            del r["rewards/accuracy_reward/mean"]
            r["reward"] = a
        rows.append(r)
    return rows


def test_length_hacking_fires_when_longer_without_better_answers():
    rows = _length_rows([40] * 5 + [70] * 5, [0.4] * 10)
    monitor = acc_monitor()
    got = [w for r in rows for w in monitor.update(r)]
    assert [(w.step, w.kind) for w in got] == [(10, "length_hacking")]
    message = got[0].message
    assert "likely reward hacking" in message and "1.75x" in message
    assert "accuracy_reward" in message and "40" in message and "70" in message


def test_length_hacking_boundaries():
    # Exactly 1.5x is not more than 1.5x.
    assert run(acc_monitor(), _length_rows([40] * 5 + [60] * 5, [0.4] * 10)) == []
    # Longer but more accurate is learning to reason, not hacking.
    assert run(acc_monitor(), _length_rows([40] * 5 + [70] * 5, [0.4] * 5 + [0.6] * 5)) == []
    # The window is not full before step 10.
    assert run(acc_monitor(), _length_rows([40] * 4 + [90] * 5, [0.4] * 9)) == []
    # Correctness falling counts as not improving.
    rows = _length_rows([40] * 5 + [70] * 5, [0.5] * 5 + [0.3] * 5)
    assert run(acc_monitor(), rows) == [(10, "length_hacking")]


def test_length_hacking_uses_the_correctness_reward_not_the_total():
    # The total reward rises (a length-rewarding function), accuracy does not: still hacking.
    rows = _length_rows([40] * 5 + [70] * 5, [0.4] * 10)
    for r in rows[5:]:
        r["reward"] = 1.5
    assert run(acc_monitor(), rows) == [(10, "length_hacking")]
    # Without a correctness reward the total reward is the yardstick.
    rows = _length_rows([40] * 5 + [70] * 5, [0.4] * 10, correctness=False)
    monitor = acc_monitor()  # named, but not logged
    got = [w for r in rows for w in monitor.update(r)]
    assert [w.kind for w in got] == ["length_hacking"] and "reward did not" in got[0].message
    rows = _length_rows([40] * 5 + [70] * 5, [0.4] * 5 + [0.8] * 5, correctness=False)
    assert run(acc_monitor(), rows) == []


def test_length_hacking_uses_the_reward_the_trainer_names():
    # The correctness reward is the one named at construction (the trainer passes the function
    # marked is_correctness), not one guessed from the logged names.
    rows = _length_rows([40] * 5 + [70] * 5, [0.4] * 5 + [0.9] * 5)  # accuracy_reward rises
    for r in rows:
        r["rewards/my_checker/mean"] = 0.3  # ... the run's own correctness reward does not
    monitor = TrainingMonitor(correctness_reward="my_checker")
    got = [w for r in rows for w in monitor.update(r)]
    assert [w.kind for w in got] == ["length_hacking"] and "my_checker did not" in got[0].message
    assert run(acc_monitor(), rows) == []
    # Not named: the total reward (flat 0.5 here) is the yardstick, whatever else is logged.
    monitor = TrainingMonitor()
    got = [w for r in rows for w in monitor.update(r)]
    assert [w.kind for w in got] == ["length_hacking"] and "reward did not" in got[0].message


# --- nan_step and should_stop -------------------------------------------------------------------
def test_bad_steps_stop_after_max_consecutive():
    monitor = TrainingMonitor()  # max_bad_steps = 3
    (w,) = monitor.record_bad_step(1, "loss")
    assert isinstance(w, TrainingWarning) and (w.step, w.kind) == (1, "nan_step")
    assert "loss was not finite at step 1" in w.message and "1 in a row" in w.message
    monitor.record_bad_step(2, "grad_norm")
    assert not monitor.should_stop
    monitor.update(row(3))  # a good step resets the count
    assert monitor.consecutive_bad_steps == 0
    monitor.record_bad_step(4)
    monitor.record_bad_step(5)
    assert not monitor.should_stop
    (w,) = monitor.record_bad_step(6)
    assert monitor.should_stop and "stopping the run" in w.message


def test_bad_step_reported_twice_or_also_updated_counts_once():
    monitor = TrainingMonitor(max_bad_steps=2)
    monitor.record_bad_step(1)
    monitor.record_bad_step(1)
    # The trainer may also pass the skipped step's metrics to update(): not a good step.
    monitor.update(row(1, loss=float("nan"), grad_norm=float("inf")))
    assert monitor.consecutive_bad_steps == 1 and not monitor.should_stop
    monitor.record_bad_step(2)
    assert monitor.should_stop
    never = TrainingMonitor(max_bad_steps=0)
    for s in range(1, 10):
        never.record_bad_step(s)
    assert not never.should_stop


# --- loss_zero_note -----------------------------------------------------------------------------
def test_loss_zero_note_once_per_run():
    monitor = TrainingMonitor()
    assert monitor.update(row(1, loss=0.0, grad_norm=0.0)) == []  # no gradient: nothing to say
    assert monitor.update(row(2, loss=2e-6, grad_norm=0.3)) == []
    (note,) = monitor.update(row(3, loss=-3e-8, grad_norm=0.3))
    assert (note.step, note.kind) == (3, "info")
    assert "by construction" in note.message and "watch reward, not loss" in note.message
    assert monitor.update(row(4, loss=0.0, grad_norm=0.3)) == []
    assert note.to_dict() == {"step": 3, "kind": "info", "message": note.message}


# --- eval rows, missing keys and exact resume ---------------------------------------------------
def test_eval_rows_and_missing_keys_are_ignored():
    monitor = TrainingMonitor()
    before = monitor.state_dict()
    assert monitor.update({"step": 0, "eval/reward": 0.0, "eval/num_prompts": 64}) == []
    assert monitor.state_dict() == before
    assert monitor.update({"step": 1}) == []
    assert monitor.update({"step": 2, "entropy": "n/a", "kl": float("nan")}) == []


def _scenario():
    """120 steps that trigger every rule, with state in flight at every split point."""
    rows = []
    for s in range(1, 121):
        r = row(s, loss=0.0 if s == 3 else 0.02)
        if 8 <= s <= 40:
            r["frac_reward_zero_std"] = 0.95
        if 30 <= s <= 34 or 55 <= s <= 90:
            r["entropy"] = 0.01
        r["kl"] = 0.01 * 1.6 ** max(0, s - 60) if s < 75 else 0.02
        r["completions/mean_length"] = 40.0 if s < 100 else 90.0
        r["rewards/accuracy_reward/mean"] = 0.4 + 0.001 * (s % 3)
        rows.append(r)
    return rows


@pytest.mark.parametrize("split", [6, 33, 58, 104])
def test_state_dict_round_trip_resumes_exactly(split):
    rows = _scenario()
    reference = TrainingMonitor()
    expected = [[w.to_dict() for w in reference.update(r)] for r in rows]
    kinds = {w["kind"] for ws in expected for w in ws}
    assert kinds == {"zero_std", "entropy_collapse", "kl_blowup", "length_hacking", "info"}

    first = TrainingMonitor()
    for r in rows[:split]:
        first.update(r)
    state = json.loads(json.dumps(first.state_dict()))  # survives a JSON checkpoint
    resumed = TrainingMonitor()
    resumed.load_state_dict(state)
    got = [[w.to_dict() for w in resumed.update(r)] for r in rows[split:]]
    assert got == expected[split:]
    assert resumed.state_dict() == reference.state_dict()


def test_state_dict_keeps_the_bad_step_count():
    monitor = TrainingMonitor()
    monitor.record_bad_step(1)
    monitor.record_bad_step(2)
    resumed = TrainingMonitor()
    resumed.load_state_dict(json.loads(json.dumps(monitor.state_dict())))
    resumed.record_bad_step(2)  # the same step again (re-reported after resume) counts once
    assert not resumed.should_stop
    resumed.record_bad_step(3)
    assert resumed.should_stop


def test_trainer_order_bad_step_then_update_stops_after_max():
    # The trainer reports a skipped step and then passes that step's metrics to update().
    monitor = TrainingMonitor()
    for step in (1, 2, 3):
        assert [w.kind for w in monitor.record_bad_step(step, "loss or gradient")] == ["nan_step"]
        monitor.update(row(step, loss=float("nan"), grad_norm=float("nan"), nonfinite_step=1.0))
        assert monitor.should_stop == (step == 3)
