"""One GRPO step as a reader follows it, traced on a real step of the tiny-random model: every
groupwise file whose code runs between the start of ``GRPOTrainer.train_step`` and the
optimizer's first step (a profiler hook over the whole call tree), and the step's route by
stage folder.

The route is the sequence of stages the trainer calls into (its own files, ``trainer/``, are the
spine that calls them); each stage's line lists the files that stage's calls run, in the order
they are first entered, below it included (``runtime/`` under the rollout engine, ``algo/``
under the policy's loss, ...). The route must follow the data flow (prompts -> curriculum ->
rollout -> rewards -> advantages -> loss -> optimizer) and re-enter a stage it has left at most
three times. docs/architecture.md prints the route; this test holds it to the trace.
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import FrameType
from typing import Any

import groupwise
from conftest import TargetToken, tiny_config
from groupwise import GRPOTrainer

SRC = str(Path(groupwise.__file__).resolve().parent) + "/"
ARCHITECTURE = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"
MAX_FILES = 16
MAX_REENTRIES = 3
ROWS = [{"prompt": f"Say something number {i}"} for i in range(16)]
DATA_FLOW = ["curriculum", "rollout", "rewards", "algo", "policy"]


def stage(path: str) -> str:
    """The stage folder of a groupwise file (a top-level module is its own stage)."""
    name = path.removeprefix(SRC)
    return name.split("/")[0] if "/" in name else name.removesuffix(".py")


def trace_step(trainer: GRPOTrainer) -> tuple[list[str], list[tuple[str, list[str]]]]:
    """The groupwise files the trainer's own code runs (``trainer/``), and the route: for each
    call of the trainer into another stage, that stage and the files its call tree entered,
    consecutive calls into the same stage merged. One ``train_step()``, up to the optimizer's
    first step."""
    spine: list[str] = []
    route: list[tuple[str, list[str]]] = []
    state: dict[str, Any] = {"root": None, "done": False}

    def entry_of(frame: FrameType) -> FrameType | None:
        """The outermost frame of another stage than the trainer's between ``frame`` and
        ``train_step`` (None: ``frame`` runs on the trainer's spine)."""
        entry = None
        while frame is not None and frame is not state["root"]:
            path = frame.f_code.co_filename
            if path.startswith(SRC) and stage(path) != "trainer":
                entry = frame
            frame = frame.f_back
        return entry

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event != "call" or state["done"]:
            return
        path = frame.f_code.co_filename
        if state["root"] is None:
            if frame.f_code.co_name == "train_step" and path.startswith(SRC):
                state["root"] = frame
                spine.append(path.removeprefix(SRC))
            return
        if frame.f_code.co_name == "step" and "/torch/optim/" in path:
            state["done"] = True  # the optimizer's first step: the walk ends here
            return
        if not path.startswith(SRC):
            return
        name = path.removeprefix(SRC)
        entry = entry_of(frame)
        if entry is None:
            if name not in spine:
                spine.append(name)
            return
        top = stage(entry.f_code.co_filename)
        if not route or route[-1][0] != top:
            route.append((top, []))
        if name not in route[-1][1]:
            route[-1][1].append(name)

    sys.setprofile(profile)
    try:
        trainer.train_step()
    finally:
        sys.setprofile(None)
    assert state["root"] is not None and state["done"], "the step was not traced to its end"
    return spine, route


def route_text(spine: list[str], route: list[tuple[str, list[str]]]) -> str:
    """The route as docs/architecture.md prints it."""
    lines = [f"GRPOTrainer.train_step   {', '.join(spine)}"]
    lines += [f"  -> {top + '/':<12} {', '.join(files)}" for top, files in route]
    return "\n".join(lines)


def documented_route() -> str:
    """The first fenced block after the "### One step's route" heading."""
    section = ARCHITECTURE.read_text(encoding="utf-8").split("### One step's route", 1)[1]
    return section.split("```", 2)[1].split("\n", 1)[1].rstrip("\n")


def reentries(stages: list[str]) -> list[str]:
    """The stages the route enters again after it had left them."""
    seen, again = set(), []
    for name in stages:
        if name in seen:
            again.append(name)
        seen.add(name)
    return again


def test_reentries_by_hand():
    assert reentries(["curriculum", "rollout", "curriculum", "policy"]) == ["curriculum"]
    assert reentries(["a", "b", "c"]) == []


def test_one_step_runs_few_files_and_follows_the_data_flow(tmp_path):
    args = tiny_config(tmp_path, beta=0.04, warn_kl_max=2.5, select_top_up_first=3)
    trainer = GRPOTrainer("tiny-random", TargetToken(), ROWS, args=args)
    # The parts were assembled from the config's sections (groupwise.build.assemble).
    options = trainer.options
    assert options == args.sections() and trainer.loss.options is options.loss
    assert trainer.monitor.thresholds.kl_max == 2.5 and trainer.top_up.first == 3
    assert trainer.prompts.prompts_per_rank == options.batch.prompts_per_step == 2
    spine, route = trace_step(trainer)
    text = route_text(spine, route)
    print(text)
    files = set(spine) | {name for _, names in route for name in names}
    assert len(files) <= MAX_FILES, f"{len(files)} files:\n{text}"
    stages = [top for top, _ in route]
    assert reentries(stages) == ["curriculum"], text  # the plan's row weights, after the loss
    assert len(reentries(stages)) <= MAX_REENTRIES
    # the data flow: each stage first entered after the one before it
    first = [stages.index(name) for name in DATA_FLOW]
    assert first == sorted(first), text
    # the reference's log-probs (beta > 0) ran before the optimizer step
    assert "policy/logprobs.py" in dict(route)["policy"] and "algo/grpo.py" in dict(route)["policy"]
    assert text == documented_route(), "docs/architecture.md's route differs from the trace"
