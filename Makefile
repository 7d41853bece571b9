# Two commands for a fresh machine: `make demo` and `make test`. Every target creates the
# pinned CPU environment in .venv first when it is missing (or older than the lock file).
PYTHON ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

export TORCH_EXTENSIONS_DIR ?= $(CURDIR)/.venv/torch_extensions
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: venv test test-fast lint demo bench clean

venv: $(STAMP)

# torch first and alone, pinned: the CPU wheel on local disk. Installing it with the rest lets
# pip pick a several-GB CUDA build. openrlhf goes in with --no-deps because it hard-requires
# flash-attn (CUDA-only sdist); its other requirements are pinned in the lock file. Then the
# patch set (band loss, flags, metrics, imports without flash-attn / vLLM) goes onto it.
$(STAMP): requirements/cpu-lock.txt setup.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet torch==2.13.0 triton==3.7.1
	DS_BUILD_OPS=0 $(PY) -m pip install --quiet -c requirements/cpu-lock.txt -r requirements/cpu-lock.txt
	$(PY) -m pip install --quiet --no-deps openrlhf==0.11.2
	$(PY) -m pip install --quiet --no-deps --no-build-isolation -e .
	$(VENV)/bin/openrlhf-band patch apply
	touch $(STAMP)

# One OpenMP thread: the suite runs many small tensor ops, which thread-pool contention on a
# 2-core machine slows by 10x or more.
test: $(STAMP) lint
	OMP_NUM_THREADS=1 $(PY) -m pytest

SHELL_SCRIPTS := examples/scripts/*.sh bench/gpu_check.sh openrlhf_band/patches/regenerate.sh .ci/run

lint: $(STAMP)
	$(PY) -m ruff check openrlhf_band tests bench
	$(VENV)/bin/hadolint Dockerfile
	$(VENV)/bin/shellcheck -x $(SHELL_SCRIPTS)

# The CPU demo: GRPO with clip, Clip-Higher and BandPO from one warm-up checkpoint (out/demo/).
demo: $(STAMP)
	OMP_NUM_THREADS=1 $(VENV)/bin/openrlhf-band demo --out out/demo

bench: $(STAMP)
	$(VENV)/bin/openrlhf-band bench bounds

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache .ruff_cache .hypothesis
