"""benchmarks/curriculum_e9_retime.py: the re-timing of E9's arms (units and their rotation,
resuming, the phase arithmetic and the paired ratio, the tiny end-to-end path)."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def retime() -> ModuleType:
    sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location("curriculum_e9_retime",
                                                  BENCH / "curriculum_e9_retime.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["curriculum_e9_retime"] = module
    spec.loader.exec_module(module)
    return module


def test_units_rotate_the_arms_seed_by_seed(retime: ModuleType) -> None:
    u, s, r = "uniform", "select", "rollout_gdro_level"
    assert retime.units(3) == [(s, 1), (r, 1), (u, 1), (r, 2), (u, 2), (s, 2),
                               (u, 3), (s, 3), (r, 3)]  # fmt: skip


def record(arm: str, seed: int, steps: list[list[float]], groups=None) -> dict:
    return {"arm": arm, "seed": seed, "phase_names": ["tokens", "generation", "scoring",
            "update", "planning", "step"], "phases": steps,
            "groups": groups or [[[2, 4, 1]] * 4], "rollouts": 16 * len(steps),
            "tokens": sum(s[0] for s in steps),
            "step_seconds": sum(s[-1] for s in steps)}  # fmt: skip


def test_seconds_per_token_ratio_and_equal_groups_by_hand(retime: ModuleType) -> None:
    # Two steps of 500 and 1500 tokens: step seconds 10 + 30 = 40 over 2,000 tokens.
    a = record("uniform", 1, [[500, 4, 0, 5, 0, 10], [1500, 12, 0, 15, 0, 30]])
    assert retime.seconds_per_1k(a) == pytest.approx(20.0)
    assert retime.seconds_per_1k(a, "generation") == pytest.approx(8.0)
    b = record("select", 1, [[1000, 1, 0, 1, 0, 30]],
               groups=[[[2, 4, 1], [2, 4, 0]], [[2, 6, 1], [2, 2, 0]]])
    assert retime.equal_group_share(b, 4) == 0.5
    # Ratios 1.5 and 1.2 at seeds 1 and 2: the geometric mean sqrt(1.8), a t interval on logs.
    c = record("uniform", 2, [[1000, 1, 0, 1, 0, 10]])
    d = record("select", 2, [[1000, 1, 0, 1, 0, 12]])
    out = retime.analyse([a, b, c, d], 4)
    step = out["ratios"]["select"]["step"]
    assert step["ratio"] == pytest.approx(math.sqrt(1.5 * 1.2))
    assert step["per_seed"] == pytest.approx([1.5, 1.2])
    half = 12.706204736 * abs(math.log(1.5) - math.log(1.2)) / math.sqrt(2) / math.sqrt(2)
    assert step["low"] == pytest.approx(math.sqrt(1.8) * math.exp(-half))
    assert step["high"] == pytest.approx(math.sqrt(1.8) * math.exp(half))
    assert out["arms"]["uniform"]["step_s_per_1k_tokens"] == pytest.approx((20.0 + 10.0) / 2)
    assert "rollout_gdro_level" not in out["ratios"]
    # Per completion (16 a step): uniform seed 1 40 s / 32, select seed 1 30 s / 16.
    assert out["ratios"]["select"]["step_per_rollout"]["per_seed"][0] == pytest.approx(
        (30 / 16) / (40 / 32))
    assert out["arms"]["uniform"]["completion_length"] == pytest.approx((2000 / 32 + 1000 / 16)
                                                                        / 2)


def test_tiny_runs_every_arm_resumes_and_reports(retime: ModuleType, tmp_path) -> None:
    e9 = retime.e9
    setup = e9.tiny()
    work, e9_results, results = tmp_path / "work", tmp_path / "e9", tmp_path / "retime"
    e9.warm_start(work, e9_results, setup)  # E9's warm.json: the budget unit
    retime.command_run(work, e9_results, results, setup, seeds=1, jobs=1, unfrozen=True)
    runs = e9.read_runs(results)
    assert sorted(r["arm"] for r in runs) == sorted(retime.ARMS)
    meta = json.loads((results / "warm.json").read_text())
    assert meta["tokens_per_step"] == 128 and meta["e9_digest"] == "tiny-random"
    for r in runs:
        assert r["points"] == [] and "greedy_two" not in r  # no evaluation
        assert r["tokens"] >= r["budget"] == 256
        assert len(r["phases"]) == r["optimizer_steps"] and r["phase_names"][0] == "tokens"
        assert sum(step[0] for step in r["phases"]) == r["tokens"]
        assert all(0 < step[-1] and step[1] + step[3] <= step[-1] for step in r["phases"])
    retime.command_run(work, e9_results, results, setup, seeds=1, jobs=1, unfrozen=True)
    assert len(e9.read_runs(results)) == 3  # resumed: nothing re-run
    out = retime.report(results)
    assert set(out["ratios"]) == set(e9.CURRICULA)
    assert json.loads((results / "analysis.json").read_text())["ratios"].keys() == out[
        "ratios"].keys()  # fmt: skip
