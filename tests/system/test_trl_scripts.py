"""Real TRL scripts, run with their ``from trl import ...`` line switched to groupwise: the
trimmed copies in tests/fixtures/trl_scripts/ (each names its source, commit, licence and every
change: the import line and the offline stand-ins for hub datasets) run as a user runs them,
``python script.py --option value ...``, in a subprocess, on the built-in tiny-random model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

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


def _biogrid_assets(assets: Path) -> None:
    """Stand-ins for the hub datasets qgallouedec/biogrid (interactions, with the spaced column
    names the script renames) and qgallouedec/biogrid_qa (question, answer)."""
    import pandas as pd

    (assets / "qgallouedec" / "biogrid").mkdir(parents=True)
    (assets / "qgallouedec" / "biogrid_qa").mkdir(parents=True)
    pd.DataFrame({
        "Alt IDs Interactor A": ["entrez gene/locuslink:MAP2K4", "entrez gene/locuslink:TP53"],
        "Alt IDs Interactor B": ["entrez gene/locuslink:MAPK8", "entrez gene/locuslink:MDM2"],
        "Aliases Interactor A": ["entrez gene/locuslink:JNKK(gene name synonym)", "-"],
        "Aliases Interactor B": ["-", "-"],
        "Taxid Interactor A": ["taxid:9606", "taxid:9606"],
    }).to_parquet(assets / "qgallouedec" / "biogrid" / "train.parquet")  # fmt: skip
    questions = [
        ("Does the gene TP53 interact with MDM2?", "Yes"),
        ("Does the gene TP53 interact with MAPK8?", "No"),
        ("Does the gene MAP2K4 interact with MAPK8?", "Yes"),
        ("Does the gene MDM2 interact with JNKK?", "No"),
        ("Which genes interact with TP53?", "MDM2"),  # the script keeps "Does the gene" ones
    ]
    pd.DataFrame({"question": [q for q, _ in questions], "answer": [a for _, a in questions]}
                 ).to_parquet(assets / "qgallouedec" / "biogrid_qa" / "train.parquet")  # fmt: skip


@pytest.mark.slow
def test_trl_grpo_agent_script_trains_and_saves(tmp_path):
    """TRL's examples/scripts/grpo_agent.py: TrlParser((ScriptArguments, GRPOConfig,
    ModelConfig)) with TRL's names on the command line, a SQL tool, three reward functions."""
    assets = tmp_path / "assets"
    _biogrid_assets(assets)
    result = _run("grpo_agent.py", [
        "--model_name_or_path", "tiny-random", "--output_dir", "out", "--max_steps", "2",
        "--per_device_train_batch_size", "4", "--num_generations", "2",
        "--max_completion_length", "8", "--use_cpu", "True", "--bf16", "False",
        "--report_to", "none", "--push_to_hub", "False", "--learning_rate", "1e-2",
        "--seed", "0", "--disable_tqdm", "True",
    ], tmp_path, assets)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "biogrid.db created. Rows stored: 2" in result.stdout
    out = tmp_path / "out"
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [1, 2]
    # The script's three reward functions scored every step's completions.
    for name in ("correctness_reward", "structure_reward", "query_reward"):
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
