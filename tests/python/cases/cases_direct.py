"""Rank-side cases for test_direct.py: torch_smddp.all_reduce_, the
synchronous allreduce entered without c10d. Every result is checked against
an independent oracle: the rank-ordered reduction computed here in one
process (cases_small), a closed form, or Gloo's result on the same inputs."""

import time

import torch
import torch.distributed as dist

import torch_smddp
from cases_small import DTYPES, OPS, digest, input_of, ordered_oracle
from mp_harness import expect_raises


def _stat(name):
    return torch_smddp.stats()[name]


def oracle(rank, world, seed=11):
    """Every dtype and op of cases_small at small and sharded sizes: bit for
    bit the rank-ordered oracle, and bit for bit what dist.all_reduce leaves
    on the same inputs. Counts the calls the engine ran on the caller."""
    bad, digests = [], []
    before = _stat("calls_run_by_caller")
    direct_before = _stat("direct_calls")
    calls = 0
    case = 0
    for dname, dtype in DTYPES.items():
        for oname, op in OPS.items():
            if oname == "avg" and not dtype.is_floating_point:
                continue
            if oname == "product" and dtype != torch.float64:
                continue
            for numel in (1, 7, 1024, 16384 + 3, 300_000):
                case += 1
                t = input_of(rank, numel, dtype, seed + case)
                same = t.clone()
                out = torch_smddp.all_reduce_(t, op=op)
                calls += 1
                dist.all_reduce(same, op=op)
                want = ordered_oracle(world, numel, dtype, oname, seed + case)
                if out is not t:
                    bad.append(f"{dname} {oname} {numel}: did not return its tensor")
                if not torch.equal(t.view(torch.uint8), want.view(torch.uint8)):
                    bad.append(f"{dname} {oname} {numel} elements: differs from the oracle")
                if not torch.equal(t.view(torch.uint8), same.view(torch.uint8)):
                    bad.append(f"{dname} {oname} {numel} elements: differs from dist.all_reduce")
                digests.append(digest(t))
    # Fusion buffers of 4 MiB and more (SMDDP_STREAMING_STORE_BYTES): a
    # caller running its own call writes the result through the caches, the
    # engine thread (an async call) with streaming stores. Both, at an odd
    # offset, against the oracle.
    numel = 1_100_003
    want = ordered_oracle(world, numel, torch.float32, "sum", seed)
    for how in ("direct", "dist", "async"):
        buf = torch.zeros(numel + 3)
        t = buf[3:]
        t.copy_(input_of(rank, numel, torch.float32, seed))
        if how == "direct":
            torch_smddp.all_reduce_(t)
        elif how == "dist":
            dist.all_reduce(t)
        else:
            dist.all_reduce(t, async_op=True).wait()
        calls += how == "direct"
        if not torch.equal(t.view(torch.uint8), want.view(torch.uint8)):
            bad.append(f"float32 sum {numel} elements at offset 3, {how}: differs from the oracle")
        if buf[:3].count_nonzero().item():
            bad.append(f"float32 sum {numel} elements at offset 3, {how}: wrote before the view")
    # Empty tensors: nothing to reduce, but still a call on every rank.
    for shape in ((0,), (3, 0)):
        e = torch.empty(shape)
        if torch_smddp.all_reduce_(e) is not e or tuple(e.shape) != shape:
            bad.append(f"empty {shape}: not returned unchanged")
        calls += 1
    on_caller = _stat("calls_run_by_caller") - before
    return {"bad": bad, "digests": digests, "calls": calls, "on_caller": on_caller,
            "direct": _stat("direct_calls") - direct_before}


def order(rank, world):
    """all_reduce_ among asynchronous c10d calls in flight: on a view of
    memory an earlier async call writes it must read that call's result
    (call order), and the async calls must complete right. Closed forms."""
    bad = []
    n = 1 << 20
    for rep in range(5):
        a = torch.full((n,), float(rank + 1))
        b = torch.full((4096,), float(rank + 1))
        w1 = dist.all_reduce(a, async_op=True)
        w2 = dist.all_reduce(b, async_op=True)
        # a's first 1000 elements after w1: world(world+1)/2; reduced again: x world
        head = a[:1000]
        torch_smddp.all_reduce_(head)
        w1.wait()
        w2.wait()
        s = world * (world + 1) / 2
        if not torch.all(head == s * world):
            bad.append(f"rep {rep}: the overlapping view read {head[0].item()} not {s * world}")
        if not torch.all(a[1000:] == s):
            bad.append(f"rep {rep}: the async call's tail is {a[1000].item()} not {s}")
        if not torch.all(b == s):
            bad.append(f"rep {rep}: the second async call left {b[0].item()} not {s}")
        # A direct call between two c10d calls on one tensor, then a barrier.
        c = torch.full((333,), float(rank))
        dist.all_reduce(c)
        torch_smddp.all_reduce_(c, op=dist.ReduceOp.MAX)
        dist.all_reduce(c, op=dist.ReduceOp.AVG)
        want = float(world * (world - 1) / 2)
        if not torch.all(c == want):
            bad.append(f"rep {rep}: sum, max, avg gave {c[0].item()} not {want}")
    return {"bad": bad}


