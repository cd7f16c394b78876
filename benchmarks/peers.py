"""Allreduce, all-gather or reduce-scatter against its peers: smddp, Gloo
and DeepSpeed's CPU shm op in the same processes, and MPICH
(benchmarks/peers_mpi.py, its own job) in one table.

    PY=.venv-peers/bin/python        # the peers' venv (benchmarks/README.md, "Peers")
    $PY benchmarks/peers_mpi.py --world 2 4 --out /tmp/mpich.json
    $PY benchmarks/peers.py --world 2 4 --mpi /tmp/mpich.json [--plot peers.png]
    $PY benchmarks/peers.py --world 2 4 --pairs 3     # MPICH's job and these, 3 times
    $PY benchmarks/peers.py --op all_gather --world 2 4 --min 1M --max 64M --pairs 2

Installs nothing: a backend whose package is missing (DeepSpeed) or whose
op cannot be built shows as "n/a" with the reason. DeepSpeed's op is
`torch.ops.deepspeed.inference_all_reduce_` after its CPU comm op
(ShareMemCommBuilder, DS_ACCELERATOR=cpu) has loaded and initialised.

Method (float32, SUM, in place): for every size, each backend in turn runs
a block of back-to-back calls (nccl-tests style; the block's iteration
count is set once per size and backend from a warm-up call, the same on
every rank), after a Gloo barrier and --warmup untimed calls; time per call = block time / calls, the
max over ranks. The backends take turns for --rounds rounds, in ABBA order
(A B C, C B A, ...), so they see the same machine noise; the table shows
the median round. smddp_direct is torch_smddp.all_reduce_, the same engine
call entered without c10d's dispatcher and Work. busbw = algbw x 2(n-1)/n (nccl-tests). Before and after
each size's timed rounds, one call per backend is checked against the
closed form (rank r holds r + 1 everywhere, so every element must be
n(n+1)/2); a wrong result fails the run. The timed blocks run on zeros, so
that back-to-back in-place sums stay finite.

--op all_gather (dist.all_gather_single, FSDP2's entry on torch 2.13, or
all_gather_into_tensor before it) and --op reduce_scatter
(dist.reduce_scatter_single, or reduce_scatter_tensor; SUM) time the two
collectives FSDP spends its time in, on smddp's and Gloo's groups, measured as above. Their sizes,
closed forms and busbw are torch_smddp.bench --op's (bench_ops.py, as
nccl-tests): SIZE is all-gather's whole output and reduce-scatter's whole
input (S / n per rank goes in, or comes out); busbw = algbw x (n-1)/n.
Rank r gives r + 1: all-gather's output part j must hold j + 1, and
reduce-scatter's output n(n+1)/2; the check poisons the output (-1)
first, so a call that writes nothing fails it. The timed blocks read the
input the check filled. smddp_direct (torch_smddp.all_reduce_) and
DeepSpeed's op (inference_all_reduce_, the only collective its CPU comm op
has) are allreduce only: for the other two ops their columns read n/a,
with the reason.

`copy` (--backends ... copy) is no peer but the floor (bench_ops.py): every
rank at once copying what it must receive, timed in blocks like the
others, so on a machine with fewer cores than ranks it shares the cores as
the collective's ranks do. The table sets smddp's time against it
(smddp / copy). --in-place times all-gather as FSDP2 calls it: the input
is this rank's part of the output (MPICH: MPI.IN_PLACE), and the floor
copies the other n - 1 parts.

`torch` (--backends ... torch) is no peer either: the same
torch.distributed call on a group of torch's own "fake" backend
(FakeProcessGroup), which communicates nothing, fills the output from
the local input (all-gather copies the input into every part,
reduce-scatter copies this rank's block; allreduce writes nothing) and
hands back a Work already complete. So it times torch's layer (Python
entry, dispatcher, Work), which every c10d backend pays on every call and
mpi4py's MPICH does not, plus that local copy; its output is not checked.

--pairs N runs peers_mpi.py's job and then the in-process backends' job N
times in a row (the same worlds, sizes and rounds). This machine's speed
changes for minutes at a time (docs/notes/2026-11-one-host-allreduce.md,
"The world-2 episodes"), so an MPICH job run once, minutes apart from the others, can
land in another episode; a pair's two jobs run back to back. The table
then shows the median over pairs of each pair's median round, and a last
column how many pairs smddp_direct was at least as fast as the best peer.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

# Appended, not prepended: a torch_smddp on PYTHONPATH (another build, to
# compare) wins over this checkout's.
sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from torch_smddp.bench import (  # noqa: E402
    OPS, OpBuffers, add_common_args, bus_factor, fmt_size, launch_ranks, resolve_sizes,
    result_path)

# smddp: dist.all_reduce on the smddp group; smddp_direct: the same engine
# call through torch_smddp.all_reduce_, without c10d (as DeepSpeed's op);
# smddp_pool: all-gather and reduce-scatter on buffers from the backend's
# allocate_tensor (the shared pool, which FSDP2 uses after
# set_allocate_memory_from_process_group_for_comm(True)).
BACKENDS = ["smddp", "smddp_direct", "smddp_pool", "gloo", "deepspeed", "copy", "torch"]
OURS = ("smddp", "smddp_direct", "smddp_pool")
# Not collectives, never peers, timed in blocks as the others are, every
# rank at once. copy: the copy floor (bench_ops.OpBuffers.copy_floor).
# torch: the same torch.distributed entry on a group of torch's "fake"
# backend (FakeProcessGroup: no communication, a local copy into the
# output, its Work complete at once), so torch's own layer: what a call
# through c10d costs whatever the backend, and the mpi4py call beside it
# does not pay. Its output is not checked.
FLOORS = ("copy", "torch")
OP_NAMES = {"all_reduce": "allreduce", "all_gather": "all-gather",
            "reduce_scatter": "reduce-scatter"}
# What has no entry for all_gather and reduce_scatter, and why.
NOT_ALLREDUCE = {
    "smddp_pool": "allreduce's buffers are the model's gradients (DDP's buckets), not the "
                  "backend's to allocate",
}
ALLREDUCE_ONLY = {
    "smddp_direct": "torch_smddp has a direct entry for allreduce only (all_reduce_)",
    "deepspeed": "DeepSpeed's CPU comm op (ShareMemCommBuilder) has only inference_all_reduce_; "
                 "its all_gather_single and reduce_scatter_single are torch.distributed's",
}


def abba(names, i):
    names = list(names)
    return names if i % 2 == 0 else names[::-1]


def load_deepspeed(world: int, rank: int):
    """DeepSpeed's CPU shm allreduce, or (None, reason)."""
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    os.environ.setdefault("LOCAL_SIZE", str(world))
    os.environ.setdefault("LOCAL_RANK", str(rank))
    try:
        import torch
        from deepspeed.accelerator import get_accelerator

        builder = get_accelerator().create_op_builder("ShareMemCommBuilder")
        if builder is None:
            return None, "the cpu accelerator has no ShareMemCommBuilder"
        mod = builder.load(verbose=False)
        mod.initialize(world, rank)
        op = torch.ops.deepspeed.inference_all_reduce_
        return op, ""
    except Exception as e:  # any failure: report it, keep measuring the others
        return None, f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"


