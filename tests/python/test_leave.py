"""A peer that leaves the group in order is not a peer that is slow.

A rank that shuts its group down (destroy_process_group, torchft's
shutdown) or exits after its goodbye will never run another call of that
group. Gloo's survivors read a closed connection and fail at once; smddp's
must too, naming the rank, not wait out the group timeout: on one host
through a leave notice on the control channel, across hosts through the
liveness goodbye, which carries the first call the rank never ran. And a
rank that leaves right after its last call (any job's end) fails nobody.

The oracle is the victim's own account: it leaves at a time it records,
and before a call the survivors are already in; the group timeout (30 s)
is what the survivors would otherwise wait. cases_leave.py runs every case
in one job per topology.
"""

from __future__ import annotations

import pytest

from mp_harness import ExitedRank, find_free_port, run_world

PG_TIMEOUT = 30.0
CASES = ("all_reduce", "broadcast", "barrier", "exit")


def _check(results: list, victim: int) -> list[str]:
    problems = []
    dead = results[victim]
    if not isinstance(dead, ExitedRank) or dead.returncode != 3:
        problems.append(f"rank {victim} did not exit as planned: {dead!r}")
    for rank, out in enumerate(results):
        if rank == victim:
            continue
        if not out["end_of_job"]["sums_ok"]:
            problems.append(f"rank {rank}: a sum was wrong in the end-of-job case")
        cases = CASES + (("recv",) if rank == 0 else ())
        for case in cases:
            res = out[case]
            where = f"rank {rank}, {case}"
            if not res["raised"]:
                problems.append(f"{where}: returned although rank {victim} had left")
                continue
            if not res["is_dist_backend_error"]:
                problems.append(f"{where}: raised {res['type']}, not DistBackendError")
            # On one host a process that exits also frees its owner lock,
            # which names it as exited; either account names the rank.
            if f"rank {victim}" not in res["msg"] or not (
                    "left the group" in res["msg"] or "exited" in res["msg"]):
                problems.append(f"{where}: the leave of rank {victim} is not named: "
                                f"{res['msg']!r}")
            if res["after_leave_s"] > PG_TIMEOUT / 3:
                problems.append(f"{where}: failed {res['after_leave_s']:.1f} s after the leave "
                                f"(the group timeout is {PG_TIMEOUT:.0f} s)")
    return problems


@pytest.mark.parametrize("topology", ["one host, world 3", "two hosts, world 4"])
def test_a_rank_that_leaves_fails_the_calls_that_need_it_at_once(topology):
    """Each survivor's call fails within moments of the leave, naming the
    rank, for a collective, a barrier, a receive from the leaver and a
    clean process exit; the end-of-job case fails nobody. On pretend hosts
    the victim (rank 3) shares its host with rank 2 only: rank 2 hears its
    leave notice, ranks 0 and 1 its liveness goodbye."""
    if topology.startswith("one"):
        world, victim, env = 3, 2, {}
    else:
        world, victim = 4, 3
        env = {"SMDDP_HOST_ID": lambda rank: f"leavehost{rank // 2}", "FI_TCP_IFACE": "lo"}
    results = run_world(world, "cases_leave:leave_cases", args=(victim,), env=env,
                        pg_timeout=PG_TIMEOUT, timeout=240, expect_failure=True,
                        allow_exit={victim})
    problems = _check(results, victim)
    times = {r: {c: round(out[c]["after_leave_s"], 2) for c in CASES}
             for r, out in enumerate(results) if r != victim}
    print(f"{topology}: seconds from the leave to each survivor's failure: {times}")
    assert not problems, f"{problems}; seconds from leave to failure: {times}"


def test_a_rank_that_finished_the_call_and_left_fails_nobody_still_in_it():
    """The end of a job, ranks finishing in any order: rank 2 finishes a
    gather to rank 0, shuts its group down and exits while rank 0 still
    waits for rank 1 (1.5 s late). Rank 0's liveness check sees rank 2's
    process gone, but rank 2's leave notice says it ran the gather: the
    gather completes with every part (the oracle: each rank's part is
    rank + 1)."""
    results = run_world(3, "cases_leave:finished_then_left", args=(2,), pg_timeout=PG_TIMEOUT,
                        timeout=120, allow_exit={2})
    assert isinstance(results[2], ExitedRank) and results[2].returncode == 0, results[2]
    assert results[0]["gathered"] == [[1.0] * 3, [2.0] * 3, [3.0] * 3], results[0]
    assert results[0]["seconds"] >= 1.0, results[0]  # it did wait for rank 1 past the exit


def test_rank_0_exiting_first_leaves_no_store_warnings_on_its_peers():
    """Launched without torchrun, rank 0 hosts the TCPStore, and its exit
    takes the store away. Each peer's desync responder waits in that store
    until its group is destroyed; a peer still waiting when the store goes
    printed TCPStore's "recvValue failed" warning with a C++ stack. Rank 0
    now lets its peers' responders leave first, up to 1 s (the peers here
    take 0.4 s longer to reach destroy_process_group). Oracle: the peers'
    stderr holds no TCPStore warning, and rank 0's destroy waited for them
    but not past the bound: it ended after every peer's destroy began (the
    ranks' own clock readings, on the CLOCK_MONOTONIC they share; a bound
    on its length alone would assume rank 0 reached destroy first, which a
    loaded machine need not keep)."""
    import os
    import subprocess
    import sys

    world, late = 3, 0.4
    port = find_free_port()
    here = os.path.dirname(os.path.abspath(__file__))
    repo = os.path.dirname(os.path.dirname(here))
    script = os.path.join(here, "workers", "exit_order_worker.py")
    procs = []
    try:
        for rank in range(world):
            env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                       WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
                       PYTHONPATH=os.pathsep.join([repo, os.environ.get("PYTHONPATH", "")]))
            procs.append(subprocess.Popen([sys.executable, script, str(late)], env=env,
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                          text=True, start_new_session=True))
        outs = [p.communicate(timeout=90) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for rank, (p, (out, err)) in enumerate(zip(procs, outs)):
        assert p.returncode == 0, f"rank {rank} exited {p.returncode}:\n{out}\n{err[-3000:]}"
        assert "TCPStore" not in err and "recvValue" not in err, f"rank {rank}:\n{err[-3000:]}"
    start = [float(out.split("destroy_start")[1].split()[0]) for out, _ in outs]
    end = [float(out.split("destroy_end")[1].split()[0]) for out, _ in outs]
    spans = [round(e - s, 3) for s, e in zip(start, end)]
    assert end[0] >= max(start[1:]), f"rank 0 ended its destroy before a peer began: {start} {end}"
    assert spans[0] <= 5.0, spans
