"""Allreduce against its peers: smddp, Gloo and DeepSpeed's CPU shm op in
the same processes, and MPICH (benchmarks/peers_mpi.py, its own job) in
one table.

    PY=.venv-peers/bin/python        # the peers' venv (benchmarks/README.md, "Peers")
    $PY benchmarks/peers_mpi.py --world 2 4 --out /tmp/mpich.json
    $PY benchmarks/peers.py --world 2 4 --mpi /tmp/mpich.json [--plot peers.png]
    $PY benchmarks/peers.py --world 2 4 --pairs 3     # MPICH's job and these, 3 times

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
    add_common_args, fmt_size, launch_ranks, resolve_sizes, result_path)

# smddp: dist.all_reduce on the smddp group; smddp_direct: the same engine
# call through torch_smddp.all_reduce_, without c10d (as DeepSpeed's op).
BACKENDS = ["smddp", "smddp_direct", "gloo", "deepspeed"]
OURS = ("smddp", "smddp_direct")


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


def worker(args) -> None:
    import torch
    import torch.distributed as dist

    import torch_smddp

    torch.set_num_threads(1)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    # Compile DeepSpeed's op (JIT, cached) one rank at a time, before any
    # group exists, so the build neither races nor stalls a timeout.
    ds_op, ds_why = (None, "not requested")
    if "deepspeed" in args.backends:
        ds_op, ds_why = load_deepspeed(world, rank)
    dist.init_process_group("smddp")
    gloo = dist.new_group(backend="gloo")
    have = torch.tensor([1.0 if ds_op is not None else 0.0])
    dist.all_reduce(have, op=dist.ReduceOp.MIN, group=gloo)
    backends = [b for b in args.backends if b != "deepspeed" or have.item() == 1.0]
    calls = {
        "smddp": lambda t: dist.all_reduce(t),
        "smddp_direct": lambda t: torch_smddp.all_reduce_(t),
        "gloo": lambda t: dist.all_reduce(t, group=gloo),
        "deepspeed": lambda t: ds_op(t),
    }
    expected = world * (world + 1) / 2

    def checked(name, t):
        t.fill_(rank + 1.0)
        calls[name](t)
        bad = (t != expected).nonzero()
        flag = torch.tensor([float(bad.numel() > 0)])
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=gloo)
        if flag.item():
            raise SystemExit(f"peers.py: WRONG RESULT: {name} allreduce of {fmt_size(t.numel() * 4)}"
                             f" at world {world} (rank {rank} {'differs' if bad.numel() else 'ok'})")

    def agree_max(x: float) -> float:
        v = torch.tensor([x], dtype=torch.float64)
        dist.all_reduce(v, op=dist.ReduceOp.MAX, group=gloo)
        return v.item()

    rows = []
    for nbytes in args.sizes:
        t = torch.empty(max(1, nbytes // 4), dtype=torch.float32)
        iters = {}
        for name in backends:
            checked(name, t)
            t.zero_()
            dist.barrier(group=gloo)
            t0 = time.perf_counter()
            calls[name](t)
            warm = agree_max(time.perf_counter() - t0)
            iters[name] = int(max(args.min_iters, min(args.max_iters, args.block_s / max(warm, 1e-7))))
        times = {name: [] for name in backends}
        for i in range(args.rounds):
            for name in abba(backends, i):
                t.zero_()
                dist.barrier(group=gloo)
                f = calls[name]
                # Gloo's barrier lets ranks go up to milliseconds apart (four
                # ranks on two cores); a few untimed calls of the backend
                # itself line them up, so a short block times the calls, not
                # the skew (nccl-tests' warm-up iterations).
                for _ in range(args.warmup):
                    f(t)
                t0 = time.perf_counter()
                for _ in range(iters[name]):
                    f(t)
                dt = (time.perf_counter() - t0) / iters[name]
                times[name].append(agree_max(dt))
        for name in backends:
            checked(name, t)
        rows.append({"bytes": t.numel() * 4, "iters": iters, "times": times})
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump({"world": world, "rows": rows, "backends": backends,
                       "deepspeed_unavailable": "" if "deepspeed" in backends else ds_why}, f)
    dist.barrier(group=gloo)
    dist.destroy_process_group()


def _timing_args(args) -> list[str]:
    """The sizes and timing options, as both this script's and
    peers_mpi.py's jobs take them."""
    return ["--rounds", str(args.rounds), "--block-s", str(args.block_s),
            "--min-iters", str(args.min_iters), "--max-iters", str(args.max_iters),
            "--warmup", str(args.warmup), "--sizes", *map(str, args.sizes)]


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
        m = mpi.get(data["world"])
        if not m:
            continue
        by_size = {r["bytes"]: r for r in m["rows"]}
        for row in data["rows"]:
            if row["bytes"] in by_size:
                row["times"]["mpich"] = by_size[row["bytes"]]["times"]
        data["backends"] = data["backends"] + ["mpich"]


