# jaxhc: `make test` and `make train` set up everything they need on a fresh machine.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# The CUDA module goes into the install where nvcc and a GPU are (sm_80 and sm_90). Where nvcc is
# but no GPU (CI), nothing could load it: `make test` compiles it as a check instead (sm_90 alone,
# one architecture builds the same sources in 60 % of the time), beside the tests at the lowest CPU
# priority, so that it cannot rot and does not hold up the tests. JAXHC_CUDA=ON forces it in.
HAVE_NVCC := $(shell command -v nvcc 2>/dev/null)
HAVE_GPU := $(shell nvidia-smi -L 2>/dev/null)
JAXHC_CUDA ?= $(if $(and $(HAVE_NVCC),$(HAVE_GPU)),ON,OFF)
JAXHC_CUDA_ARCHS ?= $(if $(HAVE_GPU),80;90,90)
CUDA_CHECK := $(if $(HAVE_NVCC),$(if $(HAVE_GPU),,$(filter OFF,$(JAXHC_CUDA))))
NATIVE_SOURCES := CMakeLists.txt pyproject.toml $(wildcard ffi/*/*.h ffi/*/*.cc ffi/*/*.cu)
# What `make setup` installs: jax (`make gpu-check` asks for jax[cuda13] or jax[cuda12] where a GPU
# is and no CUDA jax is), and jaxhc with these extras (gpu-check: `testing`, the test runner alone).
JAX_REQS ?= jax>=0.10.2 jaxlib>=0.10.2
JAXHC_EXTRAS ?= dev
PYTEST := $(BIN)/python -m pytest
XLA_HOST8 := XLA_FLAGS=--xla_force_host_platform_device_count=8

.PHONY: setup setup-mpi setup-peer native train test test-mpi test-all bench bench-mpi bench-links \
  bench-peer gpu-check gpu-wheels lint clean cuda-check

setup: $(VENV)/.native

# System packages (only when root and apt-get exists; otherwise they must already be there).
$(VENV)/.system:
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  need=""; for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || need="$$need $$p"; done; \
	  if [ -n "$$need" ]; then echo "apt-get install$$need"; \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$need) >/dev/null; fi; \
	fi
	@mkdir -p $(VENV) && touch $@

# Open MPI before the native build, which compiles the fused MPI collectives against it.
APT_PACKAGES := build-essential openmpi-bin libopenmpi-dev

$(VENV)/.deps: pyproject.toml $(VENV)/.system
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "scikit-build-core>=0.10" "nanobind>=2.4" $(foreach r,$(JAX_REQS),"$(r)")
	touch $@

$(VENV)/.native: $(VENV)/.deps $(NATIVE_SOURCES)
	JAXHC_CUDA=$(JAXHC_CUDA) JAXHC_CUDA_ARCHS="$(JAXHC_CUDA_ARCHS)" \
	  $(BIN)/python -m pip install -q --no-build-isolation -e ".[$(JAXHC_EXTRAS)]"
	touch $@

native: $(VENV)/.native

# --- MPI: Open MPI from Debian, the `mpi` extra (mpi4py wheel, mpi4jax built here against it) ----
MPI_APT_PACKAGES := openmpi-bin libopenmpi-dev
# The requirements of pyproject.toml's `mpi` extra, one a line: `$(MPI_REQS) mpi4jax` gives mpi4jax's,
# `$(MPI_REQS) mpi4py` the others (mpi4jax's build needs mpi4py installed first).
MPI_REQS = $(BIN)/python -c 'import sys; exec("try: import tomllib\nexcept ImportError: from pip._vendor import tomli as tomllib"); \
  reqs = tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["mpi"]; \
  print("\n".join(r for r in reqs if r.startswith("mpi4jax") == (sys.argv[1] == "mpi4jax")))'
# mpi4jax's setup.py builds a CUDA bridge when it finds nvcc on PATH, CUDA_PATH or /usr/local/cuda,
# and that build fails here: build it CPU-only, with every folder holding nvcc off PATH and
# CUDA_PATH naming an empty folder (its CUDA lookup then finds no headers and skips the bridge).
NO_NVCC_PATH = $$(tr ':' '\n' <<< "$$PATH" | while read -r d; do [ -x "$$d/nvcc" ] || printf '%s:' "$$d"; done)

$(VENV)/.mpi: pyproject.toml $(VENV)/.native
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  need=""; for p in $(MPI_APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || need="$$need $$p"; done; \
	  if [ -n "$$need" ]; then echo "apt-get install$$need"; \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$need) >/dev/null; fi; \
	fi
	@command -v mpicc >/dev/null && command -v mpirun >/dev/null || \
	  { echo "Open MPI is missing: apt-get install $(MPI_APT_PACKAGES)"; exit 1; }
	(echo "setuptools>=82.0.1"; echo wheel; $(MPI_REQS) mpi4py) | xargs -d '\n' $(BIN)/python -m pip install -q
	nocuda=$$(mktemp -d) && $(MPI_REQS) mpi4jax | PATH="$(NO_NVCC_PATH)" CUDA_PATH="$$nocuda" \
	  xargs -d '\n' $(BIN)/python -m pip install -q --no-build-isolation --no-binary mpi4jax; \
	  rc=$$?; rmdir "$$nocuda"; exit $$rc
	$(BIN)/python -c "import mpi4jax"
	touch $@

setup-mpi: $(VENV)/.mpi

# The MPI suites: rank 0 reports; a failing rank aborts the job; `timeout` bounds a hang.
MPI_TIMEOUT ?= 600
MPIRUN = timeout -k 10 $(MPI_TIMEOUT) mpirun --oversubscribe --allow-run-as-root --bind-to none
# Ranks waiting in MPI yield the core (rank 0 alone computes the XLA reference meanwhile).
MPI_ENV = PYTHONPATH=tests XLA_FLAGS=--xla_force_host_platform_device_count=4 OMPI_MCA_mpi_yield_when_idle=1
# `make test` leaves out the MPI tests marked slow, as it does the others; `make test-all` runs them.
MPI_MARK ?= mpi
MPI_PYTEST = $(BIN)/python -m pytest -q -p mpi_plugin -p no:cacheprovider --timeout=150 -m "$(MPI_MARK)" \
  tests/test_mpi_transport.py tests/test_mpi_fused.py tests/test_mpi_feedback.py tests/test_overlap_mpi.py \
  tests/test_prefetch_mpi.py tests/test_keep_mpi.py

# The job sizes (`make test` runs 4 alone: its 2 x 2 meshes put every collective on axes of 2
# ranks too, and tests/test_train_mpi.py's 2 x 2 x 2 runs fuse over pairs; CI time).
MPI_NPS ?= 2 4
test-mpi: setup-mpi
	for np in $(MPI_NPS); do $(MPI_ENV) $(MPIRUN) -np $$np $(MPI_PYTEST) || exit 1; done

# The quick suite on two pytest-xdist workers, a test module (its module fixtures: shared training
# runs) on one worker, in the order tests/conftest.py gives (longest first; xdist's own reorder
# would put the modules with the fewest tests, the multi-process ones, last). (xdist's loadgroup
# marks do not group under pytest 9: it sets a node id attribute pytest no longer reads.)
# Programs compiled again by other tests and subprocesses (the same step resumed, retrained,
# run by a CLI child) come from a JAX compilation cache of this run, removed at its end; results
# are those of the same executables. No size limit is set: a limit turns on jax's file lock, under
# which every write rescans the cache and the workers waited on each other (the quick suite went
# from 14 to over 20 minutes); unlocked, a process that read an entry still being written would
# warn and compile it again.
JAX_CACHE = JAX_COMPILATION_CACHE_DIR="$$cache" JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0 \
  JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES=-1
test: setup setup-mpi
	@cache=$$(mktemp -d /tmp/jaxhc-test-jit.XXXXXX) && check= && \
	  trap 'rm -rf "$$cache"; [ -z "$$check" ] || kill -- -$$check 2>/dev/null' EXIT && \
	  echo "JAX compilation cache: $$cache" && \
	  $(if $(CUDA_CHECK),{ mkdir -p build && echo "CUDA compile check: $(CUDA_CHECK_LOG)" && \
	    { setsid nice -n 19 $(MAKE) --no-print-directory cuda-check >$(CUDA_CHECK_LOG) 2>&1 & check=$$!; }; } &&) \
	  $(XLA_HOST8) $(JAX_CACHE) $(PYTEST) -q -n 2 --dist loadscope --no-loadscope-reorder \
	    --durations=25 -m "not slow and not mpi" && \
	  $(JAX_CACHE) $(MAKE) --no-print-directory test-mpi MPI_NPS=4 MPI_MARK="mpi and not slow" \
	  $(if $(CUDA_CHECK),&& { wait $$check && check= && echo "CUDA module: compiles" || \
	    { check= && tail -n 40 $(CUDA_CHECK_LOG) && echo "the CUDA module does not compile"; exit 1; }; })

# The CUDA module's sources compiled, not linked nor installed (`make test` runs it where nvcc is
# but no GPU): its object files alone, without nanobind's library, which the CPU module's build
# already compiles.
CUDA_CHECK_DIR := build/cuda-check
CUDA_CHECK_LOG := build/cuda-check.log
CUDA_OBJECTS := $(addsuffix .o,$(basename $(wildcard ffi/cuda/*.cc ffi/cuda/*.cu)))
cuda-check: $(VENV)/.deps
	cmake -S . -B $(CUDA_CHECK_DIR) -G "Unix Makefiles" -DJAXHC_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
	  -DCMAKE_BUILD_TYPE=Release -DPython_EXECUTABLE=$(abspath $(BIN)/python) >/dev/null
	cmake --build $(CUDA_CHECK_DIR) -j 2 --target $(CUDA_OBJECTS)

test-all: setup setup-mpi
	$(XLA_HOST8) $(PYTEST) -q -m "not mpi"
	@$(MAKE) --no-print-directory test-mpi

# The default small GPT on the embedded corpus, 8 simulated CPU devices, policy zhybrid; then a
# short sample of what it writes.
RUN ?= runs/default-$(shell date +%Y%m%d-%H%M%S)
train: setup
	run="$(RUN)" && \
	  $(XLA_HOST8) $(BIN)/jaxhc train --config configs/experiments/default.yaml --out "$$run" && \
	  echo "--- a sample from $$run:" && \
	  $(BIN)/jaxhc generate --run "$$run" --prompt "The " --max-new-tokens 200 --seed 0

bench: setup
	$(BIN)/python bench/codecs.py --out bench/results/codecs.json

# The collectives per codec on the MPI transport, 2 and 4 processes (QUICK=1: 64 KB and 1 MB),
# JSON in bench/results/collectives_mpi_np<P>[_quick].json.
bench-mpi: MPI_TIMEOUT = 3600
bench-mpi: setup setup-mpi
	for np in 2 4; do $(MPIRUN) -np $$np \
	  $(BIN)/python bench/collectives.py --transport mpi $(if $(QUICK),--quick) || exit 1; done

# The collectives across shaped links: network-namespace hosts on a bridge, tc tbf, Open MPI over
# TCP (bench/links; root only). QUICK=1: a few minutes; ARGS: more options (python -m bench.links
# bench --help); OUT: the JSON (.md and .png beside it). Waits for other benchmarks (flock).
OUT ?= bench/results/links.json
bench-links:
	@$(PYTHON) -m bench.links check >/dev/null
	@$(MAKE) --no-print-directory setup setup-mpi
	flock /tmp/jaxhc-bench.lock $(BIN)/python -m bench.links bench $(if $(QUICK),--quick) \
	  --out $(OUT) $(ARGS)

# --- The training peer: PyTorch DDP over gloo (pyproject.toml's `peer` extra) -----------------
# The requirements of an extra, one a line, jaxhc's own extras it names (jaxhc[hf]) expanded.
EXTRA_REQS = $(BIN)/python -c 'import sys; \
  exec("try: import tomllib\nexcept ImportError: from pip._vendor import tomli as tomllib"); \
  x = tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]; \
  f = lambda e: [q for r in x[e] for q in (f(r[6:-1]) if r.startswith("jaxhc[") else [r])]; \
  print("\n".join(f(sys.argv[1])))'

$(VENV)/.peer: pyproject.toml $(VENV)/.native
	$(EXTRA_REQS) peer | xargs -d '\n' $(BIN)/python -m pip install -q
	$(BIN)/python -c "import torch, transformers"
	touch $@

setup-peer: $(VENV)/.peer

# jaxhc beside PyTorch DDP across the shaped links (bench/links; root only): `python -m bench.links
# peer` trains the DDP hooks (none, fp16, bf16, powersgd) of configs/experiments/links.yaml on the
# namespace hosts, and jaxhc's policies first in the same run when ARGS names them, e.g.
#   make bench-peer ARGS="--policies none,zhybrid,qhybrid --hosts 2,4 --steps 30"
# PEER_OUT: the JSON (.md and .png beside it). Waits for other benchmarks (flock).
PEER_OUT ?= bench/results/train_links_peer.json
bench-peer:
	@$(PYTHON) -m bench.links check >/dev/null
	@$(MAKE) --no-print-directory setup setup-mpi setup-peer
	flock /tmp/jaxhc-bench.lock $(BIN)/python -m bench.links peer --out $(PEER_OUT) $(ARGS)

# The GPU path in one command (bench/gpu_check.sh, docs/gpu.md): setup for the GPU here (CUDA
# module for its architecture alone), the gpu-marked tests, codec GB/s against the device's copy
# bandwidth, compressed collectives against jax.lax; at most 8 minutes, one JSON in $OUT (a
# folder, when the environment names one) or bench/results/gpu_check.json. DRY_RUN=1: the same
# stages on the CPU (setup, the gpu tests collected, the harness with small sizes).
gpu-check:
	DRY_RUN=$(DRY_RUN) bash bench/gpu_check.sh

# Wheels for a GPU machine without a package index, into .whl (where `make gpu-check` takes them
# from): those a CUDA image with jax usually lacks, for its Python (GPU_PY) on x86-64 Linux.
GPU_PY ?= 3.12
GPU_WHEELS ?= zfpy==1.0.1.post0
gpu-wheels:
	$(PYTHON) -m pip download -q --no-deps --only-binary=:all: --python-version $(GPU_PY) \
	  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
	  --platform manylinux2014_x86_64 -d .whl $(GPU_WHEELS)

lint: setup
	$(BIN)/ruff check jaxhc tests bench && $(BIN)/ruff format --check jaxhc tests bench

clean:
	rm -rf build $(VENV)
