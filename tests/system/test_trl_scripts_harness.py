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


# -- TRL's gspo.py, grpo_2048.py and grpo_continuous_batching.py: their edits and checks -------

PARSED = textwrap.dedent("""\
    from trl import (
        GRPOConfig,
        GRPOTrainer,
        ModelConfig,
        TrlParser,
        get_peft_config,
    )
    from trl.rewards import accuracy_reward

    parser = TrlParser((GRPOConfig, ModelConfig))
""")


def test_the_parser_variant_switches_only_the_trainers_two_names():
    """A user who changes only GRPOConfig / GRPOTrainer: TrlParser, ModelConfig and the rest
    (trl.rewards included) stay TRL's and are listed; TRL's own run switches nothing."""
    log = harness.EditLog()
    out = harness.edit_trl_imports(PARSED, log, harness.trainer_only)
    assert out.splitlines()[:3] == ["from groupwise import GRPOConfig, GRPOTrainer",
                                    "from trl import ModelConfig, TrlParser, get_peft_config",
                                    "from trl.rewards import accuracy_reward"]  # fmt: skip
    assert [m.split(" (")[0] for m in log.missing] == [
        "trl.ModelConfig", "trl.TrlParser", "trl.get_peft_config", "trl.rewards.accuracy_reward"]
    assert harness.edit_trl_imports(PARSED, harness.EditLog(), harness.on_trl) == PARSED


GAME_SCRIPT = textwrap.dedent("""\
    def main():
        trainer = GRPOTrainer(
            model="org/model",
            args=GRPOConfig(
                logging_steps=1,
                report_to="trackio",
                max_completion_length=2048,
            ),
        )
        other = GRPOConfig(beta=0.1)
        empty = GRPOConfig()
        untouched = SFTConfig(report_to="trackio")
""")


def test_keyword_overrides_for_a_script_without_a_command_line():
    """(c): GRPOConfig(...)'s values replaced in place, new ones added one per line in a call
    laid out one argument per line, inline otherwise; other calls are left alone."""
    log = harness.EditLog()
    values = {"max_steps": 2, "max_completion_length": 256, "report_to": "none"}
    out = harness.override_keywords(GAME_SCRIPT, "GRPOConfig", values, "CPU scale", log)
    assert out == textwrap.dedent("""\
        def main():
            trainer = GRPOTrainer(
                model="org/model",
                args=GRPOConfig(
                    logging_steps=1,
                    report_to="none",
                    max_completion_length=256,
                    max_steps=2,
                ),
            )
            other = GRPOConfig(beta=0.1, max_steps=2, max_completion_length=256, report_to="none")
            empty = GRPOConfig(max_steps=2, max_completion_length=256, report_to="none")
            untouched = SFTConfig(report_to="trackio")
    """)  # fmt: skip
    assert "line 6: GRPOConfig(report_to=...) -> 'none' (CPU scale)" in log.changes
    assert "line 4: GRPOConfig(..., max_steps=2) added (CPU scale)" in log.changes
    assert len(log.changes) == 2 + 1 + 3 + 3  # replaced, added; then added to the other two
    # Positions are byte offsets in ast: a non-ASCII character before the call changes nothing.
    text = 'x = "é"; c = GRPOConfig(a=1)\n'
    assert harness.override_keywords(text, "GRPOConfig", {"a": 2}, "r", harness.EditLog()) == (
        'x = "é"; c = GRPOConfig(a=2)\n')  # fmt: skip


