"""One rank per host on a cluster of network namespaces (3 hosts of 1 rank,
2 Gbit/s links): the world group takes the network-only path (a host
segment would only copy), and matches Gloo on the same inputs, its calls
of 4 MiB and up in pairwise rounds; a group
crossing hosts in bf16 takes it too, in bf16's wire form (docs/design.md,
"Compression between hosts"), stays within the stated bound of Gloo's f64
sum, and leaves the same bytes on every host. One job; the cluster's
context and launch_on_cluster's deadline kill whatever is left."""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cluster as cl  # noqa: E402  (torch-free)
from mp_harness import backend_under_test, worker  # noqa: E402

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.skipif("smddp" not in backend_under_test(), reason="smddp's allreduce paths"),
]

HOSTS = 3


def test_one_rank_per_host_routes_to_the_network_path_in_fp32_and_in_bf16():
    res = cl.launch_or_fail([worker("cluster_paths_worker.py")], HOSTS, 1, "2gbit", 240,
                            "cluster_paths_worker")
    assert len(res) == HOSTS
    for r in res:
        assert r["world_path"] != "shared-memory", r  # one rank per host: network only
        assert r["narrow_path"] != "shared-memory", r  # bf16 crossing: network only too
        assert r["int64_equal_gloo"], r
        assert r["rounds_calls"] == 2, r  # the int64 and f64 calls, in pairwise rounds
        assert r["f64_within_rounding_of_gloo"], r
        for tag in ("big", "small"):
            assert r[f"all_gather_{tag}_equal_gloo"], (tag, r)
            assert r[f"reduce_scatter_{tag}_closed_form"], (tag, r)
            assert r[f"reduce_scatter_{tag}_int64_equal_gloo"], (tag, r)
        # The big all-gather and its two reduce-scatters (7.2 MB and up),
        # in pairwise rounds; the small ones (1.2 MB) not.
        assert r["gather_scatter_rounds_calls"] == 3, r
        assert r["bf16_within_bound"], r
        assert r["bf16_worst_of_bound"] > 0.05, r  # it did cross in bf16
        assert r["bf16_representable"], r
    assert len({r["bf16_bytes"] for r in res}) == 1, res
