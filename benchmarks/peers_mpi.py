"""MPICH's allreduce, all-gather or reduce-scatter, measured the way
benchmarks/peers.py measures the others, as its own job (mpiexec, mpi4py);
peers.py --mpi merges it into its table (the same --op).

    .venv-peers/bin/python benchmarks/peers_mpi.py --world 2 4 --out /tmp/mpich.json
    .venv-peers/bin/python benchmarks/peers_mpi.py --op all_gather --world 2 4 --out /tmp/ag.json

Installs nothing: it needs mpi4py and an MPI (the `mpich` wheel's mpiexec
next to this Python, or one on PATH). Allreduce: float32 SUM in place
(MPI.IN_PLACE, on zeros). --op all_gather: comm.Allgather; --op
reduce_scatter: comm.Reduce_scatter_block (SUM); float32 numpy buffers,
sized as peers.py and torch_smddp.bench size them (bench_ops.py: SIZE is
all-gather's whole output, reduce-scatter's whole input, S / n per rank
in or out). Blocks of back-to-back calls after a barrier, time per call =
block time / calls, max over ranks, median over --rounds rounds; one call
before and after each size is checked against the closed form (rank r
gives r + 1: all-gather's part j holds j + 1, the other two n(n+1)/2,
into an output poisoned with -1 first).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time


def _bench_helpers():
    # torch_smddp/bench.py and bench_ops.py alone, not the package:
    # importing torch_smddp loads its extension and with it the system's
    # libfabric, and mpi4py then no longer loads the mpich wheel's libmpi:
    # it takes the system's Open MPI, and under MPICH's mpiexec every rank
    # is a world of one. bench.py imports torch_smddp.bench_ops, so a bare
    # package module (the directory as its path, __init__.py not run)
    # stands in for torch_smddp.
    import importlib.util
    import types

    pkg_dir = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "torch_smddp")
    if "torch_smddp" not in sys.modules:
        bare = types.ModuleType("torch_smddp")
        bare.__path__ = [pkg_dir]
        sys.modules["torch_smddp"] = bare
    spec = importlib.util.spec_from_file_location("smddp_bench_helpers", os.path.join(pkg_dir, "bench.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.fmt_size, mod.parse_size, mod.sizes_between, mod.result_path


fmt_size, parse_size, sizes_between, result_path = _bench_helpers()
OPS = ("all_reduce", "all_gather", "reduce_scatter")


class MpiBuffers:
    """One size of `op` on one rank, as bench_ops.OpBuffers has it, in
    numpy: the input, the output (the same array for allreduce, in place),
    what the output must hold, and the call."""

    def __init__(self, op: str, nbytes: int, rank: int, world: int, comm, in_place=False):
        import numpy as np
        from mpi4py import MPI

        self.op, self.rank = op, rank
        sum_all = world * (world + 1) / 2
        if op == "all_reduce":
            self.inp = self.out = np.empty(max(1, nbytes // 4), dtype=np.float32)
            self.expected = sum_all
            self.nbytes = self.out.size * 4
            self.call = lambda: comm.Allreduce(MPI.IN_PLACE, self.out, op=MPI.SUM)
            return
        per = max(1, nbytes // 4 // world)
        self.nbytes = per * world * 4
        whole, part = np.empty(per * world, dtype=np.float32), np.empty(per, dtype=np.float32)
        if op == "all_gather":
            self.inp, self.out = part, whole
            self.expected = np.repeat(np.arange(1, world + 1, dtype=np.float32), per)
            self.call = lambda: comm.Allgather(self.inp, self.out)
            if in_place:  # FSDP2's form: this rank's part already sits in the output
                self.inp = whole[rank * per:(rank + 1) * per]
                self.call = lambda: comm.Allgather(MPI.IN_PLACE, self.out)
        else:
            self.inp, self.out = whole, part
            self.expected = sum_all
            self.call = lambda: comm.Reduce_scatter_block(self.inp, self.out, op=MPI.SUM)

    def refill(self) -> None:
        if self.out is not self.inp:
            self.out.fill(-1.0)
        self.inp.fill(self.rank + 1.0)

    def prepare(self) -> None:
        """Before a timed block: allreduce sums in place on zeros (so the
        sums stay finite); the others read the input as the check left it."""
        if self.op == "all_reduce":
            self.out.fill(0)

    def wrong(self) -> int:
        import numpy as np

        return int(np.count_nonzero(self.out != self.expected))


def worker(args) -> None:
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank, world = comm.Get_rank(), comm.Get_size()

    def agree_max(x: float) -> float:
        return comm.allreduce(x, op=MPI.MAX)

    def checked(b):
        b.refill()
        b.call()
        if comm.allreduce(b.wrong(), op=MPI.MAX):
            raise SystemExit(f"peers_mpi.py: WRONG RESULT: {args.op} of {fmt_size(b.nbytes)}, "
                             f"world {world}")

    rows = []
    for nbytes in args.sizes:
        b = MpiBuffers(args.op, nbytes, rank, world, comm, args.in_place)
        checked(b)
        b.prepare()
        comm.Barrier()
        t0 = time.perf_counter()
        b.call()
        warm = agree_max(time.perf_counter() - t0)
        iters = int(max(args.min_iters, min(args.max_iters, args.block_s / max(warm, 1e-7))))
        times = []
        for _ in range(args.rounds):
            b.prepare()
            comm.Barrier()
            for _ in range(args.warmup):  # as peers.py: untimed calls first
                b.call()
            t0 = time.perf_counter()
            for _ in range(iters):
                b.call()
            times.append(agree_max((time.perf_counter() - t0) / iters))
        checked(b)
        rows.append({"bytes": b.nbytes, "iters": {"mpich": iters}, "times": times})
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump({"world": world, "op": args.op, "rows": rows,
                       "mpi": MPI.Get_library_version().strip()}, f)


def mpiexec() -> str:
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    return here if os.path.exists(here) else (shutil.which("mpiexec") or "mpiexec")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--op", choices=OPS, default="all_reduce",
                    help="the collective (sizes as peers.py: the buffer, all-gather's output, "
                         "reduce-scatter's input)")
    ap.add_argument("--min", default="4K")
    ap.add_argument("--max", default="256M")
    ap.add_argument("--sizes", nargs="+", type=int)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--block-s", type=float, default=0.2)
    ap.add_argument("--min-iters", type=int, default=3)
    ap.add_argument("--max-iters", type=int, default=2000)
    ap.add_argument("--warmup", type=int, default=5,
                    help="untimed calls before each timed block")
    ap.add_argument("--in-place", action="store_true",
                    help="all_gather with MPI.IN_PLACE (FSDP2's form, as peers.py --in-place)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if not args.sizes:
        args.sizes = sizes_between(parse_size(args.min), parse_size(args.max))
    if args.worker:
        worker(args)
        return 0
    results = []
    for w in args.world:
        with result_path("smddp-mpich-") as part:
            cmd = [mpiexec(), "-n", str(w), sys.executable, os.path.abspath(__file__),
                   "--worker", "--out", part, "--op", args.op, "--rounds", str(args.rounds),
                   "--block-s", str(args.block_s), "--min-iters", str(args.min_iters),
                   "--max-iters", str(args.max_iters), "--warmup", str(args.warmup),
                   "--sizes", *map(str, args.sizes)]
            subprocess.run(cmd, check=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
            with open(part) as f:
                d = json.load(f)
        results.append(d)
        print(f"{args.op}, world {w} ({d['mpi'].splitlines()[0]}):")
        for r in d["rows"]:
            ts = sorted(r["times"])
            print(f"  {fmt_size(r['bytes']):>6}  {ts[len(ts) // 2] * 1e6:10.1f} us")
    with open(args.out, "w") as f:
        json.dump(results, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
