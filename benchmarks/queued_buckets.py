"""DDP's gradient buckets as allreduce calls, three ways: issued together
and then waited for (what DDP does when buckets are ready faster than the
link takes them), one after another, and as one call of the same bytes.
smddp in f32, smddp crossing hosts in bf16, and Gloo, in the same
processes, taking turns (ABBA). Every result is checked against the closed
form (each element is the world size). Prints the slowest rank's median.

    sudo .venv/bin/python benchmarks/queued_buckets.py --hosts 4 --ranks 1 --rate 2gbit \\
        [--bucket-mb 4] [--mb 82] [--rounds 6]

docs/notes/2026-11-27-network-fusion-copies.md has what it found.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # cluster_launch
from tools.smddp_model import ddp_buckets  # noqa: E402
from cluster_launch import add_cc_arg, cluster_cc, launch_on_cluster  # noqa: E402
from torch_smddp.bench import launch_ranks  # noqa: E402

MODES = ("together", "serial", "one")


def worker(args) -> None:
    import torch
    import torch.distributed as dist

    import torch_smddp

    torch.set_num_threads(1)
    dist.init_process_group("smddp")
    rank, world = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    narrow = dist.new_group(backend="smddp",
                            pg_options=torch_smddp.Options(cross_host_dtype="bf16"))
    groups = {"smddp": None, "smddp bf16": narrow, "gloo": gloo}
    total = int(args.mb * (1 << 20)) // 4 * 4
    buckets = [torch.ones(n // 4) for n in ddp_buckets(total, int(args.bucket_mb * (1 << 20)))]
    whole = torch.ones(total // 4)

    def together(pg):
        for w in [dist.all_reduce(b, group=pg, async_op=True) for b in buckets]:
            w.wait()

    def serial(pg):
        for b in buckets:
            dist.all_reduce(b, group=pg)

    def one(pg):
        dist.all_reduce(whole, group=pg)

    run = {"together": together, "serial": serial, "one": one}
    names = [(g, m) for g in groups for m in MODES]
    times = {f"{g} {m}": [] for g, m in names}
    bad = []
    for r in range(args.rounds + 1):  # round 0 warms up
        for g, m in (names if r % 2 == 0 else names[::-1]):
            for t in (*buckets, whole):
                t.fill_(1.0)
            dist.barrier(group=gloo)
            t0 = time.perf_counter()
            run[m](groups[g])
            dt = time.perf_counter() - t0
            # bf16 crossing holds small integers exactly.
            out = [whole] if m == "one" else buckets
            if any(not bool(torch.all(t == world)) for t in out):
                bad.append(f"{g} {m}, round {r}")
            if r:
                times[f"{g} {m}"].append(dt)
    medians = {}
    for k, v in times.items():
        t = torch.tensor(v, dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=gloo)
        medians[k] = statistics.median(t.tolist()) * 1e3
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump({"world": world, "median_ms": medians, "bad": bad,
                       "buckets": len(buckets)}, f)
    dist.destroy_process_group()


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hosts", type=int, default=0, help="namespace hosts (root); 0: one host")
    p.add_argument("--ranks", type=int, default=2, help="ranks per host")
    p.add_argument("--rate", default="2gbit", help="each host's link (with --hosts)")
    add_cc_arg(p)
    p.add_argument("--mb", type=float, default=78.26, help="gradient MiB (ddp_step.py's 82 MB)")
    p.add_argument("--bucket-mb", type=float, default=4)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--worker", action="store_true")
    p.add_argument("--out")
    return p


def main() -> int:
    args = parser().parse_args()
    if args.worker:
        worker(args)
        return 0
    cmd = [os.path.abspath(__file__), "--worker", "--mb", str(args.mb),
           "--bucket-mb", str(args.bucket_mb), "--rounds", str(args.rounds)]
    if args.hosts:
        res = launch_on_cluster(cmd, args.hosts, args.ranks, args.rate, args.timeout,
                                "queued_buckets.py --hosts", args.cc)
        where = (f"{args.hosts} hosts x {args.ranks} ranks, links of {args.rate}, "
                 f"tcp {cluster_cc(args.cc)}")
    else:
        res = launch_ranks([sys.executable, *cmd], args.ranks, args.timeout, "queued_buckets.py")
        where = f"one host, {args.ranks} ranks"
    print(f"# {where}: {args.mb:g} MiB in {res['buckets']} buckets of {args.bucket_mb:g} MiB "
          f"(the first 1 MiB); median of {args.rounds} rounds, slowest rank, ms")
    print(f"{'backend':>12} " + " ".join(f"{m:>9}" for m in MODES))
    for g in ("smddp", "smddp bf16", "gloo"):
        print(f"{g:>12} " + " ".join(f"{res['median_ms'][f'{g} {m}']:9.1f}" for m in MODES))
    if res["bad"]:
        print("WRONG RESULTS: " + "; ".join(res["bad"]))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
