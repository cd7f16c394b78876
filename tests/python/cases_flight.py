"""Rank-side cases of test_flight.py: the flight recorder and the desync report.

One world-3 job: a few collectives of known shapes (the recorder's entries
are returned for the parent to check against them), then ranks 0 and 1 call
an all_reduce that rank 2 never makes, with a 4 s group timeout; rank 2
stays alive to answer the desync request. Torch-free at import time.
"""

from __future__ import annotations

import time

BEHIND_SLEEP = 10.0


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
        time.sleep(BEHIND_SLEEP)  # never calls sequence 6, but answers
        rec["after"] = torch_smddp.flight_recorder()
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
    return rec
