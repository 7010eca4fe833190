"""What a TRL / Hugging Face user types: ``train(resume_from_checkpoint=...)``, ``--resume`` on a
run folder alone, and TRL's command-line names (--model_name_or_path, --dataset_name, --config)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import TargetToken, tiny_config
from groupwise import GRPOTrainer
from groupwise.cli import main
from groupwise.errors import ConfigError
from groupwise.trainer.checkpoints import CheckpointError
from groupwise.wiring.rows import build_datasets

ROWS = [{"prompt": f"Say something number {i}"} for i in range(8)]

# A run that is as cheap as a run can be, with options that differ from the defaults (so a
# resume that used the defaults instead of the run's own options would be refused).
TINY = [
    "--model", "tiny-random", "--num_generations", "2", "--per_device_train_batch_size", "2",
    "--max_completion_length", "4", "--num_train_prompts", "4", "--num_eval_prompts", "0",
    "--learning_rate", "0.001", "--beta", "0", "--disable_tqdm", "true", "--logging_steps", "1",
]  # fmt: skip


def _steps(run: Path) -> list[int]:
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [row["step"] for row in rows if "reward" in row]


# --- train(resume_from_checkpoint=...) as in the Hugging Face Trainer ------------------------
def test_train_resumes_from_true_and_from_a_path_and_names_a_missing_one(tmp_path, capsys):
    first = GRPOTrainer("tiny-random", TargetToken(), ROWS,
                        args=tiny_config(tmp_path, save_steps=1))  # fmt: skip
    first.train()
    run = tmp_path / "run"
    assert (run / "checkpoint-2").is_dir()

    latest = GRPOTrainer("tiny-random", TargetToken(), ROWS,
                         args=tiny_config(tmp_path, save_steps=1, max_steps=3))  # fmt: skip
    latest.train(resume_from_checkpoint=True)  # the newest checkpoint: step 2
    assert latest.global_step == 3
    assert f"resumed from {run / 'checkpoint-2'} at step 2" in capsys.readouterr().out

    chosen = GRPOTrainer("tiny-random", TargetToken(), ROWS,
                         args=tiny_config(tmp_path, save_steps=1, max_steps=3))  # fmt: skip
    chosen.train(resume_from_checkpoint=str(run / "checkpoint-1"))
    assert f"resumed from {run / 'checkpoint-1'} at step 1" in capsys.readouterr().out
    assert chosen.global_step == 3 and _steps(run) == [1, 2, 3]

    missing = run / "checkpoint-9"
    with pytest.raises(CheckpointError, match=str(missing)) as info:
        chosen.train(resume_from_checkpoint=str(missing))
    assert "checkpoint-3" in str(info.value)  # the checkpoints that do exist are listed

    empty = GRPOTrainer("tiny-random", TargetToken(), ROWS,
                        args=tiny_config(tmp_path / "new"))  # fmt: skip
    with pytest.raises(CheckpointError, match="no checkpoint to resume from") as info:
        empty.train(resume_from_checkpoint=True)
    assert str(tmp_path / "new" / "run") in str(info.value)


# --- groupwise train --output_dir RUN --resume ------------------------------------------------
def test_resume_on_the_run_folder_alone_takes_the_runs_own_options(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", *TINY, "--max_steps", "1", "--save_steps", "1",
                 "--output_dir", str(run)]) == 0  # fmt: skip
    capsys.readouterr()
    # No config file and none of the run's options: they come from run/config.yaml.
    assert main(["train", "--output_dir", str(run), "--resume", "--max_steps", "2"]) == 0
    out = capsys.readouterr().out
    assert f"the run's own options from {run / 'config.yaml'}, with --max_steps on top" in out
    assert "resumed from" in out and _steps(run) == [1, 2]

    # An override that changes training is refused, naming it and the way that works.
    code = main(["train", "--output_dir", str(run), "--resume", "--learning_rate", "0.5"])
    err = capsys.readouterr().err
    assert code == 2 and "learning_rate: 0.001 -> 0.5" in err
    assert f"groupwise train {run / 'config.yaml'} --resume" in err
    # The run folder where a config file goes: the command that continues it.
    assert main(["train", str(run), "--resume"]) == 2
    assert f"groupwise train --output_dir {run} --resume" in capsys.readouterr().err


def test_resume_from_a_checkpoint_path_finds_its_run(tmp_path, capsys, monkeypatch):
    run = tmp_path / "run"
    assert main(["train", *TINY, "--max_steps", "2", "--save_steps", "1",
                 "--output_dir", str(run)]) == 0  # fmt: skip
    monkeypatch.chdir(tmp_path)  # config.yaml holds the folder as given then; found from here
    assert main(["train", "--resume", "run/checkpoint-1", "--max_steps", "2"]) == 0
    assert f"resumed from {Path('run') / 'checkpoint-1'} at step 1" in capsys.readouterr().out
    assert _steps(run) == [1, 2]


# --- TRL's names ------------------------------------------------------------------------------
def test_trl_names_model_name_or_path_dataset_name_and_config(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{i}+1?", "answer": str(i + 1)}) + "\n"
                            for i in range(4)))  # fmt: skip
    config = tmp_path / "grpo.yaml"
    # A TRL-style YAML: the script's names next to GRPOConfig's.
    config.write_text(f"model_name_or_path: tiny-random\ndataset_name: {data}\nmax_steps: 1\n"
                      "num_generations: 2\nper_device_train_batch_size: 2\n"
                      "max_completion_length: 3\ndisable_tqdm: true\n")  # fmt: skip
    out = tmp_path / "run"
    assert main(["train", "--config", str(config), "--output_dir", str(out)]) == 0
    saved = (out / "config.yaml").read_text()
    assert "model: tiny-random" in saved and f"task: {data}" in saved
    assert _steps(out) == [1]

    from groupwise.cli.args import _config_from_argv

    args = _config_from_argv(["--model_name_or_path", "some/model", "--dataset_name", str(data)])
    assert (args.model, args.task) == ("some/model", str(data))
    with pytest.raises(ConfigError, match="model_name_or_path .* and model are the same option"):
        _config_from_argv(["--model_name_or_path", "a", "--model", "b"])
    with pytest.raises(ConfigError, match="two config files"):
        _config_from_argv([str(config), "--config", str(config)])


def test_dataset_name_a_saved_datasetdict_takes_train_and_test_splits(tmp_path):
    datasets = pytest.importorskip("datasets")
    folder = tmp_path / "saved"

    def rows(name, n):
        return datasets.Dataset.from_list([{"prompt": f"{name}{i}", "answer": "1"}
                                           for i in range(n)])  # fmt: skip

    datasets.DatasetDict({"train": rows("t", 5), "test": rows("e", 3)}).save_to_disk(str(folder))
    from groupwise.cli.args import _config_from_argv

    train, evals = build_datasets(_config_from_argv(["--dataset_name", str(folder)]))
    assert [row["prompt"] for row in train] == [f"t{i}" for i in range(5)]
    assert [row["prompt"] for row in evals] == [f"e{i}" for i in range(3)]


def test_dataset_name_a_hub_id_loads_from_the_hub_or_says_it_is_offline(tmp_path, monkeypatch,
                                                                        capsys):  # fmt: skip
    datasets = pytest.importorskip("datasets")
    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    loaded = []

    def load_dataset(name, *args, **kwargs):  # the hub, where one is reachable
        loaded.append(name)
        return datasets.DatasetDict(
            {"train": datasets.Dataset.from_list([{"prompt": "p", "answer": "1"}] * 2)}
        )

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    from groupwise.cli.args import _config_from_argv

    train, evals = build_datasets(_config_from_argv(["--dataset_name", "trl-lib/tldr"]))
    assert loaded == ["trl-lib/tldr"] and len(train) == 2 and evals is None

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert main(["train", "--dataset_name", "trl-lib/tldr", "--output_dir", "x"]) == 2
    err = capsys.readouterr().err
    assert "task='trl-lib/tldr' is no local file or folder" in err and "HF_HUB_OFFLINE" in err
    assert loaded == ["trl-lib/tldr"]  # offline: the hub is not tried


# --- groupwise eval RUN / chat RUN -----------------------------------------------------------
def test_eval_and_chat_on_a_run_folder_use_the_runs_settings(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", *TINY, "--max_steps", "1", "--max_completion_length", "3",
                 "--num_eval_prompts", "2", "--output_dir", str(run)]) == 0  # fmt: skip
    capsys.readouterr()
    assert main(["eval", str(run)]) == 0
    out = capsys.readouterr().out
    report = json.loads((run / "eval.json").read_text())  # next to the model
    assert report["model"] == str(run)
    # The run's generation settings (3 tokens), not the default 256; its 2 held-out prompts.
    assert report["config"]["max_completion_length"] == 3
    assert report["summary"]["overall"]["num_prompts"] == 2
    assert "difficulty=12 (1-digit operands, 2 operands)" in out

    assert main(["chat", str(run), "--prompt", "What is 2 + 2?", "--prompt", "Say hi"]) == 0
    out = capsys.readouterr().out
    assert ">>> What is 2 + 2?" in out and ">>> Say hi" in out
    assert main(["chat", str(run)]) == 0  # a few of the run's own held-out prompts
    out = capsys.readouterr().out
    assert out.count(">>> ") == 2 and out.count("(expected answer: ") == 2
    assert "max_completion_length 3" in out

    code = main(["chat", str(tmp_path)])  # no model, no checkpoint
    assert code == 2 and "holds no model" in capsys.readouterr().err


def test_difficulty_levels_are_named_in_words():
    from groupwise.evaluation import format_table
    from groupwise.tasks import level_name

    assert level_name("arithmetic", "12") == "1-digit operands, 2 operands"
    assert level_name("arithmetic", 23) == "2-digit operands, 3 operands"
    assert level_name("countdown", 4) == "4 numbers"
    assert level_name("logic", "3") == "3 people"
    assert level_name("mixed", 2) == "difficulty 2"
    summary = {"overall": {"num_prompts": 2}, "by_difficulty": {"13": {"num_prompts": 2}}}
    assert "difficulty=13 (1-digit operands, 3 operands)" in format_table(summary, "arithmetic")
    assert "(1-digit" not in format_table(summary)  # no task: the number alone


# --- a model name that is a typo'd local path, not a hub id ----------------------------------
def test_a_near_miss_of_a_local_folder_is_not_sent_to_the_hub(tmp_path, monkeypatch):
    from groupwise.errors import ModelLoadError
    from groupwise.runtime.models import check_model_name, load_model_and_tokenizer

    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)  # the hub counts as reachable
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs" / "demo").mkdir(parents=True)
    with pytest.raises(ModelLoadError, match="did you mean the local 'runs/demo'"):
        check_model_name("runz/demo")
    check_model_name("Qwen/Qwen2.5-0.5B")  # a hub id: nothing here is close to "Qwen"

    import transformers

    def not_on_the_hub(name, **kwargs):
        raise OSError(
            f"{name} is not a valid model identifier listed on 'https://huggingface.co/models'"
        )

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", not_on_the_hub)
    with pytest.raises(ModelLoadError, match="is no local folder, and loading it from the Hugging"):
        load_model_and_tokenizer("someone/no-such-model")
