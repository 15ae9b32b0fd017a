# jaxhc: `make test` and `make train` set up everything they need on a fresh machine.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# The CUDA module is compiled whenever nvcc is found (CI compiles it so it cannot rot).
JAXHC_CUDA ?= $(if $(shell command -v nvcc 2>/dev/null),ON,OFF)
NATIVE_SOURCES := CMakeLists.txt pyproject.toml $(wildcard ffi/*/*.h ffi/*/*.cc ffi/*/*.cu)
PYTEST := $(BIN)/python -m pytest
XLA_HOST8 := XLA_FLAGS=--xla_force_host_platform_device_count=8

.PHONY: setup native test test-all bench lint clean

setup: $(VENV)/.native

# System packages (only when root and apt-get exists; otherwise they must already be there).
$(VENV)/.system:
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  need=""; for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || need="$$need $$p"; done; \
	  if [ -n "$$need" ]; then echo "apt-get install$$need"; \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$need) >/dev/null; fi; \
	fi
	@mkdir -p $(VENV) && touch $@

APT_PACKAGES := build-essential

$(VENV)/.deps: pyproject.toml $(VENV)/.system
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "scikit-build-core>=0.10" "nanobind>=2.4" "jax>=0.10.2" "jaxlib>=0.10.2"
	touch $@

$(VENV)/.native: $(VENV)/.deps $(NATIVE_SOURCES)
	JAXHC_CUDA=$(JAXHC_CUDA) $(BIN)/python -m pip install -q --no-build-isolation -e ".[dev]"
	touch $@

native: $(VENV)/.native

test: setup
	$(XLA_HOST8) $(PYTEST) -q -m "not slow"

test-all: setup
	$(XLA_HOST8) $(PYTEST) -q

bench: setup
	$(BIN)/python bench/codecs.py --out bench/results/codecs.json

lint: setup
	$(BIN)/ruff check jaxhc tests bench && $(BIN)/ruff format --check jaxhc tests bench

clean:
	rm -rf build $(VENV)
