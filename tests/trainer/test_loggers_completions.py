"""log_completions as TRL's GRPOTrainer does it: the rich table of the logged step's completions
(compared with TRL's own print_prompt_completions_sample) and the "completions" table sent to
the report_to trackers; completions.jsonl unchanged."""

import json
import random

import pytest
import torch
from test_loggers import _offline_runs, _tensorboard, wandb_env  # noqa: F401 (a fixture)
from trl.trainer.utils import print_prompt_completions_sample

from conftest import TargetToken, tiny_config
from groupwise import GRPOTrainer
from groupwise.runtime.distributed import DistributedContext
from groupwise.trainer import records as records_module
from groupwise.trainer.console import completion_text, print_completions_sample
from groupwise.trainer.loggers import RunLoggers, markdown_table
from groupwise.trainer.records import RunRecords

CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is 2+2?"}]},
]
TOOL_REPLY = [
    {"role": "assistant", "reasoning_content": "use the tool", "content": "",
     "tool_calls": [{"function": {"name": "add", "arguments": '{"a": 2, "b": 2}'}}]},
]  # fmt: skip


def _rows(n):
    prompts = ["The sky is", CONVERSATION, "The sun is"][:n]
    completions = [" blue.", TOOL_REPLY, " in the sky."][:n]
    rewards = {"Correctness": [0.123, 0.456, float("nan")][:n], "Format": [0.789, 0.101, 1.0][:n]}
    return prompts, completions, rewards, [0.987, -0.654, 0.0][:n], {"source": ["A", "B", 3][:n]}


@pytest.mark.parametrize("num_samples", [None, 3, 10])
def test_table_is_trls(capsys, num_samples):
    """All rows (None, or at least as many as there are): the very characters TRL prints."""
    prompts, completions, rewards, advantages, extra = _rows(3)
    print_prompt_completions_sample(prompts, completions, rewards, advantages, 42,
                                    num_samples, extra=extra)  # fmt: skip
    trl = capsys.readouterr().out
    print_completions_sample(prompts, completions, rewards, advantages, 42, num_samples,
                             extra=extra)  # fmt: skip
    ours = capsys.readouterr().out
    assert ours == trl
    for text in ("Step 42", "SYSTEM", "[IMAGE]", "0.12", "-0.65", "nan"):  # (80 columns wrap)
        assert text in ours


def test_table_without_advantages_or_extras_is_trls(capsys):
    prompts, completions, rewards, _, _ = _rows(2)
    print_prompt_completions_sample(prompts, completions, rewards, None, 7)
    trl = capsys.readouterr().out
    print_completions_sample(prompts, completions, rewards, None, 7)
    assert capsys.readouterr().out == trl


def test_a_sample_of_rows_leaves_the_random_state_alone(capsys):
    prompts = [f"prompt-{i}" for i in range(6)]
    completions = [f"completion-{i}" for i in range(6)]
    rewards = {"r": [float(i) for i in range(6)]}
    state = random.getstate()
    print_completions_sample(prompts, completions, rewards, [0.0] * 6, 1, 2, seed=5)
    assert random.getstate() == state
    out = capsys.readouterr().out
    shown = [i for i in range(6) if f"completion-{i}" in out]
    assert len(shown) == 2
    assert all(f"prompt-{i}" in out for i in shown)  # each row keeps its own prompt
    print_completions_sample(prompts, completions, rewards, [0.0] * 6, 1, 2, seed=5)
    assert capsys.readouterr().out == out  # the same seed, the same rows
    print_completions_sample(prompts, completions, rewards, [0.0] * 6, 1, 0)
    assert capsys.readouterr().out == ""  # 0 rows: nothing


def test_completion_text_of_a_conversation():
    assert completion_text(TOOL_REPLY).plain == "ASSISTANT\nuse the tool\nadd(a=2, b=2)"
    assert completion_text(CONVERSATION).plain == "SYSTEM\nBe brief.\n\nUSER\n[IMAGE]What is 2+2?"
    assert completion_text(3).plain == "3"


# --- RunRecords.log_completions -------------------------------------------------------------
def _records(tmp_path, keep_samples):
    """Records holding a step's batch by hand: 2 prompts x 2 completions, two reward functions
    (the second returned None once: NaN), a log_extra column."""
    records = RunRecords(tmp_path, DistributedContext(), ["accuracy_reward", "format_reward"],
                         "answer", keep_samples=keep_samples)  # fmt: skip
    rows = [{"prompt": "1+1?", "answer": "2"}, {"prompt": "2+3?", "answer": "5"}]
    texts = ["2", "3", "5", "five"]
    per_func = torch.tensor([[1.0, 0.5], [0.0, 0.5], [1.0, float("nan")], [0.0, 1.0]])
    rewards = per_func.nan_to_num().sum(1)
    advantages = torch.tensor([0.5, -0.5, 0.25, -0.25])
    group_ids = torch.tensor([0, 0, 1, 1])
    extra = {"judge": ["ok", "wrong", "ok", "words"]}
    records.last_batch = (rows, texts, rewards, per_func, advantages, group_ids, extra)
    return records


COLUMNS = ["step", "prompt", "completion", "accuracy_reward", "format_reward", "judge",
           "advantage"]  # fmt: skip
ROWS = [
    [3, "1+1?", "2", 1.0, 0.5, "ok", 0.5],
    [3, "1+1?", "3", 0.0, 0.5, "wrong", -0.5],
    [3, "2+3?", "5", 1.0, None, "ok", 0.25],
    [3, "2+3?", "five", 0.0, 1.0, "words", -0.25],
]


