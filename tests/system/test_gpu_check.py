"""The prepared GPU check (scripts/gpu_check.sh, scripts/gpu_check.py) on its CPU path, so the
script only a lent GPU runs in full cannot rot: every check runs, and the results that mean
something on a CPU hold."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

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


def test_gpu_check_installs_a_carried_pinned_wheel_over_another_version(tmp_path):
    """A carried wheel at the version the constraints pin replaces the machine's other version
    (the QLoRA stack runs as the tests ran it); one at another version than the pin does not."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    _wheel(wheels, "tqdm", "0.0.2")  # installed here at another version
    _wheel(wheels, "pyyaml", "0.0.3")  # installed here; the pin below is another version
    pins = tmp_path / "pins.txt"
    pins.write_text("tqdm==0.0.2\npyyaml==9.9.9\n")
    done = subprocess.run(
        ["bash", str(WRAPPER), "--help"], cwd=ROOT,
        env=_env(tmp_path, GPU_CHECK_WHEELS=str(wheels), GPU_CHECK_CONSTRAINTS=str(pins)),
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    line = done.stdout.split("installed from the carried wheels: ")[1].splitlines()[0]
    assert line == "tqdm-0.0.2-py3-none-any.whl"
    assert (tmp_path / "site" / "tqdm" / "__init__.py").exists()


@pytest.mark.slow  # about 30 s on 2 cores: four groupwise runs and TRL's, at tiny sizes
def test_gpu_check_real_suite_cpu_path(tmp_path):
    """The real-size stages at tiny sizes, in their order: QLoRA at micro-batch x accumulation,
    the 8-bit AdamW full fine-tune, the static against the HF engine on the 4-bit + LoRA model,
    TRL's GRPOTrainer from the carried wheel, offloading; the versions recorded."""
    out = tmp_path / "out"
    done = subprocess.run(
        ["bash", str(WRAPPER), "--device", "cpu", "--quick", "--tokenizer", "synthetic",
         "--suite", "real", "--out", str(out)],
        cwd=ROOT, env=_env(tmp_path), capture_output=True, text=True, timeout=400,
    )  # fmt: skip
    summary = json.loads((out / "gpu_check.json").read_text())
    checks = summary["checks"]
    assert summary["suite"] == "real" and "running" not in summary
    assert list(checks) == ["real_qlora", "real_full_ft", "real_decode_4bit", "real_trl",
                            "real_offload"]  # fmt: skip
    packages = summary["environment"]["packages"]
    assert set(packages) >= {"torch", "transformers", "peft", "bitsandbytes", "accelerate"}
    assert all(packages[name] for name in ("torch", "transformers", "peft", "bitsandbytes"))
    assert f"peft {packages['peft']}, bitsandbytes {packages['bitsandbytes']}" in done.stdout
    # Every stage ran (none says it did not) and the verdict is theirs.
    for name, check in checks.items():
        assert "not_run" not in check and "error" not in check, (name, check)
    assert summary["passed"] == all(c["passed"] for c in checks.values())
    assert done.returncode == (0 if summary["passed"] else 1), done.stdout[-4000:]

    qlora = checks["real_qlora"]
    sizes = qlora["sizes"]
    assert qlora["passed"], qlora
    assert sizes["qlora_micro_batch"] * sizes["qlora_accumulation"] == (
        sizes["prompts"] * sizes["group"]
    )
    assert qlora["engine"] == "HFEngine" and qlora["steps_logged"] == sizes["qlora_steps"]
    assert qlora["predicted_bytes"] > 0 and qlora["max_memory_reserved_bytes"] is None  # CPU
    assert qlora["memory_limit"]["limit_bytes"] == 22 * 2**30
    assert qlora["memory_limit"]["under_limit"] is None  # not measured on a CPU

    full = checks["real_full_ft"]
    assert full["passed"], full
    run = full["default"]
    assert run["optimizer"] == "bitsandbytes.optim.adamw.AdamW8bit (8-bit)"
    assert run["steps_logged"] == full["sizes"]["steps"]
    assert run["engine"] == "HFEngine"  # auto on a CPU
    assert run["weights_dtype"] == "torch.float32" and run["predicted_bytes"] > 0
    assert run["generation_tokens_per_s"] > 0 and run["median_s"]["step"] > 0

    decode = checks["real_decode_4bit"]
    assert decode["hf"]["engine"] == "HFEngine" and decode["hf"]["tokens_per_s"] > 0
    if decode["passed"]:  # the static engine decodes the 4-bit + LoRA model
        assert decode["static"]["engine"] == "StaticEngine"
        assert (
            decode["static"]["tokens"]
            == decode["hf"]["tokens"]
            == (decode["rows"] * decode["new_tokens"])
        )
        assert 0 <= decode["greedy_rows_identical"] <= 1
    else:  # it refused, and that fails the stage with the reason
        assert decode["static"]["error"] and "static failed" in decode["summary"]

    trl = checks["real_trl"]  # installed from scripts/wheels into the check's own site
    assert trl["passed"] and trl["trl"] == "1.16.0"
    assert trl["optimizer"].startswith("bitsandbytes.") and trl["optimizer"].endswith("(8-bit)")
    assert len(trl["step_seconds"]) == full["sizes"]["trl_steps"]
    assert trl["weights_dtype"] == "torch.float32"
    assert set(trl["groupwise_over_trl"]) == {"step_over_trl"}  # memory: not on a CPU

    offload = checks["real_offload"]
    assert offload["passed"] and offload["optimizer"] == run["optimizer"]
    assert offload["steps_logged"] == full["sizes"]["steps"] and offload["step_over_plain"] > 0
    markdown = (out / "gpu_check.md").read_text()
    assert "real suite" in markdown and "| real_trl | pass |" in markdown
    assert f"peft {packages['peft']}" in markdown


# -- the real suite's logic, without running a stage ---------------------------------------------


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def real():
    return _load("gpu_check_real")


@pytest.fixture(scope="module")
def check():
    """scripts/gpu_check.py, imported with the process's environment and path kept as they
    were (it sets offline defaults and puts src/ and scripts/ first)."""
    environ, path = dict(os.environ), list(sys.path)
    try:
        return _load("gpu_check")
    finally:
        os.environ.clear()
        os.environ.update(environ)
        sys.path[:] = path


def test_real_stages_run_in_order_of_value_within_the_budget(real, check):
    order = ["real_qlora", "real_full_ft", "real_decode_4bit", "real_trl", "real_offload"]
    assert list(real.STAGES) == order == list(real.ESTIMATE_S)
    assert list(check.REAL_CHECKS) == order
    # Every stage's estimate fits the real suite's budget together, the budget ends before the
    # wrapper's hard stop, and that stop plus the wheels' install stays under 7 minutes.
    budget = check.BUDGET_S["real"]
    assert sum(real.ESTIMATE_S.values()) + 20 <= budget
    script = WRAPPER.read_text()
    hard_stop = int(re.search(r"limit=(\d+)  # the real suite", script)[1])
    assert budget < hard_stop and hard_stop + 20 <= 7 * 60


def test_a_stage_starts_only_when_its_estimate_fits(check):
    assert check.start_refusal(10.0, 150, 390) is None
    assert check.start_refusal(240.0, 150, 390) is None  # ends at 390: fits
    refused = check.start_refusal(241.0, 150, 390)
    assert refused.startswith("not started: about 150 s needed, 149 s left")
    assert check.start_refusal(391.0, 0, 390).startswith("not started: past the 390 s budget")


def test_qlora_memory_limit_arithmetic(real):
    gib = 2**30
    under = real.memory_limit(20 * gib, 22 * gib, 16 * gib)
    assert under["under_limit"] is True and under["headroom_bytes"] == 2 * gib
    assert under["measured_over_planned"] == 1.25
    over = real.memory_limit(22 * gib, 22 * gib, 11 * gib)  # at the limit is over it
    assert over["under_limit"] is False and over["headroom_bytes"] == 0
    assert over["measured_over_planned"] == 2.0
    assert real.memory_limit(20 * gib, 22 * gib, None)["measured_over_planned"] is None
    cpu = real.memory_limit(None, 22 * gib, 16 * gib)
    assert cpu["under_limit"] is None and cpu["headroom_bytes"] is None


def _base(fields, band=(0.5, 2.0)):
    """The parts of gpu_check.py a stage reads before it runs anything."""
    return SimpleNamespace(grpo_fields=lambda: set(fields), MEMORY_BAND=band)


@pytest.mark.parametrize("peak_gib, passed", [(13, True), (23, False)])
def test_qlora_stage_fails_over_22_gib(real, monkeypatch, tmp_path, peak_gib, passed):
    """The QLoRA stage's verdict from a run's measured peak (the run itself stubbed): over
    22 GiB it fails, and the summary prints planned and measured / planned."""
    gib = 2**30
    monkeypatch.setattr(real, "bitsandbytes_problem", lambda device: None)
    monkeypatch.setattr(real, "build_folder", lambda *a: {"reused": True})
    monkeypatch.setattr(real, "predicted_bytes", lambda *a, **k: (12 * gib, "planner"))
    seen = {}

    def run(ns, base, folder, out, steps=None, **options):
        seen.update(options, steps=steps)
        return {"engine": "HFEngine", "optimizer": "AdamW", "steps_logged": steps,
                "median_s": {"step": 40.0}, "generation_tokens_per_s": 400.0,
                "peak_reserved_bytes": peak_gib * gib,
                "max_memory_reserved_bytes": peak_gib * gib,
                "mem_get_info": {"total": 80 * gib, "free_after": 60 * gib}}  # fmt: skip

    monkeypatch.setattr(real, "groupwise_run", run)
    ns = SimpleNamespace(quick=False, torch_device=torch.device("cuda"))
    out = real.check_qlora(ns, tmp_path, _base(real.QLORA_OPTIONS))
    assert seen["per_device_train_batch_size"] == 8 and seen["gradient_accumulation_steps"] == 4
    assert seen["load_in_4bit"] and seen["use_bnb_nested_quant"] and seen["steps"] == 2
    assert out["passed"] is passed, out
    assert out["memory_limit"]["measured_over_planned"] == round(peak_gib / 12, 3)
    assert ("OVER" in out["summary"]) is not passed and "planned 12.0 GiB" in out["summary"]
    assert "mem_get_info: 20.0 GiB of 80.0 GiB in use" in out["summary"]


@pytest.mark.parametrize("stage", ["real_qlora", "real_full_ft", "real_decode_4bit", "real_trl",
                                   "real_offload"])  # fmt: skip
def test_a_stage_that_cannot_run_fails(real, monkeypatch, tmp_path, stage):
    """bitsandbytes missing (or, for TRL's stage, trl): the stage fails, saying why."""
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(real.importlib.util, "find_spec",
                        lambda name, *a: None if name in ("bitsandbytes", "trl")
                        else find_spec(name, *a))  # fmt: skip
    ns = SimpleNamespace(quick=True, torch_device=torch.device("cpu"), results={})
    fields = {*real.QLORA_OPTIONS, "optim", "generation_engine", "activation_offloading",
              "padding_free"}  # fmt: skip
    out = real.STAGES[stage](ns, tmp_path, _base(fields))
    assert out["passed"] is False
    assert ("trl" if stage == "real_trl" else "bitsandbytes") in out["not_run"]
    assert out["summary"].startswith("NOT RUN: ")


def test_a_stage_without_its_options_fails(real, tmp_path):
    ns = SimpleNamespace(quick=True, torch_device=torch.device("cpu"), results={})
    out = real.check_offload(ns, tmp_path, _base({"optim"}))
    assert out["passed"] is False
    assert out["not_run"] == "GRPOConfig has no activation_offloading, padding_free"


def test_versions_are_recorded(real):
    versions = real.package_versions()
    assert list(versions) == list(real.VERSIONED)
    assert versions["torch"] == importlib.metadata.version("torch")
    assert {"peft", "bitsandbytes", "accelerate", "transformers"} <= set(versions)


def test_real_suite_past_its_budget_fails_every_stage(tmp_path):
    """A stage that is not started is no pass: the run fails and says why for each."""
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gpu_check.py"), "--device", "cpu", "--quick",
         "--suite", "real", "--budget-s", "0", "--out", str(out)],
        cwd=ROOT, env=_env(tmp_path), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads((out / "gpu_check.json").read_text())
    assert summary["passed"] is False and summary["budget_s"] == 0
    assert summary["environment"]["packages"]["torch"]
    for check in summary["checks"].values():
        assert check["passed"] is False and check["not_run"].startswith("not started: past")
    assert "FAILED: real_qlora, real_full_ft" in done.stdout


def test_decode_stage_fails_but_keeps_the_hf_numbers_when_static_is_refused(
    real, check, monkeypatch, tmp_path
):
    """The 4-bit decode stage on a CPU at tiny sizes, with the static engine refusing the model:
    the stage fails with the refusal, and the HF engine's tokens/s are still measured."""
    import groupwise.wiring.rollout as rollout
    from groupwise.errors import ConfigError

    def refuse(*args, **kwargs):
        raise ConfigError("generation_engine=static: refused for this test")

    monkeypatch.setattr(rollout, "build_static", refuse)
    ns = SimpleNamespace(quick=True, device="cpu", torch_device=torch.device("cpu"), results={},
                         missing_options=set())  # fmt: skip
    out = real.check_decode_4bit(ns, tmp_path, check)
    assert out["passed"] is False
    assert "refused for this test" in out["static"]["error"]
    assert out["hf"]["engine"] == "HFEngine" and out["hf"]["tokens_per_s"] > 0
    assert out["summary"].startswith("static failed: ConfigError")
