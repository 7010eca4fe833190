"""transformers.Trainer's post-training methods on groupwise's trainer, as GRPO scripts call
them (open-r1's grpo.py, TRL's trl/scripts/grpo.py): the files ``save_metrics`` and
``save_state`` write are compared with what a transformers.Trainer writes for the same
metrics; ``accelerator``, ``create_model_card``, ``push_to_hub`` offline, ``end``."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import Trainer as HFTrainer
from transformers import TrainingArguments

from conftest import tiny_config
from groupwise import GRPOTrainer
from groupwise.runtime.distributed import DistributedContext
from groupwise.runtime.models import tiny_random_model
from groupwise.trainer.hf_api import Accelerator

ROWS = [{"prompt": p} for p in ("a b", "c d", "e f", "g h")]


def _length(completions, **kwargs):
    return [float(len(c)) for c in completions]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hf_api")
    trainer = GRPOTrainer("tiny-random", _length, ROWS, args=tiny_config(tmp, max_steps=2))
    return trainer, trainer.train()


@pytest.fixture(scope="module")
def hf_trainer(tmp_path_factory):
    out = tmp_path_factory.mktemp("hf_trainer")
    args = TrainingArguments(output_dir=str(out), report_to=[], use_cpu=True)
    return HFTrainer(model=tiny_random_model(seed=0), args=args)


def test_save_metrics_and_log_metrics_write_what_the_hf_trainer_writes(trained, hf_trainer, capsys):
    trainer, result = trained
    metrics = dict(result.metrics, train_samples=len(ROWS))  # open-r1's addition
    trainer.save_metrics("train", metrics)
    hf_trainer.save_metrics("train", metrics)
    trainer.save_metrics("eval", {"eval_reward": 0.5})
    hf_trainer.save_metrics("eval", {"eval_reward": 0.5})
    ours, theirs = trainer.output_dir, hf_trainer.args.output_dir
    for name in ("train_results.json", "eval_results.json", "all_results.json"):
        assert (ours / name).read_text() == open(f"{theirs}/{name}").read()
    combined = json.loads((ours / "all_results.json").read_text())
    assert combined["train_samples"] == 4 and combined["eval_reward"] == 0.5
    assert combined["train_loss"] == pytest.approx(result.training_loss)
    capsys.readouterr()
    trainer.log_metrics("train", metrics)
    ours_printed = capsys.readouterr().out
    hf_trainer.log_metrics("train", metrics)
    assert ours_printed == capsys.readouterr().out
    assert ours_printed.startswith("***** train metrics *****\n")
    # metrics_format: runtime as hh:mm:ss.ss, floats to 4 significant digits
    assert "  train_samples            =          4" in ours_printed


def test_save_state_writes_trainer_state_json_in_the_hf_format(trained, hf_trainer):
    trainer, _ = trained
    trainer.save_state()
    hf_trainer.save_state()
    ours = json.loads((trainer.output_dir / "trainer_state.json").read_text())
    theirs = json.loads(open(f"{hf_trainer.args.output_dir}/trainer_state.json").read())
    assert set(ours) == set(theirs)
    assert ours["global_step"] == 2 and ours["max_steps"] == 2
    assert ours["log_history"] == json.loads(json.dumps(trainer.state.log_history))
    assert [row["step"] for row in ours["log_history"]] == [1, 2, 2]  # two steps, the summary
    assert "train_loss" in ours["log_history"][-1]


def test_accelerator_over_the_runs_processes(trained, capsys):
    trainer, _ = trained
    accelerator = trainer.accelerator
    assert accelerator.is_main_process and accelerator.is_local_main_process
    assert (accelerator.process_index, accelerator.num_processes) == (0, 1)
    assert accelerator.local_process_index == 0 and not accelerator.use_distributed
    assert accelerator.device == trainer.device
    accelerator.wait_for_everyone()  # a world of one: returns at once
    accelerator.print("done")
    assert capsys.readouterr().out == "done\n"
    wrapped = torch.nn.Module()
    wrapped.module = trainer.model
    assert accelerator.unwrap_model(wrapped) is trainer.model
    assert trainer.is_world_process_zero() and trainer.is_local_process_zero()
    other = Accelerator(DistributedContext(rank=3, world_size=4, local_rank=1), torch.device("cpu"))
    assert not other.is_main_process and not other.is_local_main_process
    assert (other.process_index, other.num_processes, other.local_process_index) == (3, 4, 1)
    other.print("not printed")
    assert capsys.readouterr().out == ""


def test_model_card_and_push_to_hub_offline(trained, monkeypatch):
    trainer, _ = trained
    path = trainer.create_model_card(dataset_name="my/data", tags=["open-r1"])
    text = path.read_text()
    assert path == trainer.output_dir / "README.md"
    from huggingface_hub import ModelCard

    card = ModelCard.load(path)
    assert card.data.base_model == "tiny-random" and card.data.datasets == ["my/data"]
    assert card.data.tags == ["open-r1", "grpo", "groupwise"]
    assert card.data.library_name == "transformers"
    assert "trained with GRPO" in text and "for 2 steps" in text
    assert trainer.hub_model_id == trainer.output_dir.name
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(RuntimeError, match=f"push_to_hub: .*HF_HUB_OFFLINE.*{trainer.output_dir}"):
        trainer.push_to_hub(dataset_name="my/data")
    trainer.end()  # no process group here: nothing to leave, no error
