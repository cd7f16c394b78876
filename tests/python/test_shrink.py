"""dist.shrink_group on smddp (torch 2.13's Backend::shrink): the survivors
of a failure go on in a smaller group, no process restarted. No CPU
backend had it (Gloo and MPI do not shrink); every oracle here is a closed
form over the ranks that remain. cases_shrink.py runs both cases in one
job of world 4."""

from __future__ import annotations

from mp_harness import ExitedRank, run_world


def check_shrink(results: dict, world: int, excluded: int, victims: list[int]) -> list[str]:
    """The problems in cases_shrink.shrink_cases's results (rank -> dict) of
    the ranks that survive `victims`; every oracle a closed form over the
    ranks that remain."""
    problems = []
    survivors = [r for r in range(world) if r not in victims]
    sub_members = [r for r in range(world) if r != excluded]
    for rank in survivors:
        sub, default = results[rank]["subgroup"], results[rank]["default"]
        if not sub["warm_ok"]:
            problems.append(f"rank {rank}: warm-up sum wrong")
        if sub["world_sum"] != [world * (world + 1) / 2] * 2:
            problems.append(f"rank {rank}: world group after the sub-group's shrink: "
                            f"{sub['world_sum']}")
        if rank == excluded:
            late = sub["excluded_call"]
            # Its peers shut the old group down (the shrink): its call fails
            # at once, with their leave or their report of the shutdown.
            if not late["raised"] or not ("left the group" in late["msg"]
                                          or "shut down" in late["msg"]):
                problems.append(f"rank {rank} (excluded): its call into the old group: {late}")
            if late["raised"] and late["elapsed"] > 10:
                problems.append(f"rank {rank} (excluded): failed only after "
                                f"{late['elapsed']:.1f} s")
        else:
            refused = sub["default_refused"]
            if not refused["raised"] or "SHRINK_DEFAULT needs the group idle" not in refused["msg"]:
                problems.append(f"rank {rank}: SHRINK_DEFAULT with a call in flight: {refused}")
            if not sub["stuck_raised"]:
                problems.append(f"rank {rank}: the call SHRINK_ABORT aborted returned normally")
            want = [sub_members.index(rank), world - 1]
            if sub["small_rank_size"] != want:
                problems.append(f"rank {rank}: shrunk sub-group rank/size {sub['small_rank_size']}")
            total = float(sum(r + 1 for r in sub_members))
            if sub["small_sum"] != [total] * 4:
                problems.append(f"rank {rank}: shrunk sub-group sum {sub['small_sum']}")
            if sub["idle_default"] != {"rank_size": want, "sum": [total] * 3}:
                problems.append(f"rank {rank}: the idle sub-group shrunk with SHRINK_DEFAULT: "
                                f"{sub['idle_default']}")
        failure = default["failure"]
        if not failure["raised"] or not any(f"rank {v}" in failure["msg"] for v in victims):
            problems.append(f"rank {rank}: the all_reduce {victims} died in: {failure}")
        if default["world"] != [survivors.index(rank), len(survivors)]:
            problems.append(f"rank {rank}: rank/size after the shrink {default['world']}")
        if not default["sum_ok"]:
            problems.append(f"rank {rank}: all_reduce on the shrunk default group is wrong")
        if default["gathered"] != [[float(r)] * 2 for r in survivors]:
            problems.append(f"rank {rank}: all_gather {default['gathered']}")
        if default["broadcast"] != [float(survivors[2])] * 3:
            problems.append(f"rank {rank}: broadcast {default['broadcast']}")
    return problems


def test_shrink_group_on_a_sub_group_and_on_the_default_group_after_a_kill():
    results = run_world(4, "cases_shrink:shrink_cases", timeout=240, pg_timeout=30,
                        allow_exit={3})
    dead = results[3]
    assert isinstance(dead, ExitedRank) and dead.returncode == -9, dead
    problems = check_shrink(results, 4, excluded=1, victims=[3])
    times = [round(results[r]["default"]["kill_to_step_s"], 2) for r in range(3)]
    assert not problems, f"{problems}; kill to first step after the shrink (s): {times}"


def test_the_shrink_example_trains_on_through_a_kill_and_matches_one_process():
    """examples/shrink_on_failure.py: DDP at world 4, rank 3 SIGKILLed in
    the middle of step 4; the survivors shrink the default group and redo
    the step. The oracle is the example's own one-process replay (each
    step's loss the mean over the shards of the ranks alive then)."""
    import json
    import os
    import signal
    import subprocess
    import sys

    from mp_harness import REPO_ROOT

    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    cmd = [sys.executable, "examples/shrink_on_failure.py", "--nproc", "4", "--kill-rank", "3",
           "--kill-step", "4", "--steps", "8", "--timeout", "30", "--check"]
    proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=200)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the launcher and every rank it started
        out, err = proc.communicate()
        raise AssertionError(f"the example hung: {out[-2000:]} {err[-3000:]}")
    assert proc.returncode == 0, f"{out[-2000:]}\n{err[-4000:]}"
    verdict = json.loads(out.strip().splitlines()[-1])
    assert verdict["ok"], verdict
    assert verdict["members_at"] == [[0, 1, 2, 3]] * 4 + [[0, 1, 2]] * 4, verdict
    assert verdict["recovered_s"] is not None, verdict
