#!/usr/bin/env bash
# The prepared one-GPU check (scripts/gpu_check.py: precision modes, learning, bf16 SDPA with left
# padding, memory vs the planner, collectives, generation tokens/s, the static engine against the
# HF engine, whole-step time per engine, vLLM where it imports). It runs under the GPU
# machine's own python3, torch and transformers, with groupwise from this tree's src/, finishes
# within 8 minutes on one H200 and writes one summary file, gpu_check.json, to --out (default
# $OUT, else runs/gpu_check); the table at the end of its output says the same. Exit status 0
# only if every check passed. Options after the script's name go to gpu_check.py (--help).
#
# `--suite real` runs the real-size stages instead (scripts/gpu_check_real.py), in this order:
# Qwen3-8B QLoRA at the documented configuration (4 prompts x G 8, micro-batches of 8 x 4
# accumulation, 256 + 512 tokens, checkpointing; peak reserved memory under 22 GiB), a
# Qwen2.5-1.5B full fine-tune with the 8-bit AdamW, the static against the HF engine decoding the
# 4-bit + LoRA 8B, TRL's GRPOTrainer side by side, activation offloading. Under 7 minutes on one
# H100 with the wheels' install; a stage whose estimate no longer fits is not started and fails,
# as does one that cannot run (bitsandbytes missing, say). Prepare once, from the repository root:
#
#   make gpu-check-wheels      # .whl/: the pinned bitsandbytes, peft, transformers, accelerate
#                              # and math-verify wheels for Python 3.12 (about 58 MB; it checks
#                              # that they and the tree stay under the 64 MiB a call carries)
#
# then call the device tool's run with
#
#   command: bash scripts/gpu_check.sh --suite real
#   carry:   [".whl"]
#   timeout_s: 480
#
# and read gpu_check.json (and gpu_check.md) among the files that come back. The standard suite is
# the same call with `command: bash scripts/gpu_check.sh` and timeout_s 540.
#
# The machine has no network: what groupwise needs and its image lacks travels as wheels in
# scripts/wheels/ (tracked: TRL 1.16.0 and what it needs beyond the image, datasets, dill and
# multiprocess for Python 3.12) and .whl/ (git-ignored; GPU_CHECK_WHEELS names other folders,
# colon-separated), each installed into /tmp/gpu-check-site (GPU_CHECK_SITE) when its package is
# missing there, older than the floor in pyproject.toml, or at another version than the wheel's
# where the wheel is the version constraints/cpu.txt pins. As the image was read in 2026-11: no
# bitsandbytes or math-verify, transformers 5.17.0 (below groupwise's floor, 5.18; the pinned one
# needs huggingface-hub >= 1.31 and tokenizers 0.23.x, which the image has), accelerate 1.15.0,
# and a peft whose version was not read. gpu_check.py prints the versions it runs with at start
# and records them (environment.packages in gpu_check.json).
#
# The tokenizer needs nothing carried: the SmolLM2 one is read from the demo model's GGUF, which
# does not travel, so there the check builds a synthetic one (gpu_check.py's docstring). CPU
# rehearsal (tests/system/test_gpu_check.py):
#
#   bash scripts/gpu_check.sh --device cpu --quick --tokenizer synthetic --out /tmp/gpu_check
#   bash scripts/gpu_check.sh --device cpu --quick --tokenizer synthetic --suite real --out /tmp/r
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
WHEELS=${GPU_CHECK_WHEELS:-scripts/wheels:.whl}
SITE=${GPU_CHECK_SITE:-/tmp/gpu-check-site}
PINS=${GPU_CHECK_CONSTRAINTS:-constraints/cpu.txt}

# Carried wheels: install those whose package is missing here, older than groupwise's floor, or
# at another version than the carried wheel's where that is the version constraints/cpu.txt pins
# (the QLoRA stack, peft, bitsandbytes, transformers and accelerate, runs as the tests ran it).
found=""
IFS=: read -ra folders <<<"$WHEELS"
for folder in "${folders[@]}"; do
  compgen -G "$folder/*.whl" >/dev/null && found=1
done
if [ -n "$found" ]; then
  mapfile -t wheels < <(WHEELS="$WHEELS" PINS="$PINS" "$PYTHON" - <<'PY'
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
pins = {}
try:
    with open(os.environ["PINS"]) as handle:
        for line in handle:
            found = re.match(r"([A-Za-z0-9_.-]+)==([^\s;#]+)", line.strip())
            if found:
                pins[norm(found[1])] = found[2]
except OSError:
    pass
paths = [w for folder in os.environ["WHEELS"].split(":") if folder
         for w in glob.glob(os.path.join(folder, "*.whl"))]
for wheel in sorted(paths, key=os.path.basename):
    name, version = os.path.basename(wheel).split("-")[:2]
    name = norm(name)
    try:
        have = md.version(name)
    except md.PackageNotFoundError:
        print(wheel)
        continue
    if pins.get(name) == version and have != version:
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

# The hard stop (GPU_CHECK_TIMEOUT_S: another, for a run of other sizes or on a CPU): the standard
# suite starts no check after 420 s and stops at 470 s, under 8 minutes in all; the real suite
# starts a stage only when its estimate fits in 390 s and stops at 400 s, with the wheels'
# install under 7 minutes. gpu_check.json is rewritten after every check (and names the one
# running), so a run stopped here keeps what finished.
limit=470  # the standard suite
previous=""
for arg in "$@"; do
  if [ "$arg" = --suite=real ] || { [ "$previous" = --suite ] && [ "$arg" = real ]; }; then
    limit=400  # the real suite
  fi
  previous=$arg
done
exec timeout -k 10 "${GPU_CHECK_TIMEOUT_S:-$limit}" "$PYTHON" scripts/gpu_check.py "$@"
