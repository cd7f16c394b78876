#!/usr/bin/env bash
# Device code in the given CUDA objects or libraries must load on every GPU
# torch 2.14's CUDA 13 wheels support from Turing up: SASS for sm_75, 80,
# 86, 89, 90, 100 and 120, and PTX for newer ones. No device code at all
# passes (the GPU path uses copies, events and NCCL only), saying so.
set -euo pipefail
CUOBJDUMP=${CUOBJDUMP:-$(command -v cuobjdump || echo "${CUDA_HOME:-/usr/local/cuda}/bin/cuobjdump")}
want=(sm_75 sm_80 sm_86 sm_89 sm_90 sm_100 sm_120)
status=0
for f in "$@"; do
  elf=$("$CUOBJDUMP" --list-elf "$f" 2>/dev/null || true)
  ptx=$("$CUOBJDUMP" --list-ptx "$f" 2>/dev/null || true)
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
