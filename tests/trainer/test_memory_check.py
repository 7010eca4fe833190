"""The memory plan against the GPU: a warning before the model loads, and a step that runs out of
memory explained (its phase, the plan, the settings that fit) with the last checkpoint intact.
The GPU's memory is faked (``memory_check.device_memory``), so these run on the CPU."""

import warnings

import pytest
import torch

from conftest import tiny_config
from groupwise import GRPOTrainer
from groupwise.policy import update
from groupwise.trainer import checkpoints as ckpt
from groupwise.trainer import memory_check
from groupwise.wiring import assemble

ROWS = [{"prompt": f"Add {i} and {i + 1}.", "answer": str(2 * i + 1)} for i in range(12)]
CUDA_MESSAGE = "CUDA out of memory. Tried to allocate 2.00 GiB"


def _reward(completions, answer, **kwargs):
    return [float(a in c) for c, a in zip(completions, answer, strict=True)]


def _gpu_of(monkeypatch, size: int) -> None:
    monkeypatch.setattr(memory_check, "device_memory", lambda device: size)


class Loaded(Exception):
    """Raised by the fake model loader: the run got as far as loading the weights."""


def _gpu_under_its_plan(monkeypatch, args) -> int:
    """Fake a GPU one byte smaller than the plan of ``args``: this run does not fit it, and the
    planner's fit table has settings that do (LoRA's peak is far lower)."""
    size = memory_check.plan_run(args, "tiny-random", 80 * 2**30).peak - 1
    _gpu_of(monkeypatch, size)
    return size


def test_a_plan_over_the_gpu_warns_before_the_model_loads(tmp_path, monkeypatch):
    args = tiny_config(tmp_path)
    size = _gpu_under_its_plan(monkeypatch, args)
    said_before_loading: list[str] = []

    def load(*args, **kwargs):
        fit = [w for w in caught if w.category is memory_check.MemoryFitWarning]
        said_before_loading.extend(str(w.message) for w in fit)
        raise Loaded

    monkeypatch.setattr(assemble, "build_model", load)
    with warnings.catch_warnings(record=True) as caught, pytest.raises(Loaded):
        warnings.simplefilter("always")
        GRPOTrainer("tiny-random", _reward, ROWS, args=args)
    (message,) = said_before_loading  # once, before the loader ran
    device = memory_check.human(size)
    assert f"the memory plan of this run peaks at {memory_check.human(size + 1)}" in message
    assert f"over this GPU's {device} ({size / 2**30:.1f} GiB)" in message
    assert f"Settings that fit {device} by the plan:" in message
    assert "use_peft=True" in message  # LoRA's adapter instead of every weight's gradient


