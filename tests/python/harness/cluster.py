"""The cluster of network namespaces the tests use: tools/smddp_cluster.py
(shared with benchmarks/cluster_launch.py), loaded from its file
so that the pytest process imports neither torch nor the package through
it, plus the tests' cluster worker (workers/cluster_worker.py)."""

import importlib.util
import os
import sys

from mp_helpers import REPO_ROOT as _REPO_ROOT, WORKERS, worker

_PATH = os.path.join(_REPO_ROOT, "tools", "smddp_cluster.py")
_spec = importlib.util.spec_from_file_location("smddp_cluster", _PATH)
_mod = importlib.util.module_from_spec(_spec)
sys.modules["smddp_cluster"] = _mod
_spec.loader.exec_module(_mod)

REPO_ROOT = _mod.REPO_ROOT
SCRIPT = _mod.SCRIPT
STORE_PORT = _mod.STORE_PORT
Cluster = _mod.Cluster
DEFAULT_CC = _mod.DEFAULT_CC
read_json = _mod.read_json
sweep_stale_clusters = _mod.sweep_stale_clusters
tail = _mod.tail
wait_for_files = _mod.wait_for_files
why_unavailable = _mod.why_unavailable

WORKER = worker("cluster_worker.py")


def launch_or_fail(argv, hosts, nproc, rate, deadline_s, name, **kw) -> list:
    """benchmarks/cluster_launch.py's launch_on_cluster(ARGS...) for a
    test: its results, a skip where namespaces cannot be made here, and a
    failure quoting its message (the ranks' log tails) where the job failed
    or passed its deadline."""
    import pytest

    why = why_unavailable()
    if why:
        pytest.skip(f"no cluster of network namespaces here: {why}")
    sys.path.insert(0, os.path.join(REPO_ROOT, "benchmarks"))
    from cluster_launch import launch_on_cluster

    try:
        return launch_on_cluster(argv, hosts, nproc, rate, deadline_s, name, **kw)
    except SystemExit as e:
        pytest.fail(str(e))


def run_worker(cluster, job, args, nproc, out_dir, env=None):
    """torchrun workers/cluster_worker.py ARGS on every host."""
    cluster.torchrun(job, [WORKER, *args], nproc, out_dir, env, pythonpath=(WORKERS,))
