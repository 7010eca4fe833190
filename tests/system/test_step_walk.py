"""One GRPO step as a reader follows it, traced on a real step of the tiny-random model with a
profiler hook over the whole call tree, from the start of ``GRPOTrainer.train_step`` to the
optimizer's first step:

- the route: the stages the trainer calls into, each with the files its call tree runs; it
  follows the data flow (prompts -> curriculum -> rollout -> rewards -> advantages -> loss ->
  optimizer) without entering a stage twice, and docs/architecture.md prints it;
- the calls that climb: a call from a file into a file that imports it, directly or through
  others (the callee sits above the caller in the import order). Only the few that
  docs/architecture.md declares, each with its reason, may happen.
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import FrameType
from typing import Any

import pytest
from test_layout import GRAPH, module_name

import groupwise
from conftest import SELECT_ROWS, TargetToken, tiny_config
from groupwise import GRPOTrainer

SRC = str(Path(groupwise.__file__).resolve().parent) + "/"
ARCHITECTURE = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"
MAX_CLIMBS = 3
ROWS = [{"prompt": f"Say something number {i}"} for i in range(16)]
DATA_FLOW = ["curriculum", "rollout", "rewards", "algo", "policy"]


def stage(path: str) -> str:
    """The stage folder of a groupwise file (a top-level module is its own stage)."""
    name = path.removeprefix(SRC)
    return name.split("/")[0] if "/" in name else name.removesuffix(".py")


def imported_by(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """module -> every module it imports, directly or through others."""
    closure: dict[str, set[str]] = {}

    def below(module: str) -> set[str]:
        if module not in closure:
            closure[module] = set()
            for imported in graph.get(module, ()):
                closure[module] |= {imported} | below(imported)
        return closure[module]

    for module in graph:
        below(module)
    return closure


BELOW = imported_by(GRAPH)


def function_name(frame: FrameType) -> str:
    """``module:qualified.name`` of the code a frame runs."""
    return f"{module_name(Path(frame.f_code.co_filename))}:{frame.f_code.co_qualname}"


class StepTrace:
    """What one ``train_step()`` ran, up to the optimizer's first step: the files of the
    trainer's own spine, the route by stage, and the calls that climb (caller -> callee, with
    how often)."""

    def __init__(self, trainer: GRPOTrainer) -> None:
        self.spine: list[str] = []
        self.route: list[tuple[str, list[str]]] = []
        self.climbs: dict[tuple[str, str], int] = {}
        self.root: FrameType | None = None
        self.done = False
        sys.setprofile(self.profile)
        try:
            trainer.train_step()
        finally:
            sys.setprofile(None)
        assert self.root is not None and self.done, "the step was not traced to its end"

    def entry_of(self, frame: FrameType) -> FrameType | None:
        """The outermost frame of another stage than the trainer's between ``frame`` and
        ``train_step`` (None: ``frame`` runs on the trainer's spine)."""
        entry = None
        while frame is not None and frame is not self.root:
            path = frame.f_code.co_filename
            if path.startswith(SRC) and stage(path) != "trainer":
                entry = frame
            frame = frame.f_back
        return entry

    def profile(self, frame: FrameType, event: str, arg: Any) -> None:
        if event != "call" or self.done:
            return
        path = frame.f_code.co_filename
        if self.root is None:
            if frame.f_code.co_name == "train_step" and path.startswith(SRC):
                self.root = frame
                self.spine.append(path.removeprefix(SRC))
            return
        if frame.f_code.co_name == "step" and "/torch/optim/" in path:
            self.done = True  # the optimizer's first step: the walk ends here
            return
        if not path.startswith(SRC):
            return
        self.note_climb(frame)
        name = path.removeprefix(SRC)
        entry = self.entry_of(frame)
        if entry is None:
            if name not in self.spine:
                self.spine.append(name)
            return
        top = stage(entry.f_code.co_filename)
        if not self.route or self.route[-1][0] != top:
            self.route.append((top, []))
        if name not in self.route[-1][1]:
            self.route[-1][1].append(name)

    def note_climb(self, frame: FrameType) -> None:
        """Record the call if the nearest groupwise caller's file is imported by the callee's
        (frames of torch, contextlib, ... in between are looked through: a ``with`` block's
        generator or a module's ``forward`` is still the groupwise caller's call)."""
        caller = frame.f_back
        while caller is not None and not caller.f_code.co_filename.startswith(SRC):
            caller = caller.f_back
        if caller is None:
            return
        callee_module = module_name(Path(frame.f_code.co_filename))
        caller_module = module_name(Path(caller.f_code.co_filename))
        if callee_module != caller_module and caller_module in BELOW.get(callee_module, ()):
            key = (function_name(caller), function_name(frame))
            self.climbs[key] = self.climbs.get(key, 0) + 1

    @property
    def route_text(self) -> str:
        """The route as docs/architecture.md prints it."""
        lines = [f"GRPOTrainer.train_step   {', '.join(self.spine)}"]
        lines += [f"  -> {top + '/':<12} {', '.join(files)}" for top, files in self.route]
        return "\n".join(lines)

    @property
    def files(self) -> set[str]:
        return set(self.spine) | {name for _, names in self.route for name in names}


def fenced_block(heading: str) -> str:
    """The first fenced block after ``heading`` in docs/architecture.md."""
    section = ARCHITECTURE.read_text(encoding="utf-8").split(heading, 1)[1]
    return section.split("```", 2)[1].split("\n", 1)[1].rstrip("\n")


def declared_climbs(block: int = 0) -> set[tuple[str, str]]:
    """The calls that climb docs/architecture.md allows, ``caller -> callee`` one a line: block
    0, a default step's; block 1, those optional features add."""
    section = ARCHITECTURE.read_text(encoding="utf-8").split("### Calls that climb", 1)[1]
    section = section.split("\n### ", 1)[0]
    text = section.split("```text\n")[block + 1].split("```", 1)[0]
    pairs = set()
    for line in text.strip().splitlines():
        caller, callee = (part.strip() for part in line.split("->"))
        pairs.add((caller, callee))
    return pairs


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


def test_imported_by_follows_chains_and_cycles_by_hand():
    graph = {"a": {"b"}, "b": {"c"}, "c": set(), "d": {"a", "d"}}
    assert imported_by(graph) == {"a": {"b", "c"}, "b": {"c"}, "c": set(),
                                  "d": {"a", "b", "c", "d"}}  # fmt: skip


def test_one_step_follows_the_data_flow_and_the_documented_route(tmp_path):
    args = tiny_config(tmp_path, beta=0.04, warn_kl_max=2.5, select_top_up_first=3)
    trainer = GRPOTrainer("tiny-random", TargetToken(), ROWS, args=args)
    # The parts were assembled from the config's sections (groupwise.wiring.assemble).
    options = trainer.options
    assert options == args.sections() and trainer.loss.options is options.loss
    assert trainer.monitor.thresholds.kl_max == 2.5 and trainer.top_up.first == 3
    assert trainer.prompts.prompts_per_rank == options.batch.prompts_per_step == 2
    trace = StepTrace(trainer)
    text = trace.route_text
    print(f"{len(trace.files)} files\n{text}")
    stages = [top for top, _ in trace.route]
    assert reentries(stages) == [], text  # the curriculum plans before and observes after
    # the data flow: each stage first entered after the one before it
    first = [stages.index(name) for name in DATA_FLOW]
    assert first == sorted(first), text
    # the reference's log-probs (beta > 0) ran before the optimizer step
    policy_files = dict(trace.route)["policy"]
    assert "policy/logprobs.py" in policy_files and "algo/grpo.py" in policy_files, text
    assert text == fenced_block("### One step's route"), "docs/architecture.md's route differs"


STEPS = {
    "default": {},
    "rollout_gdro + dapo + mu 2 + mini-batches": dict(
        curriculum="rollout_gdro", loss_type="dapo", num_iterations=2, steps_per_generation=2,
        per_device_train_batch_size=4, gradient_accumulation_steps=1,
    ),  # fmt: skip
}


@pytest.mark.parametrize("overrides", STEPS.values(), ids=STEPS.keys())
def test_a_step_calls_up_only_where_docs_declare_it(tmp_path, overrides):
    """Calls that climb, counted over the whole call tree of one step: at most the few that
    docs/architecture.md lists with their reasons."""
    args = tiny_config(tmp_path, beta=0.04, **overrides)
    trace = StepTrace(GRPOTrainer("tiny-random", TargetToken(), ROWS, args=args))
    found = "\n".join(f"  {n} x {a} -> {b}" for (a, b), n in sorted(trace.climbs.items()))
    print(f"calls that climb:\n{found}")
    declared = declared_climbs()
    assert len(declared) <= MAX_CLIMBS, declared
    assert set(trace.climbs) <= declared, f"undeclared calls that climb:\n{found}"


FEATURE_STEPS = {
    "dynamic sampling": dict(dynamic_sampling=True),
    "select + top-up": dict(curriculum="select", rollout_min=2, rollout_max=8,
                            select_top_up=True),  # fmt: skip
}


@pytest.mark.parametrize("overrides", FEATURE_STEPS.values(), ids=FEATURE_STEPS.keys())
def test_optional_features_call_up_only_where_docs_declare_it(tmp_path, overrides):
    args = tiny_config(tmp_path, beta=0.04, **overrides)
    trace = StepTrace(GRPOTrainer("tiny-random", TargetToken(), SELECT_ROWS, args=args))
    found = "\n".join(f"  {n} x {a} -> {b}" for (a, b), n in sorted(trace.climbs.items()))
    print(f"calls that climb:\n{found}")
    assert set(trace.climbs) <= declared_climbs(0) | declared_climbs(1), found


def test_every_declared_climb_happens(tmp_path):
    """No stale line in the docs: each declared call that climbs is made by one of the traced
    steps."""
    seen: set[tuple[str, str]] = set()
    for name, overrides in {**STEPS, **FEATURE_STEPS}.items():
        args = tiny_config(tmp_path / name.replace(" ", "_"), beta=0.04, **overrides)
        seen |= set(StepTrace(GRPOTrainer("tiny-random", TargetToken(), SELECT_ROWS,
                                          args=args)).climbs)  # fmt: skip
    assert declared_climbs(0) | declared_climbs(1) <= seen


def test_the_docs_declare_each_climb_once_and_few_for_the_default_step():
    default, features = declared_climbs(0), declared_climbs(1)
    assert 0 < len(default) <= MAX_CLIMBS and features and not default & features


def code_in(path: str, source: str, name: str, **names: Any):
    """Function ``name`` of ``source``, compiled as if it stood in groupwise file ``path`` (so
    the profiler sees its frames there)."""
    namespace: dict[str, Any] = dict(names)
    exec(compile(source, SRC + path, "exec"), namespace)
    return namespace[name]


def test_the_climb_detector_sees_a_callback_into_the_trainer(tmp_path, monkeypatch):
    """A control: the scorer calling a function of the trainer's file (as a lambda the trainer
    patched into it would) is a call into a file above the scorer's, and the trace reports it;
    the test's own frames in between are looked through."""
    trainer = GRPOTrainer("tiny-random", TargetToken(), ROWS, args=tiny_config(tmp_path))
    callback = code_in("trainer/grpo.py", "def callback():\n    return trainer.global_step\n",
                       "callback", trainer=trainer)  # fmt: skip
    real_call = type(trainer.scorer).__call__
    calling_back = code_in(
        "rewards/scoring.py",
        "def calling_back(self, rows, rollout):\n"
        "    relay()\n"
        "    return real(self, rows, rollout)\n",
        "calling_back", relay=lambda: callback(), real=real_call,
    )  # fmt: skip
    monkeypatch.setattr(type(trainer.scorer), "__call__", calling_back)
    trace = StepTrace(trainer)
    assert ("rewards.scoring:calling_back", "trainer.grpo:callback") in trace.climbs, trace.climbs
