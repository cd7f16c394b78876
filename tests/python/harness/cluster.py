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


def run_worker(cluster, job, args, nproc, out_dir, env=None):
    """torchrun workers/cluster_worker.py ARGS on every host."""
    cluster.torchrun(job, [WORKER, *args], nproc, out_dir, env, pythonpath=(WORKERS,))
