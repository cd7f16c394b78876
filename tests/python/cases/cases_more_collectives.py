"""Child side: reduce_scatter, reduce, gather, scatter, all-to-all and the
coalesced allgather/reduce-scatter variants, each compared with Gloo on the
same inputs in the same job (and with a closed form where Gloo refuses)."""

import zlib

import torch
import torch.distributed as dist

from collective_oracle import settle

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8,
          torch.int32, torch.int64, torch.bool]
OPS = {"SUM": dist.ReduceOp.SUM, "MIN": dist.ReduceOp.MIN, "MAX": dist.ReduceOp.MAX,
       "PRODUCT": dist.ReduceOp.PRODUCT, "AVG": dist.ReduceOp.AVG, "BAND": dist.ReduceOp.BAND,
       "BOR": dist.ReduceOp.BOR, "BXOR": dist.ReduceOp.BXOR}


def ops_for(dtype):
    if dtype.is_floating_point:
        return ["SUM", "MIN", "MAX", "PRODUCT", "AVG"]
    return ["SUM", "MIN", "MAX", "PRODUCT", "BAND", "BOR", "BXOR"]


def make(key, rank, dtype, n):
    # zlib.crc32, not hash(): str hashes are salted per process.
    g = torch.Generator().manual_seed(zlib.crc32(f"{key}/{rank}".encode()))
    if dtype == torch.bool:
        return torch.randint(0, 2, (n,), generator=g).bool()
    if dtype.is_floating_point:
        # Small integers: exact in every float dtype for SUM/PRODUCT of <= 4 ranks.
        return torch.randint(-3, 4, (n,), generator=g).to(dtype)
    lo, hi = (0, 8) if dtype == torch.uint8 else (-4, 5)
    return torch.randint(lo, hi, (n,), generator=g).to(dtype)


def fold(op, xs, world):
    acc = xs[0].clone()
    for x in xs[1:]:
        if op in ("SUM", "AVG"):
            acc = (acc.to(torch.float64) + x.to(torch.float64)) if acc.dtype != torch.bool else (acc | x)
        elif op == "PRODUCT":
            acc = acc * x if acc.dtype != torch.bool else (acc & x)
        elif op == "MIN":
            acc = torch.minimum(acc, x)
        elif op == "MAX":
            acc = torch.maximum(acc, x)
        elif op == "BAND":
            acc = acc & x
        elif op == "BOR":
            acc = acc | x
        elif op == "BXOR":
            acc = acc ^ x
    if op == "AVG":
        acc = acc / world
    return acc.to(xs[0].dtype)


class Checker:
    def __init__(self, rank, world):
        self.rank, self.world = rank, world
        self.gloo = dist.new_group(backend="gloo")
        self.cases, self.failures = 0, []

    def same(self, case, got, want, tol=0.0):
        settle()
        self.cases += 1
        if got.dtype.is_floating_point and tol:
            ok = torch.allclose(got.double(), want.double(), rtol=tol, atol=tol)
        else:
            ok = torch.equal(got, want)
        if not ok:
            self.failures.append(f"rank {self.rank} {case}: got {got.flatten()[:6].tolist()} "
                                 f"want {want.flatten()[:6].tolist()}")

    def gloo_or_none(self, fn):
        settle()
        try:
            fn(self.gloo)
            return True
        except Exception:
            return False