def usable_backends(args, gloo, ds_op, ds_why: str) -> tuple[list[str], dict]:
    """The backends this job measures, and each requested one it cannot
    with the reason: DeepSpeed where its op did not load on every rank,
    smddp_direct and DeepSpeed for any op but allreduce."""
    import torch
    import torch.distributed as dist

    have = torch.tensor([1.0 if ds_op is not None else 0.0])
    dist.all_reduce(have, op=dist.ReduceOp.MIN, group=gloo)
    unavailable = {}
    if "deepspeed" in args.backends and have.item() != 1.0:
        unavailable["deepspeed"] = ds_why or "its op did not load on every rank"
    if args.op != "all_reduce":
        unavailable.update({b: why for b, why in ALLREDUCE_ONLY.items() if b in args.backends})
    else:
        unavailable.update({b: why for b, why in NOT_ALLREDUCE.items() if b in args.backends})
    return [b for b in args.backends if b not in unavailable], unavailable


def backend_calls(op: str, bufs, gloo, ds_op, pooled=None, fake=None) -> dict:
    """Per backend, the call on `bufs` (bench_ops.OpBuffers): allreduce in
    place on bufs.out, the other ops from bufs.inp into bufs.out;
    smddp_pool's on `pooled`, the same op's buffers from allocate_tensor;
    torch's on `fake`, a group of torch's fake backend."""
    import torch.distributed as dist

    import torch_smddp

    if op != "all_reduce":
        calls = {"smddp": bufs.call(dist, None), "gloo": bufs.call(dist, gloo),
                 "copy": bufs.copy_floor(), "torch": bufs.call(dist, fake)}
        if pooled is not None:
            calls["smddp_pool"] = pooled.call(dist, None)
        return calls
    t = bufs.out
    return {
        "copy": bufs.copy_floor(),
        "torch": lambda: dist.all_reduce(t, group=fake),
        "smddp": lambda: dist.all_reduce(t),
        "smddp_direct": lambda: torch_smddp.all_reduce_(t),
        "gloo": lambda: dist.all_reduce(t, group=gloo),
        "deepspeed": lambda: ds_op(t),
    }


