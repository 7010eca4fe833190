#!/usr/bin/env bash
# The prepared one-GPU check (scripts/gpu_check.py: precision modes, learning, bf16 SDPA with left
# padding, memory vs the planner, collectives, generation tokens/s, the static engine against the
# HF engine, whole-step time per engine, vLLM where it imports). It runs under the GPU
# machine's own python3, torch and transformers, with groupwise from this tree's src/, finishes
# within 8 minutes on one H200 and writes one summary file, gpu_check.json, to --out (default
# $OUT, else runs/gpu_check); the table at the end of its output says the same. Exit status 0
# only if every check passed. Options after the script's name go to gpu_check.py (--help).
#
# `--suite real` runs the real-size stages instead (scripts/gpu_check_real.py: Qwen2.5-1.5B full
# fine-tune and Qwen3-8B QLoRA at 4 prompts x 8, 256 + 512 tokens, the memory planner and TRL's
# GRPOTrainer side by side), also under 8 minutes on one H100:
#
#   command: bash scripts/gpu_check.sh --suite real
#   carry:   [".whl"]
#   timeout_s: 540
#
# The machine has no network: what groupwise needs and its image lacks travels as wheels in
# scripts/wheels/ (tracked: TRL 1.16.0 and what it needs beyond the image, datasets, dill and
# multiprocess for Python 3.12) and .whl/ (git-ignored; GPU_CHECK_WHEELS names other folders,
# colon-separated), each installed into
# /tmp/gpu-check-site (GPU_CHECK_SITE) only when its package is missing there or older than
# the floor in pyproject.toml. As the image was read in 2026-11: math-verify and its two
# dependencies are missing, and its transformers (5.17.0) is below groupwise's floor (5.18), so
# the transformers that constraints/cpu.txt pins travels too (it needs huggingface-hub >= 1.31
# and tokenizers 0.23.x, which the image has). Prepare once, from the repository root (14 MB):
#
#   mkdir -p .git/info && echo /.whl/ >> .git/info/exclude
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#     --implementation cp --platform manylinux2014_x86_64 -d .whl \
#     math-verify==0.9.0 latex2sympy2_extended==1.11.0 antlr4-python3-runtime==4.13.2 \
#     transformers==5.23.0
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#     --implementation cp --platform manylinux_2_24_x86_64 -d .whl bitsandbytes==0.50.2
#
# (bitsandbytes, 43 MB, for the QLoRA stage: 57 MB in .whl with the rest, which with the tree's
# 5 MB stays under the 64 MiB a device call carries; without it that stage says it did not run.)
#
# then call the device tool's run with
#
#   command: bash scripts/gpu_check.sh
#   carry:   [".whl"]
#   timeout_s: 540
#
# and read gpu_check.json among the files that come back. The tokenizer needs nothing carried:
# the SmolLM2 one is read from the demo model's GGUF, which does not travel, so there the check
# builds a synthetic one (gpu_check.py's docstring). CPU rehearsal (tests/test_gpu_check.py):
#
#   bash scripts/gpu_check.sh --device cpu --quick --tokenizer synthetic --out /tmp/gpu_check
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
WHEELS=${GPU_CHECK_WHEELS:-scripts/wheels:.whl}
SITE=${GPU_CHECK_SITE:-/tmp/gpu-check-site}

# Carried wheels: install those whose package is missing here or older than groupwise's floor.
found=""
IFS=: read -ra folders <<<"$WHEELS"
for folder in "${folders[@]}"; do
  compgen -G "$folder/*.whl" >/dev/null && found=1
done
if [ -n "$found" ]; then
  mapfile -t wheels < <(WHEELS="$WHEELS" "$PYTHON" - <<'PY'
import glob, importlib.metadata as md, os, re
def norm(name):
    return re.sub(r"[-_.]+", "-", name).lower()
floors = {}
try:
    import tomllib  # Python 3.11+; without it only missing packages count
    with open("pyproject.toml", "rb") as handle:
        for dep in tomllib.load(handle)["project"]["dependencies"]:
            found = re.match(r"([A-Za-z0-9_.-]+)\s*>=\s*([0-9][^,;\s]*)", dep)
            if found:
                floors[norm(found[1])] = found[2]
except Exception:
    pass
paths = [w for folder in os.environ["WHEELS"].split(":") if folder
         for w in glob.glob(os.path.join(folder, "*.whl"))]
for wheel in sorted(paths, key=os.path.basename):
    name = norm(os.path.basename(wheel).split("-")[0])
    try:
        have = md.version(name)
    except md.PackageNotFoundError:
        print(wheel)
        continue
    if name in floors:
        from packaging.version import Version
        if Version(have) < Version(floors[name]):
            print(wheel)
PY
)
  if [ ${#wheels[@]} -gt 0 ]; then
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target "$SITE" "${wheels[@]}" || exit 1
    echo "[gpu_check] installed from the carried wheels: ${wheels[*]##*/}"
    export GPU_CHECK_INSTALLED="${wheels[*]##*/}"  # recorded in the summary
  else
    echo "[gpu_check] installed from the carried wheels: nothing (all there already)"
  fi
  export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_HUB_DISABLE_PROGRESS_BARS=1

# What groupwise imports (at import time, or in a check: math_verify scores the memory check's
# arithmetic task), and what is older than groupwise's floor, named before the checks run.
"$PYTHON" - <<'PY'
import importlib.metadata as md, importlib.util, re
need = ["torch", "transformers", "tokenizers", "safetensors", "numpy", "yaml", "tqdm", "peft",
        "accelerate", "sympy", "jinja2", "math_verify", "rich"]
missing = [m for m in need if importlib.util.find_spec(m) is None]
print("[gpu_check] missing packages:", ", ".join(missing) or "none")
older = []
try:
    import tomllib
    from packaging.version import Version
    with open("pyproject.toml", "rb") as handle:
        deps = tomllib.load(handle)["project"]["dependencies"]
    for dep in deps:
        found = re.match(r"([A-Za-z0-9_.-]+)\s*>=\s*([0-9][^,;\s]*)", dep)
        if found:
            try:
                have = md.version(found[1])
            except md.PackageNotFoundError:
                continue
            if Version(have) < Version(found[2]):
                older.append(f"{found[1]} {have} (groupwise declares >= {found[2]})")
except Exception as err:  # Python < 3.11: no tomllib
    older.append(f"not checked ({type(err).__name__})")
print("[gpu_check] older than groupwise's floor:", ", ".join(older) or "none")
PY

# gpu_check.py starts no check after 420 s; this is the hard stop, under 8 minutes in all
# (GPU_CHECK_TIMEOUT_S: another, for a run of other sizes or on a CPU).
exec timeout -k 10 "${GPU_CHECK_TIMEOUT_S:-470}" "$PYTHON" scripts/gpu_check.py "$@"
