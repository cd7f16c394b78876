"""FSDP2 step benchmark: the FSDP counterpart of `ddp_step.py --paired`, on
one host. ddp_step.py's transformer (build_model), sharded with FSDP2
(torch.distributed.fsdp.fully_shard: each encoder layer, then the root),
smddp against Gloo in the same processes.

    .venv/bin/python benchmarks/fsdp_step.py --paired [--world 2] [--steps 4] [--rounds 6]
    .venv/bin/python benchmarks/fsdp_step.py --paired --hosts 2 --ranks 2 --rate 2gbit   # root

--hosts H runs the same job across H namespace hosts of --ranks ranks
each, links shaped to --rate (tools/smddp_cluster.py, as
benchmarks/bench_hosts.py and ddp_step.py --hosts do): smddp's all-gathers
and reduce-scatters then take the hierarchy across hosts (docs/design.md).

Every rank holds three copies of the model, built from the same seed:
- "smddp": fully_shard on a DeviceMesh over the smddp default group, so
  FSDP's all-gathers (forward and backward) and reduce-scatters (backward)
  go through smddp;
- "gloo": the same on a DeviceMesh built from a Gloo group over the same
  ranks (DeviceMesh.from_group);
- "compute only": the plain model, unsharded; forward, backward and the
  optimizer step on this rank's batch with no communication at all: the
  floor that neither backend can beat.

They take turns in ABBA order (ddp_step.abba_order: smddp, gloo, compute
only; then compute only, gloo, smddp; ...) for --rounds rounds of --steps
steps each. A round's time is its mean step (max over ranks); the table gives
the median round, and the ratios are medians of the per-round ratios, as
ddp_step.py --paired does.

The oracle: the smddp and Gloo copies start equal, see the same batches and
take the same SGD steps, so after the timed rounds their parameter shards
must agree (allclose, --rtol, --atol); any difference on any rank fails the
run. Both copies must also have moved away from the initial weights, so the
check cannot pass on a model that never learned.

--pool adds "smddp pool": the smddp copy with FSDP2's communication
buffers from the backend's allocate_tensor
(set_allocate_memory_from_process_group_for_comm(True): smddp's shared
pool, which the host's ranks read without a system call); its shards
must equal the smddp copy's bit for bit.

--offcpu-ms MS takes the compute off the CPU, as ddp_step.py's does: every
copy's forward and backward sleep instead of computing, MS per step in all
(offcpu_lm), so that the collectives have the host's cores to themselves
while "compute" runs, as beside a GPU. Unlike ddp_step.py's offcpu_model it
still calls every encoder layer as a module, so FSDP2's hooks unshard each
layer's parameters before its forward and reduce-scatter their gradients
after its backward; each part hands back a gradient of 1e-3 * (rank + 1)
for every element of the parameters it was given (the unsharded ones).
It adds "smddp comm only" and "gloo comm only": the same FSDP2 step with
sleeps of 0, its all-gathers and reduce-scatters with no compute to hide
them; and prints the overlap share, (compute + comm only - step) /
min(compute, comm only), as ddp_step.py does.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import warnings

sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # ddp_step, this checkout's
from ddp_step import (abba_order, build_model, lm_step, sleeping_part,  # noqa: E402
                      synthetic_batch)
from torch_smddp.bench import launch_ranks  # noqa: E402

from cluster_launch import launch_on_cluster  # noqa: E402

NAMES = ("smddp", "gloo", "compute only")


def sharded_model(torch, mesh, seq, offcpu=None, pool=False):
    """build_model's transformer under FSDP2 on `mesh`: one FSDP unit per
    encoder layer (their all-gathers can overlap the previous layer's
    compute) and one for the rest (embedding, positions, output layer);
    with `offcpu` (compute seconds, rank), its compute off the CPU; with
    `pool`, its communication buffers from the process group."""
    from torch.distributed.fsdp import FSDPModule, fully_shard

    torch.manual_seed(0)
    lm = build_model(torch, seq=seq)
    if offcpu is not None:
        lm = offcpu_lm(torch, lm, *offcpu)
    for layer in lm.body.layers:
        fully_shard(layer, mesh=mesh)
    lm = fully_shard(lm, mesh=mesh)
    if pool:
        for m in lm.modules():
            if isinstance(m, FSDPModule):
                m.set_allocate_memory_from_process_group_for_comm(True)
    return lm


def offcpu_lm(torch, lm, compute_s, rank):
    """`lm` (before fully_shard) with forward and backward that sleep
    instead of computing: compute_s per step, a third forward and two
    thirds backward, by parameter count (the embedding's lookup counts as
    nothing), as ddp_step.offcpu_model. The encoder layers are still called
    as modules, so FSDP2's hooks around them run; each part's backward
    returns a gradient of 1e-3 * (rank + 1) for every element of the
    parameters its module holds at forward time (FSDP2's unsharded ones)."""
    import types

    Part = sleeping_part(torch)
    fill = 1e-3 * (rank + 1)
    weight = sum(p.numel() for p in lm.parameters()) - lm.emb.weight.numel() - lm.pos.numel()

    def part(h, params, counted=True):
        share = compute_s * sum(p.numel() for p in params) / weight if counted else 0.0
        return Part.apply(h, share / 3, share * 2 / 3, fill, *params)

    for layer in lm.body.layers:
        layer.forward = types.MethodType(lambda self, h: part(h, list(self.parameters())), layer)

    def forward(self, x):
        h = part(x.float(), [self.emb.weight, self.pos], counted=False)
        for layer in self.body.layers:
            h = layer(h)
        return part(h, list(self.head.parameters()))

    lm.forward = types.MethodType(forward, lm)
    return lm


def local_shards(model) -> list:
    """Each parameter as this rank holds it: the DTensor's local shard under
    FSDP2."""
    return [p.to_local() if hasattr(p, "to_local") else p for p in model.parameters()]


def check_agree(torch, models, initial, rtol, atol) -> dict:
    """The oracle: the smddp copy's shards equal the Gloo copy's to
    (rtol, atol), and both moved away from `initial` (the shards before the
    first step). Returns the largest differences seen on this rank."""
    worst = {"max_abs_diff": 0.0, "min_moved": float("inf")}
    pairs = zip(local_shards(models["smddp"][0]), local_shards(models["gloo"][0]), initial)
    for i, (a, b, p0) in enumerate(pairs):
        a, b = a.detach(), b.detach()
        if a.numel() == 0:
            continue
        worst["max_abs_diff"] = max(worst["max_abs_diff"], (a - b).abs().max().item())
        worst["min_moved"] = min(worst["min_moved"], (a - p0).abs().max().item(),
                                 (b - p0).abs().max().item())
        if not torch.allclose(a, b, rtol=rtol, atol=atol):
            bad = ((a - b).abs() > atol + rtol * b.abs()).nonzero()[0].tolist()
            raise RuntimeError(f"parameter {i}: the smddp copy {a[tuple(bad)].item():.8g} and "
                               f"the gloo copy {b[tuple(bad)].item():.8g} differ at {bad}")
    if "smddp pool" in models:  # the same path on other memory: the same bits
        for i, (a, b) in enumerate(zip(local_shards(models["smddp pool"][0]),
                                       local_shards(models["smddp"][0]))):
            if not torch.equal(a.detach(), b.detach()):
                raise RuntimeError(f"parameter {i}: the smddp pool copy differs from the smddp "
                                   f"copy by {(a - b).abs().max().item():.3g}")
    if worst["min_moved"] == 0.0:
        raise RuntimeError("a parameter shard never moved from its initial value: "
                           "the check could not have failed")
    return worst


def paired_worker(args) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh

    import torch_smddp
    # FSDP2 warns that the root returns a view (Linear on a 3-D input); the
    # step never changes it in place.
    warnings.filterwarnings("ignore", message=".*returned a view tensor")
    torch.set_num_threads(max(1, args.threads))
    dist.init_process_group("smddp")
    rank, world = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    offcpu = (args.offcpu_ms / 1e3, rank) if args.offcpu_ms else None
    copies = [("smddp", dist.group.WORLD, offcpu), ("gloo", gloo, offcpu)]
    if args.pool:
        copies.append(("smddp pool", dist.group.WORLD, offcpu))
    if offcpu:
        copies += [("smddp comm only", dist.group.WORLD, (0.0, rank)),
                   ("gloo comm only", gloo, (0.0, rank))]
    models = {}
    for name, group, off in copies:
        models[name] = sharded_model(torch, DeviceMesh.from_group(group, "cpu"), args.seq, off,
                                     pool=name == "smddp pool")
    torch.manual_seed(0)
    models["compute only"] = build_model(torch, seq=args.seq)
    if offcpu:
        models["compute only"] = offcpu_lm(torch, models["compute only"], *offcpu)
    models = {n: (m, torch.optim.SGD(m.parameters(), lr=args.lr)) for n, m in models.items()}
    initial = [p.detach().clone() for p in local_shards(models["smddp"][0])]
    nparams = sum(p.numel() for p in models["compute only"][0].parameters())
    x, y = synthetic_batch(torch, rank, args.batch, args.seq)
    names = (*NAMES, *(["smddp pool"] if args.pool else []),
             *(["smddp comm only", "gloo comm only"] if offcpu else []))

    def step(name):
        if not offcpu:
            lm_step(torch, *models[name], x, y)
            return
        model, opt = models[name]
        opt.zero_grad(set_to_none=True)
        model(x).sum().backward()
        opt.step()

    for _ in range(args.warmup):
        for name in names:
            step(name)
    times = {name: [] for name in names}
    for i in range(args.rounds):
        for name in abba_order(names, i):
            dist.barrier(group=gloo)
            t0 = time.perf_counter()
            for _ in range(args.steps):
                step(name)
            times[name].append((time.perf_counter() - t0) / args.steps)
    # Outside the timed rounds: the oracle, on every rank; a failure on one
    # rank fails the job.
    worst = check_agree(torch, models, initial, args.rtol, args.atol)
    for name in times:
        t = torch.tensor(times[name], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=gloo)
        times[name] = t.tolist()
    w = torch.tensor([worst["max_abs_diff"], -worst["min_moved"]], dtype=torch.float64)
    dist.all_reduce(w, op=dist.ReduceOp.MAX, group=gloo)
    stats = torch_smddp.stats()
    if rank == 0:
        def ratio(a, b):
            return statistics.median(x / y for x, y in zip(times[a], times[b]))

        median = {k: statistics.median(v) for k, v in times.items()}
        # (compute + comm only - step) / min(compute, comm only): 1 when the
        # step takes the larger of the two, 0 when it takes their sum.
        overlap = {}
        for n in ("smddp", "gloo"):
            c, a, st = median["compute only"], median.get(f"{n} comm only"), median[n]
            if a:
                overlap[n] = (c + a - st) / min(c, a)
        with open(args.out, "w") as f:
            json.dump({"params": nparams, "world": world, "times": times, "overlap": overlap,
                       "median": median,
                       "smddp_over_gloo": ratio("smddp", "gloo"),
                       **({"pool_over_gloo": ratio("smddp pool", "gloo"),
                           "pool_over_smddp": ratio("smddp pool", "smddp")} if args.pool else {}),
                       "compute_over": {n: ratio("compute only", n) for n in ("smddp", "gloo")},
                       "max_abs_diff": w[0].item(), "min_moved": -w[1].item(),
                       "gather_scatter_path": stats["gather_scatter_path"],
                       "collective_counts": stats.get("collective_counts", {})}, f)
    dist.destroy_process_group()


def worker_args(args) -> list:
    """The worker's command line after the script's path: every option a
    worker reads, forwarded from `args`."""
    return ["--worker", "--steps", str(args.steps), "--rounds", str(args.rounds),
            "--warmup", str(args.warmup), "--batch", str(args.batch), "--seq", str(args.seq),
            "--threads", str(args.threads), "--lr", str(args.lr), "--rtol", str(args.rtol),
            "--atol", str(args.atol), "--offcpu-ms", str(args.offcpu_ms),
            *(["--pool"] if args.pool else [])]


def print_table(res, args) -> None:
    tokens = args.batch * args.seq * args.world
    print(f"\n# FSDP2 step, transformer {res['params'] / 1e6:.1f}M params, world {args.world}, "
          f"batch {args.batch}x{args.seq} tokens per rank, {args.rounds} rounds of {args.steps} "
          "steps, smddp, Gloo and compute only (unsharded, no communication) taking turns in "
          "ABBA order in the same processes")
    print(f"gather_scatter_path (smddp): {res['gather_scatter_path']}; smddp calls on rank 0: " +
          ", ".join(f"{k} {v}" for k, v in sorted(res["collective_counts"].items()) if v))
    print(f"{'backend':>14} {'median step ms':>15} {'tokens/s':>10}   rounds (ms per step)")
    for name, m in res["median"].items():
        rounds = " ".join(f"{t * 1e3:.0f}" for t in res["times"][name])
        print(f"{name:>14} {m * 1e3:>15.1f} {tokens / m:>10.0f}   {rounds}")
    print(f"median of per-round step time smddp/gloo: {res['smddp_over_gloo']:.3f} "
          f"(throughput smddp/gloo {1 / res['smddp_over_gloo']:.2f}x); compute only/smddp: "
          f"{res['compute_over']['smddp']:.3f}; compute only/gloo: "
          f"{res['compute_over']['gloo']:.3f}")
    if "pool_over_gloo" in res:
        print(f"smddp pool (buffers from allocate_tensor): step time over gloo's "
              f"{res['pool_over_gloo']:.3f} (throughput {1 / res['pool_over_gloo']:.2f}x), over "
              f"smddp's on private buffers {res['pool_over_smddp']:.3f}; its shards equal "
              "smddp's bit for bit")
    if res.get("overlap"):
        print("compute off the CPU: " + f"{args.offcpu_ms:g} ms of sleeps per step; overlap "
              "share, (compute + comm only - step) / min(compute, comm only): " +
              ", ".join(f"{n} {v:.2f}" for n, v in res["overlap"].items()))
    print(f"check: smddp and gloo parameters agree (rtol {args.rtol:g}, atol {args.atol:g}); "
          f"largest difference {res['max_abs_diff']:.3g}, every shard moved at least "
          f"{res['min_moved']:.3g} from its initial value")


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--paired", action="store_true",
                    help="smddp and Gloo FSDP2 copies and compute only taking turns in the same "
                         "processes (the only mode)")
    ap.add_argument("--worker", action="store_true", help="internal: run as one of the ranks")
    ap.add_argument("--out", help="internal: where rank 0 writes its results")
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--steps", type=int, default=4, help="steps per copy per round")
    ap.add_argument("--rounds", type=int, default=6, help="rounds, in ABBA order (median)")
    ap.add_argument("--warmup", type=int, default=1, help="untimed steps per copy first")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--rtol", type=float, default=1e-4, help="the oracle's relative tolerance")
    ap.add_argument("--atol", type=float, default=1e-6, help="the oracle's absolute tolerance")
    ap.add_argument("--timeout", type=float, default=600, help="hard deadline of the job (s)")
    ap.add_argument("--offcpu-ms", type=float, default=0.0,
                    help="compute off the CPU: forward and backward sleep this many ms per step "
                         "(offcpu_lm), and the comm-only copies are timed")
    ap.add_argument("--pool", action="store_true",
                    help="add a smddp copy with FSDP2's buffers from allocate_tensor")
    ap.add_argument("--hosts", type=int, help="across this many namespace hosts (root)")
    ap.add_argument("--ranks", type=int, default=2, help="with --hosts: ranks per host")
    ap.add_argument("--rate", default="2gbit", help="with --hosts: each link's rate (tc tbf)")
    return ap


def main() -> int:
    ap = parser()
    args = ap.parse_args()
    if args.worker:
        paired_worker(args)
        return 0
    if not args.paired:
        ap.error("only --paired is implemented")
    if args.hosts:
        args.world = args.hosts * args.ranks
        res = launch_on_cluster([os.path.abspath(__file__)] + worker_args(args), args.hosts,
                                args.ranks, args.rate, args.timeout, "fsdp_step.py --paired --hosts")
        print(f"\n# across {args.hosts} hosts x {args.ranks} ranks, links of {args.rate}")
    else:
        res = launch_ranks([sys.executable, __file__] + worker_args(args), args.world,
                           args.timeout, "fsdp_step.py --paired")
    print_table(res, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
