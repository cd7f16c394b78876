"""All-gather and reduce-scatter across hosts, on a cluster of network
namespaces (3 hosts of 2 ranks, 2 Gbit/s links): the world group takes the
hierarchy (docs/design.md, "All-gather and reduce-scatter across hosts"),
and every case of cases_host_collectives passes against its oracles (Gloo,
the network path, the closed form of the hierarchy's sums, its own
out-of-place and repeated results), and so does FSDP2 training against
Gloo. One job; the cluster's context and launch_on_cluster's deadline
kill whatever is left."""

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

HOSTS, NPROC = 3, 2


def test_gather_and_scatter_across_three_hosts_of_two():
    res = cl.launch_or_fail([worker("cluster_gather_worker.py")], HOSTS, NPROC, "2gbit", 420,
                            "cluster_gather_worker")
    assert len(res) == HOSTS * NPROC
    assert len({r["host"] for r in res}) == HOSTS, [r["host"] for r in res]
    for r in res:
        coll, fsdp = r["collectives"], r["fsdp"]
        assert coll["failures"] == [], (r["rank"], len(coll["failures"]), coll["failures"][:8])
        assert coll["cases"] > 300, (r["rank"], coll["cases"])
        assert fsdp["failures"] == [], (r["rank"], fsdp["failures"][:8])
        assert fsdp["checks"] > 20, (r["rank"], fsdp["checks"])
