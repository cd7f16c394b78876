"""Child side of test_network_fusion.py: allreduce fusion on the network-only
path (SMDDP_SHM_ALLREDUCE=0, or hosts with different numbers of ranks)."""

import hashlib

import torch
import torch.distributed as dist

import torch_smddp
from cases_call_order import _half_inputs, overlapping_calls
from cases_engine import sync_against_async

_SUM, _MAX, _MIN, _AVG = (dist.ReduceOp.SUM, dist.ReduceOp.MAX, dist.ReduceOp.MIN,
                          dist.ReduceOp.AVG)


def _behind_a_large_call():
    """A 16 MiB allreduce first: the calls issued after it queue up on every
    rank while it runs, so they can fuse."""
    big = torch.ones(1 << 22)
    return big, dist.all_reduce(big, async_op=True)


def _closed_form(base, world, op):
    if op == _SUM:
        return base * world + world * (world - 1) // 2
    if op == _MAX:
        return base + world - 1
    if op == _MIN:
        return base
    return base.double() + (world - 1) / 2  # AVG


def mixed_queue(rank, world, calls=240):
    """Async all_reduces of mixed sizes, dtypes and ops, queued together;
    each result against its closed form. Runs of 8 calls share a dtype and
    an op (only those fuse)."""
    dtypes = [torch.float32, torch.float64, torch.int32, torch.float16, torch.bfloat16]
    sizes = [0, 1, 5, 64, 1000, 4097, 70000]
    torch_smddp.reset_stats()
    big, first = _behind_a_large_call()
    works = []
    for i in range(calls):
        dtype = dtypes[(i // 8) % len(dtypes)]
        op = [_SUM, _MAX, _MIN, _AVG][(i // 40) % 4]
        if op == _AVG and not dtype.is_floating_point:
            op = _SUM
        base = torch.arange(sizes[i % len(sizes)], dtype=torch.int64) % 11 + i % 5
        t = (base + rank).to(dtype)
        works.append((dist.all_reduce(t, op=op, async_op=True), t,
                      _closed_form(base, world, op).to(dtype)))
    first.wait()
    bad = [] if torch.all(big == world) else ["the large call"]
    for i, (w, t, want) in enumerate(works):
        w.wait()
        if not torch.equal(t, want):
            bad.append(i)
    st = torch_smddp.stats()
    return {"bad": bad, "calls": calls + 1, "stats": {k: st[k] for k in (
        "allreduce_path", "fusion_buffers_flushed", "fusion_bytes", "fused_calls",
        "fused_calls_per_buffer", "collective_counts")}}


def random_floats(rank, world, calls=24):
    """Random float32 inputs whose low bits depend on the summation order,
    queued together: each result equals the rank-ordered sum computed here
    in one process, bit for bit; the digests let the test compare ranks."""
    big, first = _behind_a_large_call()
    works = []
    for i in range(calls):
        n = 1 + (i * 7919) % 30000
        ins = [torch.randn(n, generator=torch.Generator().manual_seed(1000 * i + r)) * 1000
               for r in range(world)]
        t = ins[rank].clone()
        want = ins[0].clone()
        for x in ins[1:]:
            want += x  # rank order, float32, as every server combines
        works.append((dist.all_reduce(t, async_op=True), t, want))
    first.wait()
    bad, h = [], hashlib.sha256()
    for i, (w, t, want) in enumerate(works):
        w.wait()
        if not torch.equal(t, want):
            bad.append(i)
        h.update(t.numpy().tobytes())
    return {"bad": bad, "digest": h.hexdigest()}


def half_sums_fused(rank, world):
    """f16/bf16 SUM and AVG queued together: accumulated in f32 in rank
    order and rounded once, as the one-process oracle does."""
    big, first = _behind_a_large_call()
    works = []
    for dtype in (torch.float16, torch.bfloat16):
        for op in (_SUM, _AVG):
            for n in (1000, 4097, 30000):
                t = _half_inputs(rank, n, dtype)
                acc = torch.zeros(n)
                for r in range(world):
                    acc = acc + _half_inputs(r, n, dtype).float()
                if op == _AVG:
                    acc = acc / world
                works.append((f"{dtype} {op} {n}", dist.all_reduce(t, op=op, async_op=True), t,
                              acc.to(dtype)))
    first.wait()
    bad = []
    for key, w, t, want in works:
        w.wait()
        mismatched = int((t.view(torch.int16) != want.view(torch.int16)).sum())
        if mismatched:
            bad.append((key, mismatched))
    return bad


def batches_recorded():
    """The fusion batches the flight recorder saw: (first seq, calls), and
    whether every entry agrees with its batch (consecutive, same count)."""
    entries = [e for e in torch_smddp.flight_recorder()
               if e["collective"] == "allreduce" and e["state"] == "completed"]
    by_batch = {}
    for e in entries:
        by_batch.setdefault(e["batch"], []).append(e)
    problems = []
    for b, es in sorted(by_batch.items()):
        seqs = sorted(e["seq"] for e in es)
        if seqs != list(range(b, b + len(seqs))):
            problems.append(("not consecutive", b, seqs))
        if any(e["batch_calls"] != len(es) for e in es):
            problems.append(("batch_calls", b, [e["batch_calls"] for e in es]))
        if any(e["path"] != "network" for e in es):
            problems.append(("path", b, [e["path"] for e in es]))
    return {"batches": sorted((b, len(es)) for b, es in by_batch.items()),
            "problems": problems}


def network_fusion(rank, world):
    """Every case in one spawn."""
    return {"mixed": mixed_queue(rank, world),
            "random": random_floats(rank, world),
            "half_bad": half_sums_fused(rank, world),
            "call_order_bad": overlapping_calls(rank, world),
            "sync_async": sync_against_async(rank, world),
            "recorder": batches_recorded()}
