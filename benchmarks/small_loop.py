"""A plain loop of synchronous small allreduces: the per-call cost of
smddp's two entries, for A/B comparisons of builds (docs/notes/2026-11-small-messages.md).

    torchrun --nproc-per-node 2 benchmarks/small_loop.py --numel 1024 --blocks 8
    python benchmarks/small_loop.py --numel 1024          # a group of one rank
    torchrun --nproc-per-node 2 benchmarks/small_loop.py --numel 1048576 2097152 --entries direct

Each block is --calls back-to-back calls on zeros (float32, SUM, in place;
at most 256 MiB of calls per block, and at least 4) after a barrier; it
prints rank 0's microseconds per call for every block, per size and entry: `direct` is torch_smddp.all_reduce_, `dist` is dist.all_reduce.
Before timing, one call per entry is checked against the closed form (rank
r holds r + 1, so every element must be n(n+1)/2); a wrong result exits 1.
No peers here: benchmarks/peers.py compares against Gloo, DeepSpeed, MPICH.
"""

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist

import torch_smddp


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--numel", type=int, nargs="+", default=[1024],
                    help="float32 elements per call (several: one after the other)")
    ap.add_argument("--blocks", type=int, default=5)
    ap.add_argument("--calls", type=int, default=2000, help="calls per block")
    ap.add_argument("--entries", nargs="+", choices=["direct", "dist"],
                    default=["direct", "dist"])
    args = ap.parse_args()
    if "RANK" not in os.environ:  # plain python: a group of one rank
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29659")
        dist.init_process_group("smddp", rank=0, world_size=1)
    else:
        dist.init_process_group("smddp")
    rank, world = dist.get_rank(), dist.get_world_size()
    calls = {"direct": torch_smddp.all_reduce_,
             "dist": lambda t: dist.all_reduce(t)}
    for numel in args.numel:
        for name in args.entries:
            t = torch.full((numel,), float(rank + 1))
            calls[name](t)
            if not bool(torch.all(t == world * (world + 1) / 2)):
                print(f"rank {rank}: {name} gave {t[:4].tolist()}, want {world * (world + 1) / 2}",
                      file=sys.stderr)
                sys.exit(1)
        per_block = min(args.calls, max(4, (256 << 20) // (4 * numel)))
        t = torch.zeros(numel)
        for name in args.entries:
            for _ in range(min(200, per_block)):
                calls[name](t)
        times = {name: [] for name in args.entries}
        for _ in range(args.blocks):
            for name in args.entries:
                f = calls[name]
                dist.barrier()
                t0 = time.perf_counter()
                for _ in range(per_block):
                    f(t)
                times[name].append((time.perf_counter() - t0) / per_block * 1e6)
        if rank == 0:
            for name, v in times.items():
                print(f"world {world} numel {numel} {name}: us/call per block "
                      + " ".join(f"{x:.1f}" for x in v), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
