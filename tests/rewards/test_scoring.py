import asyncio
import json
import logging
import math

import pytest
import torch

from groupwise.rewards.scoring import RewardFunctionError, RewardScorer

PROMPTS = ["p0", "p1", "p2", "p3"]
COMPLETIONS = ["a", "bb", "ccc", "dddd"]


def length(prompts, completions, **kwargs):
    return [float(len(c)) for c in completions]


def half(prompts, completions, **kwargs):
    return [0.5 if i % 2 == 0 else None for i in range(len(completions))]


def test_weighted_sum_with_none_as_not_applicable():
    scorer = RewardScorer([length, half], weights=[2.0, -1.0])
    rewards, per_func = scorer(PROMPTS, COMPLETIONS)
    # row 0: 2*1 - 0.5 = 1.5; row 1: 2*2 (half is None) = 4; row 2: 2*3 - 0.5 = 5.5; row 3: 8
    assert rewards.tolist() == [1.5, 4.0, 5.5, 8.0]
    assert per_func[:, 0].tolist() == [1.0, 2.0, 3.0, 4.0]
    assert per_func[0, 1] == 0.5 and math.isnan(per_func[1, 1])


def test_all_none_gives_nan_and_nan_counts_as_none():
    def nothing(prompts, completions, **kwargs):
        return [None, float("nan"), None, 1.0]

    rewards, per_func = RewardScorer([nothing])(PROMPTS, COMPLETIONS)
    assert torch.isnan(rewards[:3]).all() and rewards[3] == 1.0
    assert torch.isnan(per_func[1, 0])


def test_columns_and_completion_ids_are_passed_by_name():
    seen = {}

    def spy(prompts, completions, completion_ids, answer, **kwargs):
        seen.update(ids=completion_ids, answer=answer, extra=kwargs)
        return [1.0] * len(completions)

    RewardScorer([spy])(PROMPTS, COMPLETIONS, [[1], [2], [3], [4]], answer=["1", "2", "3", "4"])
    assert seen["ids"] == [[1], [2], [3], [4]] and seen["answer"] == ["1", "2", "3", "4"]
    # TRL's shared kwargs and nothing else; no trainer here, so no trainer_state
    assert set(seen["extra"]) == {"trainer_state", "log_extra", "log_metric"}
    assert seen["extra"]["trainer_state"] is None
    with pytest.raises(ValueError, match="column 'answer' has 2 values for 4 completions"):
        RewardScorer([spy])(PROMPTS, COMPLETIONS, answer=["1", "2"])


def test_log_metric_means_and_log_extra_columns():
    def logs(prompts, completions, log_metric, log_extra, **kwargs):
        log_metric("m", 1.0)
        log_metric("m", 4.0)
        log_extra("upper", [c.upper() for c in completions])
        log_extra("short", ["x"])  # one value for four completions: left out
        assert kwargs["trainer_state"] == "state"  # what the trainer_state callable returns
        return [0.0] * len(completions)

    scorer = RewardScorer([logs], trainer_state=lambda: "state")
    scorer(PROMPTS, COMPLETIONS)
    scorer(PROMPTS, COMPLETIONS)
    assert scorer.take_metrics() == {"m": 2.5}  # (1 + 4 + 1 + 4) / 4
    assert scorer.take_metrics() == {}
    assert scorer.last_extra == {"upper": ["A", "BB", "CCC", "DDDD"]}


def test_one_failing_completion_costs_one_none(caplog):
    calls = []

    def fragile(prompts, completions, **kwargs):
        calls.append(len(completions))
        if "ccc" in completions:
            raise ZeroDivisionError("bad completion")
        return [1.0] * len(completions)

    scorer = RewardScorer([fragile, length], max_failure_fraction=0.5)
    with caplog.at_level(logging.WARNING, logger="groupwise.rewards"):
        rewards, per_func = scorer(PROMPTS, COMPLETIONS)
        scorer(PROMPTS, COMPLETIONS)
    assert calls[:5] == [4, 1, 1, 1, 1]  # the batch, then one by one
    assert per_func[:, 0].tolist()[:2] == [1.0, 1.0] and math.isnan(per_func[2, 0])
    assert rewards[2] == 3.0  # the other function still counts
    assert scorer.error_counts["fragile"]["ZeroDivisionError"] == 2
    assert scorer.error_summary() == {"fragile": 2, "length": 0}
    tracebacks = [r for r in caplog.records if "Traceback" in r.getMessage()]
    assert len(tracebacks) == 1 and "bad completion" in tracebacks[0].getMessage()


