"""The fusion-buffer engine through torch: skewed ranks, stats, and results
that are bitwise identical on every rank and from run to run."""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mp_harness import backend_under_test, run_world  # noqa: E402

pytestmark = pytest.mark.skipif("smddp" not in backend_under_test(),
                                reason="engine behaviour and stats are smddp's")


@pytest.mark.parametrize("world", [3])
def test_skewed_async_calls_fuse_and_match_closed_forms(world):
    results = run_world(world, "cases_engine:skew_and_stats", timeout=120)
    for rank, res in enumerate(results):
        assert res["bad"] == [], (rank, res["bad"][:10])
        st = res["stats"]
        assert st["allreduce_path"] == "shared-memory", st
        assert st["reduction_servers"] == world, st
        for key in ("bytes_sent", "bytes_received", "fusion_buffers_flushed",
                    "fusion_mean_fill_bytes", "chunks_in_flight_max", "server_reduce_seconds"):
            assert st[key] > 0, (rank, key, st)
        assert st["fused_calls"] >= 300, st
    # The leader fused queued calls: fewer buffers than calls.
    st0 = results[0]["stats"]
    assert st0["fused_calls"] > st0["fusion_buffers_flushed"], st0


def test_same_job_three_times_gives_the_same_bytes():
    digests = []
    for _ in range(3):
        res = run_world(3, "cases_engine:digest_of_sum", timeout=60)
        assert len({r["digest"] for r in res}) == 1, "ranks disagree bitwise"
        digests.append(res[0]["digest"])
    assert len(set(digests)) == 1, digests


@pytest.mark.parametrize("path", ["shared-memory", "network"])
def test_256_mib_tensors(path):
    env = {} if path == "shared-memory" else {"SMDDP_SHM_ALLREDUCE": "0"}
    results = run_world(2, "cases_engine:large_tensors", timeout=180, env=env)
    for rank, res in enumerate(results):
        assert res["sum_ok"] and res["bcast_ok"], (rank, res)
        assert (res["path"] == "shared-memory") == (path == "shared-memory"), res


def test_log_levels_describe_the_group_and_each_call():
    world = 2
    results = run_world(world, "cases_engine:debug_log", timeout=60,
                        env={"SMDDP_LOG_LEVEL": "debug"})
    for rank, res in enumerate(results):
        assert res["ok"], rank
        lines = res["lines"]
        groups = [l for l in lines if "INFO" in l and f"[rank {rank}] group" in l]
        assert len(groups) == 1, lines
        g = groups[0]
        for token in (f"{world} rank(s) on 1 host(s)", "provider shm",
                      "shared-memory segment", f"{world} reduction server(s) per host",
                      "slot ", "fusion buffer"):
            assert token in g, (token, g)
        calls = [l for l in lines if "DEBUG" in l and f"[rank {rank}] group" in l]
        # One line per call: the three allreduces (through shared memory, the
        # batches' calls named by their first sequence) and the broadcast.
        for n in (3, 5, 7):
            mine = [l for l in calls if f"allreduce(SUM, float32, {n} elements)" in l]
            assert len(mine) == 1, (n, calls)
            assert "via shared memory, batch of" in mine[0] and mine[0].endswith(", ok"), mine
            assert " queued " in mine[0] and " ran " in mine[0], mine
        bc = [l for l in calls if "broadcast(float32, 11 elements, root 0)" in l]
        assert len(bc) == 1 and "via libfabric" in bc[0], calls
