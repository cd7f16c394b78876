"""What standalone reduction servers add across hosts (docs/design.md,
"Standalone reduction servers"), on a scripts/cluster.sh cluster (root):

    sudo .venv/bin/python benchmarks/servers.py --workers 4 --configs 0 2 2:33 --rate 2gbit

W worker hosts of one rank each and K server hosts (one server each), every
host on its own tbf-shaped link to the hub. Each configuration runs one
torchrun job on the worker hosts: warm-up, then ITERS allreduces of SIZE
float32 bytes, timed on every rank (the slowest rank counts). Prints a
table: configuration, seconds per allreduce, algbw (SIZE / time), and the
bytes each worker and each server sends per allreduce by the formula
S + (H-2)·a and H·b, a and b the host and server pieces (2(H-1)/H·S
without servers). A configuration is K or K:P, P the SMDDP_SERVER_SHARE
percent (default: -1, balanced for links of one speed). ``--wire`` picks
how the server wire is protected, one run per mode for each configuration
with servers: ``off`` (SMDDP_SERVER_INTEGRITY=0), ``mac`` (=1, AES-GMAC
on every frame) and ``encrypt`` (SMDDP_WIRE_ENCRYPT=1, AES-256-GCM);
``--rounds N`` repeats the whole list N times, so that the modes alternate
on a noisy machine (``--integrity`` is ``--wire mac``). Servers and workers
share a key file made in --out (SMDDP_SERVER_KEY_FILE, --key-file), and the
workers' logs land there (torchrun.hH.log, server.hH.log).
"""

import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "python", "harness"))
from cluster import DEFAULT_CC, Cluster, tail, wait_for_files, why_unavailable  # noqa: E402

sys.path.insert(0, ROOT)
from tools.smddp_model import server_share  # noqa: E402

WORKER = r'''
import datetime, json, os, sys, time
import torch, torch.distributed as dist, torch_smddp
torch.set_num_threads(1)
n, iters, out = int(sys.argv[1]) // 4, int(sys.argv[2]), sys.argv[3]
dist.init_process_group("smddp", timeout=datetime.timedelta(seconds=300))
t = torch.ones(n)
for _ in range(2):
    dist.all_reduce(t)
dist.barrier()
t0 = time.perf_counter()
for _ in range(iters):
    dist.all_reduce(t)
dt = (time.perf_counter() - t0) / iters
# The check: ones summed once more, so the result is exact in f32 and in a
# narrow wire alike (SMDDP_CROSS_HOST_DTYPE=bf16: world ** iters is not).
t.fill_(1.0)
dist.all_reduce(t)
ok = bool(torch.all(t == dist.get_world_size()).item())
st = torch_smddp.stats()
rank = dist.get_rank()
with open(os.path.join(out, f"bench.{rank}.json"), "w") as f:
    json.dump({"rank": rank, "s": dt, "ok": ok, "steps": st.get("standalone_server_steps", 0)}, f)
dist.destroy_process_group()
'''


WIRE_ENV = {"off": {"SMDDP_SERVER_INTEGRITY": "0", "SMDDP_WIRE_ENCRYPT": "0"},
            "mac": {"SMDDP_SERVER_INTEGRITY": "1", "SMDDP_WIRE_ENCRYPT": "0"},
            "encrypt": {"SMDDP_SERVER_INTEGRITY": "1", "SMDDP_WIRE_ENCRYPT": "1"}}


