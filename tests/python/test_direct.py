"""torch_smddp.all_reduce_: the synchronous allreduce entered without c10d.
One job per world size runs every case (cases_direct.job)."""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mp_harness import backend_under_test, run_world  # noqa: E402

pytestmark = pytest.mark.skipif("smddp" not in backend_under_test(),
                                reason="torch_smddp.all_reduce_ is smddp's own entry")


@pytest.mark.parametrize("world", [2, 3])
def test_all_reduce_direct(world):
    results = run_world(world, "cases_direct:job", timeout=240)
    for rank, res in enumerate(results):
        o = res["oracle"]
        assert o["bad"] == [], (rank, o["bad"][:10])
        # Every call took the direct entry (whether it then ran on the
        # caller's thread depends on whether the engine was idle: timing).
        assert o["direct"] == o["calls"], o
        assert res["order"]["bad"] == [], (rank, res["order"]["bad"])
        assert res["fallbacks"]["bad"] == [], (rank, res["fallbacks"]["bad"])
        assert res["fallbacks"]["direct"] == 0, res["fallbacks"]
        e = res["errors"]
        assert "BAND" in e["band_float"] and "float32" in e["band_float"], e["band_float"]
        # The error names two of the disagreeing calls (rank r has 10 + r elements).
        named = [n for n in range(10, 10 + world) if f"{n} elements" in e["mismatch"]]
        assert len(named) >= 2, e["mismatch"]
        assert e["mismatch_s"] < 30, e
        assert e["after_ok"] and e["group_ok"], e
        assert e["destroyed"], e
    first = results[0]["oracle"]["digests"]
    for rank, res in enumerate(results):
        assert res["oracle"]["digests"] == first, f"rank {rank} differs bitwise from rank 0"


def test_all_reduce_direct_world_one():
    """World 1: the result is the input (AVG divides by one), and each
    synchronous call, direct or through c10d, runs on the caller's thread
    (there is no peer to wait for)."""
    (res,) = run_world(1, "cases_direct:job_one", timeout=120)
    o = res["oracle"]
    assert o["bad"] == [], o["bad"][:10]
    assert o["direct"] == o["calls"], o
    assert res["order"]["bad"] == [], res["order"]["bad"]
    assert res["on_caller"] >= 2 * o["calls"], res
    # On the pinned torch the default group is read without the WORLD
    # property, and a new default group is picked up (its first direct call).
    assert res["fast_world"], res
    assert res["reinit"] == {"ok": True, "direct": 1}, res["reinit"]
