"""The GPU path without a GPU: with SMDDP_DEVICE_SIM=1 every collective on
CPU tensors takes the device path (csrc/backend/device_collectives.h): an
event on the caller's side, copies through page-locked staging on the
simulated device's streams (random delays, so chunks land out of order), the
CPU collective on a private host group from the pipeline thread, and the
copies back behind the pipeline's host flag. Only the CUDA streams, events
and the caching allocator are left out (csrc/device/cuda/, tests/gpu/).

The oracles are the ones the CPU path is held to: Gloo's results on the same
inputs and closed forms (the same case modules), and the failure tests'
bounds. Small chunks (SMDDP_DEVICE_CHUNK_BYTES) make every allreduce above a
few KiB take many chunks and reuse every staging slot.
"""

import os
import re
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cases_failures as cf  # noqa: E402
from mp_harness import ExitedRank, run_world  # noqa: E402

SIM = {"SMDDP_DEVICE_SIM": "1", "SMDDP_DEVICE_SIM_DELAY_US": "100",
       "SMDDP_DEVICE_CHUNK_BYTES": "16K"}


@pytest.mark.parametrize("world", [2, 3])
def test_collectives_vs_gloo_through_the_device_path(world):
    results = run_world(world, "cases_collectives:collectives_vs_gloo", backend="smddp",
                        timeout=300, args=("smddp", None, True), env=SIM)
    failures = [f for r in results for f in r["failures"]]
    assert not failures, f"{len(failures)} failing checks:\n" + "\n".join(failures[:60])
    for r in results:
        assert r["counts"].get("all_reduce", 0) > 100, r["counts"]
        assert r["async_checked"] >= 50


def test_calls_take_the_device_path_and_many_chunks_agree_with_the_closed_form():
    """The switch really routes: a group under SMDDP_DEVICE_SIM counts its
    calls as device calls, and an allreduce of many chunks (more chunks than
    staging slots, landing out of order) matches the closed form exactly."""
    results = run_world(2, "cases_device_sim:routed", backend="smddp", timeout=120, env=SIM)
    for rank, r in enumerate(results):
        assert r["ok"], (rank, r)
        assert r["device_calls"] >= r["calls"], (rank, r)
    plain = run_world(2, "cases_device_sim:routed", backend="smddp", timeout=120)
    assert all(r["ok"] and r["device_calls"] == 0 for r in plain), plain


def test_more_collectives_through_the_device_path():
    results = run_world(2, "cases_more_collectives:run", backend="smddp", timeout=300, env=SIM)
    for rank, res in enumerate(results):
        assert res["failures"] == [], (rank, res["failures"][:8])
        assert res["cases"] > 500, (rank, res["cases"])


def test_bad_inputs_are_rejected_on_the_callers_thread():
    """The device path checks a call with the CPU path's own checks before it
    queues anything, so a bad call raises at once, with the same message."""
    results = run_world(2, "cases_collectives:bad_inputs", backend="smddp", timeout=120,
                        expect_failure=True, env=SIM)
    for rank, res in enumerate(results):
        for name, info in res.items():
            assert info["message"].strip(), (rank, name)
            assert info["input_unchanged"], (rank, name)
        assert re.search(r"root", res["broadcast root=world"]["message"])
        assert re.search(r"AVG", res["all_reduce int32 AVG"]["message"])


def test_ddp_through_the_device_path_matches_gloo():
    results = run_world(2, "cases_ddp:ddp_vs_gloo", backend="smddp", timeout=240, args=(10,),
                        env=SIM)
    failures = [f for r in results for f in r["failures"]]
    assert not failures, "\n".join(failures)


def test_a_rank_that_dies_mid_pipeline_fails_the_survivors_fast():
    """A rank is SIGKILLed while the survivors' pipelines wait on it: their
    call fails naming the rank well before the group timeout, the streams
    drain (no wait hangs), and the next call fails at once with that cause."""
    world, victim = 3, 2
    results = run_world(world, "cases_failures:peer_death", backend="smddp", timeout=60,
                        pg_timeout=60.0, expect_failure=True, allow_exit={victim},
                        args=("all_reduce", victim, "sigkill"), env=SIM)
    assert isinstance(results[victim], ExitedRank) and results[victim].returncode == -9
    for rank in range(world):
        if rank == victim:
            continue
        first, later = results[rank]["first"], results[rank]["later"]
        assert first["raised"] and first["is_dist_backend_error"], (rank, first)
        assert f"rank {victim}" in first["msg"], (rank, first["msg"])
        assert "timed out" not in first["msg"], (rank, first["msg"])
        assert 0.2 * cf.DEATH_DELAY < first["elapsed"] < 10.0, (rank, first)
        assert later["raised"] and later["elapsed"] < 5.0, (rank, later)
        assert f"rank {victim}" in later["msg"], (rank, later["msg"])


def test_tensors_on_devices_it_cannot_serve_fail_at_once_naming_the_call():
    results = run_world(2, "cases_device_sim:device_errors", backend="smddp", timeout=60)
    for rank, r in enumerate(results):
        assert r["after_ok"], (rank, r)
        assert re.search(r"all_gather.*one device.*(cpu.*meta|meta.*cpu)",
                         r["mixed all_gather"] or ""), r
