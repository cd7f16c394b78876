#!/usr/bin/env bash
# What `make test` runs once the build is done: ctest and pytest, then the
# ASan/UBSan tests, the fuzzers, the CUDA build's checks and the install
# into a fresh venv. Those last four need builds of their own, about 20
# minutes of CPU on CI's two cores. They are built in the background, one
# after another, at idle priority (SCHED_IDLE) while ctest and pytest run:
# pytest's multi-process tests leave the cores idle much of the time (they
# wait on timeouts, on shaped links and on each other), and an idle-priority
# task gets a core only when no test wants it, so no test waits for them.
# What is not built when pytest ends is built then, at full speed.
#
# Every stage prints when it starts. A failed background build fails the
# run with its log's tail; a failed test kills the background builds.
set -euo pipefail
cd "$(dirname "$0")/.."

MAKE=${MAKE:-make}
PY=${PY:-.venv/bin/python}
FUZZ_SECONDS_CI=${FUZZ_SECONDS_CI:-20}
BG=build-bg   # the background builds' logs
BG_TARGETS=(build-asan build-fuzz build-cuda-ext build-install)
# torch's TCPStore looks up the name of every connection's peer
# (::ffff:127.0.0.1, which /etc/hosts lacks). This VM's resolver lets every
# 25th lookup run into its 5 s timeout, holding a store, or its server's
# loop, for 5-10 s: enough to trip a test's bounds. A short resolver
# timeout caps such a stall at a second
# (docs/notes/2026-12-06-host-group-formation.md).
export RES_OPTIONS=${RES_OPTIONS:-"timeout:1 attempts:1"}

stage() { echo "[make test] $(date -u +%H:%M:%S) $*"; }
# Free space where the builds and venvs go: the CUDA stage alone installs
# torch's CUDA build (about 7 GiB with its nvidia wheels), and a run that
# fills the disk fails in a background build with "No space left on device".
free_gib() { df -Pk . | awk 'NR == 2 { printf "%.1f", $4 / 1048576 }'; }
NEED_GIB=${SMDDP_TEST_NEED_GIB:-16}

idle=(chrt --idle 0)
"${idle[@]}" true 2>/dev/null || idle=(nice -n 19)

rm -rf "$BG"
mkdir -p "$BG"
stage "disk: $(free_gib) GiB free here; a whole run takes about $NEED_GIB GiB"
if awk -v f="$(free_gib)" -v n="$NEED_GIB" 'BEGIN { exit !(f < n) }'; then
  echo "make test: WARNING: $(free_gib) GiB free, under the $NEED_GIB GiB a whole run takes: expect 'No space left on device'" >&2
fi
stage "background builds, at idle priority: ${BG_TARGETS[*]} (logs in $BG/)"
setsid "${idle[@]}" bash -c '
  for t in "$@"; do
    echo "$(date -u +%H:%M:%S) $t" >> '"$BG"'/started
    if ! '"$MAKE"' --no-print-directory "$t" > '"$BG"'/"$t".log 2>&1; then
      echo "$t" > '"$BG"'/failed
      exit 1
    fi
  done
  echo "$(date -u +%H:%M:%S) done" >> '"$BG"'/started' bash "${BG_TARGETS[@]}" &
bg=$!
# A failed stage (set -e) must not leave the builds running.
trap 'kill -- -$bg 2>/dev/null || true' EXIT

stage ctest
(cd build && ctest --output-on-failure -j 2 --timeout 300)
stage pytest
"$PY" -m pytest -q --durations=40 tests/python tests/tools

stage "waiting for the background builds (so far: $(tr '\n' ' ' < "$BG/started"))"
if ! wait "$bg"; then
  failed=$(cat "$BG/failed" 2>/dev/null || echo "?")
  tail -120 "$BG/$failed.log" 2>/dev/null || true
  echo "make test: the background build '$failed' failed: $BG/$failed.log ($(free_gib) GiB free now)"
  exit 1
fi
echo "background builds: $(tr '\n' ' ' < "$BG/started")"

stage test-asan-ci
$MAKE --no-print-directory test-asan-ci
stage fuzz
$MAKE --no-print-directory fuzz FUZZ_SECONDS="$FUZZ_SECONDS_CI"
stage check-cuda
$MAKE --no-print-directory check-cuda-run
stage check-install
$MAKE --no-print-directory check-install-run
stage done