def test_the_new_scripts_are_prepared_from_a_trl_layout(tmp_path):
    """gspo.py three ways (groupwise, the parser variant, TRL itself), grpo_2048.py with its
    GRPOConfig keywords, grpo_continuous_batching.py's default dataset id -> the stand-in."""
    tree = tmp_path / "trl"
    scripts = {
        harness.GSPO: PARSED + 'load_dataset("AI-MO/NuminaMath-TIR", split=["train[:5%]"])\n',
        harness.GAME: "from trl import GRPOConfig, GRPOTrainer\n" + GAME_SCRIPT,
        harness.BATCHING: PARSED + 'load_dataset(name or "openai/gsm8k", "main")\n',
    }  # fmt: skip
    for rel, text in scripts.items():
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        (tree / rel).write_text(text)
    source, work = harness.Source(tree), tmp_path / "work"
    hub = {"AI-MO/NuminaMath-TIR": "/a/numina", "openai/gsm8k": "/a/gsm8k", "org/model": "/a/m"}
    gspo = harness.prepare_trl(source, work, hub, harness.GSPO, "gspo")
    variant = harness.prepare_trl(source, work, hub, harness.GSPO, "gspo-trl-parser",
                                  harness.trainer_only)  # fmt: skip
    on_trl = harness.prepare_trl(source, work, hub, harness.GSPO, "gspo-trl", harness.on_trl)
    copied = (work / "gspo-trl" / harness.GSPO).read_text()
    assert copied == scripts[harness.GSPO].replace("AI-MO/NuminaMath-TIR", "/a/numina")
    assert on_trl.missing == [] and on_trl.sizes == {harness.GSPO: (1, 1)}
    assert "from trl import ModelConfig, TrlParser, get_peft_config" in (
        work / "gspo-trl-parser" / harness.GSPO).read_text()  # fmt: skip
    assert len(variant.missing) == 4 and gspo.sizes[harness.GSPO][0] > 1
    game = harness.prepare_trl(source, work, hub, harness.GAME, "grpo_2048",
                               keywords=harness.game_keywords(3))  # fmt: skip
    text = (work / "grpo_2048" / harness.GAME).read_text()
    assert text.startswith("from groupwise import GRPOConfig, GRPOTrainer\n")
    assert 'model="/a/m"' in text and "            max_steps=3,\n" in text
    assert '            report_to="none",\n' in text and "            use_cpu=True,\n" in text
    diff = (work / "diffs" / "grpo_2048.diff").read_text()
    assert '-            report_to="trackio",' in diff and "CPU scale" in "".join(
        c for log in game.logs.values() for c in log.changes)  # fmt: skip
    harness.prepare_trl(source, work, hub, harness.BATCHING, "grpo_continuous_batching")
    assert 'name or "/a/gsm8k"' in (work / "grpo_continuous_batching" / harness.BATCHING
                                   ).read_text()  # fmt: skip
    with pytest.raises(SystemExit, match="is not in"):
        harness.prepare_trl(source, work, hub, "examples/scripts/absent.py", "absent")


def _write(folder: Path, files: dict[str, object]) -> None:
    for rel, content in files.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_text(content if isinstance(content, str) else json.dumps(content))


def test_optimizer_steps_and_saved_model_as_trl_and_groupwise_leave_them(tmp_path):
    """TRL's count: the last checkpoint's trainer_state.json (TRL saves one at the last step);
    groupwise's: trainer_state.json if saved, else the last metrics row; the saved model is
    the output folder's, else the last checkpoint's."""
    trl = tmp_path / "trl" / "out"
    _write(trl, {"checkpoint-1/trainer_state.json": {"global_step": 1},
                 "checkpoint-10/trainer_state.json": {"global_step": 10},
                 "checkpoint-10/adapter_config.json": {},
                 "checkpoint-2/trainer_state.json": {"global_step": 2}})  # fmt: skip
    assert harness.optimizer_steps(trl) == (10, "out/checkpoint-10/trainer_state.json")
    assert harness.saved_model(trl) == trl / "checkpoint-10"
    ours = tmp_path / "ours" / "out"
    rows = "\n".join(json.dumps({"step": s, "loss": 0.0}) for s in (1, 2, 4)) + "\n"
    _write(ours, {"metrics.jsonl": rows, "checkpoint-4/checkpoint.json": {"step": 4},
                  "config.json": {}})  # fmt: skip
    steps, where = harness.optimizer_steps(ours)
    assert steps == 4 and "metrics.jsonl" in where and "checkpoint-4" in where
    assert harness.saved_model(ours) == ours
    _write(ours, {"trainer_state.json": {"global_step": 4}})  # save_state() was called
    assert harness.optimizer_steps(ours) == (4, "out/trainer_state.json")
    assert harness.optimizer_steps(tmp_path / "none") == (None, "no record")
    assert harness.saved_model(tmp_path / "none") is None
    # Where a run without a command line put its output: TRL's default, else the metrics'.
    game = tmp_path / "game"
    _write(game, {"runs/model-task-1/metrics.jsonl": rows})
    assert harness.output_folder(game) == game / "runs/model-task-1"
    _write(game, {"trainer_output/metrics.jsonl": rows})
    assert harness.output_folder(game) == game / "trainer_output"
    assert harness.output_folder(tmp_path / "ours") == ours


def test_rewards_are_checked_in_every_logged_row(tmp_path):
    def rows(*entries):
        _write(tmp_path, {"metrics.jsonl": "".join(json.dumps(e) + "\n" for e in entries)})

    ok = {"rewards/r/mean": 0.5, "rewards/r/errors": 0}
    rows({"step": 2, **ok})  # logging_steps above max_steps: the last step only
    assert harness.check_rewards(tmp_path, ["r"], 2) == (True, "steps [2]: r [0.5]")
    rows({"step": 1, **ok}, {"step": 2, "rewards/r/mean": float("nan")})
    assert harness.check_rewards(tmp_path, ["r"], 2)[0] is False
    rows({"step": 1, **ok}, {"step": 2, **ok, "rewards/r/errors": 1})
    assert harness.check_rewards(tmp_path, ["r"], 2)[0] is False
    rows({"step": 2, **ok}, {"step": 1, **ok})
    assert harness.check_rewards(tmp_path, ["r"], 2) == (False, "metrics.jsonl steps [2, 1]")
    rows({"step": 3, **ok})
    assert harness.check_rewards(tmp_path, ["r"], 2)[0] is False
    rows()
    assert harness.check_rewards(tmp_path, ["r"], 2)[0] is False


