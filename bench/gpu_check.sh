#!/usr/bin/env bash
# The GPU check in one command (`make gpu-check`; docs/gpu.md): on a machine with an NVIDIA GPU it
# sets up through `make setup` (the CUDA module for this GPU's architecture alone; jax with CUDA),
# runs the gpu-marked tests, measures codec throughput against the device's copy bandwidth, and runs
# compressed collectives against jax.lax. Every stage runs under its own `timeout`, all of them
# inside GPU_CHECK_SECONDS, so that a hang in one still leaves the others' results; one JSON gathers
# each stage's status, seconds, output tail and results.
#
# Environment (all optional):
#   DRY_RUN=1            the same stages on the CPU: setup, collection of the gpu tests, the bench
#                        harness on the CPU backend with small sizes (what CI can prove)
#   OUT                  a folder: the JSON is $OUT/gpu_check.json, each stage's whole log in
#                        $OUT/gpu_check_logs/ (else bench/results/gpu_check.json;
#                        gpu_check_dry_run.json in a dry run)
#   GPU_CHECK_JSON       the JSON's path, over both
#   GPU_CHECK_SECONDS    the whole check's bound (480)
#   GPU_CHECK_SETUP_SECONDS  the setup stage's bound (300: a fresh build of both modules)
#   GPU_CHECK_MIB        MiB per benchmarked array (256; 4 in a dry run)
#   GPU_PYTHON           the Python whose packages the venv inherits when it already has a CUDA jax
#                        (python3)
#   WHEELS               a folder of wheels for an offline machine (.whl: `make gpu-wheels`); when it
#                        holds wheels, pip uses them and no index
#   GPU_CHECK_MAKE_FLAGS flags for the setup stage's make (e.g. -n: print what it would run)
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=$ROOT/.venv/bin/python
DRY=${DRY_RUN:-0}
[ "$DRY" = 0 ] && DRY=""
START=$(date +%s)
BUDGET=${GPU_CHECK_SECONDS:-480}
NAME=gpu_check${DRY:+_dry_run}.json
if [ -n "${GPU_CHECK_JSON:-}" ]; then JSON=$GPU_CHECK_JSON
elif [ -n "${OUT:-}" ]; then JSON=$OUT/$NAME
else JSON=bench/results/$NAME; fi
WORK=$(mktemp -d /tmp/jaxhc-gpu-check.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false

# stage NAME CAP_SECONDS COMMAND...: runs COMMAND under `timeout` (CAP, or what is left of BUDGET
# less a reserve for the report) with its output in $WORK/NAME.log; $WORK/NAME.meta records it.
stage() {
  local name=$1 cap=$2 left t0 rc
  shift 2
  left=$((START + BUDGET - 15 - $(date +%s)))
  [ "$left" -lt "$cap" ] && cap=$left
  if [ "$cap" -lt 5 ]; then
    printf 'rc=skipped\nms=0\nlimit=%s\n' "$cap" >"$WORK/$name.meta"
    echo "== $name: skipped, no time left"
    return
  fi
  echo "== $name (at most ${cap} s)"
  t0=$(date +%s%N)
  # A child bash runs the command (a function of this script too: they are exported); timeout
  # signals its whole process group.
  timeout -k 10 "$cap" bash -c '"$@"' "$name" "$@" >"$WORK/$name.log" 2>&1
  rc=$?
  printf 'rc=%s\nms=%s\nlimit=%s\n' "$rc" "$((($(date +%s%N) - t0) / 1000000))" "$cap" \
    >"$WORK/$name.meta"
  tail -n 3 "$WORK/$name.log"
  echo "== $name: exit $rc"
}

# The architectures of the GPUs here, as CMake names them (compute capability 9.0 -> 90).
gpu_archs() {
  nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | tr -d ' .' | sort -u |
    paste -sd';'
}

# The jax extra for this driver: CUDA 13 wheels need driver 580 or later, CUDA 12 ones 525.
jax_cuda_extra() {
  local major
  major=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1 |
    cut -d. -f1)
  if [ "${major:-0}" -ge 580 ]; then echo cuda13; else echo cuda12; fi
}

# The venv, inheriting the packages of GPU_PYTHON (a CUDA jax among them, as on an image made for
# GPUs) through a .pth file: nothing to download then, which an offline machine needs.
inherit_venv() {
  local base=${GPU_PYTHON:-python3} site
  "$base" -c 'import importlib.metadata as m, sys
def has(name):
    try:
        return bool(m.version(name))
    except m.PackageNotFoundError:
        return False
sys.exit(not (has("jax-cuda13-plugin") or has("jax-cuda12-plugin")))' 2>/dev/null || return 1
  # Without ensurepip there, a venv without pip: it runs the inherited one.
  [ -x "$PY" ] || "$base" -m venv .venv || "$base" -m venv --without-pip .venv || return 1
  site=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])') || return 1
  # addsitedir, not a bare path: the inherited folders' own .pth files count too.
  "$base" -c 'import site
for p in site.getsitepackages():
    print(f"import site; site.addsitedir({p!r})")' >"$site/_jaxhc_inherited.pth" || return 1
  echo "venv inherits the packages of $("$base" -c 'import sys; print(sys.prefix)')"
}