def measure_size(args, nbytes: int, backends: list[str], gloo, ds_op, fake=None) -> dict:
    """One size: every backend checked, its block length set from a warm-up
    call, --rounds timed blocks in ABBA order, and checked again."""
    import torch
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    bufs = OpBuffers(args.op, nbytes, rank, world, args.in_place)
    pooled = None
    if "smddp_pool" in backends:
        cpu = torch.device("cpu")
        backend = dist.group.WORLD._get_backend(cpu)
        pooled = OpBuffers(args.op, nbytes, rank, world, args.in_place,
                           empty=lambda n, dt: backend.allocate_tensor(n, dtype=dt, device=cpu))
    calls = backend_calls(args.op, bufs, gloo, ds_op, pooled, fake)
    bufs_of = {name: pooled if name == "smddp_pool" else bufs for name in calls}

    def prepare(name):
        # Allreduce's timed blocks sum in place: on zeros, so the sums stay
        # finite. The other ops leave their input as it is.
        b = bufs_of[name]
        if args.op == "all_reduce":
            b.out.zero_()
        else:
            b.refill()

    def checked(name):
        if name == "torch":  # communicates nothing: no result to check
            return
        bufs_of[name].refill()
        calls[name]()
        problem = bufs_of[name].problem(0)
        flag = torch.tensor([float(bool(problem))])
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=gloo)
        if flag.item():
            raise SystemExit(f"peers.py: WRONG RESULT: {name} {OP_NAMES[args.op]} of "
                             f"{fmt_size(bufs.nbytes)} at world {world} (rank {rank}: "
                             f"{problem or 'ok here'})")

    def agree_max(x: float) -> float:
        v = torch.tensor([x], dtype=torch.float64)
        dist.all_reduce(v, op=dist.ReduceOp.MAX, group=gloo)
        return v.item()

    iters = {}
    for name in backends:
        checked(name)
        prepare(name)
        dist.barrier(group=gloo)
        t0 = time.perf_counter()
        calls[name]()
        warm = agree_max(time.perf_counter() - t0)
        iters[name] = int(max(args.min_iters, min(args.max_iters, args.block_s / max(warm, 1e-7))))
    times = {name: [] for name in backends}
    for i in range(args.rounds):
        for name in abba(backends, i):
            prepare(name)
            dist.barrier(group=gloo)
            f = calls[name]
            # Gloo's barrier lets ranks go up to milliseconds apart (four
            # ranks on two cores); a few untimed calls of the backend
            # itself line them up, so a short block times the calls, not
            # the skew (nccl-tests' warm-up iterations).
            for _ in range(args.warmup):
                f()
            t0 = time.perf_counter()
            for _ in range(iters[name]):
                f()
            dt = (time.perf_counter() - t0) / iters[name]
            times[name].append(agree_max(dt))
    for name in backends:
        checked(name)
    return {"bytes": bufs.nbytes, "iters": iters, "times": times}


def worker(args) -> None:
    import torch
    import torch.distributed as dist

    import torch_smddp  # noqa: F401  (registers the smddp backend)

    torch.set_num_threads(1)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    # Compile DeepSpeed's op (JIT, cached) one rank at a time, before any
    # group exists, so the build neither races nor stalls a timeout. Only
    # allreduce has one.
    ds_op, ds_why = (None, "not requested")
    if "deepspeed" in args.backends and args.op == "all_reduce":
        ds_op, ds_why = load_deepspeed(world, rank)
    dist.init_process_group("smddp")
    gloo = dist.new_group(backend="gloo")
    fake = None
    if "torch" in args.backends:
        import torch.testing._internal.distributed.fake_pg  # noqa: F401 (registers "fake")

        fake = dist.new_group(backend="fake")
    backends, unavailable = usable_backends(args, gloo, ds_op, ds_why)
    rows = [measure_size(args, nbytes, backends, gloo, ds_op, fake) for nbytes in args.sizes]
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump({"world": world, "op": args.op, "in_place": args.in_place, "rows": rows,
                       "backends": backends,
                       "unavailable": unavailable}, f)
    dist.barrier(group=gloo)
    dist.destroy_process_group()


