"""Rank-side cases of test_shrink.py: dist.shrink_group on smddp, at world
4 on one host, every oracle a closed form over the ranks that remain.

1. A sub-group of all four, rank 1 excluded while alive: the survivors'
   call in flight (rank 1 never joins it) keeps SHRINK_DEFAULT from
   shrinking, SHRINK_ABORT aborts it, and the shrunk group (ranks 0, 2, 3
   renumbered 0, 1, 2) reduces correctly; the world group is untouched;
   rank 1's call into the old group fails, naming a rank that left. A
   second sub-group, idle, shrinks with SHRINK_DEFAULT.
2. The default group after rank 3 is SIGKILLed in the middle of an
   all_reduce: the survivors catch the error naming it, shrink with
   SHRINK_ABORT, and the new default group (world 3) runs collectives;
   the time from the kill to the first completed call is reported.
"""

from __future__ import annotations

import datetime
import os
import time

from cases_failures import _attempt

VICTIM = 3
EXCLUDED = 1


def _store():
    import torch.distributed.distributed_c10d as c10d

    return c10d._get_default_store()


def _store_barrier(store, key: str, count: int, timeout: float = 60.0) -> None:
    store.add(key, 1)
    deadline = time.monotonic() + timeout
    while int(store.add(key, 0)) < count:
        if time.monotonic() > deadline:
            raise TimeoutError(f"store barrier {key}: {store.add(key, 0)} of {count}")
        time.sleep(0.01)


def _subgroup_case(rank: int, world: int, excluded: int = EXCLUDED) -> dict:
    import torch
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import SHRINK_ABORT, SHRINK_DEFAULT

    out: dict = {}
    g = dist.new_group(list(range(world)))
    idle = dist.new_group(list(range(world)))  # never used before its shrink
    t = torch.full((4,), float(rank + 1))
    dist.all_reduce(t, group=g)
    out["warm_ok"] = t.tolist() == [world * (world + 1) / 2] * 4
    store = _store()
    if rank == excluded:
        store.wait(["shrink-sub/done"], datetime.timedelta(seconds=200))
        late = _attempt(lambda: dist.all_reduce(torch.ones(4), group=g))
        out["excluded_call"] = {k: late[k] for k in ("raised", "msg", "elapsed")}
    else:
        stuck = dist.all_reduce(torch.ones(4), group=g, async_op=True)  # rank 1 never joins
        refused = _attempt(lambda: dist.shrink_group([excluded], group=g,
                                                     shrink_flags=SHRINK_DEFAULT))
        out["default_refused"] = {k: refused[k] for k in ("raised", "msg")}
        # Every survivor tries SHRINK_DEFAULT before any aborts: a peer's
        # abort ends the call in flight (its leave), after which the group
        # is idle and SHRINK_DEFAULT would go ahead.
        _store_barrier(store, "shrink-sub/refused", world - 1)
        small = dist.shrink_group([excluded], group=g, shrink_flags=SHRINK_ABORT)
        out["stuck_raised"] = _attempt(stuck.wait)["raised"]
        out["small_rank_size"] = [small.rank(), small.size()]
        u = torch.full((4,), float(rank + 1))
        dist.all_reduce(u, group=small)
        out["small_sum"] = u.tolist()  # the survivors' rank + 1
        # An idle group shrinks with SHRINK_DEFAULT. (torch names a shrunk
        # group after its ranks, so the one above, of the same ranks, goes
        # first.)
        dist.destroy_process_group(small)
        calm = dist.shrink_group([excluded], group=idle, shrink_flags=SHRINK_DEFAULT)
        v = torch.full((3,), float(rank + 1))
        dist.all_reduce(v, group=calm)
        out["idle_default"] = {"rank_size": [calm.rank(), calm.size()], "sum": v.tolist()}
        if rank == 0:
            store.set("shrink-sub/done", "1")
    w = torch.full((2,), float(rank + 1))
    dist.all_reduce(w)  # the world group, untouched
    out["world_sum"] = w.tolist()
    return out


def _default_case(rank: int, world: int, victims: tuple[int, ...] = (VICTIM,),
                  killer=None) -> dict:
    """The default group loses `victims` in the middle of an all_reduce they
    never join. killer None: the one victim SIGKILLs itself once the
    survivors are inside. Else the parent kills them (a whole host):
    killer.inside(rank) tells it this survivor is in, killer.killed_at() is
    when it struck; the victims wait to be killed."""
    import torch
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import SHRINK_ABORT

    store = _store()
    survivors = [r for r in range(world) if r not in victims]
    if rank in victims:
        if killer is not None:
            time.sleep(600)  # the parent kills this host
        store.wait([f"shrink-kill/in/{r}" for r in survivors])
        time.sleep(0.3)  # the survivors are inside their all_reduce
        store.set("shrink-kill/at", repr(time.time()))
        os.kill(os.getpid(), 9)
    work = dist.all_reduce(torch.ones(1 << 12), async_op=True)
    store.set(f"shrink-kill/in/{rank}", "1")
    if killer is not None:
        killer.inside(rank)
    failed = _attempt(work.wait)
    out = {"failure": {k: failed[k] for k in ("raised", "msg", "is_dist_backend_error")}}
    dist.shrink_group(list(victims), shrink_flags=SHRINK_ABORT)
    t = torch.full((1 << 12,), float(rank + 1))
    dist.all_reduce(t)
    killed_at = float(store.get("shrink-kill/at")) if killer is None else killer.killed_at()
    out["kill_to_step_s"] = time.time() - killed_at
    out["world"] = [dist.get_rank(), dist.get_world_size()]
    out["sum_ok"] = bool((t == sum(r + 1 for r in survivors)).all())
    gathered = [torch.zeros(2) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, torch.full((2,), float(rank)))
    out["gathered"] = [x.tolist() for x in gathered]
    b = torch.full((3,), float(rank))
    dist.broadcast(b, 2)
    out["broadcast"] = b.tolist()
    return out


def shrink_cases(rank: int, world: int) -> dict:
    out = {"subgroup": _subgroup_case(rank, world)}
    out["default"] = _default_case(rank, world)
    return out
