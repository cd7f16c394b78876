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
percent (default: -1, balanced for links of one speed). ``--integrity``
runs every configuration with SMDDP_SERVER_INTEGRITY=1. Servers and workers
share a key file made in --out (SMDDP_SERVER_KEY_FILE, --key-file).
"""

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "python"))
from cluster import DEFAULT_CC, Cluster, why_unavailable  # noqa: E402

SCRIPT = os.path.join(ROOT, "scripts", "cluster.sh")

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
ok = bool(torch.all(t == dist.get_world_size() ** (iters + 2)).item())
st = torch_smddp.stats()
rank = dist.get_rank()
with open(os.path.join(out, f"bench.{rank}.json"), "w") as f:
    json.dump({"rank": rank, "s": dt, "ok": ok, "steps": st.get("standalone_server_steps", 0)}, f)
dist.destroy_process_group()
'''


def key_file(out_dir):
    """The key the servers and workers share (one file: the hosts are
    namespaces of this machine)."""
    path = os.path.join(out_dir, "server.key")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.write(fd, os.urandom(32).hex().encode())
    os.close(fd)
    os.chmod(path, 0o600)
    return path


def run(cluster, workers, servers, share, size, iters, out_dir, timeout_s, integrity=False):
    procs = []
    env = dict(os.environ, SMDDP_CLUSTER=cluster.prefix, PYTHONUNBUFFERED="1",
               PYTHONPATH=ROOT, OMP_NUM_THREADS="1", SMDDP_SERVER_KEY_FILE=key_file(out_dir),
               SMDDP_SERVER_INTEGRITY="1" if integrity else "0")
    env.pop("SMDDP_SERVER_HOSTS", None)
    try:
        hosts = []
        for k in range(servers):
            h = workers + k
            addr = cluster.addr(h)
            p = subprocess.Popen([SCRIPT, "exec", str(h), sys.executable, "-m",
                                  "torch_smddp.server", "--port", "29600", "--advertise", addr],
                                 env=env, stdout=subprocess.PIPE, text=True,
                                 start_new_session=True)
            procs.append(p)
            line = p.stdout.readline()
            m = re.match(r"SMDDP_SERVER_HOSTS=(\S+)", line)
            assert m, f"server on h{h} did not start: {line!r}"
            hosts.append(m.group(1))
        wenv = dict(env)
        if hosts:
            wenv["SMDDP_SERVER_HOSTS"] = ",".join(hosts)
            wenv["SMDDP_SERVER_SHARE"] = str(share)
        script = os.path.join(out_dir, "bench_worker.py")
        with open(script, "w") as f:
            f.write(WORKER)
        job = f"bench-{servers}-{int(time.time())}"
        for h in range(workers):
            log = open(os.path.join(out_dir, f"w{servers}.h{h}.log"), "wb")
            procs.append(subprocess.Popen(
                [SCRIPT, "exec", str(h), sys.executable, "-m", "torch.distributed.run",
                 "--nnodes", str(workers), "--nproc-per-node", "1", "--rdzv-backend", "c10d",
                 "--rdzv-endpoint", f"{cluster.addr('hub')}:29400", "--rdzv-id", job,
                 "--rdzv-conf", "is_host=0", "--local-addr", cluster.addr(h),
                 "--max-restarts", "0", script, str(size), str(iters), out_dir],
                env=wenv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
            log.close()
        paths = [os.path.join(out_dir, f"bench.{r}.json") for r in range(workers)]
        end = time.monotonic() + timeout_s
        while time.monotonic() < end and not all(os.path.exists(p) for p in paths):
            time.sleep(0.2)
        res = []
        for p in paths:
            with open(p) as f:
                res.append(json.load(f))
            os.remove(p)
        return res
    finally:
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        for h in range(workers + servers):
            try:
                cluster.kill_host(h)
            except RuntimeError:
                pass
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass


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
    ap.add_argument("--integrity", action="store_true",
                    help="SMDDP_SERVER_INTEGRITY=1: a MAC on every frame to and from the servers")
    a = ap.parse_args()
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
    print(f"{'servers':>8} {'share':>6} {'s/allreduce':>12} {'algbw GB/s':>11} "
          f"{'worker sends':>13} {'server sends':>13} {'correct':>8}")
    with Cluster(H + max(k for k, _ in configs), a.rate, cc=a.cc) as c:
        for K, share in configs:
            res = run(c, H, K, share, S, a.iters, a.out, a.timeout, a.integrity)
            t = max(r["s"] for r in res)
            ok = all(r["ok"] for r in res) and (K == 0 or all(r["steps"] > 0 for r in res))
            if K:
                f = _share(H, K, share)
                a_, b_ = (1 - f) / H, f / K
                w, srv = 1 + (H - 2) * a_, f"{H * b_:.2f} S"
                shown = f"{f * 100:.0f}%"
            else:
                w, srv, shown = 2 * (H - 1) / H, "-", "-"
            print(f"{K:>8} {shown:>6} {t:>12.3f} {S / t / 1e9:>11.3f} {w:>11.2f} S {srv:>13} "
                  f"{str(ok):>8}", flush=True)


def _share(H, K, percent):
    """server_wire.h, serverShareMillionths, as a fraction."""
    if percent >= 0:
        return min(percent, 100) / 100
    return min(1.0, 2 * K * (H - 1) / (H * H + (H - 2) * K))


if __name__ == "__main__":
    main()
