"""Rank-side cases for test_small.py: synchronous calls that run on the
caller's thread and small fusion batches, checked against a rank-ordered
reduction computed here, in one process, from every rank's inputs."""

import hashlib
import random
import time

import torch
import torch.distributed as dist

import torch_smddp

DTYPES = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16,
          "bfloat16": torch.bfloat16, "int32": torch.int32}
OPS = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.AVG, "max": dist.ReduceOp.MAX,
       "product": dist.ReduceOp.PRODUCT}


def input_of(rank, numel, dtype, seed):
    """Rank `rank`'s input: wide magnitudes, so a float sum's low bits
    depend on the order of the additions."""
    g = torch.Generator().manual_seed(seed * 1009 + rank)
    if dtype.is_floating_point:
        x = torch.randn(numel, generator=g, dtype=torch.float64)
        x = x * torch.pow(10.0, torch.randint(-3, 4, (numel,), generator=g).to(torch.float64))
        return x.to(dtype)
    return torch.randint(-1000, 1000, (numel,), generator=g, dtype=dtype)


def ordered_oracle(world, numel, dtype, op, seed):
    """inputs[0] op inputs[1] op ... in rank order; f16/bf16 accumulate in
    f32 and round once; AVG divides the sum once, in that precision."""
    ins = [input_of(r, numel, dtype, seed) for r in range(world)]
    wide = dtype in (torch.float16, torch.bfloat16)
    acc = ins[0].to(torch.float32) if wide else ins[0].clone()
    for x in ins[1:]:
        x = x.to(torch.float32) if wide else x
        if op in ("sum", "avg"):
            acc = acc + x
        elif op == "max":
            acc = torch.maximum(acc, x)
        else:
            acc = acc * x
    if op == "avg":
        acc = acc / world
    return acc.to(dtype)


def digest(t):
    return hashlib.sha256(t.contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()


def boundaries(rank, world, small_bytes, seed=7):
    """Synchronous all_reduce calls at, just below and just above the small
    threshold (and a few more sizes), every dtype and op listed, each
    compared bit for bit with the rank-ordered oracle. Returns the mismatches
    and a digest per call (the test compares them across ranks)."""
    bad, digests = [], []
    case = 0
    for dname, dtype in DTYPES.items():
        es = torch.empty(0, dtype=dtype).element_size()
        counts = sorted({1, 3, small_bytes // es - 1, small_bytes // es, small_bytes // es + 1,
                         2 * small_bytes // es + 5, 1000})
        for oname, op in OPS.items():
            if oname == "avg" and not dtype.is_floating_point:
                continue
            if oname == "product" and dtype != torch.float64:
                continue  # products of wide values overflow narrow dtypes
            for numel in counts:
                if numel <= 0:
                    continue
                case += 1
                t = input_of(rank, numel, dtype, seed + case)
                dist.all_reduce(t, op=op)
                want = ordered_oracle(world, numel, dtype, oname, seed + case)
                if not torch.equal(t.view(torch.uint8), want.view(torch.uint8)):
                    bad.append(f"{dname} {oname} {numel} elements")
                digests.append(digest(t))
    return {"bad": bad, "digests": digests, "stats": torch_smddp.stats()}


def mixed_async(rank, world, small_bytes, calls=120, seed=11):
    """Async calls alternating below and above the small threshold, issued
    with a different random rhythm on every rank (so batches fuse and cut
    differently), with synchronous calls on overlapping memory in between
    (call order: the synchronous call must read the async call's result).
    Everything is checked against rank-ordered oracles."""
    rng = random.Random(1000 + rank)
    sizes = [small_bytes // 4 - 1, small_bytes // 4, small_bytes // 4 + 1, 5, 70000,
             small_bytes // 8]
    works, want = [], []
    bad = []
    for i in range(calls):
        numel = max(1, sizes[i % len(sizes)])
        t = input_of(rank, numel, torch.float32, seed + i)
        works.append((dist.all_reduce(t, async_op=True), t))
        want.append(ordered_oracle(world, numel, torch.float32, "sum", seed + i))
        if i % 10 == 9:
            # The same tensor again, synchronously: it is queued behind the
            # async call, so it reads that call's result (world x it).
            dist.all_reduce(t)
            acc = want[-1].clone()
            for _ in range(world - 1):
                acc = acc + want[-1]  # rank order, as the engine adds
            want[-1] = acc
        if rng.random() < 0.3:
            time.sleep(rng.random() * 0.003)
    for i, ((w, t), e) in enumerate(zip(works, want)):
        w.wait()
        if not torch.equal(t, e):
            bad.append(i)
    digests = [digest(t) for _, t in works]
    return {"bad": bad, "digests": digests, "stats": torch_smddp.stats()}


def sync_after_async_burst(rank, world, rounds=30):
    """A burst of async small calls and then a synchronous one, many times:
    the synchronous call finds the queue busy on some ranks and idle on
    others, so some ranks run it on the caller's thread and some on the
    engine's; the results must not care. Closed forms."""
    bad = []
    for r in range(rounds):
        ts = [torch.full((17 + k,), float(rank + k + r)) for k in range(5)]
        ws = [dist.all_reduce(t, async_op=True) for t in ts]
        if rank == r % world:
            time.sleep(0.002)
        s = torch.full((33,), float(rank + 1))
        dist.all_reduce(s)
        for w in ws:
            w.wait()
        for k, t in enumerate(ts):
            if not torch.equal(t, torch.full_like(t, world * (k + r) + world * (world - 1) / 2)):
                bad.append((r, k))
        if not torch.equal(s, torch.full_like(s, world * (world + 1) / 2)):
            bad.append((r, "sync"))
    return {"bad": bad, "stats": torch_smddp.stats()}
