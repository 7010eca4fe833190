"""The prepared GPU check (scripts/gpu_check.sh, scripts/gpu_check.py) on its CPU path, so the
script only a lent GPU runs in full cannot rot: every check runs, and the results that mean
something on a CPU hold."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
WRAPPER = ROOT / "scripts" / "gpu_check.sh"
PROJECTIONS_AND_NORMS = ("attention", "mlp", "norm")


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {**os.environ, "PYTHON": sys.executable, "OMP_NUM_THREADS": "1",
           "GPU_CHECK_SITE": str(tmp_path / "site"), **extra}  # fmt: skip
    env.pop("OUT", None)  # the default --out of a run on the GPU machine
    return env


@pytest.mark.slow  # about 40 s on 2 cores: six checks, three short trainings, one subprocess
def test_gpu_check_cpu_path_writes_its_summary(tmp_path):
    out = tmp_path / "out"
    done = subprocess.run(
        ["bash", str(WRAPPER), "--device", "cpu", "--quick", "--tokenizer", "synthetic",
         "--out", str(out)],
        cwd=ROOT, env=_env(tmp_path), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert "all passed" in done.stdout
    summary = json.loads((out / "gpu_check.json").read_text())
    assert summary["passed"] and summary["quick"] and summary["tokenizer"] == "synthetic"
    assert {"torch", "transformers", "device", "grpo_options"} <= set(summary["environment"])
    checks = summary["checks"]
    assert list(checks) == ["precision", "learning", "sdpa_left_padding", "memory",
                            "collectives", "generation", "static_engine", "step_time",
                            "vllm"]  # fmt: skip
    for name, check in checks.items():
        assert check["passed"] is True and check["summary"] and check["seconds"] >= 0, name

    precision = checks["precision"]
    for mode in ("fp32", "bf16_mixed"):
        assert precision[mode]["weights_dtype"] == "torch.float32"
        moved = precision[mode]["fraction_moved_in_some_step"]
        assert all(moved[f] >= 0.99 for f in PROJECTIONS_AND_NORMS), (mode, moved)
    assert precision["bf16_mixed"]["precision"] == "bf16 mixed"
    pure = precision["bf16_pure"]
    assert pure["weights_dtype"] == "torch.bfloat16"
    assert any("PrecisionWarning" in w for w in pure["warnings"])
    for fam in PROJECTIONS_AND_NORMS:  # bf16 weights lose most updates at lr 1e-6
        assert pure["fraction_changed"][fam] < 0.5 * precision["fp32"]["fraction_changed"][fam]
    assert pure["fraction_changed"]["norm"] == 0.0

    learning = checks["learning"]
    assert learning["last5_reward"] >= learning["first5_reward"] + 0.1

    sdpa = checks["sdpa_left_padding"]
    assert all(sdpa[mode]["finite"] for mode in ("fp32", "bf16_autocast", "bf16_weights"))
    assert sdpa["fp32"]["padded_vs_alone_max_abs_diff"] < 1e-3

    collectives = checks["collectives"]
    assert collectives["backend"] == "gloo"
    assert collectives["calls"] and set(collectives["calls"].values()) == {"ok"}

    generation = checks["generation"]
    for engine in ("hf_fp32", "hf_bf16_autocast", "static_bf16", "static_bf16_compiled"):
        assert generation[engine]["tokens_per_second"] > 0, generation[engine]
    assert generation["static_bf16"]["engine"] == "StaticEngine"
    assert generation["static_bf16_compiled_compile_s"] >= 0
    assert generation["static_bf16_graphs"].startswith("not run: CUDA graphs need")
    assert generation["static_bf16_compiled_over_eager"] > 0
    assert (out / "gpu_check.md").read_text().count("| pass |") == len(checks)
    step_time = checks["step_time"]
    assert step_time["hf"]["engine"] == "HFEngine"
    assert step_time["static"]["engine"] == "StaticEngine"
    for engine in ("hf", "static"):
        assert step_time[engine]["steps_logged"] == step_time["steps"]
        medians = step_time[engine]["median_s"]
        assert 0 < medians["generation"] < medians["step"]
        assert 0 < medians["update"] < medians["step"]
    assert step_time["static_over_hf"]["step"] > 0
    static = checks["static_engine"]
    assert static["greedy_rows_identical"] >= 0.75 and static["max_logprob_gap"] < 1e-3
    # vLLM, where both it and a groupwise engine for it are installed, is measured too.
    assert "vllm_bf16_autocast" in generation or generation["vllm"].startswith("not available")

    # The vLLM comparison runs only where vllm imports; here it records why it did not run.
    assert checks["vllm"]["skipped"].startswith("not run")

    memory = checks["memory"]
    low, high = memory["expected_band"]
    for engine in ("hf", "static"):
        assert low <= memory[engine]["measured_over_predicted"] <= high, memory[engine]
    # The static engine's own weight copy is in its plan (fp32 on a CPU without autocast).
    static = memory["static"]
    assert static["generation_dtype"] == "fp32"
    copy = static["predicted_components"]["generation engine weights"]
    assert copy == static["predicted_components"]["policy weights"]
    assert "generation engine weights" not in memory["hf"]["predicted_components"]


def _wheel(folder: Path, name: str, version: str) -> Path:
    """A minimal pure-Python wheel: one empty module and its metadata."""
    dist_info = f"{name}-{version}.dist-info"
    path = folder / f"{name}-{version}-py3-none-any.whl"
    files = {
        f"{name}/__init__.py": "",
        f"{dist_info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{dist_info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }
    files[f"{dist_info}/RECORD"] = "".join(f"{f},,\n" for f in [*files, f"{dist_info}/RECORD"])
    with zipfile.ZipFile(path, "w") as archive:
        for member, text in files.items():
            archive.writestr(member, text)
    return path


def test_gpu_check_installs_only_the_carried_wheels_it_needs(tmp_path):
    """A carried wheel is installed when its package is missing; one already there at or above
    groupwise's floor is left alone (the machine's own copy is used)."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    _wheel(wheels, "gpu_check_probe", "1.0")
    _wheel(wheels, "tqdm", "0.0.1")  # installed here, above the floor pyproject declares
    done = subprocess.run(
        ["bash", str(WRAPPER), "--help"], cwd=ROOT,
        env=_env(tmp_path, GPU_CHECK_WHEELS=str(wheels)), capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "installed from the carried wheels: gpu_check_probe-1.0-py3-none-any.whl" in done.stdout
    assert "tqdm" not in done.stdout.split("installed from")[1].splitlines()[0]
    assert (tmp_path / "site" / "gpu_check_probe" / "__init__.py").exists()
    assert not (tmp_path / "site" / "tqdm").exists()


@pytest.mark.slow  # about 50 s on 2 cores: two groupwise runs and TRL's, at tiny sizes
def test_gpu_check_real_suite_cpu_path(tmp_path):
    """The real-size stages at tiny sizes: groupwise with the HF and the default engine against
    the planner, TRL's GRPOTrainer from the carried wheel, and the stages whose options this
    tree lacks saying so."""
    out = tmp_path / "out"
    done = subprocess.run(
        ["bash", str(WRAPPER), "--device", "cpu", "--quick", "--tokenizer", "synthetic",
         "--suite", "real", "--out", str(out)],
        cwd=ROOT, env=_env(tmp_path), capture_output=True, text=True, timeout=400,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    summary = json.loads((out / "gpu_check.json").read_text())
    assert summary["passed"] and summary["suite"] == "real"
    checks = summary["checks"]
    assert list(checks) == ["real_full_ft", "real_trl", "real_qlora", "real_offload"]
    full = checks["real_full_ft"]
    assert full["sizes"]["completion_len"] == 8 and full["shape_from"]
    # On a CPU the default engine is the HF engine (auto); both ran every step.
    for engine in ("hf", "default"):
        run = full[engine]
        assert run["engine"] == "HFEngine" and run["steps_logged"] == full["sizes"]["steps"]
        assert run["generation_tokens_per_s"] > 0 and run["median_s"]["step"] > 0
        assert run["weights_dtype"] == "torch.float32"
        assert run["predicted_bytes"] > 0 and run["peak_reserved_bytes"] is None  # CPU
    assert full["default_over_hf_step"] > 0
    trl = checks["real_trl"]  # installed from scripts/wheels into the check's own site
    assert trl["trl"] == "1.16.0" and len(trl["step_seconds"]) == full["sizes"]["trl_steps"]
    assert trl["weights_dtype"] == "torch.float32"
    assert set(trl["groupwise_over_trl"]) == {"hf_step_over_trl", "default_step_over_trl"}
    for name, needs in (("real_qlora", "load_in_4bit"), ("real_offload", "activation_offloading")):
        stage = checks[name]
        if summary["environment"]["grpo_options"][needs]:
            assert stage["steps_logged"] >= 2 and "skipped" not in stage, stage
        else:
            assert stage["skipped"].startswith("not run: GRPOConfig has n"), stage
    markdown = (out / "gpu_check.md").read_text()
    assert "real suite" in markdown and "| real_trl | pass |" in markdown