def test_log_completions_prints_all_rows_and_sends_the_table(tmp_path, capsys):
    records = _records(tmp_path, keep_samples=True)
    records.loggers = RunLoggers(tmp_path, ["tensorboard", "wandb"], {})
    records.log_completions(3, sample_size=1, to_print=None)  # None: every completion
    records.close_loggers()
    out = capsys.readouterr().out
    assert "Step 3" in out and "Advantage" in out and "judge" in out
    assert all(f"│ {text} " in out for text in ("2", "3", "5", "five"))
    assert "-0.25" in out and "nan" in out
    # completions.jsonl as before: the first sample_size prompts, all their completions
    (line,) = (tmp_path / "completions.jsonl").read_text().splitlines()
    record = json.loads(line)
    assert (record["step"], record["prompt"], record["answer"]) == (3, "1+1?", "2")
    assert [c["text"] for c in record["completions"]] == ["2", "3"]
    # the trackers get every completion, TRL's columns, NaN as null
    (run_dir,) = (tmp_path / "wandb").glob("offline-run-*")
    (run,) = _offline_runs(tmp_path)
    path = run["history"][3]["completions/path"]
    table = json.loads((run_dir / "files" / path).read_text())
    assert table["columns"] == COLUMNS and table["data"] == ROWS
    (text,) = _tensorboard(tmp_path / "tensorboard").Tensors("completions/text_summary")
    assert (text.step, text.tensor_proto.string_val[0].decode()) == (
        3,
        markdown_table(COLUMNS, ROWS),
    )


def test_log_completions_prints_num_completions_to_print_rows(tmp_path, capsys):
    records = _records(tmp_path, keep_samples=True)
    records.log_completions(3, sample_size=2, to_print=2)
    out = capsys.readouterr().out
    shown = [text for text in ("│ 2 ", "│ 3 ", "│ 5 ", "│ five ") if text in out]
    assert len(shown) == 2
    records.log_completions(4, sample_size=2, to_print=0)
    assert capsys.readouterr().out == ""
    assert len((tmp_path / "completions.jsonl").read_text().splitlines()) == 4


def test_without_log_completions_no_table_goes_to_the_trackers(tmp_path, capsys):
    # log_completions_steps alone: completions.jsonl and the per-prompt tables, as before.
    records = _records(tmp_path, keep_samples=False)
    records.loggers = RunLoggers(tmp_path, ["tensorboard"], {})
    records.log_completions(3, sample_size=2, to_print=1)
    records.close_loggers()
    out = capsys.readouterr().out
    assert "answer: 2" in out and "answer: 5" not in out and "Step 3" not in out
    assert (
        "completions/text_summary" not in _tensorboard(tmp_path / "tensorboard").Tags()["tensors"]
    )
    records.log_completions(4, sample_size=2, to_print=None)
    assert capsys.readouterr().out == ""


def test_the_table_holds_every_ranks_rows(tmp_path, monkeypatch):
    """Under data parallel rank 0's table holds every rank's completions, in rank order (as TRL
    gathers them): here rank 1's batch is rank 0's with other texts."""
    records = _records(tmp_path, keep_samples=True)

    def gather(value, ctx):
        other = {key: list(values) for key, values in value.items()}
        other["completion"] = [f"rank1-{text}" for text in value["completion"]]
        return [value, other]

    monkeypatch.setattr(records_module, "all_gather_objects", gather)
    table = records.completions_table()
    assert table["completion"] == ["2", "3", "5", "five", "rank1-2", "rank1-3", "rank1-5",
                                   "rank1-five"]  # fmt: skip
    assert table["advantage"] == [0.5, -0.5, 0.25, -0.25] * 2
    assert list(table) == ["prompt", "completion", "accuracy_reward", "format_reward", "judge",
                           "advantage"]  # fmt: skip


def test_training_with_log_completions(tmp_path, capsys):
    """A 2-step run with log_completions and report_to wandb (offline), run_name set: each
    logged step prints its table and logs it to the W&B run named run_name."""
    args = tiny_config(tmp_path, logging_steps=1, log_completions=True, num_completions_to_print=3,
                       report_to=["wandb"], run_name="grpo-e2e")  # fmt: skip
    prompts = [{"prompt": f"Say something number {i}"} for i in range(8)]
    trainer = GRPOTrainer("tiny-random", TargetToken(), prompts, args=args)
    trainer.train()
    out = capsys.readouterr().out
    assert "Step 1" in out and "Step 2" in out
    (run,) = _offline_runs(tmp_path / "run")
    assert run["name"] == "grpo-e2e"
    (run_dir,) = (tmp_path / "run" / "wandb").glob("offline-run-*")
    rows, texts, _, per_func, advantages = trainer.records.last_batch[:5]
    names = trainer.records.reward_names
    for step in (1, 2):
        path = run["history"][step]["completions/path"]
        table = json.loads((run_dir / "files" / path).read_text())
        assert table["columns"] == ["step", "prompt", "completion", *names, "advantage"]
        assert len(table["data"]) == len(texts)  # every completion of the step, not 3
        assert {row[0] for row in table["data"]} == {step}
    # the last table is the last step's batch
    assert [row[2] for row in table["data"]] == list(texts)
    assert [row[-1] for row in table["data"]] == pytest.approx(advantages.tolist())
    assert [row[3] for row in table["data"]] == pytest.approx(per_func[:, 0].tolist())
