"""scripts/trl_scripts.py, the check that runs public TRL scripts on groupwise: its edits and
its extraction on small TRL-style sources written here, and the whole pipeline end to end on a
fake source tree laid out as TRL's and open-r1's repositories are (no third-party code)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("trl_scripts", ROOT / "scripts" / "trl_scripts.py")
harness = importlib.util.module_from_spec(spec)
sys.modules["trl_scripts"] = harness  # dataclasses look their module up there
spec.loader.exec_module(harness)


def _groupwise_has(module: str, name: str) -> bool:
    """A fixed answer, so the expected edits do not depend on groupwise's export list."""
    names = {"groupwise": {"GRPOConfig", "GRPOTrainer", "TrlParser", "ScriptArguments"},
             "groupwise.rewards.trl_rewards": {"accuracy_reward"}}  # fmt: skip
    return name in names.get(module, set())


SCRIPT = textwrap.dedent('''\
    import os
    from typing import TYPE_CHECKING

    import trl
    from trl import (
        GRPOConfig,
        SFTConfig as Sft,
        TrlParser,
    )
    from trl.rewards import accuracy_reward
    from trl.experimental.judges import PairJudge

    if TYPE_CHECKING:
        from trl import GRPOTrainer


    class Args(trl.ScriptArguments):
        base: type = trl.SFTConfig


    def main():
        from trl import GRPOTrainer  # imported where it is used
        return load("org/data", split="train"), "org/data-2", os.sep
''')


def test_trl_imports_become_groupwise_imports_and_missing_names_stay_on_trl():
    log = harness.EditLog()
    out = harness.edit_trl_imports(SCRIPT, log, _groupwise_has)
    assert out == textwrap.dedent('''\
        import os
        from typing import TYPE_CHECKING

        import groupwise
        import trl
        from groupwise import GRPOConfig, TrlParser
        from trl import SFTConfig as Sft
        from groupwise.rewards.trl_rewards import accuracy_reward
        from trl.experimental.judges import PairJudge

        if TYPE_CHECKING:
            from groupwise import GRPOTrainer


        class Args(groupwise.ScriptArguments):
            base: type = trl.SFTConfig


        def main():
            from groupwise import GRPOTrainer  # imported where it is used
            return load("org/data", split="train"), "org/data-2", os.sep
    ''')  # fmt: skip
    assert sorted(log.missing) == sorted([
        "trl.SFTConfig (line 5)", "trl.experimental.judges.PairJudge (line 11)",
        "trl.SFTConfig (used as trl.SFTConfig)"])  # fmt: skip
    # A module whose names groupwise all has becomes groupwise under the same name.
    log = harness.EditLog()
    plain = "import trl\n\nclass C(trl.GRPOConfig):\n    pass\n"
    assert harness.edit_trl_imports(plain, log, _groupwise_has) == (
        "import groupwise as trl\n\nclass C(trl.GRPOConfig):\n    pass\n")  # fmt: skip
    assert log.missing == []


def test_hub_literals_recipe_values_and_optional_imports():
    log = harness.EditLog()
    out = harness.replace_literals(SCRIPT, {"org/data": "/assets/org/data"}, log)
    assert 'load("/assets/org/data", split="train"), "org/data-2"' in out
    assert out.count("/assets/") == 1 and len(log.changes) == 1  # "org/data-2" is untouched
    recipe = "model_name_or_path: org/model\nnested:\n  id: org/model\nseed: 42\n"
    assert harness.edit_recipe(recipe, {"org/model": "/m"}, log) == (
        "model_name_or_path: /m\nnested:\n  id: org/model\nseed: 42\n")  # fmt: skip
    rewards = ("import re\nfrom .utils.remote import (\n    a,\n    b,\n)\n"
               "from .utils.remote import c as d\nfrom .utils.local import e\n")  # fmt: skip
    log = harness.EditLog()
    out = harness.drop_imports(rewards, "pkg.utils.remote", "pkg.rewards", "remote", log)
    assert out == "import re\nfrom .utils.local import e\n"
    assert log.changes == ["lines 2-5, 6: imports of pkg.utils.remote dropped (remote)"]
    diff, removed, added = harness.unified_diff("pkg/rewards.py", rewards, out)
    assert (removed, added) == (5, 0) and diff.startswith("--- a/pkg/rewards.py")


def _package(folder: Path) -> None:
    files = {
        "src/pkg/__init__.py": "",
        "src/pkg/main.py": "from pkg.configs import C\nfrom .utils import helper\n"
                           "from .rewards import score\nimport json\n",
        "src/pkg/configs.py": "C = 1\n",
        "src/pkg/rewards.py": "from .utils.remote import client\n\ndef score():\n    return 1\n",
        "src/pkg/utils/__init__.py": "from .helpers import helper\n",
        "src/pkg/utils/helpers.py": "def helper():\n    def inner():\n"
                                    "        from ..configs import C\n    return inner\n",
        "src/pkg/utils/remote.py": "import aiohttp\nclient = aiohttp\n",
        "src/pkg/unused.py": "import pkg.main\n",
    }  # fmt: skip
    for rel, text in files.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_text(text)


