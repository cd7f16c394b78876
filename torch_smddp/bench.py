"""Collective benchmark, nccl-tests style: smddp and Gloo side by side.

    python -m torch_smddp.bench [--world 2 4] [--min 4K] [--max 256M] [--plot busbw.png]
    python -m torch_smddp.bench --op all_gather|reduce_scatter [--backends smddp gloo copy]

It times allreduce unless --op names all_gather (all_gather_single, or
all_gather_into_tensor on a torch without it) or reduce_scatter
(reduce_scatter_single, or reduce_scatter_tensor), the two collectives FSDP spends its
time in; torch_smddp/bench_ops.py defines each one's sizes, closed form,
busbw and link bound, and `copy`, the floor a rank's own memory traffic
sets. What follows says it for allreduce.

Each world size is one job: N local ranks, each with an smddp default group
and a Gloo group over the same ranks. For every size both backends run in
the same processes, alternating, so they see the same machine noise.
Across hosts (a namespace cluster on this machine, with the links' bound),
benchmarks/bench_hosts.py in a source checkout runs the same worker.

time = mean seconds per allreduce (max over ranks); algbw = bytes / time;
busbw = algbw * 2(n-1)/n, the nccl-tests definition for allreduce.

Every timed result is checked against the closed form: rank r contributes
r + 1 in every element, so each allreduce must leave n(n+1)/2 everywhere
(exact in float32 for any world size here). Each call is timed on its own;
the check and the refill of the input happen between calls, outside the
timed region, so a repeated in-place allreduce never grows (or overflows)
its values and every result is checkable. A mismatch on any rank, for any
backend, size or iteration, fails the run on every rank with the first bad
element.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

from torch_smddp.bench_ops import (OPS, InPlace, OpBuffers, bus_factor, closed_form_sum,  # noqa: F401
                                   link_bound_seconds, timed_checked)

UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(s: str) -> int:
    s = s.strip().upper().rstrip("B").rstrip("I")
    if s and s[-1] in UNITS:
        return int(float(s[:-1]) * UNITS[s[-1]])
    return int(s)


def fmt_size(n: int) -> str:
    for unit, mult in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= mult and n % mult == 0:
            return f"{n // mult}{unit}"
    return str(n)


def sizes_between(lo: int, hi: int) -> list[int]:
    out, s = [], lo
    while s <= hi:
        out.append(s)
        s *= 4
    return out


def _iters_for(nbytes: int, budget_bytes: int) -> int:
    return max(8, min(200, budget_bytes // max(nbytes, 1)))


def timed_checked_calls(call, t, rank: int, expected: float, iters: int,
                        untimed: list | None = None) -> tuple[float, str]:
    """Runs ``call()`` (an in-place allreduce of ``t``) ``iters`` times and
    returns (mean seconds per call, "" or the first mismatch). Refilling
    ``t`` with this rank's input (rank + 1) and comparing the result with
    ``expected`` happen between calls, untimed (bench_ops.timed_checked)."""
    return timed_checked(call, InPlace(t, rank, expected), iters, untimed)


def worker(args, extras=None) -> None:
    """One rank of the benchmark. `extras(gloo, rank, world)`, if given,
    returns (calls, close): calls maps more backend names to a function of
    the OpBuffers that makes the timed call (benchmarks/bench_hosts.py adds
    `tcp`), and close() runs at the end."""
    import torch
    import torch.distributed as dist

    import torch_smddp

    torch.set_num_threads(1)
    dist.init_process_group("smddp")
    rank, world = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    groups = {"smddp": None, "gloo": gloo}
    if "smddp-bf16" in args.backends:
        # Partials cross hosts in bf16 (docs/design.md, "Compression between
        # hosts"); the closed form's small integers are exact in bf16.
        groups["smddp-bf16"] = dist.new_group(
            backend="smddp", pg_options=torch_smddp.Options(cross_host_dtype="bf16"))
    custom, close = extras(gloo, rank, world) if extras else ({}, None)
    results = []
    for nbytes in args.sizes:
        bufs = OpBuffers(args.op, nbytes, rank, world, args.in_place)
        iters = _iters_for(bufs.nbytes, args.budget)
        row = {"bytes": bufs.nbytes, "iters": iters}
        for name in args.backends:
            if name in custom:
                call = custom[name](bufs)
            elif name == "copy":
                call = bufs.copy_floor()
            else:
                call = bufs.call(dist, groups[name])

            _, warm_problem = timed_checked(call, bufs, args.warmup)
            dist.barrier(group=gloo)
            untimed = []
            dt, problem = timed_checked(call, bufs, iters, untimed)
            problem = problem or warm_problem
            # The slowest rank defines the collective's time; any rank's
            # wrong result fails the run on every rank (no one is left
            # waiting in the next collective). Between calls the links idle
            # until the last rank is back in the next call.
            tt = torch.tensor([dt, 1.0 if problem else 0.0, untimed[0]], dtype=torch.float64)
            dist.all_reduce(tt, op=dist.ReduceOp.MAX, group=gloo)
            if tt[1].item():
                where = f"{name} {args.op} of {fmt_size(bufs.nbytes)} at world {world}"
                raise SystemExit(f"torch_smddp.bench: WRONG RESULT: {where}, rank {rank}: "
                                 + (problem or "correct here, wrong on another rank"))
            row[name] = tt[0].item()
            row[f"{name}_between"] = tt[2].item()
        results.append(row)
    if close:
        close()
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump({"world": world, "op": args.op, "in_place": args.in_place,
                       "rows": results}, f)
    dist.barrier(group=gloo)
    dist.destroy_process_group()


@contextlib.contextmanager
def result_path(prefix: str):
    """A path for the JSON results a child process writes, in a directory
    of its own (mkdtemp: only this user can enter it, so nobody else can
    put a file at that name first); the directory goes on exit, whatever
    happened. Shared by launch_ranks and benchmarks/peers*.py."""
    d = tempfile.mkdtemp(prefix=prefix)
    try:
        yield os.path.join(d, "result.json")
    finally:
        shutil.rmtree(d, ignore_errors=True)


def launch_ranks(cmd: list[str], world: int, timeout: float, what: str,
                 env: dict | None = None, attempts: int = 3) -> dict:
    """Runs `cmd --out FILE` as `world` local ranks on a free port and returns
    the JSON that the ranks leave in FILE. The ranks get the torchrun
    variables (and `env`); past `timeout` seconds all are killed, and so are
    the others as soon as one rank fails. A free port can be taken by
    another process before rank 0's store binds it (EADDRINUSE): then the
    whole world starts again on a new port, up to `attempts` times. Shared
    by the benchmarks in benchmarks/."""
    for attempt in range(attempts):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        with result_path("smddp-bench-") as out:
            procs, errs = [], []
            for r in range(world):
                rank_env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                                RANK=str(r), WORLD_SIZE=str(world), LOCAL_RANK=str(r),
                                LOCAL_SIZE=str(world), OMP_NUM_THREADS="1", **(env or {}))
                err = tempfile.TemporaryFile()
                errs.append(err)
                procs.append(subprocess.Popen([*cmd, "--out", out], env=rank_env, stderr=err,
                                              start_new_session=True))
            deadline = time.time() + timeout
            timed_out = False
            while any(p.poll() is None for p in procs):
                if any(p.returncode for p in procs if p.poll() is not None):
                    break  # one rank failed: the others would wait for it
                if time.time() > deadline:
                    timed_out = True
                    break
                time.sleep(0.05)
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
            texts = []
            for err in errs:
                err.seek(0)
                texts.append(err.read().decode(errors="replace"))
                err.close()
            for text in texts:
                sys.stderr.write(text)
            data = None
            if os.path.exists(out) and not timed_out and not any(p.returncode for p in procs):
                with open(out) as f:
                    data = json.load(f)
        if timed_out:
            raise SystemExit(f"{what} exceeded {timeout} s")
        if any(p.returncode for p in procs):
            if attempt + 1 < attempts and any("EADDRINUSE" in t for t in texts):
                print(f"{what}: port {port} was taken, starting again on another",
                      file=sys.stderr)
                continue
            raise SystemExit(f"{what} failed: exit codes {[p.returncode for p in procs]}")
        if data is None:
            raise SystemExit(f"{what}: rank 0 wrote no results")
        return data
    raise AssertionError("unreachable")


def _worker_args(args) -> list[str]:
    return ["--worker", "--op", args.op, "--budget", str(args.budget), "--warmup", str(args.warmup),
            "--backends", *args.backends,
            "--sizes", *map(str, args.sizes), *(["--in-place"] if args.in_place else [])]


def run_world(world: int, args) -> dict:
    cmd = [sys.executable, "-m", "torch_smddp.bench", *_worker_args(args)]
    return launch_ranks(cmd, world, args.timeout, f"benchmark at world {world}")


def print_rows(rows: list[dict], backends: list[str], n: int, ratio_head: str,
                bound_of=None, op: str = "all_reduce") -> None:
    """The body both tables share: per backend the time, algbw and busbw
    (busbw = algbw x bus_factor(op, n) over n ranks) and, given `bound_of`
    (bytes -> seconds), the link bound and each backend's share of it; with
    two backends, the second one's time over the first's."""
    factor = bus_factor(op, n)
    head = f"{'size':>8} {'iters':>5}" + (f" | {'bound us':>10}" if bound_of else "")
    for b in backends:
        head += f" | {b + ' us':>12} {'algbw GB/s':>10} {'busbw GB/s':>10}"
        head += f" {'of bound':>8}" if bound_of else ""
    if len(backends) >= 2:
        head += f" | {ratio_head:>17}"
    print(head)
    for row in rows:
        bound = bound_of(row["bytes"]) if bound_of else None
        line = f"{fmt_size(row['bytes']):>8} {row['iters']:>5}"
        line += f" | {bound * 1e6:>10.1f}" if bound_of else ""
        for b in backends:
            t = row[b]
            alg = row["bytes"] / t / 1e9
            line += f" | {t * 1e6:>12.1f} {alg:>10.3f} {alg * factor:>10.3f}"
            line += f" {bound / t:>8.0%}" if bound_of else ""
        if len(backends) >= 2:
            line += f" | {row[backends[1]] / row[backends[0]]:>16.2f}x"
        print(line)


def title(op: str, in_place: bool = False) -> str:
    return {"all_reduce": "allreduce, float32, SUM",
            "all_gather": "all_gather, float32" + (", in place (FSDP2's form)" if in_place else ""),
            "reduce_scatter": "reduce_scatter, float32, SUM"}[op]


def factor_text(op: str) -> str:
    return "2(n-1)/n" if op == "all_reduce" else "(n-1)/n"


def print_table(data: dict, backends: list[str]) -> None:
    n, op = data["world"], data.get("op", "all_reduce")
    print(f"\n# {title(op, data.get('in_place', False))}, world {n}  (busbw = algbw x {factor_text(op)})")
    print_rows(data["rows"], backends, n, "busbw " + backends[0] + "/" + backends[1]
                if len(backends) >= 2 else "", op=op)


def plot(all_data: list[dict], backends: list[str], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for data in all_data:
        n = data["world"]
        factor = bus_factor(data.get("op", "all_reduce"), n)
        xs = [r["bytes"] for r in data["rows"]]
        for b, style in zip(backends, ("-o", "--s")):
            ys = [r["bytes"] / r[b] / 1e9 * factor for r in data["rows"]]
            ax.plot(xs, ys, style, label=f"{b}, world {n}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("busbw (GB/s)")
    ax.set_title(f"{all_data[0].get('op', 'all_reduce')} busbw on one host (CPU)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"\nplot written to {path}")


def add_common_args(ap: argparse.ArgumentParser, sizes_help: str = argparse.SUPPRESS) -> None:
    """The options every allreduce benchmark here shares: worlds, the size
    range (or explicit sizes), and the launcher's worker flags."""
    ap.add_argument("--world", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--min", default="4K")
    ap.add_argument("--max", default="256M")
    ap.add_argument("--sizes", nargs="+", type=parse_size, help=sizes_help)
    ap.add_argument("--in-place", action="store_true",
                    help="all_gather as FSDP2 calls it: the input is this rank's part of the "
                         "output, and the copy floor copies the other n - 1 parts")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)