def test_no_check_on_the_cpu_or_off_the_main_process(tmp_path, monkeypatch):
    def plan(*args):
        raise AssertionError("planned")

    monkeypatch.setattr(memory_check, "plan_run", plan)
    args = tiny_config(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        memory_check.check_before_load(args, "tiny-random", True, torch.device("cpu"))
        _gpu_of(monkeypatch, 2**30)
        memory_check.check_before_load(args, "tiny-random", False, torch.device("cuda"))


def test_a_plan_under_the_gpu_says_nothing(tmp_path, monkeypatch):
    _gpu_of(monkeypatch, 80 * 2**30)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        memory_check.check_before_load(tmp_config := tiny_config(tmp_path), "tiny-random", True,
                                       torch.device("cuda"))  # fmt: skip
    assert memory_check.plan_run(tmp_config, "tiny-random", 80 * 2**30).fits


def _trainer_over_its_gpu(tmp_path, monkeypatch, **overrides) -> GRPOTrainer:
    """A 3-step run that saves a checkpoint every step, on a faked GPU under its plan."""
    args = tiny_config(tmp_path, max_steps=3, save_steps=1, **overrides)
    _gpu_under_its_plan(monkeypatch, args)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", memory_check.MemoryFitWarning)
        return GRPOTrainer("tiny-random", _reward, ROWS, args=args)


def _out_of_memory(*args, **kwargs):
    raise torch.OutOfMemoryError(CUDA_MESSAGE)


def _second_step(trainer, real):
    """``real``, except from the second step on: out of memory."""

    def call(*args, **kwargs):
        return _out_of_memory() if trainer.global_step >= 1 else real(*args, **kwargs)

    return call


def _check_explained(err: BaseException, phase: str) -> None:
    assert isinstance(err, torch.OutOfMemoryError)  # code catching torch's error still does
    assert isinstance(err.__cause__, torch.OutOfMemoryError)
    text = str(err)
    assert f"out of GPU memory in the {phase} phase of step 2: {CUDA_MESSAGE}" in text
    assert "The memory plan of this run on this" in text
    assert "policy weights" in text and "peak total" in text
    assert "Settings that fit" in text
    assert "use_peft=True" in text  # LoRA fits what full fine-tuning does not
    assert "What fits a" in text  # the planner's fit table
    assert "checkpoint-1" in text and "is as it was saved" in text


def _check_last_checkpoint_resumes(tmp_path) -> None:
    run = tmp_path / "run"
    assert [s for s, _ in ckpt.checkpoint_dirs(run)] == [1]  # nothing written after the error
    assert not list(run.glob(".tmp-*")) and not (run / "model.safetensors").exists()
    ckpt.verify_checkpoint(run / "checkpoint-1")
    args = tiny_config(tmp_path, max_steps=2, save_steps=1, resume_from_checkpoint="auto")
    resumed = GRPOTrainer("tiny-random", _reward, ROWS, args=args)
    resumed.train()
    assert resumed.global_step == 2
    assert (run / "model.safetensors").exists()  # a run that ends saves its model; that one did not


def test_out_of_memory_in_generation_is_explained(tmp_path, monkeypatch):
    trainer = _trainer_over_its_gpu(tmp_path, monkeypatch)
    monkeypatch.setattr(trainer.engine, "sample", _second_step(trainer, trainer.engine.sample))
    with pytest.raises(memory_check.TrainingOutOfMemory) as caught:
        trainer.train()
    _check_explained(caught.value, "generation")
    monkeypatch.undo()
    _check_last_checkpoint_resumes(tmp_path)


def test_out_of_memory_in_the_update_is_explained(tmp_path, monkeypatch):
    trainer = _trainer_over_its_gpu(tmp_path, monkeypatch)
    monkeypatch.setattr(update, "update", _second_step(trainer, update.update))
    with pytest.raises(memory_check.TrainingOutOfMemory) as caught:
        trainer.train()
    _check_explained(caught.value, "update")
    monkeypatch.undo()
    _check_last_checkpoint_resumes(tmp_path)


def _raised_in(module: str) -> BaseException:
    """An out-of-memory error raised by a function of ``module``, called from here."""
    namespace = {"__name__": module, "torch": torch}
    exec("def f():\n    raise torch.OutOfMemoryError('CUDA out of memory.')\n", namespace)
    try:
        namespace["f"]()
    except torch.OutOfMemoryError as err:
        return err
    raise AssertionError("not raised")


def test_the_phase_is_the_outermost_stage_of_the_traceback():
    assert memory_check.phase_of(_raised_in("groupwise.rollout.hf").__traceback__) == "generation"
    assert memory_check.phase_of(_raised_in("groupwise.policy.update").__traceback__) == "update"
    assert memory_check.phase_of(_raised_in("groupwise.rewards.model").__traceback__) == "scoring"
    assert memory_check.phase_of(_raised_in("elsewhere").__traceback__) == "step"


def test_out_of_memory_without_a_plan_still_names_the_phase(tmp_path):
    err = _raised_in("groupwise.policy.logprobs")
    error = memory_check.out_of_memory_error(
        tiny_config(tmp_path), "tiny-random", torch.device("cpu"), err, 5, None
    )
    assert str(error).startswith("out of GPU memory in the update phase of step 5")
    assert "No memory plan of this run here" in str(error)
