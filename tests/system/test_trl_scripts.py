"""GRPO scripts run as a user runs them, ``python script.py --option value ...``, in a
subprocess, on the built-in tiny-random model: TRL 1.16's trl/scripts/grpo.py from its PyPI
wheel with its ``trl`` import lines switched to groupwise (tests/fixtures/trl_scripts/grpo.py
names the wheel, its licence and every change), and sql_agent.py, a tool-using script
groupwise wrote in the layout of TRL's agent examples."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "tests" / "fixtures" / "trl_scripts"


def _run(script: str, args: list[str], cwd: Path, assets: Path) -> subprocess.CompletedProcess:
    env = dict(
        os.environ,
        PYTHONPATH=str(ROOT / "src"),
        TRL_SCRIPT_ASSETS=str(assets),
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        OMP_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
    )
    return subprocess.run(
        [sys.executable, str(SCRIPTS / script), *args],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip


def _agent_assets(assets: Path) -> None:
    """The SQL agent's inputs: the interactions table and its yes/no questions."""
    import pandas as pd

    (assets / "interactions").mkdir(parents=True)
    (assets / "questions").mkdir(parents=True)
    pd.DataFrame({"gene_a": ["MAP2K4", "TP53", "TP53"], "gene_b": ["MAPK8", "MDM2", "EP300"]}
                 ).to_parquet(assets / "interactions" / "train.parquet")  # fmt: skip
    questions = [
        ("Does TP53 interact with MDM2?", "yes"),
        ("Does TP53 interact with MAPK8?", "no"),
        ("Does MAP2K4 interact with MAPK8?", "yes"),
        ("Does MDM2 interact with EP300?", "no"),
    ]
    pd.DataFrame({"question": [q for q, _ in questions], "answer": [a for _, a in questions]}
                 ).to_parquet(assets / "questions" / "train.parquet")  # fmt: skip


@pytest.mark.slow
def test_sql_agent_script_trains_and_saves(tmp_path):
    """sql_agent.py: TrlParser((ScriptArguments, GRPOConfig, ModelConfig)) with TRL's names on
    the command line, a SQL tool given through tools=, two reward functions."""
    assets = tmp_path / "assets"
    _agent_assets(assets)
    result = _run("sql_agent.py", [
        "--model_name_or_path", "tiny-random", "--dataset_name", "assets/questions",
        "--output_dir", "out", "--max_steps", "2",
        "--per_device_train_batch_size", "4", "--num_generations", "2",
        "--max_completion_length", "8", "--use_cpu", "True", "--bf16", "False",
        "--report_to", "none", "--push_to_hub", "False", "--learning_rate", "1e-2",
        "--seed", "0", "--disable_tqdm", "True", "--logging_steps", "1",
    ], tmp_path, assets)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Table loaded into interactions.db: 3 rows" in result.stdout
    out = tmp_path / "out"
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [1, 2]
    # The script's two reward functions scored every step's completions.
    for name in ("answer_reward", "tool_reward"):
        assert all(f"rewards/{name}/mean" in row and row[f"rewards/{name}/errors"] == 0
                   for row in rows)  # fmt: skip
    # The command line's options, TRL's names translated, are the run's.
    config = (out / "config.yaml").read_text()
    for line in ("max_steps: 2", "device: cpu", "bf16_autocast: false", "learning_rate: 0.01",
                 "num_generations: 2", "tools:"):  # fmt: skip
        assert line in config
    # save_model(output_dir): a from_pretrained-loadable model.
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(out)
    assert model.num_parameters() > 0 and (out / "tokenizer.json").exists()


