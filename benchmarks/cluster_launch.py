"""Benchmarks across the namespace cluster: tools/smddp_cluster.py (which
drives scripts/cluster.sh; root) launched with torchrun on every host.
Shared by benchmarks/bench_hosts.py, ddp_step.py, queued_buckets.py and
the cluster tests. It lives here, not in the installed package: the
cluster tooling is part of the source checkout only."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cluster_tool():
    """tools/smddp_cluster.py of this checkout (it drives
    scripts/cluster.sh). Loaded from its file, as tests/python/harness/cluster.py
    does: it imports neither torch nor the package."""
    path = os.path.join(REPO, "tools", "smddp_cluster.py")
    if "smddp_cluster" not in sys.modules:
        spec = importlib.util.spec_from_file_location("smddp_cluster", path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules["smddp_cluster"] = mod
        spec.loader.exec_module(mod)
    return sys.modules["smddp_cluster"]


def add_cc_arg(ap) -> None:
    """--cc, the namespace hosts' TCP congestion control (scripts/cluster.sh)."""
    ap.add_argument("--cc", help="with --hosts: the hosts' TCP congestion control (default: "
                                 "the cluster's, cubic; docs/notes/2026-11-27-congestion-control.md)")


def cluster_cc(cc: str | None) -> str:
    """The congestion control a cluster run uses: `cc` (--cc), or the
    cluster's default."""
    return cc or cluster_tool().DEFAULT_CC


def launch_on_cluster(cmd: list[str], hosts: int, ranks: int, rate: str, timeout: float,
                      what: str, cc: str | None = None, servers: int = 0,
                      socket_bytes: int | None = None) -> dict:
    """Runs `torchrun CMD --out FILE` on `hosts` namespace hosts of `ranks`
    ranks each, links shaped to `rate` (tools/smddp_cluster.py; root), and
    returns the JSON the ranks leave in FILE; the hosts' congestion control
    is cluster_cc(cc). CMD is a script and its arguments, or ["-m", module,
    ...]. With `servers`, that many more hosts, each on a link of its own,
    run a standalone reduction server for the job's smddp groups
    (docs/design.md, "Standalone reduction servers"). With `socket_bytes`,
    the job's hosts cap their TCP socket buffers at that many bytes
    (Cluster.socket_buffers). Shared by the benchmarks in benchmarks/."""
    cl = cluster_tool()

    why = cl.why_unavailable()
    if why:
        raise SystemExit(f"{what}: no cluster here: {why}")
    out_dir = tempfile.mkdtemp(prefix="smddp-cluster-")
    out = os.path.join(out_dir, "result.json")
    with cl.Cluster(hosts + servers, rate, cluster_cc(cc)) as c:
        env = {"GLOO_SOCKET_IFNAME": "eth0", "OMP_NUM_THREADS": "1"}
        if servers:
            env.update(c.start_servers(list(range(hosts, hosts + servers)), out_dir))
        for h in range(hosts) if socket_bytes else ():
            c.socket_buffers(h, socket_bytes)
        jobs = c.torchrun(f"job-{os.getpid()}", [*cmd, "--out", out], ranks, out_dir, env=env,
                          hosts=list(range(hosts)), nnodes=hosts)
        codes = c.wait_jobs(timeout, jobs)
        if codes != [0] * hosts or not os.path.exists(out):
            logs = "\n".join(f"--- host {h}:\n" + cl.tail(os.path.join(out_dir, f"torchrun.h{h}.log"))
                             for h in range(hosts))
            raise SystemExit(f"{what} on {hosts} host(s) x {ranks} rank(s) at {rate} failed "
                             f"(torchrun exit codes {codes}):\n{logs}")
    with open(out) as f:
        result = json.load(f)
    shutil.rmtree(out_dir, ignore_errors=True)  # kept, with its logs, only when the job failed
    return result