def test_extraction_follows_the_package_imports_in_a_folder_and_a_git_repository(tmp_path):
    folder = tmp_path / "checkout"
    _package(folder)
    expected = {"src/pkg/__init__.py", "src/pkg/main.py", "src/pkg/configs.py",
                "src/pkg/rewards.py", "src/pkg/utils/__init__.py", "src/pkg/utils/helpers.py",
                "src/pkg/utils/remote.py"}  # fmt: skip
    files = harness.extract_package(harness.Source(folder), "src/pkg/main.py", "src", "pkg")
    assert set(files) == expected  # not unused.py, which nothing imports
    # An edit that drops an import drops the module from what is extracted.
    def edit(rel, text):
        log = harness.EditLog()
        return harness.drop_imports(text, "pkg.utils.remote", "pkg.rewards", "remote", log) \
            if rel == "src/pkg/rewards.py" else text  # fmt: skip

    files = harness.extract_package(harness.Source(folder), "src/pkg/main.py", "src", "pkg", edit)
    assert set(files) == expected - {"src/pkg/utils/remote.py"}
    # A git repository is read at HEAD: an uncommitted change is not seen.
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(folder)]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "files"], check=True)
    (folder / "src/pkg/configs.py").write_text("C = 2\n")
    for source in (folder, folder / ".git"):
        files = harness.extract_package(harness.Source(source), "src/pkg/main.py", "src", "pkg")
        assert set(files) == expected and files["src/pkg/configs.py"] == "C = 1\n"
    with pytest.raises(SystemExit, match="neither a git directory nor a folder"):
        harness.Source(tmp_path / "absent")


# -- end to end on fake sources: TRL's and open-r1's layouts, scripts written for this test -----

FAKE_AGENT = r'''"""A tool-using GRPO script in the layout of TRL's agent example."""

import sqlite3

from datasets import load_dataset

from trl import GRPOConfig, GRPOTrainer, ModelConfig, ScriptArguments, TrlParser


def query_biogrid(sql_command: str) -> list[tuple]:
    """Run one read-only SQL statement on the interactions table.

    Args:
        sql_command: The SQL statement.
    """
    conn = sqlite3.connect("file:biogrid.db?mode=ro", uri=True)
    try:
        return conn.execute(sql_command).fetchall()
    finally:
        conn.close()


def format_example(example):
    return {"prompt": [{"role": "user", "content": f"Question: {example['question']}"}]}


def correctness_reward(completions, answer, **kwargs):
    return [float(f"*{a.lower()}*" in c[-1]["content"].lower())
            for c, a in zip(completions, answer)]


def structure_reward(completions, **kwargs):
    scores = []
    for turns in completions:
        called = any(t["role"] == "assistant" and t.get("tool_calls") for t in turns)
        answered = any(t["role"] == "tool" for t in turns)
        scores.append(0.1 if called and answered else -0.15 if called else 0.0)
    return scores


def query_reward(completions, **kwargs):
    return [float(sum(len(t.get("tool_calls") or []) for t in turns)) for turns in completions]


if __name__ == "__main__":
    parser = TrlParser((ScriptArguments, GRPOConfig, ModelConfig))
    script_args, training_args, model_args = parser.parse_args_and_config()
    table = load_dataset("qgallouedec/biogrid", split="train").to_pandas()
    table.columns = [c.replace(" ", "_") for c in table.columns]
    with sqlite3.connect("biogrid.db") as conn:
        table.to_sql("interactions", conn, if_exists="replace", index=False)
    print(f"biogrid.db created. Rows stored: {len(table)}")
    dataset = load_dataset("qgallouedec/biogrid_qa", split="train")
    dataset = dataset.filter(lambda row: row["question"].startswith("Does the gene "))
    dataset = dataset.map(format_example, remove_columns=["question"])
    trainer = GRPOTrainer(model=model_args.model_name_or_path, train_dataset=dataset,
                          tools=[query_biogrid], args=training_args,
                          reward_funcs=[correctness_reward, structure_reward, query_reward])
    trainer.train()
    trainer.save_model(training_args.output_dir)
'''

FAKE_CONFIGS = r'''from dataclasses import dataclass, field

import trl


@dataclass
class GRPOScriptArguments(trl.ScriptArguments):
    reward_funcs: list[str] = field(default_factory=lambda: ["accuracy", "format", "tag_count"])
    dataset_prompt_column: str = "prompt"


@dataclass
class GRPOConfig(trl.GRPOConfig):
    system_prompt: str | None = None
'''

