"""The GPU path without a GPU: with SMDDP_DEVICE_SIM=1 every collective on
CPU tensors takes the device path (csrc/backend/device_collectives.h) on a
stand-in device that follows CUDA's rules (csrc/device/sim_device.h): a
readiness event on the caller's current stream, copies through page-locked
staging on pool streams that share a few in-order hardware queues (random
delays), the CPU collective on a private host group from the pipeline
thread, and copies back queued only once their data is final. Only the CUDA
streams, events and the caching allocator themselves are left out
(csrc/device/cuda/, tests/gpu/). The harness fails a rank that broke one of
CUDA's rules on the stand-in or made a context on another rank's device.

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

# SMDDP_INTRA=shm: the staging path of every GPU's data, which one GPU per
# host takes; the intra-host NCCL route has tests of its own below.
# SMDDP_DEVICE_MIN_PIECE_BYTES=4K keeps all-gather and reduce-scatter in
# small pieces too.
SIM = {"SMDDP_DEVICE_SIM": "1", "SMDDP_DEVICE_SIM_DELAY_US": "100",
       "SMDDP_DEVICE_CHUNK_BYTES": "16K", "SMDDP_DEVICE_MIN_PIECE_BYTES": "4K",
       "SMDDP_INTRA": "shm"}


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
    staging slots, landing out of order) matches the closed form exactly.
    All-gather and reduce-scatter pieces keep SMDDP_DEVICE_MIN_PIECE_BYTES
    per rank, growing the slots (cases_device_chunks.min_piece)."""
    results = run_world(2, "cases_device_chunks:routed", backend="smddp", timeout=120, env=SIM)
    for rank, r in enumerate(results):
        assert r["ok"], (rank, r)
        assert r["device_calls"] >= r["calls"], (rank, r)
        # SMDDP_DEVICE_MIN_PIECE_BYTES: 3 MiB parts in 1 MiB pieces.
        assert r["pieces_ok"], (rank, r)
        assert (r["gather_copies"], r["scatter_copies"]) == (3, 3 * 2), (rank, r)
        # The list forms too (staged whole before: one copy from each).
        assert r["lists_ok"], (rank, r)
        assert (r["list_gather_copies"], r["list_scatter_copies"]) == (3, [3, 3]), (rank, r)
    plain = run_world(2, "cases_device_chunks:routed", backend="smddp", timeout=120)
    assert all(r["ok"] and r["device_calls"] == 0 for r in plain), plain
    # No GPU and no stand-in: no device path, so no private host group.
    assert [r["device_host_group"] for r in results] == ["formed"] * 2, results
    assert [r["device_host_group"] for r in plain] == ["none"] * 2, plain


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
    # DDP's own C++ reads broadcast results on the host after wait(): on the
    # stand-in, host code after wait() must then count as stream-ordered.
    results = run_world(2, "cases_ddp:ddp_vs_gloo", backend="smddp", timeout=240, args=(10,),
                        env=dict(SIM, SMDDP_DEVICE_SIM_HOST_ORDER="1"))
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


def _failed_checks(results):
    return {f"rank {r}: {k}": v for r, res in enumerate(results) for k, v in res.items() if v is not None}


@pytest.mark.parametrize("world", [2, 4])
def test_the_gpu_paths_rules_hold_on_the_stand_in(world):
    """Readiness events, chained calls, a PREMUL_SUM factor a kernel writes, capture refused by
    name with the group still usable, channels_last, chunked FSDP
    collectives, a barrier that orders device work, any-source receive, the
    profiler's title, and contexts only on the rank's own device."""
    results = run_world(world, "cases_device_sim:cuda_rules", backend="smddp", timeout=240, env=SIM)
    assert not _failed_checks(results), _failed_checks(results)


@pytest.mark.parametrize("world", [2, 4])
def test_one_hardware_queue_runs_isend_irecv_in_any_order(world):
    """CUDA_DEVICE_MAX_CONNECTIONS=1, as Megatron sets it: rings that post
    irecv before isend (or after, or by parity) complete and are right."""
    env = dict(SIM, SMDDP_DEVICE_SIM_QUEUES="1")
    results = run_world(world, "cases_device_sim:p2p_any_order", backend="smddp", timeout=120, env=env)
    assert not _failed_checks(results), _failed_checks(results)