def resolve_sizes(args) -> None:
    """--sizes as given, else every power of two from --min to --max; and
    --in-place only with --op all_gather."""
    if args.in_place and getattr(args, "op", "all_reduce") != "all_gather":
        raise SystemExit("--in-place is all_gather's form (FSDP2's); it needs --op all_gather")
    if not args.sizes:
        args.sizes = sizes_between(parse_size(args.min), parse_size(args.max))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_args(ap)
    ap.add_argument("--op", choices=OPS, default="all_reduce",
                    help="the collective to time (sizes as nccl-tests: the buffer, all_gather's "
                         "output, reduce_scatter's input)")
    ap.add_argument("--backends", nargs="+", default=["smddp", "gloo"])
    ap.add_argument("--budget", type=int, default=1 << 30, help="bytes per size and backend (sets iterations)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--plot", help="write a PNG of busbw against size")
    ap.add_argument("--hosts", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--save", help="also write the measurements as JSON to this file")
    args = ap.parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    resolve_sizes(args)
    if args.hosts is not None:
        ap.error("across hosts, run benchmarks/bench_hosts.py from a source checkout "
                 "(the namespace cluster is not part of the installed package)")
    unknown = set(args.backends) - {"smddp", "gloo", "smddp-bf16", "copy"}
    if unknown:
        ap.error(f"--backends: unknown {sorted(unknown)} (smddp, gloo, smddp-bf16, copy)")
    all_data = []
    for w in args.world:
        data = run_world(w, args)
        print_table(data, args.backends)
        all_data.append(data)
        sys.stdout.flush()
    if args.save:
        with open(args.save, "w") as f:
            json.dump(all_data, f, indent=1)
    if args.plot:
        plot(all_data, args.backends, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
