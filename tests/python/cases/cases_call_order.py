"""Child-side checks that ride in the multi-host jobs (cases_multihost.py):
async all_reduces on overlapping memory keep call order, and f16/bf16 sums
are accumulated in f32 and rounded once, whatever the hosts."""

import torch
import torch.distributed as dist


def _inputs(rank, shape=(40, 50)):
    """Rank `rank`'s starting storage: small integers, exact in float32."""
    i = torch.arange(shape[0] * shape[1], dtype=torch.float32).reshape(shape)
    return (i % 7) + rank + 1


# Each case: a list of views (functions of the storage), reduced in order.
_CASES = {
    "same tensor thrice": [lambda s: s] * 3,
    "two views of one storage": [lambda s: s.view(-1)[0:1200], lambda s: s.view(-1)[800:2000]],
    "non-contiguous views": [lambda s: s[:, 0:30], lambda s: s[:, 20:50], lambda s: s[:, 20:50]],
    "transposed, then the whole": [lambda s: s.t(), lambda s: s[::2, ::3], lambda s: s],
    "coalesced, same tensor twice": "coalesced",
    "coalescing manager": "manager",
}


def _oracle(rank, world, views):
    """Runs the calls one after another on every rank's storage (local
    tensors, no communication): each view becomes the sum over ranks."""
    stores = [_inputs(r).double() for r in range(world)]
    for view in views:
        total = sum(view(s) for s in stores)
        for s in stores:
            view(s).copy_(total)
    return stores[rank].float()


def overlapping_calls(rank, world):
    """Every case queued behind a large allreduce (so the calls would fuse),
    checked against the sequential oracle. Returns the failing cases."""
    bad = []
    for name, views in _CASES.items():
        big = torch.ones(1 << 20)
        works = [dist.all_reduce(big, async_op=True)]
        s = _inputs(rank)
        if views == "coalesced":
            views = [lambda x: x, lambda x: x]
            works.append(dist.all_reduce_coalesced([s, s], async_op=True))
        elif views == "manager":
            views = [lambda x: x[:, 1:40], lambda x: x[:, 1:40]]
            with dist._coalescing_manager(async_ops=True) as cm:
                dist.all_reduce(s[:, 1:40])
                dist.all_reduce(s[:, 1:40])
            works.append(cm)
        else:
            works += [dist.all_reduce(v(s), async_op=True) for v in views]
        for w in works:
            w.wait()
        want = _oracle(rank, world, views)
        if not torch.equal(s, want):
            bad.append((name, float((s - want).abs().max())))
        # The closed form, independent of the oracle: n calls on one tensor
        # give world^(n-1) times the sum over ranks.
        if name == "same tensor thrice":
            sigma = sum(_inputs(r) for r in range(world))
            if not torch.equal(s, sigma * world * world):
                bad.append((name + " (closed form)", float(s[0, 0])))
    return bad


def _half_inputs(rank, n, dtype):
    # Random signs and exponents 2^-2..2^9 (f16) or 2^-3..2^7 (bf16): sums of
    # a few are exact in f32, so the oracle's grouping does not matter.
    g = torch.Generator().manual_seed(4242 + rank)
    lo, hi = (-2, 10) if dtype == torch.float16 else (-3, 8)
    mant = torch.rand(n, generator=g) + 1.0
    exp = torch.randint(lo, hi, (n,), generator=g).float()
    sign = torch.randint(0, 2, (n,), generator=g).float() * 2 - 1
    return (sign * mant * torch.exp2(exp)).to(dtype)


def half_sums(rank, world, hosts):
    """f16/bf16 SUM and AVG against an f32 oracle (rank-order f32 sum, one
    rounding). `hosts` lists each host's ranks; where the path reduces per
    host, the inputs must tell one rounding from rounding per host."""
    out = {"bad": [], "double_rounding_differs": {}}
    n = 50000
    for dtype in (torch.float16, torch.bfloat16):
        for op in (dist.ReduceOp.SUM, dist.ReduceOp.AVG):
            t = _half_inputs(rank, n, dtype)
            dist.all_reduce(t, op=op)
            ins = [_half_inputs(r, n, dtype).float() for r in range(world)]
            acc = torch.zeros(n)
            for x in ins:
                acc = acc + x
            per_host = torch.zeros(n)
            for ranks in hosts:
                part = torch.zeros(n)
                for r in ranks:
                    part = part + ins[r]
                per_host = per_host + part.to(dtype).float()
            if op == dist.ReduceOp.AVG:
                acc, per_host = acc / world, per_host / world
            want = acc.to(dtype)
            key = f"{dtype} {op}"
            differs = int((per_host.to(dtype) != want).sum())
            out["double_rounding_differs"][key] = differs
            mismatched = int((t.view(torch.int16) != want.view(torch.int16)).sum())
            if mismatched:
                out["bad"].append((key, mismatched))
    return out
