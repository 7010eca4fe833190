"""benchmarks/curriculum_e9.py: the experiment's machinery (pool, go/no-go, frozen code, the
blocks between looks, resuming, the tiny end-to-end path). The experiment itself takes hours on
SmolLM2 and is not run here."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def e9() -> ModuleType:
    sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location("curriculum_e9", BENCH / "curriculum_e9.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["curriculum_e9"] = module
    spec.loader.exec_module(module)
    return module


def test_pool_levels_sizes_and_seeds(e9: ModuleType) -> None:
    setup = e9.Setup()
    rows = e9.pool_rows(3, setup)
    levels = [row["difficulty"] for row in rows]
    assert levels == [12] * 80 + [22] * 32 + [42] * 80
    assert len({row["expression"] for row in rows}) == 192  # distinct problems
    assert all(float(row["answer"]) >= 0 and "+" in row["expression"] for row in rows)
    assert [r["expression"] for r in e9.pool_rows(3, setup)] == [r["expression"] for r in rows]
    assert [r["expression"] for r in e9.pool_rows(4, setup)] != [r["expression"] for r in rows]
    # The two- and four-digit pool never meets the held-out sets.
    sets = e9.eval_sets(setup)
    held_out = {r["expression"] for r in sets["two"] + sets["four"]}
    assert not held_out & {r["expression"] for r in rows if r["difficulty"] != 12}
    # The two-digit set is the earlier experiment's 128-problem set.
    assert [r["expression"] for r in sets["two"]] == [
        r["expression"] for r in e9.r8.eval_rows()[:128]
    ]
    assert len(sets["four"]) == 128 and {r["difficulty"] for r in sets["four"]} == {42}


def test_blocks_end_at_the_looks(e9: ModuleType) -> None:
    assert e9.blocks(e9.Setup()) == [list(range(1, 9)), list(range(9, 15)), list(range(15, 21))]
    assert e9.blocks(e9.tiny()) == [[1, 2], [3]]


def pilot_run(late: list[float], four: float) -> dict:
    points = [{"sampled": [1] * round(a * 100) + [0] * (100 - round(a * 100))} for a in late]
    return {"points": points, "sampled_four": [1] * round(four * 100) + [0] * (100 - round(
        four * 100))}  # fmt: skip


def test_go_no_go_every_check(e9: ModuleType) -> None:
    levels = {"1-digit": 0.95, "2-digit": 0.25, "4-digit": 0.0}
    meta = {"sampled_accuracy": 0.25}
    good = pilot_run([0.30, 0.36, 0.38, 0.36], 0.01)  # last three average 0.3667: rise 0.1167
    go = e9.go_no_go(levels, 3.5, good, meta)
    assert go["proceed"] and go["uniform_two_digit_rise"]["value"] == pytest.approx(0.36667 - 0.25,
                                                                                       abs=1e-4)
    failing = [
        ({**levels, "1-digit": 0.89}, 3.5, good, "one_digit_pass_rate"),
        ({**levels, "4-digit": 0.03}, 3.5, good, "four_digit_pass_rate"),
        ({**levels, "2-digit": 0.46}, 3.5, good, "two_digit_pass_rate"),
        ({**levels, "2-digit": 0.14}, 3.5, good, "two_digit_pass_rate"),
        (levels, 2.9, good, "best_quarter_ratio"),
        (levels, 3.5, pilot_run([0.3, 0.34, 0.34, 0.34], 0.01), "uniform_two_digit_rise"),
        (levels, 3.5, pilot_run([0.3, 0.36, 0.38, 0.36], 0.06), "uniform_four_digit_at_budget"),
    ]
    for lv, ceiling, run, check in failing:
        got = e9.go_no_go(lv, ceiling, run, meta)
        assert not got["proceed"] and not got[check]["holds"], check
        assert sum(not c["holds"] for k, c in got.items() if k != "proceed") == 1


def test_the_experiment_runs_only_from_its_frozen_code(e9: ModuleType, tmp_path, monkeypatch):
    state = {"commit": "a" * 40, "dirty": False, "groupwise": "x", "own_src": True}
    monkeypatch.setattr(e9, "code_state", lambda: dict(state))
    with pytest.raises(SystemExit, match="freeze the code first"):
        e9.check_frozen(tmp_path, unfrozen=False)
    calls = []
    monkeypatch.setattr(e9, "git", lambda *args, **kw: calls.append(args) or "")
    e9.command_freeze(tmp_path, tmp_path / "tree")
    frozen = json.loads((tmp_path / "frozen.json").read_text())
    assert frozen["commit"] == "a" * 40
    assert calls == [("worktree", "add", "--detach", str((tmp_path / "tree").resolve()),
                      "a" * 40)]  # fmt: skip
    assert e9.check_frozen(tmp_path, unfrozen=False)["commit"] == "a" * 40
    for change, message in (({"commit": "b" * 40}, "the experiment's at aaaaaaaaaa"),
                            ({"dirty": True}, "local changes"),
                            ({"own_src": False}, "PYTHONPATH=src")):  # fmt: skip
        state_now = {**state, **change}
        monkeypatch.setattr(e9, "code_state", lambda s=state_now: dict(s))
        with pytest.raises(SystemExit, match=message):
            e9.check_frozen(tmp_path, unfrozen=False)
    # Freezing again keeps the first record.
    e9.command_freeze(tmp_path, tmp_path / "other")
    assert json.loads((tmp_path / "frozen.json").read_text())["commit"] == "a" * 40


def test_code_state_reads_this_checkout(e9: ModuleType) -> None:
    state = e9.code_state()
    assert len(state["commit"]) == 40 and isinstance(state["dirty"], bool)


def synthetic_record(arm: str, seed: int, gain: float, gaining: tuple[str, ...] = ("select",)
                     ) -> dict:  # fmt: skip
    rng = np.random.default_rng(seed)
    accs = [min(1.0, 0.3 + 0.02 * k + (gain if arm in gaining else 0.0)
                + 0.01 * rng.normal()) for k in range(10)]  # fmt: skip
    return {"arm": arm, "seed": seed, "warm": "w", "budget": 100,
            "informative_per_rollout": 0.2 if arm == "select" else 0.1,
            "points": [{"mark": (k + 1) / 10, "tokens": 10 * (k + 1),
                        "sampled": [1] * round(a * 128) + [0] * (128 - round(a * 128))}
                       for k, a in enumerate(accs)]}  # fmt: skip


def fake_experiment(e9, tmp_path, monkeypatch, gaining: tuple[str, ...]) -> list:
    """A go pilot and a warm start in ``tmp_path``, and ``run_arm`` replaced by synthetic
    records (the ``gaining`` arms 0.05 ahead of uniform); returns the list of (arm, seed) run."""
    (tmp_path / "pilot.json").write_text(json.dumps({"go": {"proceed": True}}))
    (tmp_path / "warm.json").write_text(json.dumps({"supervised": {"digest": "w"},
                                                    "tokens_per_step": 10.0,
                                                    "sampled_accuracy": 0.3}))  # fmt: skip
    ran = []

    def fake_run_arm(arm, seed, model_path, meta, setup, code):
        ran.append((arm, seed))
        return synthetic_record(arm, seed, 0.05, gaining=gaining)

    monkeypatch.setattr(e9, "run_arm", fake_run_arm)
    monkeypatch.setattr(e9, "warm_start", lambda work, results, setup: (
        "m", json.loads((tmp_path / "warm.json").read_text())))  # fmt: skip
    monkeypatch.setattr(e9, "check_frozen", lambda results, unfrozen: {"commit": "c"})
    return ran


def test_run_goes_by_blocks_stops_decided_curricula_and_resumes(e9, tmp_path, monkeypatch,
                                                                capsys):  # fmt: skip
    # Synthetic runs: select 0.05 ahead in every seed (pays at the first look, 2 seeds in the
    # tiny setup); Rollout-GDRO exactly uniform (runs on to the last look).
    ran = fake_experiment(e9, tmp_path, monkeypatch, gaining=("select",))
    setup = e9.tiny()
    e9.command_run(tmp_path, tmp_path, setup, jobs=1, unfrozen=True, force=False)
    assert ran == [(a, s) for s in (1, 2) for a in ("uniform", "select", "rollout_gdro_level")] + [
        ("uniform", 3), ("rollout_gdro_level", 3)]  # select stopped at the first look
    analysis = json.loads((tmp_path / "analysis.json").read_text())
    assert analysis["curricula"]["select"]["state"] == "pays"
    assert analysis["curricula"]["select"]["look"] == 2
    assert analysis["curricula"]["rollout_gdro_level"]["look"] == 3
    implied = analysis["curricula"]["select"]["implied_speedup"]
    assert implied["low"] <= implied["estimate"] <= implied["high"]
    assert "implied token speed-up" in capsys.readouterr().out
    assert e9.speedup_text(0.0) == "never reached" and e9.speedup_text(1.234) == "1.23x"
    # Resumed: nothing left to run.
    ran.clear()
    e9.command_run(tmp_path, tmp_path, setup, jobs=1, unfrozen=True, force=False)
    assert ran == []
    assert len(e9.read_runs(tmp_path)) == 8


def test_run_reports_when_every_curriculum_is_decided(e9, tmp_path, monkeypatch, capsys):
    # Both curricula 0.05 ahead in every seed: both pay at the first look (2 seeds in the tiny
    # setup), nothing more runs, and the analysis is still written and printed.
    ran = fake_experiment(e9, tmp_path, monkeypatch, gaining=("select", "rollout_gdro_level"))
    e9.command_run(tmp_path, tmp_path, e9.tiny(), jobs=1, unfrozen=True, force=False)
    assert ran == [(a, s) for s in (1, 2) for a in ("uniform", "select", "rollout_gdro_level")]
    out = capsys.readouterr().out
    assert "every curriculum is decided" in out and "rollout_gdro_level: pays at 2 seeds" in out
    analysis = json.loads((tmp_path / "analysis.json").read_text())
    assert {c: analysis["curricula"][c]["state"] for c in ("select", "rollout_gdro_level")} == {
        "select": "pays", "rollout_gdro_level": "pays"}


def test_run_stops_without_a_claim_when_the_spread_is_too_large(e9, tmp_path, monkeypatch,
                                                                capsys):  # fmt: skip
    # select 0.3 ahead: the blinded spread at the first look (arms pooled) is above 1.5 x 0.07.
    (tmp_path / "pilot.json").write_text(json.dumps({"go": {"proceed": True}}))
    meta = {"supervised": {"digest": "w"}, "tokens_per_step": 10.0, "sampled_accuracy": 0.3}
    ran = []
    monkeypatch.setattr(e9, "run_arm", lambda arm, seed, *a: ran.append((arm, seed))
                        or synthetic_record(arm, seed, 0.3))  # fmt: skip
    monkeypatch.setattr(e9, "warm_start", lambda work, results, setup: ("m", meta))
    monkeypatch.setattr(e9, "check_frozen", lambda results, unfrozen: {"commit": "c"})
    e9.command_run(tmp_path, tmp_path, e9.tiny(), jobs=1, unfrozen=True, force=False)
    assert {s for _, s in ran} == {1, 2}
    assert "stopped without a claim" in capsys.readouterr().out


def test_run_refuses_without_a_go(e9, tmp_path, monkeypatch):
    monkeypatch.setattr(e9, "check_frozen", lambda results, unfrozen: {"commit": "c"})
    with pytest.raises(SystemExit, match="run the pilot first"):
        e9.command_run(tmp_path, tmp_path, e9.tiny(), 1, True, False)
    (tmp_path / "pilot.json").write_text(json.dumps({"go": {"proceed": False}}))
    with pytest.raises(SystemExit, match="no-go"):
        e9.command_run(tmp_path, tmp_path, e9.tiny(), 1, True, False)


def test_tiny_pilot_and_every_arm_end_to_end(e9, tmp_path) -> None:
    results, work = tmp_path / "e9", tmp_path / "work"
    setup = e9.tiny()
    pilot = e9.command_pilot(work, results, setup, unfrozen=True)
    assert set(pilot["go"]) >= {"one_digit_pass_rate", "uniform_two_digit_rise", "proceed"}
    assert len(pilot["pass_counts"]) == 6
    assert json.loads((results / "pilot.json").read_text())["go"] == pilot["go"]
    meta = json.loads((results / "warm.json").read_text())
    assert meta["tokens_per_step"] == 128 and len(meta["sampled"]) == 4
    code = e9.code_state()
    for arm in ("select", "rollout_gdro_level"):
        record = e9.run_arm(arm, 1, "tiny-random", meta, setup, code)
        assert record["tokens"] >= record["budget"] == 256
        assert [p["mark"] for p in record["points"]] == list(e9.MARKS)
        assert all(len(p["sampled"]) == 4 for p in record["points"])
        assert len(record["greedy_two"]) == 4 and len(record["sampled_four"]) == 2
        assert record["commit"] == code["commit"]
        assert {d for step in record["groups"] for d, _, _ in step} <= {1, 2, 4}
        # The analysis reads it: a step that crosses two marks evaluates twice at its tokens.
        value = e9.analysis.endpoint(record, meta["sampled_accuracy"])
        assert 0.0 <= value <= 1.0


@pytest.mark.slow
def test_phase_times_split_each_arm_into_generation_and_update(e9, tmp_path) -> None:
    work, results = tmp_path / "work", tmp_path / "results"
    results.mkdir()
    out = e9.phase_times(work, results, e9.tiny(), seed=1, steps=3)
    assert [r["arm"] for r in out] == ["uniform", "select", "rollout_gdro_level"]
    for r in out:
        assert r["steps"] == 2 and r["tokens"] > 0  # the first step is not timed
        parts = r["generation_s_per_1k_tokens"] + r["update_s_per_1k_tokens"]
        assert 0 < parts <= r["step_s_per_1k_tokens"] * (1 + 1e-9)


def test_measure_and_two_jobs_in_worker_processes(e9, tmp_path) -> None:
    results, work = tmp_path / "e9", tmp_path / "work"
    setup = e9.tiny()
    out = e9.command_measure(work, results, setup, steps=2, unfrozen=True)
    assert [r["threads"] for r in out["one_thread_side_by_side"]] == [1, 1]
    assert out["two_threads"]["threads"] == 2
    assert out["throughput_ratio"] == pytest.approx(
        sum(r["steps_per_second"] for r in out["one_thread_side_by_side"])
        / out["two_threads"]["steps_per_second"]
    )
    meta = json.loads((results / "warm.json").read_text())
    e9.run_units([("uniform", 1), ("select", 2)], work, results, setup, 2, True, True,
                 "tiny-random", meta, {"commit": "c"})  # fmt: skip
    runs = e9.read_runs(results)
    assert sorted((r["arm"], r["seed"], r["threads"]) for r in runs) == [
        ("select", 2, 1), ("uniform", 1, 1)]
