#!/usr/bin/env bash
# The prepared GPU check (scripts/gpu_check.py): one H100/H200, under 8 minutes, one summary
# file ($OUT/gpu_check.json, else runs/gpu_check/gpu_check.json). It runs on the machine's own
# torch/transformers: groupwise comes from this tree's src/ (no install), and the few
# pure-Python packages the image lacks travel as wheels in .whl/.
#
# Prepare here, once, from the repository root (about 3 MB; both folders are git-ignored via
# .git/info/exclude):
#   echo /.whl/ >> .git/info/exclude; echo /.gpu_check/ >> .git/info/exclude
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#     --implementation cp --platform manylinux2014_x86_64 -d .whl \
#     math-verify==0.9.0 latex2sympy2_extended==1.11.0 antlr4-python3-runtime==4.13.2
#   .venv/bin/python -c "from groupwise.models import smollm2_tokenizer as t; \
#     t().save_pretrained('.gpu_check/tokenizer')"
# Then the device tool's run, with carry [".whl", ".gpu_check"] and timeout_s 540:
#   bash scripts/gpu_check.sh
# CPU rehearsal (what tests/test_gpu_check.py runs): bash scripts/gpu_check.sh --device cpu --quick
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/gpu-check-site .whl/*.whl && export PYTHONPATH=/tmp/gpu-check-site || exit 1
  echo "[gpu_check] installed from .whl: $(cd .whl && ls *.whl | tr '\n' ' ')"
fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
tokenizer=()
[ -d .gpu_check/tokenizer ] && tokenizer=(--tokenizer .gpu_check/tokenizer)
"$PYTHON" - <<'PY'
import importlib.util
missing = [m for m in ("torch", "transformers", "safetensors", "peft", "yaml", "tqdm", "rich",
                       "numpy", "math_verify") if importlib.util.find_spec(m) is None]
print("[gpu_check] missing packages:", ", ".join(missing) or "none")
PY
exec timeout 480 "$PYTHON" scripts/gpu_check.py "${tokenizer[@]}" "$@"
