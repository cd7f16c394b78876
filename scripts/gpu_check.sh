#!/usr/bin/env bash
# The GPU path on a lent machine with a CUDA GPU, in ONE command that ends
# within one 10-minute call (GPU_CHECK_BUDGET, default 500 s, bounds all
# of it) and always leaves a report that says what passed and what failed:
#   1. build: `pip install .` against the machine's own torch, as users
#      install (docs/install.md; --no-build-isolation, since there is no
#      index to fetch setuptools from), which builds the CUDA path by itself;
#   2. tests: tests/cuda through ctest (a skip is a failure here, except a
#      test that needs more GPUs than there are, or a missing cuobjdump),
#      then tests/gpu through pytest (every collective on CUDA tensors
#      against Gloo, the stream rules, DDP and FSDP2, the defects' checks);
#   3. multi, with 2 or more GPUs: a rank per GPU on both routes inside the
#      host (SMDDP_INTRA=shm and nccl): results against the closed form, no
#      CUDA context on any GPU but the rank's own (torch's
#      _cuda_hasPrimaryContext; nvidia-smi lists no processes inside
#      containers), a peer killed on the NCCL route fails the others within
#      5 s, and a DDP step of every rank against Gloo and ProcessGroupNCCL;
#   4. bench: benchmarks/gpu_bench.py on each route (the NCCL one under its
#      own bound), and the host path with CPU tensors at world 2, 4 and 8
#      against Gloo and the memcpy floor (how it scales with cores).
#
#   scripts/gpu_check.sh [--sim] [--commit SHA] [all|build|tests|multi|bench] [REPORT]
#
# --commit names the commit in the report's header (the machine's copy of
# the tree may have no .git). REPORT defaults to $OUT/gpu_report.md where
# $OUT is set, else build-cuda/gpu_report.md; each step's whole log lands
# beside it. Group timeouts are 60 s (SMDDP_TEST_PG_TIMEOUT).
#
# --sim (with SMDDP_DEVICE_SIM=1) runs the same stages on the stand-in
# device with the CPU build (make build), in a couple of minutes, so CI
# catches a broken script: tests/python/test_gpu_check.py runs it.
#
# libfabric, Catch2 and OpenSSL's libcrypto come from Debian packages: where
# the machine has none, carry them as .deb files in .gpu-debs/ (`make
# gpu-debs` fetches them on a machine with apt); they are unpacked into
# .gpu-prefix/.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
sim=0
commit=${GPU_CHECK_COMMIT:-}
while [ $# -gt 0 ] && [ "${1#--}" != "$1" ]; do
  case $1 in
    --sim) sim=1; shift ;;
    --commit) commit=${2:?--commit needs a commit}; shift 2 ;;
    *) echo "gpu_check.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
