"""Rank-side cases for a peer that leaves the group in order (test_leave.py).

A rank that shuts its group down, or exits after its goodbye, will never
run another call of that group. Its peers must fail a call that needs it
at once, naming it, as Gloo's closed connection does, and not wait out the
group timeout; and a rank that leaves after its last call (the normal end
of a job, ranks finishing in any order) must fail nobody.

Every case but the last runs on a sub-group of its own, so one job (one
torch import per rank) covers them all; ``victim`` leaves each. Times are
wall-clock differences between ranks of one machine.
"""

from __future__ import annotations

import ctypes
import sys
import time

from cases_failures import _attempt, _survivor_barrier

CALLS_BEFORE_END = 6  # calls of the "end of a job" case


def _store():
    import torch.distributed.distributed_c10d as c10d

    return c10d._get_default_store()


def _keep(res: dict) -> dict:
    return {k: res[k] for k in ("raised", "type", "msg", "elapsed", "is_dist_backend_error")}


def _leave_mid_collective(rank: int, world: int, victim: int, key: str, make_call) -> dict | None:
    """The survivors start a call on a fresh group and say so; the victim
    then shuts the group down. Returns a survivor's outcome, with how long
    after the leave its call failed."""
    import torch
    import torch.distributed as dist

    store = _store()
    g = dist.new_group(list(range(world)))
    warm = torch.full((4,), float(rank + 1))
    dist.all_reduce(warm, group=g)  # the group is formed everywhere
    assert warm.tolist() == [world * (world + 1) / 2] * 4, warm
    others = [r for r in range(world) if r != victim]
    if rank == victim:
        store.wait([f"{key}/in/{r}" for r in others])
        time.sleep(0.3)  # the survivors are inside the call by now
        store.set(f"{key}/left", repr(time.time()))
        dist.destroy_process_group(g)
        return None
    work = make_call(g)
    store.set(f"{key}/in/{rank}", "1")
    res = _attempt(work.wait)
    failed_at = time.time()
    res = _keep(res)
    res["after_leave_s"] = failed_at - float(store.get(f"{key}/left"))
    return res


def _end_of_job(rank: int, world: int, victim: int) -> dict:
    """Every rank runs CALLS_BEFORE_END all_reduces on a fresh group; the
    victim shuts the group down right after its last, while others may
    still be finishing theirs: nothing may fail, and the sums are exact."""
    import torch
    import torch.distributed as dist

    g = dist.new_group(list(range(world)))
    ok = True
    for i in range(CALLS_BEFORE_END):
        t = torch.full((1 << 14,), float(rank + 1 + i))
        dist.all_reduce(t, group=g)
        ok = ok and t[0].item() == world * (world + 1) / 2 + world * i
    if rank == victim:
        dist.destroy_process_group(g)
    return {"sums_ok": ok}


def leave_cases(rank: int, world: int, victim: int) -> dict:
    """Runs every case on this rank; the last one makes the victim exit."""
    import torch
    import torch.distributed as dist

    out: dict = {}
    n = 1 << 12
    calls = {
        "all_reduce": lambda g: dist.all_reduce(torch.ones(n), group=g, async_op=True),
        "broadcast": lambda g: dist.broadcast(torch.ones(n), victim, group=g, async_op=True),
        "barrier": lambda g: dist.barrier(group=g, async_op=True),
        # a receive from the victim, which never sends
        "recv": lambda g: dist.irecv(torch.ones(n), src=victim, group=g),
    }
    for name, make in calls.items():
        if name == "recv" and rank != 0 and rank != victim:
            # only rank 0 waits on the victim; the others just leave it be
            _leave_mid_collective_bystander(rank, world, victim, f"leave-{name}")
            continue
        res = _leave_mid_collective(rank, world, victim, f"leave-{name}", make)
        if res is not None:
            out[name] = res
    out["end_of_job"] = _end_of_job(rank, world, victim)
    # Last: the victim's process exits in the middle of the survivors'
    # all_reduce on the default group, its group never shut down. libc's
    # exit() runs the exit handlers (the liveness goodbye) as any clean exit
    # does; the harness's own exit would skip them (os._exit).
    store = _store()
    others = [r for r in range(world) if r != victim]
    if rank == victim:
        store.wait([f"exit/in/{r}" for r in others])
        time.sleep(0.3)
        store.set("exit/left", repr(time.time()))
        sys.stdout.flush()
        ctypes.CDLL(None).exit(3)
    work = dist.all_reduce(torch.ones(n), async_op=True)
    store.set(f"exit/in/{rank}", "1")
    res = _keep(_attempt(work.wait))
    res["after_leave_s"] = time.time() - float(store.get("exit/left"))
    out["exit"] = res
    _survivor_barrier(rank, others, "leave-done")
    return out


def _leave_mid_collective_bystander(rank: int, world: int, victim: int, key: str) -> None:
    """A rank with no part in the victim's point-to-point case: it forms
    the group with the others and says it is in."""
    import torch
    import torch.distributed as dist

    g = dist.new_group(list(range(world)))
    warm = torch.full((4,), float(rank + 1))
    dist.all_reduce(warm, group=g)
    _store().set(f"{key}/in/{rank}", "1")


GATHER_LATE_S = 1.5


def finished_then_left(rank: int, world: int, victim: int) -> dict:
    """One host: a gather to rank 0 that the victim finishes at once (its
    part is sent), then it destroys its group and exits; rank 1 joins the
    gather GATHER_LATE_S late, so rank 0 waits on rank 1 while the victim's
    process is gone. The victim ran the gather and said so (its leave
    notice): its exit must fail nothing."""
    import torch
    import torch.distributed as dist

    warm = torch.full((4,), float(rank + 1))
    dist.all_reduce(warm)
    if rank == 1:
        time.sleep(GATHER_LATE_S)
    part = torch.full((3,), float(rank + 1))
    out = [torch.zeros(3) for _ in range(world)] if rank == 0 else None
    t0 = time.monotonic()
    dist.gather(part, out, dst=0)
    if rank == victim:
        dist.destroy_process_group()
        sys.stdout.flush()
        ctypes.CDLL(None).exit(0)  # gone while rank 0 still waits on rank 1
    res = {"seconds": time.monotonic() - t0}
    if rank == 0:
        res["gathered"] = [x.tolist() for x in out]
    return res
