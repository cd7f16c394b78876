"""Fusion on the network-only path: queued all_reduces fuse into batches
whose cut every rank agrees on, with SMDDP_SHM_ALLREDUCE=0 and on hosts
with different numbers of ranks (SMDDP_HOST_ID)."""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mp_harness import backend_under_test, run_world  # noqa: E402

pytestmark = pytest.mark.skipif("smddp" not in backend_under_test(),
                                reason="the network path's fusion is smddp's")

LAYOUTS = {
    "world 2, SMDDP_SHM_ALLREDUCE=0": (2, {"SMDDP_SHM_ALLREDUCE": "0"}),
    "world 3, SMDDP_SHM_ALLREDUCE=0": (3, {"SMDDP_SHM_ALLREDUCE": "0"}),
    # 2 ranks on host a, 1 on host b: uneven, so allreduce takes the network path
    "world 3, hosts of 2 and 1 ranks": (3, {"SMDDP_HOST_ID": lambda r: "a" if r < 2 else "b"}),
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_network_path_fuses_queued_calls(layout):
    world, env = LAYOUTS[layout]
    results = run_world(world, "cases_network_fusion:network_fusion", timeout=240,
                        pg_timeout=60, env=env)
    for rank, res in enumerate(results):
        mixed = res["mixed"]
        assert mixed["bad"] == [], (rank, mixed["bad"][:10])
        st = mixed["stats"]
        assert st["allreduce_path"] != "shared-memory", (rank, st)
        # Every call rode in a batch, and batches held several calls.
        assert st["fused_calls"] == mixed["calls"], (rank, st)
        assert st["fusion_buffers_flushed"] < st["fused_calls"], (rank, st)
        assert st["fusion_bytes"] > 0 and st["fused_calls_per_buffer"] > 1, (rank, st)
        assert st["collective_counts"]["allreduce"] == mixed["calls"], (rank, st)
        assert res["random"]["bad"] == [], (rank, res["random"]["bad"])
        assert res["half_bad"] == [], (rank, res["half_bad"])
        # Overlapping async calls (the same tensor thrice included) keep call order.
        assert res["call_order_bad"] == [], (rank, res["call_order_bad"])
        sa = res["sync_async"]
        assert sa["bad"] == [] and sa["seconds"] < 30, (rank, sa)
        rec = res["recorder"]
        assert rec["problems"] == [], (rank, rec["problems"][:5])
        assert any(n > 1 for _b, n in rec["batches"]), (rank, rec["batches"])
    # Bitwise the same on every rank, and every rank cut the same batches.
    assert len({r["random"]["digest"] for r in results}) == 1
    assert all(r["recorder"]["batches"] == results[0]["recorder"]["batches"] for r in results)