stage=${1:-all}
case $stage in all|build|tests|multi|bench) ;; *) echo "gpu_check.sh: unknown stage $stage" >&2; exit 2 ;; esac
report=${2:-${OUT:+$OUT/gpu_report.md}}
report=${report:-build-cuda/gpu_report.md}
# Absolute, since steps run in other folders (build-cuda) and name it.
case $report in /*) ;; *) report=$ROOT/$report ;; esac
commit=${commit:-$(git rev-parse --short HEAD 2>/dev/null || echo '?')}
BUDGET=${GPU_CHECK_BUDGET:-500}
export SMDDP_TEST_PG_TIMEOUT=${SMDDP_TEST_PG_TIMEOUT:-60} SMDDP_GPU_TEST_TIMEOUT=${SMDDP_GPU_TEST_TIMEOUT:-240}
mkdir -p "$(dirname "$report")" build-cuda
: >"$report"
failed=()
log() { printf '%s\n' "$*" | tee -a "$report"; }
section() { log ""; log "## $*"; log ""; }
left() { echo $((BUDGET - SECONDS)); }
run_step() {  # run_step NAME LIMIT_S CMD...: output into the report, fenced
  local name=$1 limit=$2
  shift 2
  # Within what is left of the budget (10 s kept for the summary), and
  # GPU_CHECK_LIMIT caps every step.
  [ "${GPU_CHECK_LIMIT:-$limit}" -lt "$limit" ] && limit=$GPU_CHECK_LIMIT
  local room=$(($(left) - 10))
  [ "$room" -lt "$limit" ] && limit=$room
  if [ "$limit" -lt 5 ]; then
    log "$name: NOT RUN: the ${BUDGET} s budget is spent"
    failed+=("$name (no time left)")
    return 1
  fi
  log '```'
  local t0=$SECONDS
  # The report keeps the tail; $report.$name.log keeps all of it.
  timeout --signal=KILL "$limit" "$@" 2>&1 | tee "$report.$name.log" | tail -n 60 | tee -a "$report"
  local rc=${PIPESTATUS[0]}
  log '```'
  [ "$rc" -eq 137 ] && log "$name: KILLED at its ${limit} s bound"
  log "$name: exit $rc after $((SECONDS - t0)) s (bound ${limit} s)"
  [ "$rc" -eq 0 ] || failed+=("$name")
  return "$rc"
}
finish() {
  section "Summary"
  if [ ${#failed[@]} -eq 0 ]; then
    log "stage $stage$([ $sim = 1 ] && echo ' (--sim)'): every step passed in $SECONDS s"
  else
    log "stage $stage$([ $sim = 1 ] && echo ' (--sim)'): FAILED: ${failed[*]} ($SECONDS s)"
  fi
  echo "report: $report"
  [ ${#failed[@]} -eq 0 ]
  exit $?
}
fail_fast() { log "FAILED before any step: $*"; failed+=("preflight"); finish; }

log "# GPU check of torch-smddp $commit ($(date -u +%F\ %H:%M) UTC)$([ $sim = 1 ] && echo ', on the stand-in (--sim)')"

# ---- the python whose torch to use -------------------------------------------
# The lent machines bring their own torch, in a venv, conda or the system's
# python: take the first that imports torch (the CPU build's .venv with --sim).
if [ $sim = 1 ]; then
  export SMDDP_DEVICE_SIM=1
  candidates=("${PYTHON:-}" .venv/bin/python)
else
  candidates=("${PYTHON:-}" "$(command -v python3 || true)" "$(command -v python || true)" /opt/conda/bin/python
              /usr/local/bin/python3 /usr/bin/python3 /opt/*/bin/python3 /opt/*/venv/bin/python .venv-cuda/bin/python)
fi
PY=""
for c in "${candidates[@]}"; do
  # Absolute (steps run from build-cuda), symlinks kept (a venv's python is one).
  [ -n "$c" ] && [ -x "$c" ] && "$c" -c "import torch" 2>/dev/null &&
    { PY="$(cd "$(dirname "$c")" && pwd)/$(basename "$c")"; break; }
done
[ -n "$PY" ] || fail_fast "no python here imports torch (tried: ${candidates[*]}); set PYTHON"

section "Machine"
log '```'
{ [ $sim = 0 ] && nvidia-smi -L && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  "$PY" -c "import torch, sys; print('python', sys.executable); print('torch', torch.__version__, 'cuda', torch.version.cuda, 'gpus', torch.cuda.device_count())"
  echo "cores $(nproc)"
  # The compiler the build takes (CXX where set): one that linked libstdc++
  # statically into _C crashed every log line on a lent machine
  # (cmake/shared_libstdcxx.cmake; the build summary says what it did).
  echo "CXX ${CXX:-unset}: $("${CXX:-c++}" --version 2>&1 | head -1)"; } 2>&1 | tee -a "$report"
log '```'
ngpu=$("$PY" -c "import torch; print(torch.cuda.device_count())" 2>/dev/null || echo 0)
if [ $sim = 0 ]; then
  [ "$ngpu" -ge 1 ] || fail_fast "torch $("$PY" -c 'import torch; print(torch.__version__)') sees no GPU"
  tcuda=$("$PY" -c "import torch; print(torch.version.cuda or '')")
  [ -n "$tcuda" ] || fail_fast "the torch of $PY has no CUDA"
  nvcc=$(command -v nvcc || echo "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc")
  [ -x "$nvcc" ] || fail_fast "no nvcc (PATH, CUDA_HOME, /usr/local/cuda): the CUDA path cannot be built"
  ncuda=$("$nvcc" --version | grep -o 'release [0-9.]*' | grep -o '[0-9.]*$')
  [ "${ncuda%%.*}" = "${tcuda%%.*}" ] ||
    fail_fast "nvcc $nvcc is CUDA $ncuda but torch was built with CUDA $tcuda: the major versions must match"
  log "nvcc $nvcc: CUDA $ncuda (torch's $tcuda)"
else
  ngpu=4  # 2 pretend hosts x 2 simulated GPUs
fi

# ---- the machine's own packages, or the carried Debian ones ----------------
prefix=$PWD/.gpu-prefix
cmake_args=""
if [ $sim = 0 ]; then
  if ! ldconfig -p 2>/dev/null | grep -q libfabric.so.1 || [ ! -e /usr/include/catch2/catch.hpp ] ||
     [ ! -e /usr/include/openssl/hmac.h ]; then
    if ls .gpu-debs/*.deb >/dev/null 2>&1; then
      mkdir -p "$prefix"
      for d in .gpu-debs/*.deb; do dpkg -x "$d" "$prefix"; done
    fi
  fi
  if [ -d "$prefix/usr" ]; then
    export LD_LIBRARY_PATH=$prefix/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    export PKG_CONFIG_PATH=$prefix/usr/lib/x86_64-linux-gnu/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
    lib=$prefix/usr/lib/x86_64-linux-gnu
    # -rpath-link: libfabric's own dependencies (libibverbs, ...) live there too.
    cmake_args="-DCMAKE_PREFIX_PATH=$prefix/usr -DCatch2_DIR=$prefix/usr/lib/cmake/Catch2"
    # OpenSSL's headers: Debian keeps configuration.h in the multiarch folder.
    cmake_args+=" -DOPENSSL_ROOT_DIR=$prefix/usr -DCMAKE_CXX_FLAGS=-I$prefix/usr/include/x86_64-linux-gnu"
    cmake_args+=" -DCMAKE_EXE_LINKER_FLAGS=-Wl,-rpath-link,$lib -DCMAKE_SHARED_LINKER_FLAGS=-Wl,-rpath-link,$lib"
    # The carried libfabric is the one the build must take (docs/install.md):
    # the extension then records its folder in its run path.
    export SMDDP_LIBFABRIC_ROOT=$prefix/usr
  fi
fi
jobs=$(nproc 2>/dev/null || echo 8)
export SMDDP_BUILD_JOBS=$jobs PIP_BREAK_SYSTEM_PACKAGES=1
# The architectures are setup.py's default (sm_75 and up plus PTX), which
# tests/cuda's ctest checks, unless the caller sets TORCH_CUDA_ARCH_LIST.
make_gpu=(make --no-print-directory CUDA_PY="$PY" CUDA_SETUP= JOBS="$jobs"
          CMAKE_ARGS="$cmake_args" CUDA_PIP_ARGS="--no-build-isolation")
# Tests run from build-cuda, so `import torch_smddp` takes the installed
# package (the checkout's holds the CPU build), with the checkout's test
# helpers on the path.
TESTS_PATH="$ROOT/tests/gpu:$ROOT/tests/python/harness"

if [ "$stage" = all ] || [ "$stage" = build ]; then
  if [ $sim = 0 ]; then
    section "Build: pip install . (SMDDP_WITH_CUDA=auto)"
    run_step build 300 "${make_gpu[@]}" build-cuda-ext
  else
    section "Build (--sim: the CPU build of make build stands in)"
    run_step build 60 "$PY" -c "import torch_smddp, torch_smddp._build_info as b; print('torch_smddp', torch_smddp.__file__, 'built against torch', b.TORCH_VERSION)"
  fi
fi

if [ "$stage" = all ] || [ "$stage" = tests ]; then
  if [ $sim = 0 ]; then
    section "tests/cuda through ctest"
    out=$(cd build-cuda && timeout --signal=KILL "$(( $(left) > 70 ? 60 : 5 ))" ctest -L cuda -V 2>&1)
    rc=$?
    log '```'; grep -E "Test +#|SMDDP_TEST_SKIPPED|tests passed|FAILED|Failed|rror" <<<"$out" | tail -n 60 |
      tee -a "$report"; log '```'
    # A skip is a failure here, except a test that needs more GPUs than
    # there are ("SMDDP_TEST_SKIPPED: needs N CUDA devices") or a machine
    # without cuobjdump (the architecture check, which no GPU changes).
    skips=$(grep -o "SMDDP_TEST_SKIPPED: .*" <<<"$out" | grep -v "no cuobjdump" |
            awk -v n="$ngpu" 'match($0, /needs [0-9]+ CUDA devices/) &&
                              substr($0, RSTART + 6) + 0 > n { next } { print }')
    grep -q "no cuobjdump" <<<"$out" && log "tests/cuda: the architecture check skipped: no cuobjdump here"
    if [ $rc -ne 0 ] || [ -n "$skips" ] || grep -q "No tests were found" <<<"$out"; then
      log "tests/cuda: FAILED (a test failed, or skipped although there is a GPU: ${skips:-none})"
      failed+=("tests/cuda")
    fi
    section "tests/gpu through pytest"
    run_step test-gpu 240 bash -c "cd build-cuda && PYTHONPATH=$TESTS_PATH '$PY' -m pytest -q -rsP -p no:cacheprovider --rootdir='$ROOT' '$ROOT/tests/gpu'"
  else
    section "The GPU path's collectives on the stand-in (tests/python/test_device_sim.py)"
    run_step test-sim 180 "$PY" -m pytest -q -p no:cacheprovider \
      "tests/python/test_device_sim.py::test_collectives_vs_gloo_through_the_device_path[2]"
  fi
fi

if [ "$stage" = all ] || [ "$stage" = multi ]; then
  section "One rank per GPU, on both routes inside the host"
  if [ "$ngpu" -ge 2 ]; then
    run_step multi-gpu 150 bash -c "cd build-cuda && PYTHONPATH=$TESTS_PATH '$PY' '$ROOT/tests/gpu/multi_gpu.py' $([ $sim = 1 ] && echo --sim) $ngpu"
  else
    log "skipped: $ngpu GPU(s) here; one rank per GPU, SMDDP_INTRA=nccl and the 8-rank DDP step need 2 or more"
  fi
fi

if [ "$stage" = all ] || [ "$stage" = bench ]; then
  section "Benchmarks"
  if [ $sim = 0 ]; then
    run_step bench-shm 120 env SMDDP_INTRA=shm bash -c "cd build-cuda && '$PY' '$ROOT/benchmarks/gpu_bench.py' --report '$report.bench-shm'"
    [ -f "$report.bench-shm" ] && cat "$report.bench-shm" >>"$report" && rm -f "$report.bench-shm"
    if [ "$ngpu" -ge 2 ]; then
      run_step bench-nccl 90 env SMDDP_INTRA=nccl bash -c "cd build-cuda && '$PY' '$ROOT/benchmarks/gpu_bench.py' --iters 5 --report '$report.bench-nccl'"
      [ -f "$report.bench-nccl" ] && cat "$report.bench-nccl" >>"$report" && rm -f "$report.bench-nccl"
    fi
    worlds="2 4 8"
  else
    worlds="2"
  fi
  section "The host path on CPU tensors (world $worlds) against Gloo and the memcpy floor"
  # CPU tensors on the host path itself, so never through the stand-in.
  run_step host-bench 90 env -u SMDDP_DEVICE_SIM bash -c "cd build-cuda && '$PY' '$ROOT/benchmarks/host_scaling.py' --world $worlds $([ $sim = 1 ] && echo '--size 4M')"
fi

finish
