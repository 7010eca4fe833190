"""What a reader walks through when reading ``GRPOTrainer.train_step``: the groupwise source
files it enters directly, traced on one real step of the tiny-random model.

A file counts when one of its functions is called from ``train_step`` itself or from a helper
of the trainer reached from it without leaving the trainer (``draw`` and the base ``Trainer``'s
own methods: the trainer's files are ``trainer.py`` and ``run/__init__.py``). What those files
call in turn is theirs to explain, so it is not counted. The walk must stay short and linear:
prompts -> curriculum -> engine -> scorer -> advantages -> update (with the loss) -> metrics,
each file entered once, never re-entered after the walk moved on to another, except the
curriculum, which plans the step before generation and observes its outcome after the update
(GDRO's plan/observe bracket, as in the paper's algorithm).
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import FrameType
from typing import Any

import groupwise
from conftest import TargetToken, tiny_config
from groupwise import GRPOTrainer

SRC = Path(groupwise.__file__).resolve().parent
TRAINER_FILES = {str(SRC / "trainer.py"), str(SRC / "run" / "__init__.py")}
MAX_FILES = 8  # besides the trainer's own
ROWS = [{"prompt": f"Say something number {i}"} for i in range(16)]


def step_walk(trainer: GRPOTrainer) -> list[str]:
    """The groupwise files entered directly from one ``trainer.train_step()``, in order, each
    consecutive run of calls into the same file written once (paths relative to the package)."""
    root: list[FrameType] = []
    walk: list[str] = []
    src = str(SRC)

    def on_trainer_path(frame: FrameType | None) -> bool:
        # Every frame from the caller up to train_step is the trainer's own.
        while frame is not None:
            if frame.f_code.co_filename not in TRAINER_FILES:
                return False
            if root and frame is root[0]:
                return True
            frame = frame.f_back
        return False

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event != "call":
            return
        code = frame.f_code
        if not root:
            if code.co_name == "train_step" and code.co_filename in TRAINER_FILES:
                root.append(frame)
            return
        path = code.co_filename
        if not path.startswith(src) or path in TRAINER_FILES:
            return
        if on_trainer_path(frame.f_back):
            name = str(Path(path).relative_to(SRC))
            if not walk or walk[-1] != name:
                walk.append(name)

    sys.setprofile(profile)
    try:
        trainer.train_step()
    finally:
        sys.setprofile(None)
    assert root, "train_step was not traced"
    return walk


def test_train_step_walks_few_files_once_each(tmp_path):
    """The step's walk is at most MAX_FILES files besides the trainer's, none re-entered."""
    args = tiny_config(tmp_path, warn_kl_max=2.5, select_top_up_first=3)
    trainer = GRPOTrainer("tiny-random", TargetToken(), ROWS, args=args)
    # The parts were assembled from the config's sections (groupwise.build.assemble).
    options = trainer.options
    assert options == args.sections() and trainer.loss.options is options.loss
    assert trainer.monitor.thresholds.kl_max == 2.5 and trainer.top_up.first == 3
    assert trainer.prompts.prompts_per_rank == options.batch.prompts_per_step == 2
    walk = step_walk(trainer)
    # the curriculum: its plan right after the prompts, its observe last before the metrics
    at = [i for i, name in enumerate(walk) if name.startswith("curriculum/")]
    assert at == [1, len(walk) - 2], f"the curriculum plans and observes once each: {walk}"
    revisited = sorted({n for n in walk if walk.count(n) > 1 and not n.startswith("curriculum/")})
    assert revisited == [], f"re-entered after leaving: {revisited} in {walk}"
    assert len(set(walk)) <= MAX_FILES, f"{len(set(walk))} files: {walk}"