def test_kernels_launched_after_a_collective_do_not_wait_for_it():
    env = dict(SIM, SMDDP_DEVICE_SIM_QUEUES="1")
    results = run_world(2, "cases_device_sim:compute_not_held", backend="smddp", timeout=120, env=env)
    assert results[0]["ran_meanwhile"], results
    assert all(r["result_ok"] for r in results), results


def test_cuda_launch_blocking_does_not_deadlock():
    env = dict(SIM, CUDA_LAUNCH_BLOCKING="1", SMDDP_DEVICE_SIM_QUEUES="1")
    results = run_world(2, "cases_device_sim:p2p_any_order", backend="smddp", timeout=120, env=env)
    assert not _failed_checks(results), _failed_checks(results)


@pytest.mark.parametrize("world", [2, 4])
def test_a_sigkilled_peer_makes_the_synchronous_call_raise_and_leaves_its_tensor_alone(world):
    victim = world - 1
    results = run_world(world, "cases_device_sim:sync_peer_death", backend="smddp", timeout=90,
                        pg_timeout=60.0, expect_failure=True, allow_exit={victim},
                        args=(victim,), env=SIM)
    assert isinstance(results[victim], ExitedRank) and results[victim].returncode == -9
    for rank in range(world):
        if rank == victim:
            continue
        r = results[rank]
        assert r["raised"], (rank, r)
        assert f"rank {victim}" in r["msg"], (rank, r["msg"])
        assert r["elapsed"] < 20, (rank, r)
        assert r["kept_input"], (rank, r["values"])


def test_groups_destroyed_and_aborted_with_work_in_flight_keep_the_rules():
    """Tensors freed after their group is gone, Works used after their group,
    an abort with slow copies in flight: no stream or memory is used after
    it is gone (the harness fails any rank with a broken rule)."""
    env = dict(SIM, SMDDP_DEVICE_SIM_DELAY_US="3000")
    results = run_world(2, "cases_device_sim:destroy_then_free", backend="smddp", timeout=120, env=env)
    for r in results:
        assert r["violations"] == [], r
        assert len(r["work_after_destroy"]) == 4, r


def test_a_pairs_first_device_call_does_not_wait_for_the_other_ranks():
    results = run_world(3, "cases_device_sim:pair_first_call", backend="smddp", timeout=60,
                        pg_timeout=30.0, env=SIM)
    for rank in (0, 1):
        assert results[rank]["ok"], results
        assert results[rank]["elapsed"] < 3.0, results


def test_the_host_group_forms_in_the_background_and_a_group_may_go_while_it_forms():
    results = run_world(3, "cases_host_group:host_group_in_background", backend="smddp", timeout=90,
                        pg_timeout=30.0, env=SIM)
    for r in results:
        assert r["after_new_group"] in ("forming", "formed"), results
        assert r["sum_ok"] and r["world_ok"] and r["after_call"] == "formed", results
        assert r["world_host_group"] == "formed", results
        assert r["threads_left"] <= 0, r["threads_new"]
        assert r["cycles_s"] < 25.0, results  # not a timing: far below the group timeout (30 s)


def _survivors_of_a_lost_rank(case, world=3, victim=2):
    """Runs cases_host_group's `case`, in which rank `victim` exits with the
    group's timeout at 8 s; returns the other ranks' results, each checked
    to have raised within 5 s naming the victim: the liveness check, not
    the timeout."""
    results = run_world(world, f"cases_host_group:{case}", backend="smddp", timeout=90,
                        pg_timeout=8.0, expect_failure=True, allow_exit={victim}, args=(victim,),
                        env=SIM)
    for r in results[:victim]:
        assert r["raised"] and f"rank {victim}" in r["msg"], results
        assert r["elapsed"] < 5.0, results
    return results[:victim]


def test_a_rank_lost_before_the_host_group_forms_fails_device_calls_and_the_group_says_so():
    results = _survivors_of_a_lost_rank("host_group_peer_lost")
    for r in results:
        assert r["state_before"] == "forming", results
        assert r["state_after"] == "failed", results
        assert "host group" in (r["errored"] or ""), results
        assert "COMM_ERROR" in r["error_type"], results


def test_a_rank_lost_before_the_first_device_allreduce_fails_the_others_at_once():
    results = _survivors_of_a_lost_rank("intra_route_peer_lost")
    assert all(r["gather_ok"] for r in results), results