def test_sql_agent_rewards_read_parsed_tool_calls():
    """The script's rewards on hand-built conversations in TRL's tool-call shapes."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("sql_agent", SCRIPTS / "sql_agent.py")
    agent = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(agent)

    def call(name: str, arguments) -> dict:
        return {"type": "function", "function": {"name": name, "arguments": arguments}}

    select = call("run_sql", {"query": "SELECT * FROM interactions WHERE gene_a = 'TP53'"})
    rows = {"role": "tool", "name": "run_sql", "content": [["TP53", "MDM2"]]}
    asked = {"role": "assistant", "content": "", "tool_calls": [select]}
    final = {"role": "assistant", "content": "Found it. Answer: Yes"}
    conversations = [
        [asked, rows, final],  # one answered SELECT: 0.5
        [asked, rows, asked, rows, asked, rows, final],  # three: two count, 1.0
        [asked, final],  # a call no tool turn answered: 0.0
        [{**asked, "tool_calls": [select, call("drop_table", {})]}, rows, final],  # 0.5 - 0.5
        [{**asked, "tool_calls": [call("run_sql", '{"query": "SELECT 1"}')]}, rows, final],
        [{"role": "assistant", "content": "Answer: no"}],  # no calls: 0.0
    ]  # fmt: skip
    assert agent.tool_reward(conversations) == [0.5, 1.0, 0.0, 0.0, 0.0, 0.0]
    # The answer must close the last turn: "yes" is right for the first five rows.
    assert agent.answer_reward(conversations, answer=["yes"] * 6) == [1.0] * 5 + [0.0]
    late = [{"role": "assistant", "content": "Answer: yes, I think"}]
    assert agent.answer_reward([late], answer=["yes"]) == [0.0]


def _math_dataset(folder: Path, questions: list[tuple[str, str]], **extra: list) -> None:
    """A local stand-in for a hub math dataset: conversational prompts and a ``solution``
    column (TRL's accuracy rewards read it), saved as ``folder/train.parquet``."""
    import pandas as pd

    folder.mkdir(parents=True)
    pd.DataFrame({"prompt": [[{"role": "user", "content": q}] for q, _ in questions],
                  "solution": [s for _, s in questions], **extra}
                 ).to_parquet(folder / "train.parquet")  # fmt: skip


def _metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


_TINY_RUN = [
    "--model_name_or_path", "tiny-random", "--per_device_train_batch_size", "4",
    "--num_generations", "2", "--max_completion_length", "8", "--use_cpu", "True",
    "--bf16", "False", "--report_to", "none", "--eval_strategy", "no", "--seed", "0",
    "--disable_tqdm", "True",
    # A metrics row every step (the default, TRL's 10, would log the last of two steps only).
    "--logging_steps", "1",
]  # fmt: skip


@pytest.mark.slow
def test_trl_grpo_script_trains_with_trl_rewards_and_saves(tmp_path):
    """TRL's trl/scripts/grpo.py (``trl grpo``): GRPOScriptArguments' reward_funcs by TRL's
    registry names, a local --dataset_name, model_init_kwargs assigned after parsing, and
    quantization_config= / peft_config= passed to the trainer."""
    _math_dataset(tmp_path / "data", [
        (r"What is 1/3? Answer in \boxed{}.", r"\frac{1}{3}"),
        ("What is 2+2?", "4"),
        ("What is 3*3?", "9"),
        ("Name a colour.", "no math here"),  # TRL's accuracy_reward: None for this prompt
    ])  # fmt: skip
    result = _run("grpo.py", [
        *_TINY_RUN, "--dataset_name", "data", "--output_dir", "out", "--max_steps", "2",
        "--reward_funcs", "accuracy_reward", "think_format_reward",
        "get_soft_overlong_punishment", "--learning_rate", "1e-2",
    ], tmp_path, tmp_path)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Training completed." in result.stdout and "Model saved to out." in result.stdout
    # The model_init_kwargs the script assigns after parsing are read: what agrees with the run
    # (revision "main", trust_remote_code False, attn_implementation None) goes unreported, and
    # ModelConfig's dtype (TRL 1.16's default, float32) is the trained weights' dtype, as in TRL.
    assert "model_init_kwargs=" not in result.stderr
    out = tmp_path / "out"
    assert yaml.safe_load((out / "config.yaml").read_text())["dtype"] == "float32"
    rows = _metrics(out)
    assert [row["step"] for row in rows] == [1, 2]
    names = ("accuracy_reward", "think_format_reward", "soft_overlong_punishment_reward")
    for name in names:
        assert all(row[f"rewards/{name}/errors"] == 0 for row in rows), name
    # Two prompts a step, one pass over the four: the unparseable solution's two completions
    # (of the run's eight) scored None, once.
    assert sum(row["rewards/accuracy_reward/frac_none"] for row in rows) == pytest.approx(0.5)
    rewards = json.loads((out / "rewards.json").read_text())
    assert [r["name"] for r in rewards] == list(names)
    assert [r["is_correctness"] for r in rewards] == [True, False, False]
    from transformers import AutoModelForCausalLM

    assert AutoModelForCausalLM.from_pretrained(out).num_parameters() > 0


@pytest.mark.slow
def test_trl_grpo_script_trains_on_a_dataset_mixture(tmp_path):
    """The same script with TRL's DatasetMixtureConfig from the --config YAML file (two local
    datasets at fractions 0.5 / 0.5, one cut to two columns; get_dataset mixes them), and QLoRA
    from ModelConfig's names: get_quantization_config's BitsAndBytesConfig reaches the trainer
    as quantization_config=, get_peft_config's LoraConfig as peft_config=."""
    _math_dataset(tmp_path / "a", [("What is 1+1?", "2"), ("What is 2+1?", "3")])
    _math_dataset(tmp_path / "b", [(f"What is {i}+{i}?", str(2 * i)) for i in range(6)],
                  extra=list(range(6)))  # fmt: skip
    (tmp_path / "mix.yaml").write_text(
        "datasets:\n"
        "  - {path: a, fraction: 0.5}\n"
        "  - {path: b, columns: [prompt, solution], fraction: 0.5}\n"
        "reward_funcs: [reasoning_accuracy_reward]\n"
        "max_steps: 2\n"
    )
    result = _run("grpo.py", [
        *_TINY_RUN, "--config", "mix.yaml", "--output_dir", "out", "--use_peft", "True",
        "--load_in_4bit", "True", "--lora_r", "4", "--lora_alpha", "8",
    ], tmp_path, tmp_path)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    out = tmp_path / "out"
    config = (out / "config.yaml").read_text()
    for line in ("use_peft: true", "lora_r: 4", "load_in_4bit: true", "bnb_4bit_quant_type: nf4"):
        assert line in config
    assert (out / "adapter_config.json").exists()  # save_model: the LoRA adapter
    rows = _metrics(out)
    assert [row["step"] for row in rows] == [1, 2]
    # No </think> in a tiny model's 8 tokens: TRL's reasoning reward is 0.0, not None.
    for row in rows:
        assert row["rewards/reasoning_accuracy_reward/mean"] == 0.0
        assert row["rewards/reasoning_accuracy_reward/frac_none"] == 0.0
        assert row["rewards/reasoning_accuracy_reward/errors"] == 0