def _timing_args(args) -> list[str]:
    """The sizes and timing options, as both this script's and
    peers_mpi.py's jobs take them."""
    return ["--op", args.op, "--rounds", str(args.rounds), "--block-s", str(args.block_s),
            "--min-iters", str(args.min_iters), "--max-iters", str(args.max_iters),
            "--warmup", str(args.warmup), "--sizes", *map(str, args.sizes),
            *(["--in-place"] if getattr(args, "in_place", False) else [])]


def run_world(world: int, args) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", *_timing_args(args),
           "--backends", *args.backends]
    return launch_ranks(cmd, world, args.timeout, f"peers.py: world {world}",
                        env={"DS_ACCELERATOR": "cpu"})


def median(xs):
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])


def merge_mpi(all_data: list[dict], path: str) -> None:
    with open(path) as f:
        mpi = {d["world"]: d for d in json.load(f)}
    for data in all_data:
        theirs, ours = mpi.get(data["world"], {}).get("op", "all_reduce"), data.get("op", "all_reduce")
        if theirs != ours:
            raise SystemExit(f"peers.py: {path} holds MPICH's {theirs}, this job timed {ours}")
        m = mpi.get(data["world"])
        if not m:
            continue
        by_size = {r["bytes"]: r for r in m["rows"]}
        for row in data["rows"]:
            if row["bytes"] in by_size:
                row["times"]["mpich"] = by_size[row["bytes"]]["times"]
        data["backends"] = data["backends"] + ["mpich"]


def lead_backend(names) -> str | None:
    """The entry of ours the pairs are counted for: smddp_direct where it
    was measured (allreduce), else smddp."""
    return next((b for b in ("smddp_direct", "smddp") if b in names), None)


def run_pairs(args) -> list[dict]:
    """--pairs: MPICH's job, then the others', args.pairs times; per world,
    size and backend the list of each pair's median round, and per pair
    whether smddp_direct (smddp for the ops it has no entry for) was at
    least as fast as the best peer."""
    pairs = []
    mpi_script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "peers_mpi.py")
    for i in range(args.pairs):
        with result_path("smddp-peers-mpich-") as out:
            cmd = [sys.executable, mpi_script, "--world", *map(str, args.world),
                   *_timing_args(args), "--out", out]
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
            if p.returncode != 0:
                raise SystemExit(f"peers.py --pairs: MPICH's job failed (peers_mpi.py needs "
                                 f"mpi4py and mpich in this venv):\n{p.stderr[-2000:]}")
            data = [run_world(w, args) for w in args.world]
            merge_mpi(data, out)
        pairs.append(data)
        print(f"pair {i + 1} of {args.pairs} done", flush=True)
    merged = json.loads(json.dumps(pairs[0]))
    for d_i, d in enumerate(merged):
        for r_i, row in enumerate(d["rows"]):
            per_pair = [p[d_i]["rows"][r_i]["times"] for p in pairs]
            row["times"] = {b: [median(t[b]) for t in per_pair] for b in row["times"]}
            wins = 0
            for t in per_pair:
                peers = [median(v) for b, v in t.items() if b not in OURS + FLOORS]
                lead = lead_backend(t)
                if lead and peers and median(t[lead]) <= min(peers):
                    wins += 1
            row["pairs_won"] = f"{wins} of {len(per_pair)}"
    return merged


def fmt_us(s: float) -> str:
    us = s * 1e6
    return f"{us:.1f}" if us < 1000 else f"{us:.0f}"


IN_PLACE = ", in place (FSDP2's form: the input is this rank's part of the output)"
HEADLINES = {
    "all_reduce": "allreduce, float32, SUM, in place",
    "all_gather": "all-gather (all_gather_single), float32; size = the whole output",
    "reduce_scatter": "reduce-scatter (reduce_scatter_single), float32, SUM; size = the whole input",
}