@pytest.mark.parametrize("world", [2, 4])
def test_coalesced_calls_order_the_callers_stream(world):
    # A busy copy engine: the copies back trail the host part by far.
    env = dict(SIM, SMDDP_DEVICE_SIM_OUT_DELAY_US="20000")
    results = run_world(world, "cases_device_sim:coalesced_stream_order", backend="smddp", timeout=180,
                        env=env)
    assert not _failed_checks(results), _failed_checks(results)


TWO_BY_TWO = {"SMDDP_HOST_ID": lambda r: f"h{r // 2}"}  # 2 pretend hosts x 2 GPUs


@pytest.mark.parametrize("mode,route,dtype", [("nccl", "nccl", "float32"), ("nccl", "nccl", "bfloat16"),
                                              ("nccl", "nccl", "float16"), ("auto", "shm", "float32")])
def test_nccl_inside_the_host_on_the_stand_in(mode, route, dtype):
    """2 hosts x 2 GPUs: with SMDDP_INTRA=nccl, reduce-scatter inside the
    host (the stand-in's NCCL, answering ncclInProgress at random),
    each GPU's shard across hosts on its rail, all-gather; every size
    class, SUM/MAX/AVG and coalesced calls against the closed form, in
    fp32, bf16 and fp16. `auto` takes the host route on the same 2 x 2
    GPUs until the NCCL route has passed on hardware (docs/gpu.md)."""
    env = dict(SIM, SMDDP_INTRA=mode, **TWO_BY_TWO)
    results = run_world(4, "cases_nccl_route:intra_route", backend="smddp", timeout=240, env=env,
                        args=(dtype,))
    for rank, r in enumerate(results):
        assert r.pop("route") == route, (rank, r)
        # Asked for by name, the unproven route says so once, on rank 0.
        assert r.pop("unproven_warning") == (mode == "nccl" and rank == 0), (rank, mode)
        assert not r, (rank, r)


def test_auto_keeps_ranks_that_share_a_gpu_on_the_host_path():
    env = dict(SIM, SMDDP_INTRA="auto", SMDDP_TEST_SIM_DEVICE="0", **TWO_BY_TWO)
    results = run_world(4, "cases_nccl_route:intra_route", backend="smddp", timeout=240, env=env)
    for rank, r in enumerate(results):
        assert r.pop("route") == "shm", (rank, r)
        assert r.pop("unproven_warning") is False, rank
        assert not r, (rank, r)


@pytest.mark.parametrize("value,words", [("bogus", ["SMDDP_INTRA", "bogus"]),
                                         ("nccl", ["SMDDP_INTRA=nccl", "share a GPU"])])
def test_bad_intra_settings_fail_the_first_allreduce_clearly(value, words):
    env = dict(SIM, SMDDP_INTRA=value, SMDDP_TEST_SIM_DEVICE="0", **TWO_BY_TWO)
    results = run_world(4, "cases_nccl_route:first_allreduce_error", backend="smddp", timeout=120,
                        env=env, expect_failure=True)
    for rank, msg in enumerate(results):
        assert all(w in msg for w in words), (rank, msg)


def test_a_failed_communicator_formation_fails_every_later_call_with_its_error():
    """SMDDP_INTRA=nccl at 2 hosts x 2 GPUs, with the stand-in's first NCCL
    init failing on every rank: the first allreduce raises naming the
    communicator that did not form, and the next ones raise the same error
    at once. Before, call_once formed the route again at the next call."""
    env = dict(SIM, SMDDP_INTRA="nccl", SMDDP_DEVICE_SIM_NCCL_FAIL_INITS="1", **TWO_BY_TWO)
    results = run_world(4, "cases_nccl_route:failed_formation", backend="smddp", timeout=90,
                        pg_timeout=20.0, env=env, expect_failure=True)
    for rank, calls in enumerate(results):
        first = calls[0]["msg"]
        assert first and "ncclCommInitRankConfig" in first, (rank, calls)
        for later in calls[1:]:
            assert later["msg"] == first, (rank, calls)
            assert later["elapsed"] < 5.0, (rank, calls)