def test_results_table_has_the_step_count_and_model_columns(tmp_path):
    prepared = harness.Prepared("gspo", tmp_path / "gspo", {}, {"gspo.py": (2, 1)})
    checks = [("exit 0", True, "0"),
              ("same optimizer-step count as TRL", False, "groupwise 3; TRL 2"),
              ("model loads", True, "PeftModelForCausalLM")]  # fmt: skip
    rows = [harness.Row("gspo", "abc", "python gspo.py", 0, checks, prepared, 3, 2),
            harness.Row("gspo-trl", "abc", "python gspo.py", 1, [("exit 0", False, "boom")],
                        prepared, None, 2)]  # fmt: skip
    results = harness.write_results(tmp_path, rows).read_text()
    assert "| same optimizer-step count as TRL | saved model loads |" in results
    assert ("| gspo | abc | FAIL | 3 (2) | NO | yes | same optimizer-step count as TRL: "
            "groupwise 3; TRL 2 | - | gspo.py -2/+1 |") in results
    assert "| gspo-trl | abc | FAIL | - (2) | - | - | exit 0: boom |" in results


@pytest.mark.slow
def test_the_stand_in_datasets_load_as_the_scripts_load_them(tmp_path):
    """gspo.py's 5% of NuminaMath-TIR's train and test splits, and gsm8k's "main" config by
    name (datasets reads the config from the folder's README, as from the hub's)."""
    from datasets import load_dataset

    hub = harness.build_datasets(tmp_path)
    train, test = load_dataset(hub["AI-MO/NuminaMath-TIR"], split=["train[:5%]", "test[:5%]"])
    assert (len(train), len(test)) == (5, 2)
    assert set(train.column_names) == {"problem", "solution", "messages"}
    gsm8k = load_dataset(hub["openai/gsm8k"], "main", split="train")
    assert gsm8k.column_names == ["question", "answer"] and len(gsm8k) == 4
    assert gsm8k[0]["answer"].split("####")[-1].strip() == "4"


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
         str(tmp_path / "trl.git"), "--openr1-src", str(openr1), "--work", str(work),
         "--only", "grpo_agent,open-r1"],  # this TRL tree holds the agent example only
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


FAKE_GSPO = r'''"""In the layout of TRL's gspo example: TrlParser, TRL's rewards, LoRA."""

import torch
from datasets import load_dataset

from trl import (
    GRPOConfig,
    GRPOTrainer,
    ModelConfig,
    ScriptArguments,
    TrlParser,
    get_peft_config,
)
from trl.rewards import accuracy_reward, think_format_reward

if __name__ == "__main__":
    parser = TrlParser((ScriptArguments, GRPOConfig, ModelConfig))
    script_args, training_args, model_args = parser.parse_args_and_config()
    training_args.model_init_kwargs = {"dtype": getattr(torch, model_args.dtype)}
    train, test = load_dataset("AI-MO/NuminaMath-TIR", split=["train[:5%]", "test[:5%]"])

    def conversation(row):
        return {"prompt": [{"role": "user", "content": row["problem"]}]}

    train = train.map(conversation).remove_columns(["messages", "problem"])
    trainer = GRPOTrainer(model=model_args.model_name_or_path, args=training_args,
                          reward_funcs=[think_format_reward, accuracy_reward],
                          train_dataset=train, peft_config=get_peft_config(model_args))
    trainer.train()
    trainer.save_model(training_args.output_dir)
'''

FAKE_GAME = r'''"""In the layout of TRL's 2048 example: environment_factory, no command line."""

import random

from datasets import Dataset
from peft import LoraConfig

from trl import GRPOConfig, GRPOTrainer

PROMPT = "Double the value. Use the tool `move` with one of: up, down, left, right."


class Game2048Env:
    def reset(self, **kwargs) -> str:
        self.score = 0.0
        self.value = random.choice([2, 4])
        return f"value={self.value}"

    def move(self, direction: str) -> str:
        """
        Play one move.

        Args:
            direction: One of "up", "down", "left", "right".

        Returns:
            The value after the move.
        """
        self.value *= 2
        self.score += 1.0
        return f"value={self.value}"


def reward_score(environments, **kwargs):
    return [env.score for env in environments]


def main() -> None:
    dataset = Dataset.from_dict({"prompt": [[{"role": "user", "content": PROMPT}]] * 50})
    trainer = GRPOTrainer(
        model="Qwen/Qwen3-4B",
        train_dataset=dataset,
        reward_funcs=reward_score,
        args=GRPOConfig(
            logging_steps=1,
            log_completions=True,
            report_to="trackio",
            max_completion_length=2048,
            per_device_train_batch_size=4,
            gradient_accumulation_steps=2,
        ),
        environment_factory=Game2048Env,
        peft_config=LoraConfig(),
    )
    trainer.train()


if __name__ == "__main__":
    main()
'''

