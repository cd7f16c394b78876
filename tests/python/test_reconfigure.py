"""Abort and make again, as torchft reconfigures its process group
(docs/fault-tolerance.md, "Under torchft"): 25 cycles at world 2 on new
store prefixes, a peer SIGKILLed in 5 of them, a group aborted while it
was still forming in 5, a wait on a missing peer aborted in 5. Oracles:
closed forms for every all_reduce, the error each wait raised and what
errored() / get_error() say, and the driver's own thread and fd counts
(/proc/self/task, /proc/self/fd), which must not grow.
"""

import re

import pytest

from mp_harness import backend_under_test, run_world

pytestmark = pytest.mark.skipif("smddp" not in backend_under_test(),
                                reason="smddp's abort and errored()")

CYCLES = 25


def test_abort_and_recreate_cycles_with_peers_killed_leak_nothing():
    (res,) = run_world(1, "cases_reconfigure:abort_cycles", args=(CYCLES,), timeout=240)
    cycles, samples = res["cycles"], res["samples"]
    assert len(cycles) == CYCLES
    seen = {c["kind"] for c in cycles}
    assert seen == {"normal", "abort_blocked", "forming", "kill"}, seen
    for c in cycles:
        where = f"cycle {c['cycle']} ({c['kind']})"
        if c["kind"] == "forming":
            assert "aborted while it was still forming" in c["raised"], (where, c)
            # Cancelled after 0.3 s; the group timeout is 30 s.
            assert c["seconds"] < 15, (where, c)
            continue
        assert c["errored_healthy"] is None, (where, c)
        if c["kind"] == "abort_blocked":
            assert c["waiter"].startswith("raised"), (where, c)
            assert re.search("shut down|abort", c["waiter"]), (where, c)
            assert "aborted" in (c["errored"] or ""), (where, c)
            assert c["error_type"] == "ErrorType.COMM_ERROR", (where, c)
        if c["kind"] == "kill":
            assert c["victim_exit"] == -9, (where, c)
            assert c["waiter"].startswith("raised"), (where, c)
            assert "rank 1" in c["waiter"], (where, c)
            assert c["errored"] and "rank 1" in c["errored"], (where, c)
            assert c["error_type"] == "ErrorType.COMM_ERROR", (where, c)
    # Threads and fds after the warm-up cycles (the completion pool and
    # the like start once) against the end: no growth per cycle.
    base_threads = max(s[0] for s in samples[:5])
    base_fds = max(s[1] for s in samples[:5])
    end_threads = max(s[0] for s in samples[-5:])
    end_fds = max(s[1] for s in samples[-5:])
    assert end_threads <= base_threads, samples
    assert end_fds <= base_fds + 2, samples