def test_function_failing_too_often_stops_the_run():
    def broken(prompts, completions, **kwargs):
        if completions != ["a"]:
            raise KeyError("missing column")
        return [1.0]

    scorer = RewardScorer([broken], max_failure_fraction=0.5)
    with pytest.raises(RewardFunctionError, match=r"'broken' failed on 3 of 4 .*KeyError x3"):
        scorer(PROMPTS, COMPLETIONS)
    lenient = RewardScorer([broken], max_failure_fraction=0.75)
    rewards, _ = lenient(PROMPTS, COMPLETIONS)
    assert rewards[0] == 1.0 and torch.isnan(rewards[1:]).all()


def test_contract_violations_are_clear_errors():
    def short(prompts, completions, **kwargs):
        return [1.0]

    def text(prompts, completions, **kwargs):
        return ["yes"] * len(completions)

    with pytest.raises(RewardFunctionError, match="'short' must return a list of 4"):
        RewardScorer([short])(PROMPTS, COMPLETIONS)
    with pytest.raises(RewardFunctionError, match="'text' returned 'yes' for completion 0"):
        RewardScorer([text])(PROMPTS, COMPLETIONS)
    with pytest.raises(ValueError, match="2 reward weights for 1"):
        RewardScorer([length], weights=[1.0, 2.0])


def _handshake_pair():
    # Each function waits for the other to have started: only concurrent awaiting finishes.
    events = {}

    def make(mine, other):
        async def func(prompts, completions, **kwargs):
            events.setdefault(mine, asyncio.Event()).set()
            events.setdefault(other, asyncio.Event())
            await asyncio.wait_for(events[other].wait(), timeout=5)
            return [1.0] * len(completions)

        func.__name__ = f"async_{mine}"
        return func

    return make("a", "b"), make("b", "a")


def test_async_functions_are_awaited_concurrently():
    scorer = RewardScorer(list(_handshake_pair()), max_failure_fraction=0.0)
    rewards, per_func = scorer(PROMPTS, COMPLETIONS)
    assert per_func.tolist() == [[1.0, 1.0]] * 4
    assert rewards.tolist() == [2.0] * 4


def test_async_scoring_works_inside_a_running_event_loop():
    async def main():
        return RewardScorer(list(_handshake_pair()))(PROMPTS, COMPLETIONS)

    rewards, _ = asyncio.run(main())
    assert rewards.tolist() == [2.0] * 4


def test_manifest_names_weights_and_the_one_correctness_reward(tmp_path):
    from groupwise.rewards import accuracy_reward, code_reward, format_reward

    scorer = RewardScorer([format_reward, accuracy_reward, code_reward], [0.5, 1.0, 2.0])
    expected = [
        {"name": "format_reward", "weight": 0.5, "is_correctness": False},
        {"name": "accuracy_reward", "weight": 1.0, "is_correctness": True},
        {"name": "code_reward", "weight": 2.0, "is_correctness": False},  # only the first
    ]
    assert scorer.manifest() == expected
    path = tmp_path / "rewards.json"
    path.write_text("stale")
    scorer.write_manifest(path)
    assert json.loads(path.read_text()) == expected
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rewards.json"]  # no temporary left


def test_a_nan_reward_and_a_short_extra_column_are_each_warned_about_once(caplog):
    def nan_and_short_column(prompts, completions, log_extra, **kwargs):
        log_extra("short", ["only one"])  # 1 value for 4 completions: left out of the log
        return [float("nan"), 1.0, 1.0, 1.0]

    scorer = RewardScorer([nan_and_short_column])
    with caplog.at_level(logging.WARNING, logger="groupwise.rewards"):
        for _ in range(3):
            scorer(PROMPTS, COMPLETIONS)
    messages = [r.getMessage() for r in caplog.records]
    assert sum("returned NaN for completion 0" in m for m in messages) == 1, messages
    assert sum("log_extra('short', ...) received 1 values" in m for m in messages) == 1, messages
    assert scorer.nan_counts["nan_and_short_column"] == 3  # counted every time, logged once
    assert scorer.last_extra == {}


def test_a_completion_no_function_scores_is_reported_once_with_its_inputs(caplog):
    def sometimes(prompts, completions, **kwargs):
        return [1.0, None, None, 0.0]

    def never(prompts, completions, **kwargs):
        return [None] * len(completions)

    scorer = RewardScorer([sometimes, never])
    with caplog.at_level(logging.WARNING, logger="groupwise.rewards"):
        rewards, _ = scorer(PROMPTS, COMPLETIONS, answer=["1", "2", "3", "4"])
        scorer(PROMPTS, COMPLETIONS, answer=["1", "2", "3", "4"])
    assert torch.isnan(rewards[1:3]).all() and rewards[0] == 1.0 and rewards[3] == 0.0
    unscored = [r.getMessage() for r in caplog.records if "All reward functions" in r.getMessage()]
    assert len(unscored) == 1  # once per run, not per step
    # The first such row (row 1) with its inputs, and how many completions of the step.
    assert "'prompts': 'p1'" in unscored[0] and "'completions': 'bb'" in unscored[0]
    assert "'answer': '2'" in unscored[0] and "(2 completion(s)" in unscored[0]