def test_intra_bootstrap_keys_are_the_instances_and_ranks_agree_on_the_route():
    """2 hosts x 2 GPUs, SMDDP_INTRA=nccl (issue 53, defect 5): a group
    re-formed with the same name on the same store never reads the first
    instance's unique id (local rank 0 comes late the second time, so a
    stale key would be read); and a rank set to shm among ranks set to nccl
    gets, on every rank, one error naming both values within seconds (the
    group timeout is 12 s), never a wait in the store."""
    env = dict(SIM, SMDDP_INTRA="nccl", **TWO_BY_TWO)
    results = run_world(4, "cases_nccl_route:intra_bootstrap", backend="smddp", timeout=150,
                        pg_timeout=60.0, env=env)
    for rank, r in enumerate(results):
        assert r.pop("reformed 0") is None, (rank, r)
        assert r.pop("reformed 1") is None, (rank, r)
        msg, seconds = r.pop("mismatch_error"), r.pop("mismatch_seconds")
        assert "SMDDP_INTRA" in msg and "'shm'" in msg and "'nccl'" in msg and "rank 3" in msg, (rank, msg)
        assert seconds < 6.0, (rank, seconds, msg)
        assert not r, (rank, r)


@pytest.mark.parametrize("route", ["shm", "nccl"])
def test_a_peer_killed_mid_call_fails_every_survivor_within_seconds_on_both_routes(route):
    """2 hosts x 2 GPUs; rank 3 is SIGKILLed while the others are inside an
    all_reduce (issue 53, defect 4). On the NCCL route rank 2's
    reduce-scatter then waits for a peer that never comes (the stand-in's
    NCCL kernel hangs, as NCCL's does), and rank 0's rail waits for rank 2:
    every survivor must raise, naming rank 3, about as fast as the host
    route, far inside the 60 s group timeout, and every later call must
    fail at once with the same cause."""
    world, victim = 4, 3
    env = dict(SIM, SMDDP_INTRA=route, **TWO_BY_TWO)
    results = run_world(world, "cases_failures:peer_death", backend="smddp", timeout=150,
                        pg_timeout=60.0, expect_failure=True, allow_exit={victim},
                        args=("all_reduce", victim, "sigkill"), env=env)
    assert isinstance(results[victim], ExitedRank) and results[victim].returncode == -9
    for rank in range(world - 1):
        first, later = results[rank]["first"], results[rank]["later"]
        assert first["raised"] and first["is_dist_backend_error"], (rank, first)
        assert f"rank {victim}" in first["msg"], (rank, first["msg"])
        assert "timed out" not in first["msg"] and "ncclInProgress" not in first["msg"], (rank, first)
        assert 0.2 * cf.DEATH_DELAY < first["elapsed"] < cf.DEATH_DELAY + 3.0, (rank, first)
        assert later["raised"] and later["elapsed"] < 2.0, (rank, later)
        assert f"rank {victim}" in later["msg"], (rank, later["msg"])


def test_two_nccl_routed_groups_issued_in_opposite_orders_both_complete():
    """2 hosts x 2 GPUs, SMDDP_INTRA=nccl, two groups whose calls the two
    GPUs of each host issue in opposite orders (issue 53, defect 3): each
    intra-host communicator queues its kernels on a stream of its own, so
    neither waits behind the other's, which waits for the other GPU. Both
    calls complete, against the closed form, well inside the group
    timeout."""
    env = dict(SIM, SMDDP_INTRA="nccl", **TWO_BY_TWO)
    results = run_world(4, "cases_nccl_route:two_groups_opposite_order", backend="smddp",
                        timeout=120, pg_timeout=20.0, env=env)
    assert not _failed_checks(results), _failed_checks(results)


def test_no_rank_leaves_the_route_while_a_peer_still_forms_it():
    """The NCCL route forms on every rank before any rank's first call
    returns: a host's rank 0 whose part formed first (its host peer's rail
    group held back 1.5 s) queues an allreduce, aborts, and exits, taking the
    store with it, and no peer fails or hangs in its own formation. Every
    rank exits cleanly (the harness checks the exit codes and CUDA's rules)."""
    env = dict(SIM, SMDDP_INTRA="nccl", SMDDP_DEVICE_SIM_RAIL_DELAY_MS="1500", **TWO_BY_TWO)
    results = run_world(4, "cases_nccl_route:leave_right_after_forming", backend="smddp",
                        timeout=120, pg_timeout=30.0, env=env)
    assert [r["rank"] for r in results] == [0, 1, 2, 3], results


