#!/usr/bin/env python3
"""What SMDDP_WIRE_ENCRYPT=1 costs on the peer wire: an allreduce across 2
pretend hosts x 2 ranks on this machine (SMDDP_HOST_ID; tcp;ofi_rxm over
loopback, so only the CPU limits it), with and without encryption.

    .venv/bin/python benchmarks/peer_wire_encrypt.py [--size 64M] [--reps 3]

Each repetition runs torch_smddp.bench's worker (closed-form check of every
call included) once per setting, alternating, so both see the same machine
noise. Prints seconds per allreduce (max over ranks) of each run, the
medians and their ratio. Loopback has no link to hide the CPU behind: this
is the worst case (docs/notes/2026-12-02-peer-wire-encryption.md).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.append(os.path.dirname(HERE))

from torch_smddp import bench  # noqa: E402

# Rank r on pretend host r // ranks: the worker's command, under a shell
# that sets SMDDP_HOST_ID from the RANK launch_ranks gives each process.
HOST_OF_RANK = 'SMDDP_HOST_ID=sealbench$((RANK / {ranks})) exec "$0" "$@"'


def one_run(size: int, budget: int, hosts: int, ranks: int, encrypt: bool, timeout: float) -> float:
    cmd = ["sh", "-c", HOST_OF_RANK.format(ranks=ranks), sys.executable, "-m", "torch_smddp.bench",
           "--worker", "--op", "all_reduce", "--budget", str(budget), "--warmup", "2",
           "--backends", "smddp", "--sizes", str(size)]
    data = bench.launch_ranks(cmd, hosts * ranks, timeout,
                              f"allreduce with SMDDP_WIRE_ENCRYPT={int(encrypt)}",
                              env={"SMDDP_WIRE_ENCRYPT": "1" if encrypt else "0"})
    (row,) = data["rows"]
    return row["smddp"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="64M")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--iters", type=int, default=8, help="timed calls per run")
    ap.add_argument("--hosts", type=int, default=2)
    ap.add_argument("--ranks", type=int, default=2, help="ranks per pretend host")
    ap.add_argument("--timeout", type=float, default=600)
    args = ap.parse_args()
    size = bench.parse_size(args.size)
    times = {False: [], True: []}
    print(f"# allreduce {bench.fmt_size(size)} f32, {args.hosts} pretend hosts x {args.ranks} "
          f"ranks, {args.iters} calls per run; seconds per call")
    for rep in range(args.reps):
        for encrypt in (False, True) if rep % 2 == 0 else (True, False):
            t = one_run(size, size * args.iters, args.hosts, args.ranks, encrypt, args.timeout)
            times[encrypt].append(t)
            print(f"rep {rep} encrypt={int(encrypt)}: {t:.4f} s", flush=True)
    plain, sealed = statistics.median(times[False]), statistics.median(times[True])
    print(f"median: plain {plain:.4f} s, encrypted {sealed:.4f} s, ratio {sealed / plain:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