def print_table(all_data: list[dict]) -> None:
    """The merged table: per backend the median time and busbw, the best
    peer and its ratio to ours; a backend a job could not run reads n/a,
    its reason below the table."""
    names = []
    for d in all_data:
        names += [b for b in d["backends"] + list(d.get("unavailable", {})) if b not in names]
    order = BACKENDS + ["mpich"]
    names.sort(key=lambda b: order.index(b) if b in order else len(order))
    op = all_data[0].get("op", "all_reduce") if all_data else "all_reduce"
    in_place = bool(all_data and all_data[0].get("in_place"))
    won = any("pairs_won" in r for d in all_data for r in d["rows"])
    what = "median over pairs of each pair's median round" if won else "median of rounds"
    print(f"\n# {HEADLINES[op]}{IN_PLACE if in_place else ''}; us per call ({what}, max over ranks);")
    print(f"# busbw GB/s = algbw x {'2(n-1)/n' if op == 'all_reduce' else '(n-1)/n'}; "
          "ratio = best peer's time / smddp's (>1: smddp faster)")
    head = f"| world | size |" + "".join(f" {b} us |" for b in names)
    ours = [b for b in OURS if any(b in d["backends"] for d in all_data)]
    head += "".join(f" {b} busbw |" for b in names) + " best peer |"
    head += "".join(f" best peer / {b} |" for b in ours)
    floor = "copy" in names and bool(ours)
    head += "".join(f" {b} / copy |" for b in ours) if floor else ""
    head += f" pairs {lead_backend(ours)} won |" if won else ""
    print(head)
    print("|" + "---|" * (3 + 2 * len(names) + len(ours) * (1 + floor) + won))
    for d in all_data:
        n = d["world"]
        factor = bus_factor(op, n)
        for row in d["rows"]:
            med = {b: median(row["times"][b]) for b in names if b in row["times"]}
            line = f"| {n} | {fmt_size(row['bytes'])} |"
            line += "".join(f" {fmt_us(med[b])} |" if b in med else " n/a |" for b in names)
            line += "".join(f" {row['bytes'] / med[b] / 1e9 * factor:.3f} |" if b in med else " n/a |"
                            for b in names)
            peers = {b: v for b, v in med.items() if b not in OURS + FLOORS}
            best = min(peers, key=peers.get) if peers else None
            line += f" {best or '-'} |"
            line += "".join(f" {peers[best] / med[b]:.2f}x |" if best and b in med else " - |"
                            for b in ours)
            if floor:
                line += "".join(f" {med[b] / med['copy']:.2f} |" if b in med and "copy" in med
                                else " - |" for b in ours)
            line += f" {row.get('pairs_won', '-')} |" if won else ""
            print(line)
    worlds = {}
    for d in all_data:
        for b, why in d.get("unavailable", {}).items():
            worlds.setdefault((b, why), []).append(str(d["world"]))
    for (b, why), ws in worlds.items():
        print(f"\n{b} at world {', '.join(ws)}: n/a ({why})")


def plot(all_data: list[dict], path: str) -> None:
    try:
        import matplotlib
    except ImportError:
        print(f"\nno plot: matplotlib is not installed in {sys.prefix}")
        return

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(all_data), figsize=(6 * len(all_data), 4.5), squeeze=False)
    for ax, d in zip(axes[0], all_data):
        n = d["world"]
        op = d.get("op", "all_reduce")
        factor = bus_factor(op, n)
        for b in d["backends"]:
            pts = [(r["bytes"], r["bytes"] / median(r["times"][b]) / 1e9 * factor)
                   for r in d["rows"] if b in r["times"]]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "-o", label=b, markersize=3)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("message size (bytes)")
        ax.set_ylabel("busbw (GB/s)")
        ax.set_title(f"{OP_NAMES[op]} busbw, world {n}, one host (CPU)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"\nplot written to {path}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_args(ap, sizes_help="explicit sizes in bytes (overrides --min/--max)")
    ap.add_argument("--op", choices=OPS, default="all_reduce",
                    help="the collective (sizes as nccl-tests: the buffer, all_gather's output, "
                         "reduce_scatter's input)")
    ap.add_argument("--backends", nargs="+", default=BACKENDS, choices=BACKENDS)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--block-s", type=float, default=0.2,
                    help="target seconds of one timed block (short blocks time the ranks\x27 start-up skew)")
    ap.add_argument("--min-iters", type=int, default=3)
    ap.add_argument("--max-iters", type=int, default=2000)
    ap.add_argument("--warmup", type=int, default=5,
                    help="untimed calls of the backend before each timed block")
    ap.add_argument("--mpi", help="JSON written by peers_mpi.py --out, merged into the table")
    ap.add_argument("--pairs", type=int, default=0,
                    help="run MPICH's job (peers_mpi.py) and this one back to back, N times")
    ap.add_argument("--json", help="also write the merged results here")
    ap.add_argument("--timeout", type=float, default=3600)
    ap.add_argument("--plot", help="write a PNG of busbw against size")
    args = ap.parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    resolve_sizes(args)
    if args.pairs and args.mpi:
        raise SystemExit("peers.py: --pairs runs MPICH's job itself; drop --mpi")
    if args.pairs:
        all_data = run_pairs(args)
    else:
        all_data = [run_world(w, args) for w in args.world]
    if args.mpi:
        merge_mpi(all_data, args.mpi)
    print_table(all_data)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(all_data, f)
    if args.plot:
        plot(all_data, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
