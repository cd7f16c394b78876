"""Child side: small one-host all-gathers leave early
(SMDDP_EAGER_GATHER_BYTES, docs/design.md "Small all-gathers leave
early"). A rank whose private part is at most that long stages it in its
pool, reads its peers' parts and leaves; its peers read the staged copy
after it left, and its post stays in one of two slots until they have.
Reduce-scatters between them wait as before. run() in
cases_host_collectives calls eager() on one host.

Oracles: every call's inputs in closed form (int32 values, exact); the
same calls on a group made with SMDDP_EAGER_GATHER_BYTES=0, which waits
for its peers as before; stats' early_gathers, which counts exactly the
calls that could leave early (but the group's first, none without a
pool, none on the group with 0).
"""

import os
import time

import torch
import torch.distributed as dist

import torch_smddp
from mp_helpers import env_set

EAGER = 256 << 10  # SMDDP_EAGER_GATHER_BYTES' default
I32 = 4


def part(key, rank, n):
    """Rank `rank`'s part of call `key` (an int): exact in int32."""
    return torch.arange(n, dtype=torch.int32) * 7 + rank * 1_000_003 + key * 101


def gathered(key, world, n):
    return torch.cat([part(key, r, n) for r in range(world)])


def blocks(key, rank, world, n):
    """Rank `rank`'s reduce-scatter input of call `key`: block o is
    part(key, rank, n) + o."""
    return torch.cat([part(key, rank, n) + o for o in range(world)])


def scattered(key, rank, world, n):
    """Rank `rank`'s block of the SUM of every rank's blocks()."""
    return sum(part(key, r, n) for r in range(world)) + rank * world