setup_gpu() {
  local archs extra make_vars=()
  archs=$(gpu_archs)
  [ -n "$archs" ] || { echo "nvidia-smi lists no GPU"; return 1; }
  command -v nvcc >/dev/null || export PATH=$PATH:/usr/local/cuda/bin
  command -v nvcc >/dev/null || { echo "nvcc is not on PATH (nor in /usr/local/cuda/bin)"; return 1; }
  echo "GPU architectures: $archs; nvcc: $(nvcc --version | tail -1)"
  make_vars+=(JAXHC_CUDA=ON "JAXHC_CUDA_ARCHS=$archs" JAXHC_EXTRAS=testing)
  # The compilers are here: the CUDA check needs no MPI, so no system packages to install.
  command -v c++ >/dev/null && command -v make >/dev/null && make_vars+=("APT_PACKAGES=")
  if ! inherit_venv; then
    extra=$(jax_cuda_extra)
    echo "no CUDA jax to inherit: installing jax[$extra]"
    make_vars+=("JAX_REQS=jax[$extra]>=0.10.2")
  fi
  if compgen -G "${WHEELS:-.whl}/*.whl" >/dev/null; then
    echo "offline: pip takes the wheels in ${WHEELS:-.whl} and no index"
    export PIP_NO_INDEX=1 PIP_FIND_LINKS=$ROOT/${WHEELS:-.whl}
  fi
  export PIP_DEFAULT_TIMEOUT=20 PIP_RETRIES=1 PIP_DISABLE_PIP_VERSION_CHECK=1
  # shellcheck disable=SC2086
  make --no-print-directory ${GPU_CHECK_MAKE_FLAGS:-} setup "${make_vars[@]}" || return 1
  "$PY" -c 'import jax; from jaxhc import _native
assert _native.cuda is not None, "jaxhc has no CUDA module"
print("jax", jax.__version__, jax.devices())
assert jax.devices()[0].platform == "gpu", "jax sees no GPU"'
}

setup_dry() {
  # shellcheck disable=SC2086
  make --no-print-directory ${GPU_CHECK_MAKE_FLAGS:-} setup && "$PY" -c 'import jax, jaxhc
print("jax", jax.__version__, jax.devices())'
}

GPU_TESTS=(tests/test_gpu_codecs.py)
ORACLE_TESTS=(tests/test_zfp.py tests/test_mpc.py tests/test_quant.py)
# pytest PART FILES...: the gpu-marked tests of FILES, a JUnit report for the JSON.
gpu_pytest() {
  local part=$1
  shift
  # On the GPU: 4 pytest-xdist workers share it (the tests are bound by compilation, on the CPU).
  local how=(-n 4)
  [ -n "$DRY" ] && how=(--collect-only)
  "$PY" -m pytest -q -p no:cacheprovider -m "gpu and not slow" --timeout=120 \
    --junitxml="$WORK/$part.xml" "${how[@]}" "$@"
}

export ROOT PY DRY WORK
export -f gpu_archs jax_cuda_extra inherit_venv setup_gpu setup_dry gpu_pytest
if [ -n "$DRY" ]; then
  echo "gpu-check, dry run on the CPU: JSON $JSON"
  stage setup 240 setup_dry
  # Small sizes, and one codec of each kind in the collectives (lossy ZFP, lossy q8, budgeted
  # MPC with its agreement round): the CPU runs the same code at a fraction of the compilations.
  PLATFORM=cpu MIB=${GPU_CHECK_MIB:-4} REPEATS=2 COLLECTIVE_CODECS=zfp:8,q8,mpc:0.8
else
  echo "gpu-check: JSON $JSON"
  stage setup "${GPU_CHECK_SETUP_SECONDS:-300}" setup_gpu
  PLATFORM=gpu MIB=${GPU_CHECK_MIB:-256} REPEATS=5 COLLECTIVE_CODECS=""
fi
stage gpu_tests 120 gpu_pytest gpu_tests "${GPU_TESTS[@]}"
stage codecs 120 "$PY" bench/gpu_check.py codecs --platform "$PLATFORM" --mib "$MIB" \
  --repeats "$REPEATS" --out "$WORK/codecs.json"
stage collectives 90 "$PY" bench/gpu_check.py collectives --platform "$PLATFORM" \
  ${COLLECTIVE_CODECS:+--codecs "$COLLECTIVE_CODECS"} --out "$WORK/collectives.json"
stage oracle_tests 150 gpu_pytest oracle_tests "${ORACLE_TESTS[@]}"

# Whole stage logs beside the JSON when it goes to a folder OUT (the JSON keeps their tails).
if [ -n "${OUT:-}" ] && [ -z "${GPU_CHECK_JSON:-}" ]; then
  mkdir -p "$OUT/gpu_check_logs" && cp "$WORK"/*.log "$OUT/gpu_check_logs/" 2>/dev/null
fi
# The report needs no jax: the venv's Python where setup made one, else the system's.
REPORT_PY=$PY
[ -x "$REPORT_PY" ] || REPORT_PY=python3
"$REPORT_PY" bench/gpu_check.py report --work "$WORK" --out "$JSON" \
  --mode "$([ -n "$DRY" ] && echo dry-run || echo gpu)" --seconds "$(($(date +%s) - START))"
