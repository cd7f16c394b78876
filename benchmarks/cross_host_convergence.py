"""Does bf16 between hosts change what the demo model learns? The demo
(examples/train_ddp.py) at 2 pretend hosts x 2 ranks (SMDDP_HOST_ID: the
same numerics as separate hosts, since the cross-host step runs as it would
across them), 500 steps, once with SMDDP_CROSS_HOST_DTYPE=fp32 and once
with bf16 (and fp16 with --fp16), same seed; prints each run's held-out
loss and the relative difference.

    .venv/bin/python benchmarks/cross_host_convergence.py [--steps 500] [--fp16]
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(dtype: str, steps: int, hosts: int, per_host: int, timeout: float) -> float:
    world = hosts * per_host
    port = free_port()
    procs = []
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank % per_host),
                   LOCAL_WORLD_SIZE=str(per_host), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   SMDDP_HOST_ID=f"host{rank // per_host}", SMDDP_CROSS_HOST_DTYPE=dtype,
                   OMP_NUM_THREADS="1")
        cmd = [sys.executable, os.path.join(REPO, "examples", "train_ddp.py"), "--steps", str(steps),
               "--no-sample", "--log-every", str(steps)]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True))
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=timeout)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    if any(p.returncode for p in procs):
        raise SystemExit(f"{dtype} run failed:\n" + "\n".join(o[-2000:] for o in outs))
    m = re.search(r"held-out (\d+\.\d+)", outs[0])
    if not m:
        raise SystemExit(f"{dtype} run printed no held-out loss:\n{outs[0][-2000:]}")
    return float(m.group(1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--hosts", type=int, default=2)
    ap.add_argument("--ranks", type=int, default=2, help="ranks per pretend host")
    ap.add_argument("--fp16", action="store_true", help="also run fp16 crossing")
    ap.add_argument("--timeout", type=float, default=1800)
    args = ap.parse_args()
    dtypes = ["fp32", "bf16"] + (["fp16"] if args.fp16 else [])
    losses = {d: run(d, args.steps, args.hosts, args.ranks, args.timeout) for d in dtypes}
    print(f"# demo model, {args.steps} steps, {args.hosts} pretend hosts x {args.ranks} ranks")
    print("| crossing | held-out loss | vs fp32 |")
    print("|---|---|---|")
    for d, loss in losses.items():
        print(f"| {d} | {loss:.4f} | {(loss - losses['fp32']) / losses['fp32']:+.2%} |")


if __name__ == "__main__":
    main()
