#!/usr/bin/env bash
# Idempotent set-up for a fresh machine: Debian packages, then a .venv with
# the pinned CPU build of torch. Fast when everything is already there.
# `make check-cuda` runs it with SMDDP_VENV=.venv-cuda and the pinned CUDA
# build of torch (SMDDP_TORCH_PIN, SMDDP_PY_PACKAGES).
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(libfabric-dev libfabric-bin libssl-dev catch2 cmake g++ make procps clang libclang-rt-14-dev openmpi-bin)
VENV=${SMDDP_VENV:-.venv}
TORCH_PIN=${SMDDP_TORCH_PIN:-torch==2.13.0}
# torchft (the [ft] extra) and parameterized (its test suite's) let
# tests/python/test_torchft.py run rather than skip; torchft is installed on
# the same command line as the pinned torch, so pip keeps that torch.
read -r -a PY_PACKAGES <<< "${SMDDP_PY_PACKAGES:-pytest numpy matplotlib expecttest build torchft==0.2.0 parameterized}"

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "bootstrap: installing Debian packages: ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

PY=${PYTHON:-python3}
if [ ! -x "$VENV/bin/python" ]; then
  echo "bootstrap: creating $VENV"
  "$PY" -m venv "$VENV"
fi
stamp=$VENV/.smddp-deps
want="$TORCH_PIN ${PY_PACKAGES[*]}"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "bootstrap: installing $want into $VENV"
  # Pin torch explicitly: an unpinned torch would pull whatever is newest.
  "$VENV/bin/pip" install -q --disable-pip-version-check "$TORCH_PIN" "${PY_PACKAGES[@]}"
  # Nothing may have replaced the pinned torch (torchft requires torch>=2.7).
  got=$("$VENV/bin/python" -c "import torch; print(torch.__version__.split('+')[0])")
  [ "torch==$got" = "${TORCH_PIN%%+*}" ] || { echo "bootstrap: $VENV has torch $got, not $TORCH_PIN" >&2; exit 1; }
  echo "$want" > "$stamp"
fi
