"""Many small async all_reduces queued at once, then waited for: the case
fusion on the network-only path is for. Runs the job with
SMDDP_SHM_ALLREDUCE=0 twice per round, fusion on (SMDDP_FUSION_BUFFER_BYTES
default) and off (SMDDP_FUSION_BUFFER_BYTES=0: every call alone, the path
as it was before), in ABBA order, and prints the median round.

    .venv/bin/python benchmarks/queued_small.py [--world 2] [--calls 64] [--kib 16]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from torch_smddp.bench import launch_ranks  # noqa: E402


def worker(args) -> None:
    import torch
    import torch.distributed as dist

    import torch_smddp  # noqa: F401  registers smddp

    torch.set_num_threads(1)
    dist.init_process_group("smddp")
    rank, world = dist.get_rank(), dist.get_world_size()
    n = args.kib * 1024 // 4
    ts = [torch.full((n,), float(rank + i)) for i in range(args.calls)]
    times = []
    for it in range(args.warmup + args.iters):
        for i, t in enumerate(ts):
            t.fill_(float(rank + i))
        dist.barrier()
        t0 = time.perf_counter()
        works = [dist.all_reduce(t, async_op=True) for t in ts]
        for w in works:
            w.wait()
        dt = time.perf_counter() - t0
        if it >= args.warmup:
            times.append(dt)
    want = [world * i + world * (world - 1) / 2 for i in range(args.calls)]
    ok = all(bool(torch.all(t == w)) for t, w in zip(ts, want))
    st = torch_smddp.stats()
    # The slowest rank's time per iteration.
    tt = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(tt, op=dist.ReduceOp.MAX)
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump({"median_ms": statistics.median(tt.tolist()) * 1e3, "ok": ok,
                       "calls_per_batch": st["fused_calls_per_buffer"]}, f)
    dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--calls", type=int, default=64)
    p.add_argument("--kib", type=int, default=16)
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--worker", action="store_true")
    p.add_argument("--out")
    args = p.parse_args()
    if args.worker:
        worker(args)
        return
    modes = {"fused": {}, "alone": {"SMDDP_FUSION_BUFFER_BYTES": "0"}}
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--calls", str(args.calls),
           "--kib", str(args.kib), "--iters", str(args.iters), "--warmup", str(args.warmup)]
    got = {m: [] for m in modes}
    extra = {}
    for r in range(args.rounds):
        order = list(modes) if r % 2 == 0 else list(modes)[::-1]
        for m in order:
            res = launch_ranks(cmd, args.world, 300, f"{m} round {r}",
                               env={"SMDDP_SHM_ALLREDUCE": "0", **modes[m]})
            if not res["ok"]:
                raise SystemExit(f"{m}: wrong results")
            got[m].append(res["median_ms"])
            extra[m] = res["calls_per_batch"]
    print(f"world {args.world}, SMDDP_SHM_ALLREDUCE=0, {args.calls} x {args.kib} KiB async "
          f"all_reduce then wait all; median of {args.rounds} rounds of {args.iters} iterations")
    print(f"{'mode':<8} {'ms / iteration':>15} {'us / call':>10} {'calls / batch':>14}")
    for m in modes:
        ms = statistics.median(got[m])
        print(f"{m:<8} {ms:15.3f} {ms * 1e3 / args.calls:10.1f} {extra[m]:14.1f}")
    print(f"speed-up: {statistics.median(got['alone']) / statistics.median(got['fused']):.2f}x")


if __name__ == "__main__":
    main()
