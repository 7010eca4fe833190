"""The prepared GPU check's CPU path (scripts/gpu_check.sh --device cpu --quick), so the script
that only a lent GPU runs in full cannot rot: every check runs and its CPU-meaningful results
hold."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_gpu_check_runs_on_cpu_and_writes_its_summary(tmp_path):
    env = {**os.environ, "PYTHON": sys.executable, "OMP_NUM_THREADS": "1"}
    env.pop("OUT", None)
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--device", "cpu", "--quick",
         "--out", str(tmp_path)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads((tmp_path / "gpu_check.json").read_text())
    checks = summary["checks"]
    assert set(checks) == {"precision", "learning", "sdpa_left_padding", "memory",
                           "collectives", "generation"}  # fmt: skip
    assert summary["passed"] and all(c["passed"] for c in checks.values())
    precision = checks["precision"]
    for mode in ("fp32", "bf16_mixed"):
        assert precision[mode]["weights_dtype"] == "torch.float32"
        assert all(v >= 0.99 for v in precision[mode]["min_fraction_moved"].values()), mode
    pure = precision["bf16_pure"]
    assert pure["weights_dtype"] == "torch.bfloat16" and pure["warnings"]
    assert pure["min_fraction_moved"]["norm"] == 0.0
    assert checks["learning"]["last5_reward"] > checks["learning"]["first5_reward"]
    assert checks["sdpa_left_padding"]["bf16_autocast"]["finite"]
    assert checks["collectives"]["backend"] == "gloo"
    assert checks["generation"]["hf_fp32"]["tokens_per_second"] > 0
    assert 0.3 <= checks["memory"]["measured_over_predicted"] <= 3.0
