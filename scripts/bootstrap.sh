#!/usr/bin/env bash
# Idempotent set-up for a fresh machine: Debian packages, then a .venv with
# the pinned CPU build of torch. Fast when everything is already there.
# `make check-cuda` runs it with SMDDP_VENV=.venv-cuda and the pinned CUDA
# build of torch (SMDDP_TORCH_PIN, SMDDP_PY_PACKAGES).
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(libfabric-dev libfabric-bin libssl-dev catch2 cmake g++ make procps clang libclang-rt-14-dev)
VENV=${SMDDP_VENV:-.venv}
TORCH_PIN=${SMDDP_TORCH_PIN:-torch==2.13.0}
read -r -a PY_PACKAGES <<< "${SMDDP_PY_PACKAGES:-pytest numpy matplotlib expecttest build}"

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
  echo "$want" > "$stamp"
fi
