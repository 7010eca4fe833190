"""benchmarks/curriculum_e10.py: the experiment's machinery (the parts' pools and labels, the
blocks and their units, the tiny end-to-end path with its evaluations). The experiment itself
takes hours on SmolLM2 and is not run here."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def e10() -> ModuleType:
    sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location("curriculum_e10", BENCH / "curriculum_e10.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["curriculum_e10"] = module
    spec.loader.exec_module(module)
    return module


def test_pools_and_labels_as_each_arm_sees_them(e10: ModuleType) -> None:
    labelled, learned = e10.PARTS["labelled"], e10.PARTS["learned"]
    exact = e10.pool_rows(labelled, "exact", 3)
    # The labelled part's pool is E9's, row for row.
    e9_rows = e10.e9.pool_rows(3, e10.e9.Setup())
    assert [r["expression"] for r in exact] == [r["expression"] for r in e9_rows]
    learnable = e10.pool_rows(labelled, "learnable", 3)
    assert len(learnable) == 32 and {r["difficulty"] for r in learnable} == {22}
    assert [r["expression"] for r in learnable] == [r["expression"] for r in exact
                                                    if r["difficulty"] == 22]  # fmt: skip
    none = e10.pool_rows(learned, "none", 3)
    assert len(none) == 32 and all("difficulty" not in r for r in none)
    true = e10.pool_rows(learned, "exact", 3)
    assert [r["difficulty"] for r in true] == [12] * 13 + [22] * 6 + [42] * 13
    assert [e10.digits_of(r) for r in none] == [1] * 13 + [2] * 6 + [4] * 13
    shuffled = e10.pool_rows(learned, "shuffled", 3)
    assert [r["expression"] for r in shuffled] == [r["expression"] for r in true]
    changed = [i for i, (a, b) in enumerate(zip(shuffled, true, strict=True)) if a["difficulty"] !=
               b["difficulty"]]  # fmt: skip
    assert 0 < len(changed) <= round(0.3 * 32)  # only the chosen 30% can move
    assert sorted(r["difficulty"] for r in shuffled) == sorted(r["difficulty"] for r in true)
    assert [r["difficulty"] for r in e10.pool_rows(learned, "shuffled", 3)] == [
        r["difficulty"] for r in shuffled]  # seeded
    assert [r["difficulty"] for r in e10.pool_rows(learned, "shuffled", 4)] != [
        r["difficulty"] for r in e10.pool_rows(learned, "exact", 4)]
    with pytest.raises(ValueError, match="unknown labels"):
        e10.pool_rows(learned, "noisy", 3)


def test_hypotheses_name_arms_of_their_part(e10: ModuleType) -> None:
    for part in e10.PARTS.values():
        assert all(c in part.arms and b in part.arms for c, b in part.hypotheses)
    assert len(e10.PARTS["labelled"].hypotheses) == 4
    assert len(e10.PARTS["learned"].hypotheses) == 5


def test_block_units_rotate_and_skip_done(e10: ModuleType) -> None:
    setup = e10.Setup()
    needed = {"labelled": {"select", "dapo"}, "learned": {"uniform", "select"}}
    groups = e10.block_units(setup, [1, 2], needed, {("learned", "select", 2)})
    assert groups == [
        [("labelled", "select", 1), ("labelled", "dapo", 1)],
        [("learned", "select", 1), ("learned", "uniform", 1)],
        [("labelled", "dapo", 2), ("labelled", "select", 2)],
        [("learned", "uniform", 2)],
    ]
    assert e10.blocks(setup) == [[1, 2, 3], [4, 5]]


@pytest.mark.slow
def test_tiny_runs_both_parts_end_to_end(e10: ModuleType, tmp_path) -> None:
    setup = e10.tiny()
    work, results = tmp_path / "work", tmp_path / "e10"
    e10.command_run(work, results, setup, jobs=1, unfrozen=True)
    meta = json.loads((results / "warm.json").read_text())
    assert meta["digest"] == "tiny-random" and meta["tokens_per_step"] == 128
    assert len(meta["pass_counts"]) == 2 and len(meta["sampled_one"]) == 4
    runs = e10.e9.read_runs(results)
    for r in runs:
        assert [p["mark"] for p in r["points"]] == list(e10.MARKS)
        assert all(p["seconds"] >= 0 for p in r["points"])
        assert max(r["pass_counts"]) <= 8 and len(r["pass_counts"]) == 2
        assert len(r["greedy_two"]) == 4 and len(r["sampled_one"]) == 4
        assert r["tokens"] >= r["budget"] == 256
    arms = {(r["part"], r["arm"]) for r in runs}
    assert ("labelled", "dapo") in arms and ("learned", "prompt_gdro") in arms
    out = json.loads((results / "analysis.json").read_text())
    assert set(out["parts"]) == {"labelled", "learned"}
    # Rerunning skips what is done.
    count = len(runs)
    e10.command_run(work, results, setup, jobs=1, unfrozen=True)
    assert len(e10.e9.read_runs(results)) == count