def test_every_completion_scored_gives_no_unscored_warning(caplog):
    with caplog.at_level(logging.WARNING, logger="groupwise.rewards"):
        RewardScorer([length, half])(PROMPTS, COMPLETIONS)
    assert "All reward functions" not in caplog.text


def _slow_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "slow_call_warning" in r.getMessage()]


def test_a_slow_reward_function_is_named_once_with_the_time_it_took(caplog):
    import time

    def slow_reward(prompts, completions, **kwargs):
        time.sleep(0.15)
        return [1.0] * len(completions)

    async def slow_async(prompts, completions, **kwargs):
        await asyncio.sleep(0.15)
        return [0.5] * len(completions)

    def quick(prompts, completions, **kwargs):
        return [0.0] * len(completions)

    scorer = RewardScorer([quick, slow_reward, slow_async], slow_call_s=0.05)
    with caplog.at_level(logging.WARNING, logger="groupwise.rewards"):
        for _ in range(3):  # three steps: each function is named once
            rewards, _ = scorer(["p", "q"], ["a", "b"])
    assert rewards.tolist() == [1.5, 1.5]  # warned, not stopped
    warnings = _slow_warnings(caplog)
    assert len(warnings) == 2
    for name, message in zip(("slow_reward", "slow_async"), warnings, strict=True):
        assert message.startswith(f"reward function '{name}' took 0.")
        seconds = float(message.split(" took ")[1].split(" s ")[0])
        assert 0.1 <= seconds < 1.0  # the time the call took (0.15 s slept)
        assert "on a batch of 2 completions" in message and "slow_call_warning=0.05 s" in message
    # A function retried completion by completion (it raised on the batch) is timed per call.
    def flaky(prompts, completions, **kwargs):
        if len(completions) > 1:
            raise ValueError("one at a time")
        time.sleep(0.15)
        return [1.0]

    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="groupwise.rewards"):
        RewardScorer([flaky], slow_call_s=0.05)(["p", "q"], ["a", "b"])
    (message,) = _slow_warnings(caplog)
    assert message.startswith("reward function 'flaky' took 0.")
    assert "on a batch of 1 completions" in message
    # Below the threshold, and with the warning off (None), nothing is said.
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="groupwise.rewards"):
        RewardScorer([quick], slow_call_s=0.05)(["p"], ["a"])
        RewardScorer([slow_reward], slow_call_s=None)(["p"], ["a"])
    assert _slow_warnings(caplog) == []


def test_a_reward_sleeping_30_s_gets_the_timeout_error_or_the_warning(monkeypatch, caplog):
    """A reward function that sleeps 30 s on a call: reward_timeout stops it with an error
    naming it; without a timeout, the default slow_call_warning (5 s) names it once. The 30 s
    are simulated: the module's clock is advanced instead of sleeping."""
    import time
    from types import SimpleNamespace

    from groupwise import GRPOConfig
    from groupwise.errors import ConfigError
    from groupwise.rewards import scoring
    from groupwise.wiring.rewards import ScorerOptions, build_scorer

    clock = [1000.0]
    monkeypatch.setattr(scoring, "time", SimpleNamespace(perf_counter=lambda: clock[0]))

    def sleeps_30_s(prompts, completions, **kwargs):
        clock[0] += 30.0
        return [1.0] * len(completions)

    def scorer(**options):
        config = GRPOConfig(**options)
        return build_scorer([sleeps_30_s], ScorerOptions.from_sections(config.sections())).combine

    assert GRPOConfig().slow_call_warning == scoring.SLOW_CALL_WARNING_S == 5.0
    with caplog.at_level(logging.WARNING, logger="groupwise.rewards"):
        scorer()(["p"], ["a"])
    assert _slow_warnings(caplog) == [
        "reward function 'sleeps_30_s' took 30.0 s on a batch of 1 completions (more than "
        "slow_call_warning=5 s); every step waits for it: make it faster, or set reward_timeout "
        "to stop a call that runs too long (logged once)"
    ]

    def really_sleeps(prompts, completions, **kwargs):
        time.sleep(30)
        return [1.0] * len(completions)

    monkeypatch.undo()
    start = time.perf_counter()
    with pytest.raises(RewardFunctionError, match=r"'really_sleeps' ran past reward_timeout=0.2"):
        options = ScorerOptions.from_sections(GRPOConfig(reward_timeout=0.2).sections())
        build_scorer([really_sleeps], options).combine(["p"], ["a"])
    assert time.perf_counter() - start < 5  # stopped at the timeout, not after 30 s
    with pytest.raises(ConfigError, match="slow_call_warning must be >= 0 seconds or null"):
        GRPOConfig(slow_call_warning=-1.0)
