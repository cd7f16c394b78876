"""Allreduce benchmark, nccl-tests style: smddp and Gloo side by side.

    python -m torch_smddp.bench [--world 2 4] [--min 4K] [--max 256M] [--plot busbw.png]

Each world size is one job: N local ranks, each with an smddp default group
and a Gloo group over the same ranks. For every size both backends run in
the same processes, alternating, so they see the same machine noise.
time = mean seconds per allreduce (max over ranks); algbw = bytes / time;
busbw = algbw * 2(n-1)/n, the nccl-tests definition for allreduce.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(s: str) -> int:
    s = s.strip().upper().rstrip("B").rstrip("I")
    if s and s[-1] in UNITS:
        return int(float(s[:-1]) * UNITS[s[-1]])
    return int(s)


def fmt_size(n: int) -> str:
    for unit, mult in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= mult and n % mult == 0:
            return f"{n // mult}{unit}"
    return str(n)


def sizes_between(lo: int, hi: int) -> list[int]:
    out, s = [], lo
    while s <= hi:
        out.append(s)
        s *= 4
    return out


def _iters_for(nbytes: int, budget_bytes: int) -> int:
    return max(8, min(200, budget_bytes // max(nbytes, 1)))


def worker(args) -> None:
    import torch
    import torch.distributed as dist

    import torch_smddp  # noqa: F401

    torch.set_num_threads(1)
    dist.init_process_group("smddp")
    rank, world = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    groups = {"smddp": None, "gloo": gloo}
    results = []
    for nbytes in args.sizes:
        numel = max(1, nbytes // 4)
        t = torch.ones(numel, dtype=torch.float32)
        iters = _iters_for(nbytes, args.budget)
        row = {"bytes": numel * 4, "iters": iters}
        for name in args.backends:
            g = groups[name]
            for _ in range(args.warmup):
                dist.all_reduce(t, group=g)
            dist.barrier(group=gloo)
            t0 = time.perf_counter()
            for _ in range(iters):
                dist.all_reduce(t, group=g)
            dt = (time.perf_counter() - t0) / iters
            # The slowest rank defines the collective's time.
            tt = torch.tensor([dt], dtype=torch.float64)
            dist.all_reduce(tt, op=dist.ReduceOp.MAX, group=gloo)
            row[name] = tt.item()
            t.fill_(1.0)
        results.append(row)
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump({"world": world, "rows": results}, f)
    dist.barrier(group=gloo)
    dist.destroy_process_group()


def run_world(world: int, args) -> dict:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tempfile.mktemp(prefix="smddp-bench-", suffix=".json")
    cmd = [sys.executable, "-m", "torch_smddp.bench", "--worker", "--out", out,
           "--budget", str(args.budget), "--warmup", str(args.warmup),
           "--backends", *args.backends, "--sizes", *map(str, args.sizes)]
    procs = []
    for r in range(world):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(r),
                   WORLD_SIZE=str(world), LOCAL_RANK=str(r), OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen(cmd, env=env, start_new_session=True))
    deadline = time.time() + args.timeout
    try:
        for p in procs:
            p.wait(timeout=max(1, deadline - time.time()))
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        raise SystemExit(f"benchmark at world {world} exceeded {args.timeout} s")
    if any(p.returncode for p in procs):
        raise SystemExit(f"benchmark at world {world} failed: exit codes {[p.returncode for p in procs]}")
    with open(out) as f:
        data = json.load(f)
    os.unlink(out)
    return data


def print_table(data: dict, backends: list[str]) -> None:
    n = data["world"]
    factor = 2 * (n - 1) / n if n > 1 else 1.0
    print(f"\n# allreduce, float32, SUM, world {n}  (busbw = algbw x 2(n-1)/n)")
    head = f"{'size':>8} {'iters':>5}"
    for b in backends:
        head += f" | {b + ' us':>12} {'algbw GB/s':>10} {'busbw GB/s':>10}"
    if len(backends) == 2:
        head += f" | {'busbw ' + backends[0] + '/' + backends[1]:>17}"
    print(head)
    for row in data["rows"]:
        line = f"{fmt_size(row['bytes']):>8} {row['iters']:>5}"
        bus = {}
        for b in backends:
            t = row[b]
            alg = row["bytes"] / t / 1e9
            bus[b] = alg * factor
            line += f" | {t * 1e6:>12.1f} {alg:>10.3f} {bus[b]:>10.3f}"
        if len(backends) == 2:
            line += f" | {row[backends[1]] / row[backends[0]]:>16.2f}x"
        print(line)


def plot(all_data: list[dict], backends: list[str], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for data in all_data:
        n = data["world"]
        factor = 2 * (n - 1) / n if n > 1 else 1.0
        xs = [r["bytes"] for r in data["rows"]]
        for b, style in zip(backends, ("-o", "--s")):
            ys = [r["bytes"] / r[b] / 1e9 * factor for r in data["rows"]]
            ax.plot(xs, ys, style, label=f"{b}, world {n}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("busbw (GB/s)")
    ax.set_title("allreduce busbw on one host (CPU)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"\nplot written to {path}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--min", default="4K")
    ap.add_argument("--max", default="256M")
    ap.add_argument("--sizes", nargs="+", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--backends", nargs="+", default=["smddp", "gloo"])
    ap.add_argument("--budget", type=int, default=1 << 30, help="bytes per size and backend (sets iterations)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--plot", help="write a PNG of busbw against size")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    args.sizes = sizes_between(parse_size(args.min), parse_size(args.max))
    all_data = []
    for w in args.world:
        data = run_world(w, args)
        print_table(data, args.backends)
        all_data.append(data)
        sys.stdout.flush()
    if args.plot:
        plot(all_data, args.backends, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