def rewritten_at_once(ck, rank, world, g, label, op, calls):
    """Back-to-back all-gathers (or reduce-scatters) of one private tensor,
    which each rank overwrites as soon as its call returns: a peer still
    reading this rank's part (or blocks) must find the staged copy, not
    the tensor. One rank in turn waits a little before its next call, so
    the peers' reads lag at different points."""
    n = 4096 if op == "ag" else 1024  # 16 KiB parts; 4 KiB blocks
    x = torch.empty(n if op == "ag" else world * n, dtype=torch.int32)
    out = torch.empty(world * n if op == "ag" else n, dtype=torch.int32)
    wrong = []
    for i in range(calls):
        if op == "ag":
            x.copy_(part(i, rank, n))
            dist.all_gather_into_tensor(out, x, group=g)
            want = gathered(i, world, n)
        else:
            x.copy_(blocks(i, rank, world, n))
            dist.reduce_scatter_tensor(out, x, group=g)
            want = scattered(i, rank, world, n)
        x.fill_(-1)
        if not torch.equal(out, want):
            wrong.append(i)
        if i % 7 == 0 and (i // 7) % world == rank:
            time.sleep(0.0003)
    ck.check(f"{label}: {op} inputs overwritten as each call returns", not wrong,
             f"{len(wrong)} of {calls} calls wrong, first {wrong[:5]}")


def mixed(ck, rank, world, g, gloo, label):
    """A sequence whose steps alternate slots unevenly: small private
    all-gathers (early), the largest early part and one past it, pooled
    parts (read in place, they wait), a call staged whole, reduce-scatters,
    allreduces between, a list all-gather and an empty one; every input
    rewritten after its call. Returns how many calls could leave early."""
    backend = g._get_backend(torch.device("cpu"))
    big = EAGER // I32
    pooled = backend.allocate_tensor(world * 1024, dtype=torch.int32, device=torch.device("cpu"))
    seq = [("ag", 4096), ("ag", 1), ("rs", 999), ("ag", big), ("ar", 5), ("ag", big + 1),
           ("pooled", 1024), ("ag", 4096), ("rs", 40000), ("ag", 3 << 18), ("list", 777),
           ("ag", 0), ("rs", 3), ("ag", 13)]
    early, wrong = 0, []
    for rnd in range(6):
        for k, (op, n) in enumerate(seq):
            key = rnd * 100 + k
            if op in ("ag", "list"):
                x = part(key, rank, n)
                if op == "ag":
                    out = torch.empty(world * n, dtype=torch.int32)
                    dist.all_gather_into_tensor(out, x, group=g)
                else:
                    outs = [torch.empty(n, dtype=torch.int32) for _ in range(world)]
                    dist.all_gather(outs, x, group=g)
                    out = torch.cat(outs)
                x.fill_(-1)
                early += 0 < n * I32 <= EAGER
                ok = torch.equal(out, gathered(key, world, n))
            elif op == "pooled":
                mine = pooled[rank * n:(rank + 1) * n]
                mine.copy_(part(key, rank, n))
                dist.all_gather_into_tensor(pooled, mine, group=g)
                ok = torch.equal(pooled, gathered(key, world, n))
            elif op == "rs":
                x = blocks(key, rank, world, n)
                out = torch.empty(n, dtype=torch.int32)
                dist.reduce_scatter_tensor(out, x, group=g)
                x.fill_(-1)
                ok = torch.equal(out, scattered(key, rank, world, n))
            else:
                t = part(key, rank, n)
                dist.all_reduce(t, group=g)
                want = sum(part(key, r, n) for r in range(world))
                ok = torch.equal(t, want)
            if not ok:
                wrong.append((rnd, op, n))
    ck.check(f"{label}: a mixed sequence, every result the closed form", not wrong,
             str(wrong[:6]))
    dist.barrier(group=gloo)
    return early


def eager(ck, rank, world, gloo):
    has_pool = os.environ.get("SMDDP_SHARED_POOL_BYTES") != "0"
    g = dist.new_group(backend="smddp")
    with env_set(SMDDP_EAGER_GATHER_BYTES="0"):
        waits = dist.new_group(backend="smddp")
    # Reduce-scatters between early all-gathers wait as before; their
    # inputs too may change as soon as they return.
    for op in ("ag", "rs"):
        rewritten_at_once(ck, rank, world, g, "eager", op, 200)
        rewritten_at_once(ck, rank, world, waits, "eager off", op, 50)
    n_early = mixed(ck, rank, world, g, gloo, "eager")
    mixed(ck, rank, world, waits, gloo, "eager off")
    counted = torch_smddp.stats(g)["early_gathers"]
    # A rank leaves early only once its peers have mapped its pool (so what
    # it staged stays readable if its process ends): they do in the
    # group's first call, which waits.
    want = 200 - 1 + n_early if has_pool else 0
    ck.check("early_gathers counts the calls that could leave early", counted == want,
             f"{counted}, want {want}{'' if has_pool else ' (no pool: nothing staged)'}")
    ck.check("early_gathers: none with SMDDP_EAGER_GATHER_BYTES=0",
             torch_smddp.stats(waits)["early_gathers"] == 0,
             str(torch_smddp.stats(waits)["early_gathers"]))
    dist.destroy_process_group(g)
    dist.destroy_process_group(waits)


def exit_right_after(rank, world, victim, which):
    """`victim` ends its process (os._exit: no teardown) as soon as an
    all-gather returns on it: the group's first (`which` = "first"), or
    one after three (`which` = "warm"), which left early. What it staged
    must stay readable: the others' results are whole. A rank leaves early
    only once its peers have mapped its pool, which outlives its process;
    a group's first call waits for its peers to read."""
    import datetime

    g = dist.new_group(backend="smddp", timeout=datetime.timedelta(seconds=8))
    n = EAGER // I32
    res = {"warm_ok": True}
    if which == "warm":
        for i in range(3):
            out = torch.empty(world * n, dtype=torch.int32)
            dist.all_gather_into_tensor(out, part(i, rank, n), group=g)
            res["warm_ok"] = res["warm_ok"] and torch.equal(out, gathered(i, world, n))
    before = torch_smddp.stats(g)["early_gathers"]
    x = part(99, rank, n)
    out = torch.empty(world * n, dtype=torch.int32)
    dist.all_gather_into_tensor(out, x, group=g)
    if rank == victim:
        os._exit(0)
    res["ok"] = bool(torch.equal(out, gathered(99, world, n)))
    res["left_early"] = torch_smddp.stats(g)["early_gathers"] - before
    return res
