"""A group stuck on a lost peer must let go at once (docs/design.md,
"Failure model"): destroy/abort return without waiting out a collective,
and point-to-point calls to or from a dead peer fail naming it.

Each scenario is one multi-process job with a hard deadline (mp_harness);
the children (cases_stuck.py) report, the assertions are here. The group
timeout is long (PG_TIMEOUT) so that waiting it out shows as a failure.
"""

import os
import re
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mp_harness import ExitedRank, backend_under_test, run_world  # noqa: E402

BACKEND = backend_under_test()
smddp_only = pytest.mark.skipif("smddp" not in BACKEND,
                                reason="these failure semantics are smddp's (docs/design.md)")

PG_TIMEOUT = 30.0
TEARDOWN_LIMIT_S = 1.0  # the required bound for destroy/abort with a stuck call
PATHS = {
    # one host: allreduce through the shared segment
    "shared-memory": {},
    # one host, allreduce over libfabric (shm provider) only
    "network": {"SMDDP_SHM_ALLREDUCE": "0"},
    # every rank its own pretend host: tcp;ofi_rxm between hosts
    "hosts": {"SMDDP_HOST_ID": lambda r: f"stuck-host-{r}"},
}


@smddp_only
@pytest.mark.parametrize("how", ["destroy", "abort"])
@pytest.mark.parametrize("path", list(PATHS))
def test_destroy_or_abort_does_not_wait_out_a_stuck_collective(path, how):
    victim = 1
    results = run_world(2, "cases_stuck:abort_while_stuck", backend=BACKEND, timeout=60,
                        pg_timeout=PG_TIMEOUT, expect_failure=True, allow_exit={victim},
                        env=PATHS[path], args=(how,))
    assert isinstance(results[victim], ExitedRank), results[victim]
    r = results[0]
    where = f"{path}, {how}"
    # Otherwise the test proves nothing: a call was stuck on the stopped peer.
    assert r["pending"] >= 1, f"{where}: nothing was pending when the group was torn down"
    assert r["teardown_s"] < TEARDOWN_LIMIT_S, (
        f"{where}: {how} took {r['teardown_s']:.2f}s with a call stuck on a stopped peer")
    for i, w in enumerate(r["waits"]):
        # Every Work either completed before the stop or fails promptly.
        assert w["elapsed"] < TEARDOWN_LIMIT_S, (where, i, w)
        if w["raised"]:
            assert re.search(r"shut down|abort", w["msg"]), (where, i, w["msg"])
    assert r["waits"][-1]["raised"], f"{where}: the call issued after the stop completed"


@smddp_only
@pytest.mark.parametrize("path", ["one host", "hosts"])
def test_point_to_point_with_a_dead_peer_fails_naming_it(path):
    # "hosts": the peer is on another pretend host, watched through its
    # liveness connection (transport/peer_monitor.h), not an owner lock.
    victim = 1
    env = {"SMDDP_HOST_ID": lambda r: f"p2p-host-{r}", "FI_TCP_IFACE": "lo"} if path == "hosts" \
        else None
    results = run_world(2, "cases_stuck:p2p_dead_peer", backend=BACKEND, timeout=60,
                        pg_timeout=PG_TIMEOUT, expect_failure=True, allow_exit={victim}, env=env)
    assert isinstance(results[victim], ExitedRank) and results[victim].returncode == 3
    r = results[0]
    assert r["warm_ok"], "the warm-up send/recv gave a wrong result"
    for k in ("irecv_posted", "send_small", "send_big", "recv", "isend"):
        got = r[k]
        assert got["raised"], f"{k} with a dead peer returned normally"
        assert got["type"] in ("DistBackendError", "RuntimeError"), (k, got)
        assert re.search(r"\brank 1\b", got["msg"]), f"{k}: the dead peer is not named: {got}"
        assert re.search(r"exited|lost|died", got["msg"]), f"{k}: cause not named: {got}"
        # A dead peer is seen by liveness checks, not by the group timeout.
        assert got["elapsed"] < 10.0, (k, got)
        if path == "hosts":
            assert "on host p2p-host-1" in got["msg"], f"{k}: the host is not named: {got}"


PIECES_PG_TIMEOUT = 3.0


@smddp_only
@pytest.mark.parametrize("op", ["all_gather", "reduce_scatter"])
def test_a_call_in_pieces_waits_no_longer_than_the_group_timeout(op):
    # 64 pieces (SMDDP_STAGE_BYTES=1M), and a peer stopped for 0.8 s at a
    # time: each piece waits less than the 3 s timeout, the call as a
    # whole far longer. The timeout bounds the call, as NCCL's and Gloo's
    # bound a collective, not each of its pieces.
    results = run_world(2, "cases_stuck:pieces_under_one_timeout", backend=BACKEND, timeout=90,
                        pg_timeout=PIECES_PG_TIMEOUT, expect_failure=True,
                        env={"SMDDP_STAGE_BYTES": "1M"}, args=(op,))
    r = results[0]
    assert r["raised"], f"{op} in pieces completed after {r['elapsed']:.1f}s, past the timeout"
    assert "timed out" in r["msg"] and "timeout of 3000 ms" in r["msg"], r["msg"]
    assert "waiting for rank(s) 1;" in r["msg"], r["msg"]
    # The whole call, not a piece, ran out of time: well before it would
    # have finished at one stop per few pieces.
    assert r["elapsed"] < PIECES_PG_TIMEOUT + 3.0, r
