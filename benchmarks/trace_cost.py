"""What the flight recorder costs: the same calls on two smddp groups (both made
with new_group, in the order --order gives) over the
same ranks, one recording (SMDDP_TRACE_BUFFER_SIZE=2000, the default) and
one not (0), taking turns in ABBA order in the same processes.

    .venv/bin/python benchmarks/trace_cost.py [--world 2] [--rounds 30] [--calls 200] [--steps 16]

Part 1: a synchronous 4 KiB float32 all_reduce, blocks of --calls calls per
group per round; the per-call time of each block (max over ranks), and the
median over rounds of the per-round ratio on/off.
Part 2: a DDP step (benchmarks/ddp_step.py's transformer, batch 1) on two
DDP copies of one model, one per group, step by step in ABBA order; the
median of the per-pair ratios.
Results are checked: every all_reduce must leave n(n+1)/2.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time

sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.ddp_step import abba_order, build_model  # noqa: E402
from torch_smddp.bench import launch_ranks  # noqa: E402


def worker(args) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import torch_smddp
    torch.set_num_threads(1)
    dist.init_process_group("gloo")  # barriers and results, outside the timed regions
    rank, world = dist.get_rank(), dist.get_world_size()
    gloo = None
    # Two smddp groups made the same way, in the order asked for (--aa: both
    # record, which measures how much two groups differ by themselves).
    groups = {}
    for name in args.order.split(","):
        os.environ["SMDDP_TRACE_BUFFER_SIZE"] = "2000" if name == "on" or args.aa else "0"
        groups[name] = dist.new_group(backend="smddp")
    os.environ.pop("SMDDP_TRACE_BUFFER_SIZE")
    want = float(world * (world + 1) // 2)
    t = torch.empty(1024)

    def block(name):
        g = groups[name]
        total = 0.0
        for _ in range(args.calls):
            t.fill_(rank + 1)
            t0 = time.perf_counter()
            dist.all_reduce(t, group=g)
            total += time.perf_counter() - t0
            if t[0].item() != want or t[-1].item() != want:
                raise SystemExit(f"rank {rank}: wrong result {t[0].item()} on group {name}")
        return total / args.calls

    for name in ("on", "off"):
        block(name)  # warm-up
    small = {"on": [], "off": []}
    for i in range(args.rounds):
        for name in abba_order(("on", "off"), i):
            dist.barrier(group=gloo)
            small[name].append(block(name))
    assert torch_smddp.flight_recorder(groups["on"]), "the 'on' group records"
    assert bool(torch_smddp.flight_recorder(groups["off"])) == args.aa

    models = {}
    for name, g in groups.items():
        torch.manual_seed(0)
        ddp = DDP(build_model(torch, seq=args.seq), process_group=g)
        models[name] = (ddp, torch.optim.SGD(ddp.parameters(), lr=0.01))
    gen = torch.Generator().manual_seed(rank)
    x = torch.randint(0, 8192, (1, args.seq), generator=gen)
    y = torch.randint(0, 8192, (1, args.seq), generator=gen)
    loss_fn = torch.nn.CrossEntropyLoss()

    def step(name):
        ddp, opt = models[name]
        opt.zero_grad(set_to_none=True)
        out = ddp(x)
        loss_fn(out.reshape(-1, out.shape[-1]), y.reshape(-1)).backward()
        opt.step()

    for _ in range(2):
        for name in ("on", "off"):
            step(name)
    steps = {"on": [], "off": []}
    for i in range(args.steps):
        for name in abba_order(("on", "off"), i):
            dist.barrier(group=gloo)
            t0 = time.perf_counter()
            step(name)
            steps[name].append(time.perf_counter() - t0)

    out = {}
    for label, d in (("small", small), ("step", steps)):
        for name in d:
            v = torch.tensor(d[name], dtype=torch.float64)
            dist.all_reduce(v, op=dist.ReduceOp.MAX, group=gloo)
            d[name] = v.tolist()
        out[label] = {"times": d, "ratio": statistics.median(
            a / b for a, b in zip(d["on"], d["off"])),
            "median": {k: statistics.median(v) for k, v in d.items()}}
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump(out, f)
    with contextlib.suppress(Exception):
        dist.destroy_process_group()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--timeout", type=float, default=1200)
    ap.add_argument("--order", default="on,off", help="which group is made first (on,off or off,on)")
    ap.add_argument("--aa", action="store_true", help="both groups record (an A/A control)")
    ap.add_argument("--worker", action="store_true")
    ap.add_argument("--out")
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return 0
    cmd = [sys.executable, __file__, "--worker", "--rounds", str(args.rounds), "--calls",
           str(args.calls), "--steps", str(args.steps), "--seq", str(args.seq), "--order", args.order] + (["--aa"] if args.aa else [])
    res = launch_ranks(cmd, args.world, args.timeout, "trace cost run")
    print(f"# flight recorder on (2000) vs off (0){' [A/A: both on]' if args.aa else ''}, world "
          f"{args.world}, same processes, ABBA, groups made in the order {args.order}")
    s, d = res["small"], res["step"]
    print(f"4 KiB all_reduce: on {s['median']['on'] * 1e6:.1f} us, off "
          f"{s['median']['off'] * 1e6:.1f} us per call (median of {args.rounds} blocks of "
          f"{args.calls}); median per-round ratio on/off {s['ratio']:.4f}")
    print(f"DDP step (batch 1): on {d['median']['on'] * 1e3:.1f} ms, off "
          f"{d['median']['off'] * 1e3:.1f} ms (median of {args.steps}); median per-pair ratio "
          f"on/off {d['ratio']:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
