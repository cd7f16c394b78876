#!/usr/bin/env python3
"""torch_smddp.bench across namespace hosts (root), with the links' bound.

    sudo .venv/bin/python benchmarks/bench_hosts.py --hosts H --ranks R --rate 2gbit \\
        [--op all_reduce|all_gather|reduce_scatter] [--max 64M] [--backends smddp gloo tcp] \\
        [--save F.json]

The job runs across H hosts of R ranks each: a cluster of
network namespaces on this machine (scripts/cluster.sh; root), each host
with its own link to a hub shaped to RATE, one torchrun per host. The table
then adds the link bound: in an allreduce each host must send and receive
2(H-1)/H of the buffer (S for H = 2) through its link, so no allreduce
finishes in less than 2(H-1)/H * S / RATE, whatever the algorithm. Gloo
takes the hosts' eth0 (GLOO_SOCKET_IFNAME); smddp's tcp provider finds it
by itself. `--backends smddp gloo tcp` adds what the links themselves
carry: `tcp` is no allreduce but plain TCP between the host leaders
(`--tcp-conns` connections per pair), each sending every other host 2/H of the buffer (S
for H = 2) while it receives as much, so it moves exactly the bound's
bytes, in the same processes between the same calls. Its share of the
bound is what TCP/IP framing (1448 payload bytes per 1514-byte frame on
these 1500-byte MTU links), ACKs sharing each direction and the tbf
bucket leave of the nominal rate: the most any algorithm can reach here.
`smddp-bf16` is an smddp group whose partials cross hosts in bf16
(torch_smddp.Options(cross_host_dtype="bf16")): it can pass the f32 link
bound, up to twice it.

The ranks run torch_smddp.bench's worker (one-host tables, closed-form
checks and all: `python -m torch_smddp.bench --help`); this script adds the
cluster, the `tcp` row (benchmarks/bench_tcp.py) and the bound.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
# Appended, not prepended: a torch_smddp on PYTHONPATH (another build, to
# compare) wins over this checkout's.
sys.path.append(os.path.dirname(HERE))
sys.path.insert(0, HERE)

from torch_smddp import bench, bench_ops  # noqa: E402

from cluster_launch import add_cc_arg, cluster_cc, cluster_tool, launch_on_cluster  # noqa: E402


def tcp_extras(args):
    """The worker's `tcp` backend: plain TCP between the host leaders
    (bench_tcp.TcpMesh), moving exactly an allreduce's link bytes."""
    def extras(gloo, rank, world):
        if "tcp" not in args.backends:
            return {}, None
        from bench_tcp import TcpMesh

        mesh = TcpMesh(gloo, rank, world, args.tcp_conns)

        def make(bufs):
            # Moves bytes and leaves the buffer alone: the call sets the
            # closed form's value itself, so the same refill and check as
            # the allreduces run between calls, untimed.
            def call(n=bufs.nbytes, t=bufs.out, want=bufs.expected):
                mesh.exchange(n)
                t.fill_(want)
            return call

        return {"tcp": make}, mesh.close
    return extras


def run_cluster(args) -> dict:
    """The benchmark across --hosts namespace hosts of --ranks ranks each."""
    cl = cluster_tool()
    rate_bps = cl.parse_rate(args.rate)
    cmd = [os.path.abspath(__file__), *bench._worker_args(args), "--tcp-conns", str(args.tcp_conns)]
    data = launch_on_cluster(cmd, args.hosts, args.ranks, args.rate, args.timeout,
                             "benchmarks/bench_hosts.py", args.cc)
    data.update(hosts=args.hosts, ranks_per_host=args.ranks, rate=args.rate, rate_bps=rate_bps,
                burst_bytes=cl.burst_bytes(args.rate), cc=cluster_cc(args.cc))
    return data


def print_cluster_table(data: dict, backends: list[str]) -> None:
    h, r, rate_bps = data["hosts"], data["ranks_per_host"], data["rate_bps"]
    op = data.get("op", "all_reduce")
    print(f"\n# {bench.title(op, data.get('in_place', False))}, {h} hosts x {r} ranks, links of {data['rate']} "
          f"({rate_bps / 8e9:.3f} GB/s each way), tcp {data.get('cc', 'of the machine')}")
    if h > 1:
        what = "buffer" if op == "all_reduce" else ("output" if op == "all_gather" else "input")
        share = bench.factor_text(op).replace("n", "H")
        print(f"# link bound: each host sends and receives {share} "
              f"of the {what}: algbw <= {rate_bps / 8e9 / bench_ops.link_share(op, h):.3f} GB/s")
    else:
        print("# one host: nothing crosses a link, so there is no link bound")
    n = h * r
    print(f"# busbw = algbw x {bench.factor_text(op)} over all {n} ranks (nccl-tests); "
          "'of bound' = bound / time")
    bench.print_rows(data["rows"], backends, n, backends[1] + "/" + backends[0] + " time"
                     if len(backends) >= 2 else "",
                     bound_of=(lambda nbytes: bench_ops.link_bound_seconds(nbytes, h, rate_bps, op))
                     if h > 1 else None, op=op)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    bench.add_common_args(ap)
    ap.add_argument("--op", choices=bench_ops.OPS, default="all_reduce")
    ap.add_argument("--backends", nargs="+", default=["smddp", "gloo"])
    ap.add_argument("--budget", type=int, default=1 << 30, help="bytes per size and backend")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--hosts", type=int, default=2, help="namespace hosts")
    ap.add_argument("--ranks", type=int, default=1, help="ranks per host")
    ap.add_argument("--rate", default="2gbit", help="each link's rate (tc tbf)")
    add_cc_arg(ap)
    ap.add_argument("--save", help="also write the measurements as JSON to this file")
    ap.add_argument("--tcp-conns", type=int, default=1,
                    help="with --backends ... tcp: connections per pair of hosts")
    return ap


def main(argv=None) -> int:
    ap = parser()
    args = ap.parse_args(argv)
    if args.worker:
        bench.worker(args, extras=tcp_extras(args))
        return 0
    bench.resolve_sizes(args)
    unknown = set(args.backends) - {"smddp", "gloo", "tcp", "smddp-bf16", "copy"}
    if unknown:
        ap.error(f"--backends: unknown {sorted(unknown)} (smddp, gloo, tcp, smddp-bf16, copy)")
    if "tcp" in args.backends and args.op != "all_reduce":
        ap.error("--backends tcp moves an allreduce's link bytes: it needs --op all_reduce")
    if args.hosts < 1 or args.ranks < 1:
        ap.error("--hosts and --ranks must be at least 1")
    data = run_cluster(args)
    if args.save:   # first: a measurement outlives a failure to print it
        with open(args.save, "w") as f:
            json.dump(data, f, indent=1)
    print_cluster_table(data, args.backends)
    return 0


if __name__ == "__main__":
    sys.exit(main())