@pytest.mark.parametrize("case,target,extra", [
    ("one hardware queue", "cases_device_sim:p2p_any_order", {"SMDDP_DEVICE_SIM_QUEUES": "1"}),
    ("CUDA_LAUNCH_BLOCKING", "cases_device_sim:p2p_any_order",
     {"CUDA_LAUNCH_BLOCKING": "1", "SMDDP_DEVICE_SIM_QUEUES": "1"}),
    ("destroy and abort in flight", "cases_device_sim:destroy_then_free",
     {"SMDDP_DEVICE_SIM_DELAY_US": "3000"}),
])
def test_the_queue_and_lifetime_rules_hold_on_the_nccl_route(case, target, extra):
    """The one-queue, launch-blocking and destroy/abort cases of the host
    route, on the NCCL route at 2 hosts x 2 GPUs (issue 53, section 2):
    the stand-in NCCL's kernels share the device's queues, block a launch
    under CUDA_LAUNCH_BLOCKING until the host's other GPU comes, and hang
    until aborted; rings in every order, the collective after them, and
    groups destroyed or aborted with calls in flight keep CUDA's rules and
    the closed form (the harness fails any rank that broke a rule)."""
    env = dict(SIM, SMDDP_INTRA="nccl", **TWO_BY_TWO, **extra)
    results = run_world(4, target, backend="smddp", timeout=180, env=env)
    if target.endswith("destroy_then_free"):
        for r in results:
            assert r["violations"] == [], r
            assert len(r["work_after_destroy"]) == 4, r
    else:
        assert not _failed_checks(results), _failed_checks(results)


def test_threads_that_let_go_of_a_calls_events_last_make_no_context_on_device_0():
    """Calls whose Work the caller drops at once, with a future callback
    that outlasts the copies back, so a completion-pool thread lets go of
    the call's events last (issue 53, defect 2): destroying an event is a
    CUDA call on the thread's current device, and an unbound pool thread's
    is device 0, where every rank would make a context. Rank 1 must end
    with a context on its own device only (the harness checks it too)."""
    results = run_world(2, "cases_device_sim:dropped_works", backend="smddp", timeout=120, env=SIM)
    for rank, r in enumerate(results):
        assert r["ok"], (rank, r)
        assert r["contexts"] == [rank], (rank, r)


def test_a_send_to_a_late_peer_does_not_hold_up_sends_to_others():
    """Device send/recv take a lane per peer: a large isend to a peer that
    posts its receive late does not block a small send to another peer that
    the late one waits for (a pipeline-parallel order that works on NCCL),
    and sends to one peer still arrive in order. Before, the one send lane
    waited for each transfer in turn and this deadlocked until the harness
    killed it."""
    results = run_world(3, "cases_device_sim:p2p_late_peer", backend="smddp", timeout=60,
                        pg_timeout=30.0, env=SIM)
    assert _failed_checks(results) == {}


@pytest.mark.parametrize("warm", [True, False])
def test_a_barrier_orders_this_ranks_earlier_sends_and_receives(warm):
    """As NCCL's barrier orders device work: at world 3, rank 0's barrier
    returns only once its earlier irecv (from a rank that sends after its
    own barrier) has completed, with the data in place. Cold (warm=False):
    ranks 1 and 2 reach the barrier before any device call of theirs and
    still meet rank 0's barrier, which its irecv put on the device path
    (before, both sides waited out the group timeout)."""
    results = run_world(3, "cases_device_sim:barrier_orders_p2p", backend="smddp", timeout=60,
                        pg_timeout=30.0, env=SIM, args=(warm,))
    assert _failed_checks(results) == {}


@pytest.mark.parametrize("path", ["cpu", "device"])
def test_dtypes_that_only_move_take_every_data_movement_call(path):
    """int16, uint16/32/64 and float8 through broadcast, all_gather(_into_tensor),
    all_to_all_single, gather, scatter and send/recv, bit for bit against the
    closed form, at world 3; an all_reduce of uint16 is refused naming the
    dtype. Before, every one of these calls refused them."""
    env = SIM if path == "device" else {"SMDDP_DEVICE_SIM": None}
    results = run_world(3, "cases_device_sim:moved_only_dtypes", backend="smddp", timeout=120,
                        pg_timeout=60.0, env=env)
    assert _failed_checks(results) == {}
