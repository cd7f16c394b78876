"""What happens in a slow "episode" of the shared-memory allreduce.

    .venv/bin/torchrun --nproc-per-node 2 benchmarks/episodes.py [--size 64M] [--iters 300]

On the 2-core development VM, a large allreduce sometimes runs ~3x slower
than usual for a few seconds at a time. This script separates the causes
that could be behind it. Every iteration does, on every rank and in turn:

1. an smddp allreduce of --size bytes, with the schedstat of the rank's
   busiest non-main thread (the engine thread) around it: time running and
   time runnable but waiting for a CPU;
   and the time its reduction server spent combining (stats());
2. a Gloo allreduce of the same tensor, for comparison;
3. a private copy of the same number of bytes (no other rank involved).

It prints the times in windows of 10 iterations and a summary of the
iterations where smddp took more than twice its median ("slow"), against
the rest: if the engine thread was running (not waiting for a CPU) all the
time in slow iterations while the private copy stayed fast, the slowdown is
in moving data between the ranks' cores, not in scheduling or in memory
bandwidth.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist

import torch_smddp


def parse_size(s: str) -> int:
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(s[:-1]) * mult[s[-1]] if s[-1] in mult else int(s)


def schedstat() -> dict[int, tuple[int, int]]:
    """Per thread of this process: (ns running, ns runnable but waiting)."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                run, wait, _ = f.read().split()
            out[int(tid)] = (int(run), int(wait))
        except OSError:
            pass
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="64M")
    ap.add_argument("--iters", type=int, default=300)
    args = ap.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("smddp")
    rank = dist.get_rank()
    gloo = dist.new_group(backend="gloo")
    n = parse_size(args.size) // 4
    x = torch.ones(n)
    y = torch.empty_like(x)
    for _ in range(3):
        dist.all_reduce(x)
        dist.all_reduce(x, group=gloo)
    main_tid = os.getpid()
    rows = []
    for _ in range(args.iters):
        x.fill_(1.0)
        dist.barrier(group=gloo)
        r0 = torch_smddp.stats()["server_reduce_seconds"]
        s0 = schedstat()
        t0 = time.perf_counter()
        dist.all_reduce(x)
        t1 = time.perf_counter()
        s1 = schedstat()
        reduce = torch_smddp.stats()["server_reduce_seconds"] - r0
        busiest = max((t for t in s1 if t != main_tid and t in s0),
                      key=lambda t: s1[t][0] - s0[t][0])
        run = (s1[busiest][0] - s0[busiest][0]) / 1e9
        wait = (s1[busiest][1] - s0[busiest][1]) / 1e9
        dist.barrier(group=gloo)
        t2 = time.perf_counter()
        dist.all_reduce(x, group=gloo)
        t3 = time.perf_counter()
        dist.barrier(group=gloo)
        t4 = time.perf_counter()
        y.copy_(x)
        t5 = time.perf_counter()
        rows.append({"smddp": t1 - t0, "run": run, "wait": wait, "reduce": reduce,
                     "gloo": t3 - t2, "copy": t5 - t4})
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, rows)
    if rank == 0:
        report(everyone, args)
    dist.destroy_process_group()


def report(everyone, args) -> None:
    rows = everyone[0]
    ms = lambda v: f"{v * 1e3:7.1f}"  # noqa: E731
    print(f"# {args.size} float32 SUM, world {len(everyone)}, rank 0; times in ms, mean per window of 10")
    print(f"{'iters':>9} {'smddp':>7} {'engine run':>10} {'cpu wait':>8} {'reduce':>7} {'gloo':>7} "
          f"{'copy':>7}")
    for i in range(0, len(rows), 10):
        w = rows[i:i + 10]
        mean = lambda k: sum(r[k] for r in w) / len(w)  # noqa: E731
        print(f"{i:>4}-{i + len(w) - 1:<4} {ms(mean('smddp'))} {ms(mean('run')):>10} "
              f"{ms(mean('wait')):>8} {ms(mean('reduce'))} {ms(mean('gloo'))} {ms(mean('copy'))}")
    med = {k: statistics.median(r[k] for r in rows) for k in ("smddp", "gloo", "copy")}
    slow = [r for r in rows if r["smddp"] > 2 * med["smddp"]]
    usual = [r for r in rows if r["smddp"] <= 2 * med["smddp"]]
    print(f"\n# slow = smddp above twice its median ({ms(med['smddp']).strip()} ms): "
          f"{len(slow)} of {len(rows)} iterations")
    print(f"{'':>8} {'smddp ms':>9} {'engine running':>15} {'waiting for cpu':>16} "
          f"{'reduce ms':>10} {'gloo / median':>14} {'copy / median':>14}")
    for name, group in (("usual", usual), ("slow", slow)):
        if not group:
            continue
        m = lambda k: statistics.median(r[k] for r in group)  # noqa: E731
        frac = statistics.median(r["run"] / r["smddp"] for r in group)
        wfrac = statistics.median(r["wait"] / r["smddp"] for r in group)
        print(f"{name:>8} {ms(m('smddp')):>9} {frac:>14.0%} {wfrac:>16.0%} {ms(m('reduce')):>10} "
              f"{m('gloo') / med['gloo']:>14.2f} {m('copy') / med['copy']:>14.2f}")


if __name__ == "__main__":
    main()
