"""DDP step benchmark: a ~20M-parameter transformer on synthetic tokens,
smddp against Gloo, world 2 by default, in one run on the same machine.

    .venv/bin/python benchmarks/ddp_step.py [--world 2] [--steps 12] [--warmup 3]
    .venv/bin/python benchmarks/ddp_step.py --paired [--steps 20]
    .venv/bin/python benchmarks/ddp_step.py --paired --hosts 2 --ranks 2 --rate 2gbit   # root

Each backend runs in its own torchrun-style job (one process per rank);
step time is the mean over the timed steps (max over ranks) after a
barrier. The backends take turns for --rounds rounds in ABBA order (round
0 runs them as listed, round 1 in reverse, and so on: A B, B A, A B, ...)
and the median round is reported, so both see the same machine noise and
neither always goes first.

--paired runs both backends in the same processes instead: two DDP copies
of the model (one on the smddp default group, one on a Gloo group) and a
"compute only" step (the smddp copy under no_sync(): no allreduce) take
turns in the same ABBA order (smddp, gloo, compute only; then compute only,
gloo, smddp; ...), and the median of the per-round ratios is reported. A
fourth copy, "DDP, no comm", runs DDP with a comm hook that returns each
bucket as it is: DDP's own work (copying gradients into its buckets and
back, the hooks) without any communication. That is the best any backend
could reach; compute only / Gloo is printed too, and lies below it by
what DDP itself costs. --bucket-view gives every copy
gradient_as_bucket_view=True (no copies into and out of the buckets). Both backends then
see the same machine state step by step, which makes the ratio far less
noisy on a shared VM than separate jobs. Reversing every other round cancels
a drift that is linear in time (warming caches, a neighbour's load ramping
up) out of each pair of rounds, which a plain rotation does not.

--paired also times "allreduce only" per backend: the step's gradient
bytes in DDP's buckets (1 MiB, then --bucket-mb each), issued together and
waited for, with no compute; and prints the overlap share, (compute +
allreduce alone - step) / min(compute, allreduce alone): 1 when the step
takes the larger of the two, 0 when it takes their sum. --compressed adds
"smddp bf16" (a group crossing hosts in bf16) and "gloo bf16 hook" (Gloo
under DDP's bf16_compress_hook).

--offcpu-ms MS (with --paired) keeps the model's parameters but replaces
its forward and backward with sleeps that add up to MS (offcpu_model):
compute that holds no core, as a GPU's, so that the allreduce has the
host's cores to itself while backward runs.

--hosts H (with --paired) runs the paired job across H hosts of --ranks
ranks each: network namespaces on this machine with links shaped to
--rate (tools/smddp_cluster.py, as `benchmarks/bench_hosts.py`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import sys
import time

sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # cluster_launch
from tools.smddp_model import ddp_buckets  # noqa: E402
from cluster_launch import add_cc_arg, cluster_cc, launch_on_cluster  # noqa: E402
from torch_smddp.bench import launch_ranks  # noqa: E402


def abba_order(names, round_index: int) -> list:
    """The order of round ``round_index``: ``names`` as given in even rounds,
    reversed in odd ones (A B, B A, A B, ... for two; A B C, C B A, ... for
    three)."""
    names = list(names)
    return names if round_index % 2 == 0 else names[::-1]


def build_model(torch, vocab=8192, d=384, layers=8, heads=6, seq=128):
    nn = torch.nn

    class LM(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(vocab, d)
            self.pos = nn.Parameter(torch.zeros(seq, d))
            layer = nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.0, batch_first=True)
            self.body = nn.TransformerEncoder(layer, layers)
            self.head = nn.Linear(d, vocab)

        def forward(self, x):
            h = self.emb(x) + self.pos[: x.shape[1]]
            return self.head(self.body(h))

    return LM()


def synthetic_batch(torch, rank, batch, seq):
    """This rank's tokens and targets for build_model's LM, seeded by the
    rank: every copy of the model on a rank sees the same batch."""
    g = torch.Generator().manual_seed(rank)
    x = torch.randint(0, 8192, (batch, seq), generator=g)
    y = torch.randint(0, 8192, (batch, seq), generator=g)
    return x, y


def lm_step(torch, model, opt, x, y) -> float:
    """One training step of build_model's LM (forward, cross-entropy,
    backward, optimizer step); returns the loss."""
    opt.zero_grad(set_to_none=True)
    out = model(x)
    loss = torch.nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))
    loss.backward()
    opt.step()
    return loss.item()


def sleeping_part(torch):
    """An autograd function standing for a part of the model whose compute
    holds no core: Part.apply(h, fwd_s, bwd_s, fill, *params) sleeps fwd_s
    and passes h on; its backward sleeps bwd_s and hands back a gradient of
    `fill` for every element of `params`."""
    class Part(torch.autograd.Function):
        @staticmethod
        def forward(ctx, h, fwd_s, bwd_s, fill, *params):
            ctx.bwd_s, ctx.fill, ctx.params = bwd_s, fill, params
            time.sleep(fwd_s)
            return h * 1.0

        @staticmethod
        def backward(ctx, g):
            time.sleep(ctx.bwd_s)
            return (g, None, None, None, *[torch.full_like(p, ctx.fill) for p in ctx.params])

    return Part


def offcpu_model(torch, lm, compute_s, rank):
    """`lm`'s parameters (the same module, so the same order and DDP the
    same buckets) under a forward and backward that sleep instead of
    computing: compute that holds no core, as a GPU's does. The chain runs
    the LM's parts in forward order (embedding, the encoder layers, the
    output layer) and backward in reverse; each part sleeps its share of
    compute_s (a third forward, two thirds backward, as BACKWARD_SHARE in
    tools/smddp_model/project.py) by its parameter count (the embedding's lookup
    counts as nothing), then hands back a gradient for each of its
    parameters, every element 1e-3 * (rank + 1)."""
    Part = sleeping_part(torch)
    parts = [([lm.emb.weight, lm.pos], 0)]
    parts += [(list(layer.parameters()), sum(p.numel() for p in layer.parameters()))
              for layer in lm.body.layers]
    parts.append((list(lm.head.parameters()), sum(p.numel() for p in lm.head.parameters())))
    weight = sum(w for _, w in parts)

    class OffCpu(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lm = lm

        def forward(self, x):
            h = x.float()
            fill = 1e-3 * (rank + 1)
            for params, w in parts:
                share = compute_s * w / weight
                h = Part.apply(h, share / 3, share * 2 / 3, fill, *params)
            return h

    return OffCpu()


def worker(args) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    if "smddp" in args.backend:
        import torch_smddp  # noqa: F401
    torch.set_num_threads(max(1, args.threads))
    dist.init_process_group(args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = build_model(torch, seq=args.seq)
    nparams = sum(p.numel() for p in model.parameters())
    ddp = DDP(model, gradient_as_bucket_view=args.bucket_view)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    x, y = synthetic_batch(torch, rank, args.batch, args.seq)
    for _ in range(args.warmup):
        lm_step(torch, ddp, opt, x, y)
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        lm_step(torch, ddp, opt, x, y)
    dt = (time.perf_counter() - t0) / args.steps
    t = torch.tensor([dt], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump({"step_s": t.item(), "params": nparams, "world": world,
                       "samples_per_s": args.batch * world / t.item()}, f)
    dist.destroy_process_group()


def no_comm_hook(state, bucket):
    """A DDP comm hook that communicates nothing: the bucket comes back as it
    is, so DDP does all its own work (bucket copies, hooks) and no more."""
    import torch

    fut = torch.futures.Future()
    fut.set_result(bucket.buffer())
    return fut


def gloo_bf16_hook(group, bucket):
    """DDP's bf16_compress_hook (the bucket divided by the world size, cast to
    bf16, allreduced, cast back), which DDP registers only with NCCL or
    XCCL: torch's own code (default_hooks._compress_hook), under another
    name."""
    import torch
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    return default_hooks._compress_hook(torch.bfloat16, group, bucket)


def paired_worker(args) -> None:
    """smddp and Gloo in the same processes, step by step: two DDP copies of
    the same model, one on the default (smddp) group and one on a Gloo
    group, plus the compute-only step, taking turns in ABBA order
    (abba_order) so both see the same machine state."""
    import statistics

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import torch_smddp
    torch.set_num_threads(max(1, args.threads))
    dist.init_process_group("smddp")
    rank, world = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    copies = [("smddp", None), ("gloo", gloo), ("ddp no comm", None)]
    if args.compressed:
        # Partials cross hosts in bf16 (docs/design.md, "Compression between
        # hosts"), against Gloo with DDP's bf16 hook, which compresses the
        # whole allreduce.
        narrow = dist.new_group(backend="smddp",
                                pg_options=torch_smddp.Options(cross_host_dtype="bf16"))
        copies += [("smddp bf16", narrow), ("gloo bf16 hook", gloo)]
    models = {}
    for name, pg in copies:
        torch.manual_seed(0)
        m = build_model(torch, seq=args.seq)
        if args.offcpu_ms:
            m = offcpu_model(torch, m, args.offcpu_ms / 1e3, rank)
        ddp = DDP(m, process_group=pg, gradient_as_bucket_view=args.bucket_view,
                  bucket_cap_mb=args.bucket_mb)
        if name == "ddp no comm":
            ddp.register_comm_hook(None, no_comm_hook)
        if name == "gloo bf16 hook":
            ddp.register_comm_hook(gloo, gloo_bf16_hook)
        models[name] = (ddp, torch.optim.SGD(ddp.parameters(), lr=0.01))
    groups = {name: pg for name, pg in copies}
    nparams = sum(p.numel() for p in models["smddp"][0].parameters())
    x, y = synthetic_batch(torch, rank, args.batch, args.seq)
    loss_fn = torch.nn.CrossEntropyLoss()

    def step(name, check=False):
        # "compute only": the smddp copy under no_sync(), so no allreduce at
        # all; the floor that no backend can beat.
        ddp, opt = models["smddp" if name == "compute only" else name]
        opt.zero_grad(set_to_none=True)
        with ddp.no_sync() if name == "compute only" else contextlib.nullcontext():
            out = ddp(x)
            if args.offcpu_ms:
                loss = out.sum()
            else:
                loss = loss_fn(out.reshape(-1, out.shape[-1]), y.reshape(-1))
            loss.backward()
        if check and args.offcpu_ms and name not in ("compute only", "ddp no comm"):
            # Every rank's gradient is 1e-3 * (rank + 1) everywhere: the
            # average over the ranks, as exact as the wire allows (in the
            # warm-up steps only, so the check is not timed).
            want = 1e-3 * (world + 1) / 2
            tol = 1e-2 * want if "bf16" in name else 1e-6 * want
            for p in ddp.parameters():
                err = (p.grad - want).abs().max().item()
                if err > tol:
                    raise RuntimeError(f"{name}: a gradient is off the ranks' average by {err:.3g} "
                                       f"(want {want:.6g})")
        opt.step()
        return loss.item()

    # "allreduce only": the gradient bytes alone, in DDP's buckets (its
    # default 25 MiB cap, the first bucket 1 MiB), issued together and
    # waited for, per backend: the communication the step has to hide.
    nbytes = sum(p.numel() for p in models["smddp"][0].parameters()) * 4
    buckets = [torch.ones(n // 4) for n in ddp_buckets(nbytes, int(args.bucket_mb * (1 << 20)))]

    def allreduce_only(name):
        pg = groups[name]
        if name == "gloo bf16 hook":
            works = []
            halves = [b.to(torch.bfloat16) for b in buckets]
            works = [dist.all_reduce(h, group=pg, async_op=True) for h in halves]
            for w, h, b in zip(works, halves, buckets):
                w.wait()
                b.copy_(h)
        else:
            for w in [dist.all_reduce(b, group=pg, async_op=True) for b in buckets]:
                w.wait()

    def prepare(name):
        # Buckets back to ones before each "allreduce only", outside its
        # time: one pass over 82 MB per rank is not communication.
        if name.endswith(" allreduce only"):
            for b in buckets:
                b.fill_(1.0)

    comm_names = [n for n, _ in copies if n != "ddp no comm"]
    names = (*comm_names, "ddp no comm", "compute only",
             *[f"{n} allreduce only" for n in comm_names])

    def run(name, check=False):
        if name.endswith(" allreduce only"):
            allreduce_only(name[:-len(" allreduce only")])
        else:
            step(name, check)

    for _ in range(args.warmup):
        for name in names:
            prepare(name)
            run(name, check=True)
    times = {name: [] for name in names}
    cpu = {name: [] for name in names}  # this process's CPU seconds, every thread
    for i in range(args.steps):
        for name in abba_order(names, i):
            prepare(name)
            dist.barrier(group=gloo)
            c0 = resource.getrusage(resource.RUSAGE_SELF)
            t0 = time.perf_counter()
            run(name)
            times[name].append(time.perf_counter() - t0)
            c1 = resource.getrusage(resource.RUSAGE_SELF)
            cpu[name].append(c1.ru_utime + c1.ru_stime - c0.ru_utime - c0.ru_stime)
    # The slowest rank defines each step; CPU time is summed over the ranks.
    cpu_median = {}
    for name in times:
        t = torch.tensor(times[name], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=gloo)
        times[name] = t.tolist()
        c = torch.tensor(cpu[name], dtype=torch.float64)
        dist.all_reduce(c, group=gloo)
        cpu_median[name] = statistics.median(c.tolist())
    if rank == 0:
        ratios = [a / b for a, b in zip(times["smddp"], times["gloo"])]
        floor = [a / b for a, b in zip(times["compute only"], times["gloo"])]
        ddp_floor = [a / b for a, b in zip(times["ddp no comm"], times["gloo"])]
        median = {k: statistics.median(v) for k, v in times.items()}
        # (compute + allreduce alone - step) / min(compute, allreduce alone):
        # 1 when the step is the larger of the two, 0 when it is their sum.
        overlap = {}
        for n in comm_names:
            c, a, st = median["compute only"], median[f"{n} allreduce only"], median[n]
            overlap[n] = (c + a - st) / min(c, a)
        with open(args.out, "w") as f:
            json.dump({"params": nparams, "world": world, "times": times, "overlap": overlap,
                       "cpu": cpu_median, "cores": len(os.sched_getaffinity(0)),
                       # this rank's steps through standalone servers (--servers)
                       "server_steps": torch_smddp.stats().get("standalone_server_steps", 0),
                       "gradient_bytes": nbytes, "comm_names": comm_names,
                       "median": {k: statistics.median(v) for k, v in times.items()},
                       "ratio": statistics.median(ratios),
                       "floor_ratio": statistics.median(floor),
                       "ddp_floor_ratio": statistics.median(ddp_floor)}, f)
    dist.destroy_process_group()


def worker_args(backend: str, args) -> list:
    """The worker's command line after the script's path: every option a
    worker reads, forwarded from `args` (the same list for local ranks and
    for the namespace cluster)."""
    cmd = ["--worker", "--backend", backend, "--steps", str(args.steps), "--warmup",
           str(args.warmup), "--batch", str(args.batch), "--seq", str(args.seq), "--threads",
           str(args.threads)]
    if args.bucket_view:
        cmd.append("--bucket-view")
    if getattr(args, "compressed", False):
        cmd.append("--compressed")
    return cmd + ["--bucket-mb", str(getattr(args, "bucket_mb", 25.0)),
                  "--offcpu-ms", str(getattr(args, "offcpu_ms", 0.0))]


def launch(backend: str, args) -> dict:
    cmd = [sys.executable, __file__] + worker_args(backend, args)
    return launch_ranks(cmd, args.world, args.timeout, f"{backend} run")


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--backends", nargs="+", default=["smddp", "gloo"])
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--rounds", type=int, default=3, help="rounds per backend, in ABBA order (median)")
    ap.add_argument("--paired", action="store_true",
                    help="one job: smddp and Gloo DDP copies taking turns step by step, in ABBA order")
    ap.add_argument("--bucket-view", action="store_true",
                    help="DDP(gradient_as_bucket_view=True): no gradient copies into and out of buckets")
    ap.add_argument("--bucket-mb", type=float, default=25.0,
                    help="with --paired: DDP's bucket_cap_mb for every copy (default 25, DDP's)")
    ap.add_argument("--compressed", action="store_true",
                    help="with --paired: add smddp crossing hosts in bf16 and Gloo with DDP's "
                         "bf16_compress_hook")
    ap.add_argument("--offcpu-ms", type=float, default=0.0,
                    help="with --paired: compute that holds no core, as a GPU's: the model's "
                         "parameters under a forward and backward that sleep this many ms in all "
                         "(offcpu_model); gradients are checked against the ranks' average")
    ap.add_argument("--hosts", type=int, help="with --paired: across this many namespace hosts")
    ap.add_argument("--ranks", type=int, default=2, help="with --hosts: ranks per host")
    ap.add_argument("--rate", default="2gbit", help="with --hosts: each link's rate")
    ap.add_argument("--servers", type=int, default=0,
                    help="with --hosts: this many more hosts, each on a link of its own, run a "
                         "standalone reduction server for the smddp groups (Gloo cannot use them)")
    add_cc_arg(ap)
    ap.add_argument("--save", help="with --paired: also write the results as JSON to this file "
                    "(python -m tools.smddp_model step reads it)")
    ap.add_argument("--worker", action="store_true")
    ap.add_argument("--backend")
    ap.add_argument("--out")
    return ap


def main() -> int:
    ap = parser()
    args = ap.parse_args()
    if args.worker:
        if args.backend == "paired":
            paired_worker(args)
        else:
            worker(args)
        return 0
    if args.hosts and not args.paired:
        ap.error("--hosts needs --paired")
    if args.servers and not args.hosts:
        ap.error("--servers needs --hosts")
    if args.paired:
        if args.hosts:
            cmd = [__file__] + worker_args("paired", args)
            res = launch_on_cluster(cmd, args.hosts, args.ranks, args.rate, args.timeout,
                                    "ddp_step.py --paired --hosts", args.cc, args.servers)
            args.world = res["world"]
            print(f"\n# across {args.hosts} hosts x {args.ranks} ranks, links of {args.rate}, "
                  f"tcp {cluster_cc(args.cc)}" +
                  (f", {args.servers} standalone server host(s) for smddp ({res['server_steps']} "
                   "steps through them on rank 0)" if args.servers else ""))
            if args.servers and not res["server_steps"]:
                raise SystemExit("--servers: no allreduce went through the standalone servers")
        else:
            res = launch("paired", args)
        if args.save:
            with open(args.save, "w") as f:
                json.dump(dict(res, hosts=args.hosts or 1, ranks_per_host=args.ranks if args.hosts
                               else args.world, rate=args.rate if args.hosts else None,
                               cc=cluster_cc(args.cc) if args.hosts else None,
                               servers=args.servers,
                               batch=args.batch, seq=args.seq, bucket_mb=args.bucket_mb,
                               offcpu_ms=args.offcpu_ms), f, indent=1)
        print(f"\n# DDP step, transformer {res['params'] / 1e6:.1f}M params, world {args.world}, "
              f"batch {args.batch}x{args.seq} tokens per rank, {args.steps} rounds of steps, "
              f"smddp, Gloo, DDP without communication and no DDP at all taking turns in the "
              f"same processes{', gradient_as_bucket_view' if args.bucket_view else ''}")
        print(f"{'backend':>30} {'median step ms':>15} {'samples/s':>10} {'CPU s':>6}   steps (ms)"
              f"   (CPU s: every rank's CPU time, all threads, summed; {res['cores']} cores here)")
        for b in res["times"]:
            m = res["median"][b]
            steps = " ".join(f"{x * 1e3:.0f}" for x in res["times"][b])
            print(f"{b:>30} {m * 1e3:>15.1f} {args.batch * args.world / m:>10.2f} "
                  f"{res['cpu'][b]:>6.2f}   {steps}")
        print(f"gradients: {res['gradient_bytes'] / 1e6:.1f} MB per step; overlap share, "
              "(compute + allreduce alone - step) / min(compute, allreduce alone): " +
              ", ".join(f"{n} {v:.2f}" for n, v in res["overlap"].items()))
        for n in res["comm_names"]:
            if n != "gloo":
                print(f"throughput {n} / gloo: {res['median']['gloo'] / res['median'][n]:.2f}x")
        print(f"median of per-pair step time smddp/gloo: {res['ratio']:.3f}; "
              f"best possible (ddp no comm/gloo): {res['ddp_floor_ratio']:.3f}; "
              f"compute only/gloo: {res['floor_ratio']:.3f}")
        return 0
    runs = {b: [] for b in args.backends}
    for i in range(args.rounds):
        for b in abba_order(args.backends, i):
            runs[b].append(launch(b, args))
    results = {b: sorted(rs, key=lambda r: r["step_s"])[len(rs) // 2] for b, rs in runs.items()}
    first = next(iter(results.values()))
    print(f"\n# DDP step, transformer {first['params'] / 1e6:.1f}M params, world {args.world}, "
          f"batch {args.batch}x{args.seq} tokens per rank, {args.steps} timed steps, "
          f"median of {args.rounds} rounds in ABBA order")
    print(f"{'backend':>8} {'step ms':>10} {'samples/s':>10}   all rounds (ms)")
    for b, r in results.items():
        rounds = " ".join(f"{x['step_s'] * 1e3:.1f}" for x in runs[b])
        print(f"{b:>8} {r['step_s'] * 1e3:>10.1f} {r['samples_per_s']:>10.2f}   {rounds}")
    if len(results) == 2:
        a, b = list(results)
        print(f"step time {a}/{b}: {results[a]['step_s'] / results[b]['step_s']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