def fallbacks(rank, world):
    """What all_reduce_ leaves to dist.all_reduce gives dist.all_reduce's
    answer: non-contiguous and complex tensors, PREMUL_SUM, a Gloo group and
    a subgroup; each checked against Gloo on the same inputs."""
    gloo = dist.new_group(backend="gloo")
    sub = dist.new_group(ranks=[0, 1])
    bad = []
    direct_before = _stat("direct_calls")

    def check(name, make, op=dist.ReduceOp.SUM, group=None, ref_op=None):
        x = make()
        ref = x.clone()
        dist.all_reduce(ref, op=ref_op if ref_op is not None else op, group=gloo)
        torch_smddp.all_reduce_(x, op=op, group=group)
        if not torch.equal(x, ref):
            bad.append(f"{name}: {x.flatten()[:3].tolist()} vs Gloo {ref.flatten()[:3].tolist()}")

    base = lambda: torch.arange(64, dtype=torch.float64).reshape(8, 8) * (rank + 1)  # noqa: E731
    check("non-contiguous", lambda: base().t())
    check("strided", lambda: base()[:, ::2])
    check("complex", lambda: torch.complex(base(), -base()))
    # PREMUL_SUM(2) = SUM of 2x: Gloo has no PREMUL_SUM, so its reference is
    # the sum of the doubled inputs.
    x = base()
    ref = (base() * 2).clone()
    dist.all_reduce(ref, group=gloo)
    torch_smddp.all_reduce_(x, op=dist._make_nccl_premul_sum(2.0))
    if not torch.equal(x, ref):
        bad.append(f"premul_sum: {x[0, :3].tolist()} vs {ref[0, :3].tolist()}")
    check("gloo group", base, group=gloo)
    # The subgroup [0, 1]: only its members call.
    if rank < 2:
        y = torch.full((5,), float(rank + 1))
        torch_smddp.all_reduce_(y, group=sub)
        if not torch.all(y == 3.0):
            bad.append(f"subgroup [0, 1]: {y.tolist()}")
    dist.barrier()
    # None of these took the direct entry of the default group (the
    # subgroup's own counters are its own).
    return {"bad": bad, "direct": _stat("direct_calls") - direct_before}


def errors(rank, world):
    """Bad input gets the engine's errors through all_reduce_, and the group
    stays usable afterwards (checked with a closed form)."""
    out = {}
    t = torch.ones(4)
    out["band_float"] = expect_raises(lambda: torch_smddp.all_reduce_(t, op=dist.ReduceOp.BAND),
                                      (ValueError, RuntimeError))
    # Ranks disagree on the element count.
    u = torch.ones(10 + rank)
    t0 = time.monotonic()
    out["mismatch"] = expect_raises(lambda: torch_smddp.all_reduce_(u), RuntimeError)
    out["mismatch_s"] = time.monotonic() - t0
    v = torch.full((3,), float(rank + 1))
    torch_smddp.all_reduce_(v)
    out["after_ok"] = bool(torch.all(v == world * (world + 1) / 2))
    # A destroyed group: a clear error, not a crash.
    g = dist.new_group(backend="smddp")
    w = torch.ones(2)
    torch_smddp.all_reduce_(w, group=g)
    out["group_ok"] = bool(torch.all(w == world))
    dist.destroy_process_group(g)
    out["destroyed"] = expect_raises(lambda: torch_smddp.all_reduce_(torch.ones(2), group=g),
                                     (ValueError, RuntimeError))
    return out


def job(rank, world):
    """Every case above in one job: one spawn of `world` ranks."""
    return {"oracle": oracle(rank, world), "order": order(rank, world),
            "fallbacks": fallbacks(rank, world), "errors": errors(rank, world)}


def job_one(rank, world):
    """A group of one rank: its synchronous calls run on the caller too."""
    before = _stat("calls_run_by_caller")
    res = {"oracle": oracle(rank, world), "order": order(rank, world)}
    res["on_caller"] = _stat("calls_run_by_caller") - before
    # The default group destroyed and made again: all_reduce_ follows it
    # (it caches the last group's entry, read through torch's _world where
    # this torch has it).
    res["fast_world"] = not isinstance(torch_smddp._world, torch_smddp._WorldProperty)
    torch_smddp.all_reduce_(torch.ones(1))
    dist.destroy_process_group()
    dist.init_process_group("smddp", rank=0, world_size=1, store=dist.HashStore())
    t = torch.full((3,), 2.0)
    res["reinit"] = {"ok": bool(torch.all(torch_smddp.all_reduce_(t, op=dist.ReduceOp.SUM) == 2)),
                     "direct": _stat("direct_calls")}
    return res