def run(rank, world):
    ck = Checker(rank, world)
    for dtype in DTYPES:
        tol = 1e-2 if dtype in (torch.float16, torch.bfloat16) else 0.0
        for n in (0, 1, 7, 1000, 70001):
            for op in ops_for(dtype):
                key = f"rs{dtype}{n}{op}"
                ins = [make(key + str(r), rank, dtype, n) for r in range(world)]
                want = fold(op, [torch.cat([make(key + str(rank), q, dtype, n)]) for q in range(world)], world)
                # reduce_scatter (list) and reduce_scatter_tensor
                out = torch.empty(n, dtype=dtype)
                dist.reduce_scatter(out, [t.clone() for t in ins], op=OPS[op])
                ck.same(f"reduce_scatter {dtype} n={n} {op}", out, want, tol)
                flat = torch.cat(ins)
                out2 = torch.empty(n, dtype=dtype)
                dist.reduce_scatter_tensor(out2, flat.clone(), op=OPS[op])
                ck.same(f"reduce_scatter_tensor {dtype} n={n} {op}", out2, want, tol)
                g = torch.empty(n, dtype=dtype)
                if n and ck.gloo_or_none(lambda grp: dist.reduce_scatter_tensor(g, flat.clone(), op=OPS[op], group=grp)):
                    ck.same(f"reduce_scatter_tensor vs gloo {dtype} n={n} {op}", out2, g, tol)
                # reduce to every root
                if n in (7, 70001):
                    for root in range(world):
                        x = make(key + "red", rank, dtype, n)
                        wantr = fold(op, [make(key + "red", q, dtype, n) for q in range(world)], world)
                        y = x.clone()
                        dist.reduce(y, dst=root, op=OPS[op])
                        if rank == root:
                            ck.same(f"reduce {dtype} n={n} {op} root={root}", y, wantr, tol)
        # gather / scatter / all_to_all (no reduction)
        for n in (0, 5, 4097):
            x = make(f"g{dtype}{n}", rank, dtype, n)
            for root in range(world):
                outs = [torch.empty(n, dtype=dtype) for _ in range(world)] if rank == root else None
                dist.gather(x, outs, dst=root)
                if rank == root:
                    for q in range(world):
                        ck.same(f"gather {dtype} n={n} root={root} from {q}", outs[q], make(f"g{dtype}{n}", q, dtype, n))
                src = [make(f"s{dtype}{n}{root}", q, dtype, n) for q in range(world)] if rank == root else None
                y = torch.empty(n, dtype=dtype)
                dist.scatter(y, src, src=root)
                ck.same(f"scatter {dtype} n={n} root={root}", y, make(f"s{dtype}{n}{root}", rank, dtype, n))
            # all_to_all_single, equal and uneven splits
            inp = torch.cat([make(f"a{dtype}{n}{q}", rank, dtype, n) for q in range(world)])
            out = torch.empty_like(inp)
            dist.all_to_all_single(out, inp)
            want = torch.cat([make(f"a{dtype}{n}{rank}", q, dtype, n) for q in range(world)])
            ck.same(f"all_to_all_single {dtype} n={n}", out, want)
            in_splits = [(rank + q) % 3 + (n % 2) for q in range(world)]
            out_splits = [(q + rank) % 3 + (n % 2) for q in range(world)]
            inp = torch.cat([make(f"u{dtype}{n}{q}", rank, dtype, in_splits[q]) for q in range(world)])
            out = torch.empty(sum(out_splits), dtype=dtype)
            dist.all_to_all_single(out, inp, out_splits, in_splits)
            want = torch.cat([make(f"u{dtype}{n}{rank}", q, dtype, out_splits[q]) for q in range(world)])
            ck.same(f"all_to_all_single uneven {dtype} n={n}", out, want)
            g = torch.empty_like(out)
            if ck.gloo_or_none(lambda grp: dist.all_to_all_single(g, inp, out_splits, in_splits, group=grp)):
                ck.same(f"all_to_all_single uneven vs gloo {dtype} n={n}", out, g)
            ins = [make(f"l{dtype}{n}{q}", rank, dtype, n + q) for q in range(world)]
            outs = [torch.empty(n + rank, dtype=dtype) for _ in range(world)]
            dist.all_to_all(outs, ins)
            for q in range(world):
                ck.same(f"all_to_all list {dtype} n={n} from {q}", outs[q], make(f"l{dtype}{n}{rank}", q, dtype, n + rank))
    # coalesced variants through the coalescing manager (what FSDP uses)
    from torch.distributed.distributed_c10d import _coalescing_manager
    xs = [make(f"c{i}", rank, torch.float32, 100 * (i + 1)) for i in range(3)]
    outs = [torch.empty(100 * (i + 1) * world) for i in range(3)]
    with _coalescing_manager(async_ops=True) as cm:
        for o, x in zip(outs, xs):
            dist.all_gather_into_tensor(o, x)
    cm.wait()
    for i, o in enumerate(outs):
        ck.same(f"all_gather_into_tensor coalesced {i}", o,
                torch.cat([make(f"c{i}", q, torch.float32, 100 * (i + 1)) for q in range(world)]))
    big = [torch.cat([make(f"r{i}{q}", rank, torch.float32, 50) for q in range(world)]) for i in range(3)]
    rs = [torch.empty(50) for _ in range(3)]
    with _coalescing_manager(async_ops=True) as cm:
        for o, x in zip(rs, big):
            dist.reduce_scatter_tensor(o, x, op=dist.ReduceOp.AVG)
    cm.wait()
    for i, o in enumerate(rs):
        ck.same(f"reduce_scatter_tensor coalesced AVG {i}", o,
                fold("AVG", [make(f"r{i}{rank}", q, torch.float32, 50) for q in range(world)], world), 1e-6)
    dist.barrier(group=ck.gloo)
    return {"cases": ck.cases, "failures": ck.failures}