FAKE_BATCHING = r'''"""In the layout of TRL's continuous-batching example: options set late."""

import re

from datasets import load_dataset

from trl import GRPOConfig, GRPOTrainer, ModelConfig, ScriptArguments, TrlParser, get_peft_config


def correctness_reward(completions, reference_answer, **kwargs):
    found = [re.search(r"####\s*(\d+)", c[-1]["content"]) for c in completions]
    return [float(bool(m) and m.group(1) == r) for m, r in zip(found, reference_answer)]


if __name__ == "__main__":
    parser = TrlParser((ScriptArguments, GRPOConfig, ModelConfig))
    script_args, training_args, model_args = parser.parse_args_and_config()
    dataset = load_dataset(script_args.dataset_name or "openai/gsm8k",
                           script_args.dataset_config or "main",
                           split=script_args.dataset_train_split)

    def conversation(row):
        return {"prompt": [{"role": "user", "content": row["question"]}],
                "reference_answer": row["answer"].split("####")[-1].strip()}

    dataset = dataset.map(conversation, remove_columns=dataset.column_names)
    training_args.use_transformers_continuous_batching = True
    if training_args.transformers_continuous_batching_config is None:
        training_args.transformers_continuous_batching_config = {"use_cuda_graph": False}
    trainer = GRPOTrainer(model=model_args.model_name_or_path, reward_funcs=correctness_reward,
                          args=training_args, train_dataset=dataset,
                          peft_config=get_peft_config(model_args))
    trainer.train()
    trainer.save_model(training_args.output_dir)
'''


@pytest.mark.slow
def test_the_new_trl_scripts_end_to_end_on_a_fake_source(tmp_path):
    """The gspo and continuous-batching layouts (each on TRL itself, on groupwise, and with
    only the trainer's two names switched) and the 2048 layout (its GRPOConfig keywords set to
    CPU scale), written here, run two steps each on the stand-ins (the TRL tree holds no agent
    example: the run goes on without it); every row's optimizer steps match TRL's."""
    import importlib.util as util

    if util.find_spec("trl") is None:
        pytest.skip("TRL is not installed: the gspo-trl row and the parser variant need it")
    tree = tmp_path / "trl"
    for rel, text in ((harness.GSPO, FAKE_GSPO), (harness.GAME, FAKE_GAME),
                      (harness.BATCHING, FAKE_BATCHING)):  # fmt: skip
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        (tree / rel).write_text(text)
    work = tmp_path / "work"
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), OMP_NUM_THREADS="1")
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "trl_scripts.py"), "--trl-src", str(tree),
         "--work", str(work)],
        capture_output=True, text=True, env=env, timeout=1500)  # fmt: skip
    assert (work / "results.md").exists(), result.stderr[-3000:]
    results = (work / "results.md").read_text()
    rows = {line.split(" | ")[0][2:]: line for line in results.splitlines()
            if line.startswith("| gspo") or line.startswith("| grpo_")}  # fmt: skip
    batching = "grpo_continuous_batching"
    assert list(rows) == ["gspo-trl", "gspo", "gspo-trl-parser", "grpo_2048", f"{batching}-trl",
                          batching, f"{batching}-trl-parser"], results  # fmt: skip
    for name, row in rows.items():
        assert name == "grpo_2048" or "| PASS | 2 (2) |" in row, results
    assert "Not run, the source lacking the script: examples/scripts/grpo_agent.py" in results
    version = harness.trl_version(sys.executable)
    for name in ("gspo", batching):
        assert results.count(f"(its run on TRL {version}, row {name}-trl)") == 2, results
    # TRL's run left its count in the last checkpoint's trainer_state.json.
    assert "out/checkpoint-2/trainer_state.json" in results
    # The game: the tool ran, the reward (its environments' scores) was logged, two steps.
    assert "| 2 (2) | yes | yes |" in rows["grpo_2048"], results
    for check in ("| move tool called | yes |", "| rewards logged | yes |"):
        assert check in results, check
    game = (work / "grpo_2048" / harness.GAME).read_text()
    assert "            max_steps=2,\n" in game and '            report_to="none",\n' in game