def run(cluster, workers, servers, share, size, iters, out_dir, timeout_s, wire="off"):
    """One configuration: K servers on the hosts after the workers
    (Cluster.start_servers, with a key file they share with the workers),
    then the workers' torchrun job; every rank's result, and the cluster
    reset for the next configuration. `wire`: a key of WIRE_ENV, for the
    servers and the workers alike."""
    env = {"OMP_NUM_THREADS": "1", "SMDDP_SERVER_HOSTS": "", **WIRE_ENV[wire]}
    try:
        if servers:
            env.update(cluster.start_servers(list(range(workers, workers + servers)), out_dir,
                                             env=env))
            env["SMDDP_SERVER_SHARE"] = str(share)
        script = os.path.join(out_dir, "bench_worker.py")
        with open(script, "w") as f:
            f.write(WORKER)
        jobs = cluster.torchrun(f"bench-{servers}-{int(time.time())}",
                                [script, str(size), str(iters), out_dir], 1, out_dir, env=env,
                                hosts=list(range(workers)), nnodes=workers)
        paths = [os.path.join(out_dir, f"bench.{r}.json") for r in range(workers)]
        if not wait_for_files(paths, time.monotonic() + timeout_s,
                              alive=lambda: any(p.poll() is None for p in jobs)):
            logs = "\n".join(f"--- {name}:\n{tail(os.path.join(out_dir, name))}"
                             for name in sorted(os.listdir(out_dir)) if name.endswith(".log"))
            raise SystemExit(f"{servers} server(s): not every rank finished:\n{logs}")
        res = []
        for p in paths:
            with open(p) as f:
                res.append(json.load(f))
            os.remove(p)
        return res
    finally:
        cluster.reset()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--configs", nargs="+", default=["0", "2", "2:33"],
                    help="K or K:P (servers, SMDDP_SERVER_SHARE percent)")
    ap.add_argument("--rate", default="2gbit")
    ap.add_argument("--cc", default=DEFAULT_CC,
                    help=f"the hosts' TCP congestion control (default {DEFAULT_CC})")
    ap.add_argument("--size", type=int, default=64 << 20, help="bytes per allreduce")
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--out", default="/tmp/smddp_servers_bench")
    ap.add_argument("--timeout", type=float, default=500.0)
    ap.add_argument("--integrity", action="store_true", help="the same as --wire mac")
    ap.add_argument("--wire", nargs="+", choices=sorted(WIRE_ENV), default=None,
                    help="server wire modes, each run in turn (default: off)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="run every configuration and mode this many times, alternating")
    a = ap.parse_args()
    wires = a.wire or (["mac"] if a.integrity else ["off"])
    why = why_unavailable()
    if why:
        sys.exit(f"no cluster here: {why}")
    os.makedirs(a.out, exist_ok=True)
    H, S = a.workers, a.size
    print(f"{H} worker hosts x 1 rank, links {a.rate}, tcp {a.cc}, allreduce of {S >> 20} MiB "
          f"float32, {a.iters} timed iterations")
    configs = []
    for c in a.configs:
        k, _, p = c.partition(":")
        configs.append((int(k), int(p) if p else -1))
    print(f"{'round':>5} {'servers':>8} {'share':>6} {'wire':>8} {'s/allreduce':>12} "
          f"{'algbw GB/s':>11} {'worker sends':>13} {'server sends':>13} {'correct':>8}")
    runs = [(n, K, share, w) for n in range(a.rounds) for K, share in configs
            for w in (wires if K else ["-"])]
    with Cluster(H + max(k for k, _ in configs), a.rate, cc=a.cc) as c:
        for n, K, share, wire in runs:
            res = run(c, H, K, share, S, a.iters, a.out, a.timeout,
                      wire if K else "off")
            t = max(r["s"] for r in res)
            ok = all(r["ok"] for r in res) and (K == 0 or all(r["steps"] > 0 for r in res))
            if K:
                f = _share(H, K, share)
                a_, b_ = (1 - f) / H, f / K
                w, srv = 1 + (H - 2) * a_, f"{H * b_:.2f} S"
                shown = f"{f * 100:.0f}%"
            else:
                w, srv, shown = 2 * (H - 1) / H, "-", "-"
            print(f"{n:>5} {K:>8} {shown:>6} {wire:>8} {t:>12.3f} {S / t / 1e9:>11.3f} "
                  f"{w:>11.2f} S {srv:>13} {str(ok):>8}", flush=True)


def _share(H, K, percent):
    """server_wire.h, serverShareMillionths, as a fraction."""
    return min(percent, 100) / 100 if percent >= 0 else server_share(H, K)


if __name__ == "__main__":
    main()
