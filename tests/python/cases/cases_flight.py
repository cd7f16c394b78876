"""Rank-side cases of test_flight.py: the flight recorder and the desync report.

One world-3 job: a few collectives of known shapes (the recorder's entries
are returned for the parent to check against them), then ranks 0 and 1 call
an all_reduce that rank 2 never makes, with a 4 s group timeout; rank 2
stays alive to answer the desync request, its main thread blocked in the
store meanwhile. Rank 0 hosts the store, so it returns last (a rank that
asks after it left finds no store to ask). Torch-free at import time.
"""

from __future__ import annotations

import time

DONE_WAIT_S = 60.0


def _store():
    import torch.distributed.distributed_c10d as c10d

    return c10d._get_default_store()


def _wait_done(ranks) -> None:
    from datetime import timedelta

    _store().wait([f"flight_done/{r}" for r in ranks], timedelta(seconds=DONE_WAIT_S))


def _done(rank: int, world: int) -> None:
    """Say this rank is done with the store; rank 0, which hosts it, waits
    until every rank is (a server that leaves drops replies in flight)."""
    _store().set(f"flight_done/{rank}", "1")
    if rank == 0:
        _wait_done(range(world))


def flight_job(rank: int, world: int) -> dict:
    import torch
    import torch.distributed as dist

    import torch_smddp

    # Known calls: three async all_reduces (the engine may fuse them), a
    # broadcast, an all_gather and a barrier: sequences 0..5.
    ts = [torch.full((n,), float(rank + 1)) for n in (10, 1000, 3)]
    works = [dist.all_reduce(t, async_op=True) for t in ts]
    for w in works:
        w.wait()
    b = torch.arange(7, dtype=torch.float64)
    dist.broadcast(b, src=1)
    outs = [torch.empty(5, dtype=torch.int32) for _ in range(world)]
    dist.all_gather(outs, torch.full((5,), rank, dtype=torch.int32))
    dist.barrier()
    before = torch_smddp.flight_recorder()

    rec = {"entries": before, "now": time.time()}
    if rank == 2:
        # Never calls sequence 6, but answers: its main thread is blocked
        # in the store meanwhile, on the connection the group also uses.
        _wait_done((0, 1))
        rec["after"] = torch_smddp.flight_recorder()
        _done(rank, world)
        return rec
    t = torch.ones(250)
    t0 = time.monotonic()
    try:
        dist.all_reduce(t)
        rec["error"] = None
    except Exception as e:  # noqa: BLE001
        rec["error"] = str(e)
    rec["elapsed"] = time.monotonic() - t0
    rec["after"] = torch_smddp.flight_recorder()
    _done(rank, world)
    return rec


def detail_job(rank: int, world: int) -> dict:
    """Under TORCH_DISTRIBUTED_DEBUG=DETAIL torch wraps the backend to check
    every call's shape across ranks first; smddp's own APIs see through it."""
    import torch
    import torch.distributed as dist

    import torch_smddp

    t = torch.full((1000,), float(rank + 1))
    dist.all_reduce(t)
    rec = {"sum": t[:3].tolist()}
    stats = torch_smddp.stats()
    rec["stat_keys"] = sorted(stats)[:3]
    rec["entries"] = [(e["seq"], e["collective"]) for e in torch_smddp.flight_recorder()]
    # mismatched sizes: the wrapper's check names them before smddp runs
    try:
        dist.all_reduce(torch.ones(10 + rank))
        rec["mismatch"] = None
    except Exception as e:  # noqa: BLE001
        rec["mismatch"] = str(e)
    return rec