def run_pairs(args) -> list[dict]:
    """--pairs: MPICH's job, then the others', args.pairs times; per world,
    size and backend the list of each pair's median round, and per pair
    whether smddp_direct was at least as fast as the best peer."""
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
                peers = [median(v) for b, v in t.items() if b not in OURS]
                if "smddp_direct" in t and peers and median(t["smddp_direct"]) <= min(peers):
                    wins += 1
            row["pairs_won"] = f"{wins} of {len(per_pair)}"
    return merged


def fmt_us(s: float) -> str:
    us = s * 1e6
    return f"{us:.1f}" if us < 1000 else f"{us:.0f}"


def print_table(all_data: list[dict]) -> None:
    names = []
    for d in all_data:
        names += [b for b in d["backends"] if b not in names]
    won = any("pairs_won" in r for d in all_data for r in d["rows"])
    what = "median over pairs of each pair's median round" if won else "median of rounds"
    print(f"\n# allreduce, float32, SUM, in place; us per call ({what}, max over ranks);")
    print("# busbw GB/s = algbw x 2(n-1)/n; ratio = best peer's time / smddp's (>1: smddp faster)")
    head = f"| world | size |" + "".join(f" {b} us |" for b in names)
    ours = [b for b in OURS if b in names]
    head += "".join(f" {b} busbw |" for b in names) + " best peer |"
    head += "".join(f" best peer / {b} |" for b in ours)
    head += " pairs smddp_direct won |" if won else ""
    print(head)
    print("|" + "---|" * (3 + 2 * len(names) + len(ours) + won))
    for d in all_data:
        n = d["world"]
        factor = 2 * (n - 1) / n if n > 1 else 1.0
        for row in d["rows"]:
            med = {b: median(row["times"][b]) for b in names if b in row["times"]}
            line = f"| {n} | {fmt_size(row['bytes'])} |"
            line += "".join(f" {fmt_us(med[b])} |" if b in med else " n/a |" for b in names)
            line += "".join(f" {row['bytes'] / med[b] / 1e9 * factor:.3f} |" if b in med else " n/a |"
                            for b in names)
            peers = {b: v for b, v in med.items() if b not in OURS}
            best = min(peers, key=peers.get) if peers else None
            line += f" {best or '-'} |"
            line += "".join(f" {peers[best] / med[b]:.2f}x |" if best and b in med else " - |"
                            for b in ours)
            line += f" {row.get('pairs_won', '-')} |" if won else ""
            print(line)
    for d in all_data:
        if d.get("deepspeed_unavailable"):
            print(f"\nDeepSpeed at world {d['world']}: n/a ({d['deepspeed_unavailable']})")


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
        factor = 2 * (n - 1) / n if n > 1 else 1.0
        for b in d["backends"]:
            pts = [(r["bytes"], r["bytes"] / median(r["times"][b]) / 1e9 * factor)
                   for r in d["rows"] if b in r["times"]]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "-o", label=b, markersize=3)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("message size (bytes)")
        ax.set_ylabel("busbw (GB/s)")
        ax.set_title(f"allreduce busbw, world {n}, one host (CPU)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"\nplot written to {path}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_args(ap, sizes_help="explicit sizes in bytes (overrides --min/--max)")
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
