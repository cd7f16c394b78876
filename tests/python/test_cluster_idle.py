"""A rank that has left its call keeps serving its peers: on a cluster of
network namespaces (3 hosts of 2 ranks, 2 Gbit/s links) whose hosts cap
their TCP socket buffers at 4 KiB, rounds of all-gathers and reduce-scatters
on the hierarchy and on a network-only group, each followed by Gloo's call
on the same data, all finish and match their oracles (Gloo, the closed
forms of cases_host_collectives). Before the idle engine thread progressed
its endpoint (Communicator::parkIdle) a peer waited out the group timeout
within the first few rounds, the cause of an intermittent CI hang
(docs/notes/2026-12-06-idle-progress.md). One job; the cluster's context
and launch_on_cluster's deadline kill whatever is left."""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cluster as cl  # noqa: E402  (torch-free)
from mp_harness import backend_under_test, worker  # noqa: E402

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.skipif("smddp" not in backend_under_test(), reason="smddp's own paths"),
]

HOSTS, NPROC, REPS = 3, 2, 10


def test_peers_finish_while_a_rank_waits_elsewhere_behind_full_sockets():
    res = cl.launch_or_fail([worker("idle_progress_worker.py"), "--reps", str(REPS)], HOSTS,
                            NPROC, "2gbit", 300, "idle_progress_worker", socket_bytes=4096)
    assert sorted(r["rank"] for r in res) == list(range(HOSTS * NPROC))
    for r in res:
        assert r["failures"] == [], (r["rank"], len(r["failures"]), r["failures"][:8])
        # 2 dtypes x 3 sizes x (5 all-gather + 15-23 reduce-scatter checks) a round.
        assert r["cases"] >= REPS * 2 * 3 * 20, (r["rank"], r["cases"])
