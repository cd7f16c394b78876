#!/usr/bin/env bash
# Device code in the given CUDA objects or libraries must load on every GPU
# torch 2.14's CUDA 13 wheels support from Turing up: SASS for sm_75, 80,
# 86, 89, 90, 100 and 120, and PTX for newer ones. No device code at all
# passes (the GPU path uses copies, events and NCCL only), saying so.
#
#   check_cuda_archs.sh FILE...          check these
#   check_cuda_archs.sh --self-test NVCC the check must refuse an object
#                                        built for sm_90 alone
#
# CUOBJDUMP names the tool; with none to be found the check reports itself
# skipped (SMDDP_TEST_SKIPPED, which ctest counts as skipped), never passed.
set -euo pipefail
CUOBJDUMP=${CUOBJDUMP:-$(command -v cuobjdump || echo "${CUDA_HOME:-/usr/local/cuda}/bin/cuobjdump")}
if [ ! -x "$CUOBJDUMP" ]; then
  echo "SMDDP_TEST_SKIPPED: no cuobjdump here ('${CUOBJDUMP}'): make setup-cuda installs one"
  exit 0
fi
if [ "${1:-}" = --self-test ]; then
  nvcc=${2:?"--self-test needs the nvcc to build with"}
  dir=$(mktemp -d)
  trap 'rm -rf "$dir"' EXIT
  printf '__global__ void k(float* x) { x[0] = 1.0f; }\n' >"$dir/k.cu"
  "$nvcc" -c -gencode arch=compute_90,code=sm_90 "$dir/k.cu" -o "$dir/k.o"
  if out=$("$0" "$dir/k.o" 2>&1); then
    echo "the check passed an object with SASS for sm_90 alone:" >&2
    echo "$out" >&2
    exit 1
  fi
  grep -q "without SASS for sm_80" <<<"$out" && grep -q "without PTX" <<<"$out" ||
    { echo "the check refused it, but not for the missing architectures and PTX: $out" >&2; exit 1; }
  grep -q "sm_90" <<<"$out" && { echo "the check named sm_90, which is there: $out" >&2; exit 1; }
  echo "refused, naming the missing architectures and PTX"
  exit 0
fi
want=(sm_75 sm_80 sm_86 sm_89 sm_90 sm_100 sm_120)
status=0
for f in "$@"; do
  # Only the listed files count: some cuobjdump versions print each archive
  # member's name, or a notice, on stdout where there is no device code.
  elf=$("$CUOBJDUMP" --list-elf "$f" 2>/dev/null | grep '\.cubin' || true)
  ptx=$("$CUOBJDUMP" --list-ptx "$f" 2>/dev/null | grep '\.ptx' || true)
  if [ -z "$elf$ptx" ]; then
    echo "$f: no device code"
    continue
  fi
  for arch in "${want[@]}"; do
    if ! grep -q "\.${arch}\.cubin" <<<"$elf"; then
      echo "$f: device code without SASS for ${arch}" >&2
      status=1
    fi
  done
  if [ -z "$ptx" ]; then
    echo "$f: device code without PTX (newer GPUs could not load it)" >&2
    status=1
  fi
  [ $status -eq 0 ] && echo "$f: SASS for ${want[*]} and PTX"
done
exit $status