FAKE_REWARDS = r'''from .utils.competitive_programming import score_submission


def _boxed(text):
    return text.split("\\boxed{")[-1].split("}")[0] if "\\boxed{" in text else None


def accuracy_reward(completions, solution, **kwargs):
    return [float(_boxed(c[0]["content"]) == _boxed(s)) for c, s in zip(completions, solution)]


def format_reward(completions, **kwargs):
    def shaped(text):
        return (text.startswith("<think>\n") and "\n</think>\n<answer>\n" in text
                and text.endswith("\n</answer>"))
    return [float(shaped(c[0]["content"])) for c in completions]


def tag_count_reward(completions, **kwargs):
    tags = ("<think>\n", "\n</think>\n", "\n<answer>\n", "\n</answer>")
    return [sum(0.25 for t in tags if c[0]["content"].count(t) == 1) for c in completions]


def get_reward_funcs(script_args):
    registry = {"accuracy": accuracy_reward, "format": format_reward,
                "tag_count": tag_count_reward}
    return [registry[name] for name in script_args.reward_funcs]
'''

FAKE_MODEL_UTILS = r'''import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from trl import ModelConfig, get_quantization_config


def get_tokenizer(model_args: ModelConfig, training_args):
    return AutoTokenizer.from_pretrained(model_args.model_name_or_path,
                                         trust_remote_code=model_args.trust_remote_code)


def get_model(model_args: ModelConfig, training_args):
    return AutoModelForCausalLM.from_pretrained(
        model_args.model_name_or_path, dtype=getattr(torch, model_args.torch_dtype),
        attn_implementation=model_args.attn_implementation,
        quantization_config=get_quantization_config(model_args))
'''

FAKE_GRPO = r'''from typing import TYPE_CHECKING

import datasets

from open_r1.configs import GRPOConfig, GRPOScriptArguments
from open_r1.rewards import get_reward_funcs
from open_r1.utils import get_model, get_tokenizer
from trl import GRPOTrainer, ModelConfig, TrlParser, get_peft_config

if TYPE_CHECKING:
    from trl import SFTConfig


def main(script_args, training_args, model_args):
    dataset = datasets.load_dataset(script_args.dataset_name)
    tokenizer = get_tokenizer(model_args, training_args)
    column = script_args.dataset_prompt_column

    def conversation(row):
        return {"prompt": [{"role": "system", "content": training_args.system_prompt},
                           {"role": "user", "content": row[column]}]}

    dataset = dataset.map(conversation)
    trainer = GRPOTrainer(
        model=get_model(model_args, training_args), reward_funcs=get_reward_funcs(script_args),
        args=training_args, train_dataset=dataset["train"],
        eval_dataset=dataset["test"] if training_args.eval_strategy != "no" else None,
        peft_config=get_peft_config(model_args), processing_class=tokenizer)
    metrics = trainer.train().metrics
    metrics["train_samples"] = len(dataset["train"])
    trainer.log_metrics("train", metrics)
    trainer.save_metrics("train", metrics)
    trainer.save_state()
    trainer.save_model(training_args.output_dir)
    if trainer.accelerator.is_main_process:
        trainer.create_model_card(dataset_name=script_args.dataset_name, tags=["open-r1"])
        trainer.model.config.use_cache = True
        trainer.model.config.save_pretrained(training_args.output_dir)


if __name__ == "__main__":
    parser = TrlParser((GRPOScriptArguments, GRPOConfig, ModelConfig))
    main(*parser.parse_args_and_config())
'''

FAKE_RECIPE = r'''model_name_or_path: Qwen/Qwen2.5-1.5B-Instruct
torch_dtype: bfloat16
attn_implementation: flash_attention_2
dataset_name: open-r1/OpenR1-Math-220k
dataset_prompt_column: problem
system_prompt: "Respond in the following format: <think>\n...\n</think>\n<answer>\n...\n</answer>"
bf16: true
use_vllm: true
learning_rate: 1.0e-05
lr_scheduler_type: cosine
warmup_ratio: 0.1
num_generations: 16
max_completion_length: 1024
reward_funcs: [accuracy, format, tag_count]
log_completions: true
push_to_hub: true
report_to: [wandb]
'''

