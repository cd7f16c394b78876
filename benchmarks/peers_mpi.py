"""MPICH's allreduce, measured the way benchmarks/peers.py measures the
others, as its own job (mpiexec, mpi4py); peers.py --mpi merges it into
its table.

    .venv-peers/bin/python benchmarks/peers_mpi.py --world 2 4 --out /tmp/mpich.json

Installs nothing: it needs mpi4py and an MPI (the `mpich` wheel's mpiexec
next to this Python, or one on PATH). float32 SUM in place
(MPI.IN_PLACE); blocks of back-to-back calls after a barrier, time per
call = block time / calls, max over ranks, median over --rounds rounds;
one call before and after each size is checked against the closed form.
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
    # torch_smddp/bench.py alone, not the package: importing torch_smddp
    # loads its extension and with it the system's libfabric, which then
    # shadows the newer one the mpich wheel's libmpi needs.
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                        "torch_smddp", "bench.py")
    spec = importlib.util.spec_from_file_location("smddp_bench_helpers", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.fmt_size, mod.parse_size, mod.sizes_between, mod.result_path


fmt_size, parse_size, sizes_between, result_path = _bench_helpers()


def worker(args) -> None:
    import numpy as np
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank, world = comm.Get_rank(), comm.Get_size()
    expected = world * (world + 1) / 2

    def agree_max(x: float) -> float:
        return comm.allreduce(x, op=MPI.MAX)

    def checked(a):
        a.fill(rank + 1.0)
        comm.Allreduce(MPI.IN_PLACE, a, op=MPI.SUM)
        bad = int(np.count_nonzero(a != expected))
        if comm.allreduce(bad, op=MPI.MAX):
            raise SystemExit(f"peers_mpi.py: WRONG RESULT at {fmt_size(a.size * 4)}, world {world}")

    rows = []
    for nbytes in args.sizes:
        a = np.empty(max(1, nbytes // 4), dtype=np.float32)
        checked(a)
        a.fill(0)
        comm.Barrier()
        t0 = time.perf_counter()
        comm.Allreduce(MPI.IN_PLACE, a, op=MPI.SUM)
        warm = agree_max(time.perf_counter() - t0)
        iters = int(max(args.min_iters, min(args.max_iters, args.block_s / max(warm, 1e-7))))
        times = []
        for _ in range(args.rounds):
            a.fill(0)
            comm.Barrier()
            for _ in range(args.warmup):  # as peers.py: untimed calls first
                comm.Allreduce(MPI.IN_PLACE, a, op=MPI.SUM)
            t0 = time.perf_counter()
            for _ in range(iters):
                comm.Allreduce(MPI.IN_PLACE, a, op=MPI.SUM)
            times.append(agree_max((time.perf_counter() - t0) / iters))
        checked(a)
        rows.append({"bytes": a.size * 4, "iters": {"mpich": iters}, "times": times})
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump({"world": world, "rows": rows, "mpi": MPI.Get_library_version().strip()}, f)


def mpiexec() -> str:
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    return here if os.path.exists(here) else (shutil.which("mpiexec") or "mpiexec")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--min", default="4K")
    ap.add_argument("--max", default="256M")
    ap.add_argument("--sizes", nargs="+", type=int)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--block-s", type=float, default=0.2)
    ap.add_argument("--min-iters", type=int, default=3)
    ap.add_argument("--max-iters", type=int, default=2000)
    ap.add_argument("--warmup", type=int, default=5,
                    help="untimed calls before each timed block")
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
                   "--worker", "--out", part, "--rounds", str(args.rounds),
                   "--block-s", str(args.block_s), "--min-iters", str(args.min_iters),
                   "--max-iters", str(args.max_iters), "--warmup", str(args.warmup),
                   "--sizes", *map(str, args.sizes)]
            subprocess.run(cmd, check=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
            with open(part) as f:
                d = json.load(f)
        results.append(d)
        print(f"world {w} ({d['mpi'].splitlines()[0]}):")
        for r in d["rows"]:
            ts = sorted(r["times"])
            print(f"  {fmt_size(r['bytes']):>6}  {ts[len(ts) // 2] * 1e6:10.1f} us")
    with open(args.out, "w") as f:
        json.dump(results, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
