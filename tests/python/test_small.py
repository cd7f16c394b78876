"""Small messages: synchronous calls that run on the caller's thread, and
fusion batches up to SMDDP_SMALL_BYTES in which every rank reduces every
part. Each result is compared bit for bit with a rank-ordered reduction
computed in one process from every rank's inputs, and across ranks."""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mp_harness import backend_under_test, run_world  # noqa: E402

pytestmark = pytest.mark.skipif("smddp" not in backend_under_test(),
                                reason="smddp's small-message paths")


def same_on_every_rank(results):
    first = results[0]["digests"]
    for rank, res in enumerate(results):
        assert res["digests"] == first, f"rank {rank} differs bitwise from rank 0"


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("small_bytes", [4096, 65536])
def test_threshold_boundaries_match_the_ordered_oracle(world, small_bytes):
    results = run_world(world, "cases_small:boundaries", args=(small_bytes,), timeout=180,
                        env={"SMDDP_SMALL_BYTES": small_bytes})
    for rank, res in enumerate(results):
        assert res["bad"] == [], (rank, res["bad"][:10])
        st = res["stats"]
        assert st["small_batches"] > 0, st
        assert st["calls_run_by_caller"] > 0, st
        # sizes above the threshold took the sharded path
        assert st["fusion_buffers_flushed"] > st["small_batches"], st
    same_on_every_rank(results)


def test_without_small_batches_the_same_oracle_holds():
    results = run_world(3, "cases_small:boundaries", args=(4096,), timeout=180,
                        env={"SMDDP_SMALL_BYTES": 0})
    for rank, res in enumerate(results):
        assert res["bad"] == [], (rank, res["bad"][:10])
        assert res["stats"]["small_batches"] == 0, res["stats"]
    same_on_every_rank(results)


@pytest.mark.parametrize("world", [2, 3])
def test_mixed_small_and_large_async_calls(world):
    results = run_world(world, "cases_small:mixed_async", args=(4096,), timeout=180,
                        env={"SMDDP_SMALL_BYTES": 4096})
    for rank, res in enumerate(results):
        assert res["bad"] == [], (rank, res["bad"][:10])
        assert res["stats"]["small_batches"] > 0, res["stats"]
    same_on_every_rank(results)


@pytest.mark.parametrize("world", [2, 3])
def test_sync_call_after_an_async_burst(world):
    results = run_world(world, "cases_small:sync_after_async_burst", timeout=180)
    for rank, res in enumerate(results):
        assert res["bad"] == [], (rank, res["bad"][:10])