FAKE_OPENR1 = {
    "src/open_r1/__init__.py": "",
    "src/open_r1/configs.py": FAKE_CONFIGS,
    "src/open_r1/rewards.py": FAKE_REWARDS,
    "src/open_r1/grpo.py": FAKE_GRPO,
    "src/open_r1/sft.py": "import trl\n\nprint(trl.SFTTrainer)\n",
    "src/open_r1/utils/__init__.py": "from .model_utils import get_model, get_tokenizer\n",
    "src/open_r1/utils/model_utils.py": FAKE_MODEL_UTILS,
    "src/open_r1/utils/competitive_programming.py": "import aiohttp\n\nscore_submission = 1\n",
    "recipes/Qwen2.5-1.5B-Instruct/grpo/config_demo.yaml": FAKE_RECIPE,
}


@pytest.mark.slow
def test_the_harness_end_to_end_on_fake_sources(tmp_path):
    """``scripts/trl_scripts.py`` on a bare git repository laid out as TRL's and a checkout
    folder laid out as open-r1's: both scripts are extracted, edited, run two steps on the
    stand-ins and checked; results.md and the diffs say exactly what changed."""
    trl_tree = tmp_path / "trl-checkout"
    (trl_tree / "examples/scripts").mkdir(parents=True)
    (trl_tree / "examples/scripts/grpo_agent.py").write_text(FAKE_AGENT)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(trl_tree)]
    for command in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "agent"]):
        subprocess.run([*git, *command], check=True)
    subprocess.run(["git", "clone", "-q", "--bare", str(trl_tree), str(tmp_path / "trl.git")],
                   check=True)  # fmt: skip
    openr1 = tmp_path / "open-r1"
    for rel, text in FAKE_OPENR1.items():
        (openr1 / rel).parent.mkdir(parents=True, exist_ok=True)
        (openr1 / rel).write_text(text)
    work = tmp_path / "work"
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), OMP_NUM_THREADS="1")
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "trl_scripts.py"), "--trl-src",
         str(tmp_path / "trl.git"), "--openr1-src", str(openr1), "--work", str(work)],
        capture_output=True, text=True, env=env, timeout=900)  # fmt: skip
    results = (work / "results.md").read_text()
    assert result.returncode == 0, results + result.stderr[-3000:]
    rows = [line for line in results.splitlines()
            if line.startswith(("| grpo_agent |", "| open-r1 |"))]  # fmt: skip
    assert len(rows) == 2 and all("| PASS |" in row for row in rows), results
    # Only the modules grpo.py imports are copied: not sft.py, nor the dropped remote client
    # (dropped only where its package, aiohttp, is not installed).
    dropped = importlib.util.find_spec("aiohttp") is None
    copied = {p.relative_to(work / "open-r1").as_posix()
              for p in (work / "open-r1" / "src").rglob("*.py")}  # fmt: skip
    expected = {f"src/open_r1/{rel}" for rel in (
        "__init__.py", "configs.py", "rewards.py", "grpo.py", "utils/__init__.py",
        "utils/model_utils.py", *([] if dropped else ["utils/competitive_programming.py"]))}
    assert copied == expected
    # The TYPE_CHECKING-only SFTConfig is reported and left on trl, not invented.
    assert "src/open_r1/grpo.py: trl.SFTConfig (line 11)" in results
    # Lines changed per file: the agent's import line and its two hub ids; open-r1's import
    # lines, configs.py's `import trl`, the recipe's model and dataset, the remote import.
    for sizes in ("examples/scripts/grpo_agent.py -3/+3", "src/open_r1/configs.py -1/+1",
                  "src/open_r1/grpo.py -1/+1", "src/open_r1/utils/model_utils.py -1/+1",
                  "recipes/Qwen2.5-1.5B-Instruct/grpo/config_demo.yaml -2/+2"):  # fmt: skip
        assert sizes in results, sizes
    assert ("src/open_r1/rewards.py -1/+0" in results) == dropped
    diff = (work / "diffs" / "open-r1.diff").read_text()
    changed = [line for line in diff.splitlines() if line[:1] in "+-"]
    assert "+import groupwise as trl" in changed
    assert not any("SFTConfig" in line for line in changed)
    assert "    from trl import SFTConfig\n" in (work / "open-r1/src/open_r1/grpo.py").read_text()
    agent = (work / "diffs" / "grpo_agent.diff").read_text()
    assert "+from groupwise import GRPOConfig, GRPOTrainer, ModelConfig, ScriptArguments" in agent
    # What the runs left: open-r1's metrics files and card, the tool's calls, loadable models.
    out = work / "open-r1" / "out"
    assert json.loads((out / "train_results.json").read_text())["train_samples"] == 4
    assert "open-r1" in (out / "README.md").read_text()
    for check, count in (("| model loads | yes |", 2), ("| completions logged | yes |", 2),
                         ("| tool called | yes |", 1), ("| rewards saw tool_calls | yes |", 1),
                         ("| train_samples | yes |", 1), ("| model card | yes |", 1)):  # fmt: skip
        assert results.count(check) == count, check
