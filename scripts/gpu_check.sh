#!/usr/bin/env bash
# The GPU path's first run, in one command, on a machine with a CUDA GPU
# (one is enough; some checks need two and say so). It installs torch-smddp
# the way users do, `pip install .` against the machine's own torch (no
# network needed: --no-build-isolation, since there is no index to fetch
# setuptools from), which builds the CUDA path by itself, then runs:
#   1. tests/cuda through ctest (a skipped test is a failure here);
#   2. make test-gpu (tests/gpu: every collective on CUDA tensors against
#      Gloo, the caller's stream rules, DDP and FSDP2 against Gloo, and the
#      checks of each defect the stand-in found: a coalesced 256 MiB call
#      read at once after wait(), isend/irecv rings in every order under
#      CUDA_DEVICE_MAX_CONNECTIONS=1 and under CUDA_LAUNCH_BLOCKING=1, a
#      killed peer, destroy then free, a CUDA tensor factor, capture);
#   3. with 2 or more GPUs: a rank per GPU, no process on a GPU other than
#      its own (nvidia-smi), and SMDDP_INTRA=nccl against the closed form;
#   4. the 64 MiB benchmark against the measured copy bound, and a DDP step
#      against Gloo (benchmarks/gpu_bench.py).
# It writes one report (markdown) and exits non-zero if any step failed.
#
#   scripts/gpu_check.sh [all|build|tests|multi|bench] [REPORT]
#
# Each stage fits in 10 minutes on a 16-core machine, so a tool that limits
# one command's time can run them one by one on the same (warm) machine;
# the build stays in build-cuda between them. REPORT defaults to
# $OUT/gpu_report.md where $OUT is set, else build-cuda/gpu_report.md.
#
# libfabric, Catch2 and OpenSSL's libcrypto come from Debian packages: where the machine has
# none, carry them as .deb files in .gpu-debs/ (`make gpu-debs` fetches
# them on a machine with apt) and they are unpacked into .gpu-prefix/.
set -uo pipefail
cd "$(dirname "$0")/.."
stage=${1:-all}
report=${2:-${OUT:+$OUT/gpu_report.md}}
report=${report:-build-cuda/gpu_report.md}
PY=${PYTHON:-python3}
mkdir -p "$(dirname "$report")" build-cuda
failed=()
log() { printf '%s\n' "$*" | tee -a "$report"; }
section() { log ""; log "## $*"; log ""; }
run_step() {  # run_step NAME LIMIT_S CMD...: output into the report, fenced
  local name=$1 limit=$2
  shift 2
  # GPU_CHECK_LIMIT caps every step (a lent machine's minutes are few).
  [ "${GPU_CHECK_LIMIT:-$limit}" -lt "$limit" ] && limit=$GPU_CHECK_LIMIT
  log '```'
  local t0=$SECONDS
  # The report keeps the tail; $report.$name.log keeps all of it.
  timeout --signal=KILL "$limit" "$@" 2>&1 | tee "$report.$name.log" | tail -n 80 | tee -a "$report"
  local rc=${PIPESTATUS[0]}
  log '```'
  log "$name: exit $rc after $((SECONDS - t0)) s"
  [ "$rc" -eq 0 ] || failed+=("$name")
  return "$rc"
}

# ---- the machine's own packages, or the carried Debian ones ----------------
prefix=$PWD/.gpu-prefix
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
else
  cmake_args=""
fi
# The carried libfabric is the one the build must take (docs/install.md,
# "libfabric"): the extension then records its folder in its run path.
[ -d "$prefix/usr" ] && export SMDDP_LIBFABRIC_ROOT=$prefix/usr
# The architectures are setup.py's default (sm_75 and up plus PTX), which
# tests/cuda's ctest checks, unless the caller sets TORCH_CUDA_ARCH_LIST.
jobs=$(nproc 2>/dev/null || echo 8)
export SMDDP_BUILD_JOBS=$jobs PIP_BREAK_SYSTEM_PACKAGES=1
make_gpu=(make --no-print-directory CUDA_PY="$(command -v "$PY")" CUDA_SETUP= JOBS="$jobs"
          CMAKE_ARGS="$cmake_args" CUDA_PIP_ARGS="--no-build-isolation")

if [ "$stage" = all ] || [ "$stage" = build ]; then
  : >"$report"
  log "# GPU check of torch-smddp $(git rev-parse --short HEAD 2>/dev/null || echo '?') ($(date -u +%F\ %H:%M) UTC)"
  section "Machine"
  log '```'
  { nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    "$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'nccl', '.'.join(map(str, torch.cuda.nccl.version())), 'gpus', torch.cuda.device_count())"
    nproc; } 2>&1 | tee -a "$report"
  log '```'
  section "Build: pip install . (SMDDP_WITH_CUDA=auto)"
  run_step build 600 "${make_gpu[@]}" build-cuda-ext
fi

if [ "$stage" = all ] || [ "$stage" = tests ]; then
  section "tests/cuda through ctest"
  out=$(cd build-cuda && timeout --signal=KILL "${GPU_CHECK_LIMIT:-300}" ctest -L cuda -V 2>&1)
  rc=$?
  log '```'; grep -E "Test +#|SMDDP_TEST_SKIPPED|tests passed|FAILED|Failed|rror" <<<"$out" | tail -n 60 |
    tee -a "$report"; log '```'
  # A skip is a failure here, except a test that needs more GPUs than there
  # are ("SMDDP_TEST_SKIPPED: needs N CUDA devices").
  ngpu=$("$PY" -c "import torch; print(torch.cuda.device_count())" 2>/dev/null || echo 0)
  skips=$(grep -o "SMDDP_TEST_SKIPPED: .*" <<<"$out" |
          awk -v n="$ngpu" 'match($0, /needs [0-9]+ CUDA devices/) &&
                            substr($0, RSTART + 6) + 0 > n { next } { print }')
  if [ $rc -ne 0 ] || [ -n "$skips" ] || grep -q "No tests were found" <<<"$out"; then
    log "tests/cuda: FAILED (a test failed, or skipped although there is a GPU: ${skips:-none})"
    failed+=("tests/cuda")
  fi
  section "make test-gpu (tests/gpu)"
  run_step test-gpu 600 "${make_gpu[@]}" test-gpu
fi

if [ "$stage" = all ] || [ "$stage" = multi ]; then
  section "One rank per GPU"
  ngpu=$("$PY" -c "import torch; print(torch.cuda.device_count())" 2>/dev/null || echo 0)
  if [ "$ngpu" -ge 2 ]; then
    run_step multi-gpu 600 env PYTHONPATH="$PWD/tests/gpu:$PWD/tests/python" \
      "$PY" tests/gpu/multi_gpu.py "$ngpu"
  else
    log "skipped: $ngpu GPU(s) here; the per-GPU process check and SMDDP_INTRA=nccl need 2 or more"
  fi
fi

if [ "$stage" = all ] || [ "$stage" = bench ]; then
  section "Benchmarks (benchmarks/gpu_bench.py)"
  run_step bench 600 "$PY" benchmarks/gpu_bench.py --report "$report.bench"
  [ -f "$report.bench" ] && cat "$report.bench" >>"$report" && rm -f "$report.bench"
fi

section "Summary"
if [ ${#failed[@]} -eq 0 ]; then
  log "stage $stage: every step passed"
else
  log "stage $stage: FAILED: ${failed[*]}"
fi
echo "report: $report"
[ ${#failed[@]} -eq 0 ]
