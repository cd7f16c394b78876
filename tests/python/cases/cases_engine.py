"""Child side of test_engine.py: the fusion-buffer engine seen through torch."""

import hashlib
import random
import time

import torch
import torch.distributed as dist

import torch_smddp


def skew_and_stats(rank, world, calls=300):
    """Async all_reduces of mixed sizes and ops, issued with a different random
    rhythm on every rank (rank 0 in bursts, so calls queue and fuse); each
    result is checked against its closed form."""
    rng = random.Random(100 + rank)
    sizes = [0, 1, 5, 64, 1000, 4097, 70000]
    works, expected = [], []
    for i in range(calls):
        n = sizes[i % len(sizes)]
        # runs of one op: only consecutive calls with the same dtype and op fuse
        op = [dist.ReduceOp.SUM, dist.ReduceOp.MAX, dist.ReduceOp.AVG][(i // 50) % 3]
        base = torch.arange(n, dtype=torch.float32) % 11 + i % 5
        t = base + rank
        works.append((dist.all_reduce(t, op=op, async_op=True), t))
        if op == dist.ReduceOp.SUM:
            expected.append(base * world + world * (world - 1) / 2)
        elif op == dist.ReduceOp.MAX:
            expected.append(base + world - 1)
        else:
            expected.append(base + (world - 1) / 2)
        if (rank == 0 and i % 25 == 24) or (rank != 0 and rng.random() < 0.3):
            time.sleep(rng.random() * 0.004)
    bad = []
    for i, ((w, t), e) in enumerate(zip(works, expected)):
        w.wait()
        if not torch.equal(t, e):
            bad.append(i)
    return {"bad": bad, "stats": torch_smddp.stats()}


def digest_of_sum(rank, world):
    """A float32 SUM whose low bits depend on the summation order."""
    g = torch.Generator().manual_seed(1234 + rank)
    t = torch.randn(1 << 20, generator=g) * 1000
    dist.all_reduce(t)
    return {"digest": hashlib.sha256(t.numpy().tobytes()).hexdigest()}


def large_tensors(rank, world, mib=256):
    """A 256 MiB float32 allreduce and broadcast against closed forms."""
    n = mib * (1 << 20) // 4
    pattern = (torch.arange(n, dtype=torch.int32) % 1000).to(torch.float32)
    t = pattern + rank
    dist.all_reduce(t)
    sum_ok = bool(torch.equal(t, pattern * world + world * (world - 1) / 2))
    del t
    b = pattern + rank
    dist.broadcast(b, src=world - 1)
    bcast_ok = bool(torch.equal(b, pattern + (world - 1)))
    return {"sum_ok": sum_ok, "bcast_ok": bcast_ok,
            "path": torch_smddp.stats()["allreduce_path"]}


def sync_against_async(rank, world, calls=40):
    """Rank 0 issues every all_reduce async and waits at the end; the other
    ranks wait() on each call before issuing the next. A fusion buffer that
    held calls they had not issued yet could never complete."""
    start = time.monotonic()
    ts = [torch.full((1000 + 37 * i,), float(i + rank)) for i in range(calls)]
    if rank == 0:
        works = [dist.all_reduce(t, async_op=True) for t in ts]
        for w in works:
            w.wait()
    else:
        for t in ts:
            dist.all_reduce(t, async_op=True).wait()
    bad = [i for i, t in enumerate(ts)
           if not torch.equal(t, torch.full_like(t, world * i + world * (world - 1) / 2))]
    return {"bad": bad, "seconds": time.monotonic() - start}


def engine_across_hosts(rank, world):
    """The engine's skew job and the sync-against-async job in one spawn."""
    return {"skew": skew_and_stats(rank, world, calls=200),
            "sync_async": sync_against_async(rank, world)}


def debug_log(rank, world):
    """With SMDDP_LOG_LEVEL=debug (set by the test): the group line that a new
    group logs at info, and one debug line per collective, captured from this
    process's stderr (fd 2, where the C++ logger writes)."""
    from mp_harness import captured_stderr
    sizes = [3, 5, 7]
    lines = []
    with captured_stderr(lines):
        g = dist.new_group(list(range(world)))
        ts = [torch.full((n,), float(rank + 1)) for n in sizes]
        works = [dist.all_reduce(t, group=g, async_op=True) for t in ts]
        for w in works:
            w.wait()
        b = torch.full((11,), float(rank))
        dist.broadcast(b, src=0, group=g)
        dist.destroy_process_group(g)
    expect = float(world * (world + 1) // 2)
    ok = all(torch.equal(t, torch.full_like(t, expect)) for t in ts) and \
        torch.equal(b, torch.zeros(11))
    return {"ok": ok, "lines": lines}
