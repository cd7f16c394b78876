#!/usr/bin/env bash
# The one-host benchmarks (benchmarks/README.md), in one run on one machine:
#   benchmarks/run_all.sh 2>&1 | tee /tmp/bench.txt
# Run it on a quiet machine; the tables compare smddp with Gloo measured in
# the same processes, so compare ratios rather than absolute times.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python

echo "## allreduce, world 2 and 4 (plot: benchmarks/allreduce_busbw.png)"
$PY -m torch_smddp.bench --world 2 4 --min 4K --max 256M --plot benchmarks/allreduce_busbw.png

echo "## the world-2 episodes"
.venv/bin/torchrun --nproc-per-node 2 benchmarks/episodes.py --size 64M --iters 300

echo "## DDP step, world 2 (paired: smddp, Gloo and compute only in the same processes)"
$PY benchmarks/ddp_step.py --paired --steps 20 --batch 1
$PY benchmarks/ddp_step.py --paired --steps 16 --batch 4
echo "## DDP step, world 2 (separate jobs, median of rounds)"
$PY benchmarks/ddp_step.py --world 2 --batch 4
$PY benchmarks/ddp_step.py --world 2 --batch 1

echo "## what polling costs: SMDDP_SPIN_US (allreduce latency, DDP step)"
for spin in 0 50 1000; do
  echo "### SMDDP_SPIN_US=$spin"
  SMDDP_SPIN_US=$spin $PY -m torch_smddp.bench --world 2 --min 4K --max 64K --budget 67108864
  SMDDP_SPIN_US=$spin $PY benchmarks/ddp_step.py --paired --steps 12 --batch 1
done
