"""The host path on CPU tensors, one host, at several world sizes: smddp
against Gloo (torch_smddp.bench, both in the same processes, alternating,
every result checked against the closed form) and against the memcpy floor.

    python benchmarks/host_scaling.py [--world 2 4 8] [--size 64M]

The floor: on one host every rank copies its S bytes into the shared
segment and the reduced S bytes back out, so no allreduce through shared
memory takes less than two copies of S by one core, measured here as one
thread's torch copy of S bytes, twice (scripts/gpu_check.sh, stage bench,
runs this to see how the host path scales with cores: on the first H200
run, 64 MiB at world 2 took 15.3 ms on 16 cores, against 8.4-9.2 ms on the
2-vCPU development VM).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time


def memcpy_seconds(nbytes: int, iters: int = 10) -> float:
    import torch

    torch.set_num_threads(1)
    src = torch.ones(nbytes, dtype=torch.uint8)
    dst = torch.empty_like(src)
    for _ in range(2):
        dst.copy_(src)
    best = float("inf")
    for _ in range(iters):
        t0 = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> int:
    from torch_smddp.bench import fmt_size, parse_size

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world", type=int, nargs="+", default=[2, 4, 8])
    ap.add_argument("--size", default="64M")
    ap.add_argument("--budget", default="512M", help="bytes per world and backend (sets iterations)")
    ap.add_argument("--timeout", type=float, default=120, help="seconds per world")
    args = ap.parse_args()
    size = parse_size(args.size)
    floor = 2 * memcpy_seconds(size)
    print(f"# allreduce float32 SUM of {fmt_size(size)} on one host, {os.cpu_count()} cores; "
          f"memcpy floor (two copies of S by one core) {floor * 1e3:.2f} ms")
    print(f"{'world':>5} | {'smddp ms':>9} | {'gloo ms':>9} | {'floor ms':>9} | {'smddp/floor':>11} | "
          f"{'gloo/smddp':>10}")
    failed = False
    for w in args.world:
        with tempfile.NamedTemporaryFile(suffix=".json") as out:
            cmd = [sys.executable, "-m", "torch_smddp.bench", "--world", str(w), "--sizes", str(size),
                   "--budget", str(parse_size(args.budget)), "--timeout", str(args.timeout),
                   "--save", out.name]
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout + 30)
            if r.returncode != 0:
                print(f"{w:>5} | failed: {(r.stdout + r.stderr).strip()[-600:]}")
                failed = True
                continue
            with open(out.name) as f:
                row = json.load(f)[0]["rows"][0]
        s, g = row["smddp"], row["gloo"]
        print(f"{w:>5} | {s * 1e3:>9.2f} | {g * 1e3:>9.2f} | {floor * 1e3:>9.2f} | {s / floor:>11.2f} | "
              f"{g / s:>10.2f}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
