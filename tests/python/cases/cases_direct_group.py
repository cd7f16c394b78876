"""Child side of test_direct_group.py: ProcessGroupSmddp constructed
directly (not through init_process_group), used, deleted with calls still
queued, then made again; the last one is left alive for interpreter exit.

Deleting a group joins its engine thread. That thread frees the Works and
tensors of the calls it ran, and freeing a tensor whose Python object is
already gone takes the GIL: with the GIL held by `del pg`, that hung."""

import datetime
import time

import torch
import torch.distributed as dist

import torch_smddp

_KEEP = []  # a group that lives until the interpreter exits


def _group(store, rank, world, name):
    return torch_smddp._C.ProcessGroupSmddp(store, rank, world, datetime.timedelta(seconds=60),
                                            name)


def _use(pg, rank, world):
    """A checked allreduce (closed form), then calls left queued on
    temporary tensors, whose Python objects are gone at once."""
    t = torch.arange(1000, dtype=torch.float32) + rank
    pg.allreduce([t]).wait()
    want = world * torch.arange(1000, dtype=torch.float32) + world * (world - 1) / 2
    if not torch.equal(t, want):
        return "allreduce result differs from the closed form"
    for _ in range(20):
        pg.allreduce([torch.ones(1 << 18)])
    x = torch.ones(256, 256)
    pg.allreduce([x.t()])
    del x
    return ""


def create_use_delete(rank, world, store_path):
    store = dist.FileStore(store_path, world)
    out = {"errors": [], "del_seconds": []}
    for name in ("direct", "direct", "direct-2"):  # a name used twice, then another
        pg = _group(store, rank, world, name)
        why = _use(pg, rank, world)
        if why:
            out["errors"].append(f"{name}: {why}")
        t0 = time.monotonic()
        del pg
        out["del_seconds"].append(time.monotonic() - t0)
    # One more, alive until exit, with calls still queued.
    pg = _group(store, rank, world, "left-for-exit")
    why = _use(pg, rank, world)
    if why:
        out["errors"].append(f"left-for-exit: {why}")
    _KEEP.append(pg)
    return out
