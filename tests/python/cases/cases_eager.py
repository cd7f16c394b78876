"""Child side: small one-host all-gathers leave early
(SMDDP_EAGER_GATHER_BYTES, docs/design.md "Small all-gathers leave
early"). A rank whose private part is at most that long stages it in its
pool, reads its peers' parts and leaves; its peers read the staged copy
after it left, and its post stays in one of two slots until they have.
run() in cases_host_collectives calls eager() on one host.

Oracles: every call's inputs in closed form (int32 values, exact); the
same calls on a group made with SMDDP_EAGER_GATHER_BYTES=0, which waits
for its peers as before; stats' early_gathers, which counts exactly the
calls that could leave early (none without a pool, none on the group
with 0).
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


def rewritten_at_once(ck, rank, world, g, label, calls=240):
    """Back-to-back all-gathers of one private tensor, which each rank
    overwrites as soon as its call returns: a peer still reading this
    rank's part must find the staged copy, not the tensor. One rank in
    turn waits a little before its next call, so the peers' reads lag
    at different points."""
    n = 4096  # 16 KiB parts
    x = torch.empty(n, dtype=torch.int32)
    out = torch.empty(world * n, dtype=torch.int32)
    wrong = []
    for i in range(calls):
        x.copy_(part(i, rank, n))
        dist.all_gather_into_tensor(out, x, group=g)
        x.fill_(-1)
        if not torch.equal(out, gathered(i, world, n)):
            wrong.append(i)
        if i % 7 == 0 and (i // 7) % world == rank:
            time.sleep(0.0003)
    ck.check(f"{label}: inputs overwritten as each call returns", not wrong,
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
           ("pooled", 1024), ("ag", 4096), ("ag", 3 << 18), ("list", 777), ("ag", 0), ("ag", 13)]
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
                x = torch.cat([part(key, rank, n) + o for o in range(world)])
                out = torch.empty(n, dtype=torch.int32)
                dist.reduce_scatter_tensor(out, x, group=g)
                x.fill_(-1)
                want = sum(part(key, r, n) for r in range(world)) + rank * world
                ok = torch.equal(out, want)
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
    rewritten_at_once(ck, rank, world, g, "eager")
    rewritten_at_once(ck, rank, world, waits, "eager off", calls=60)
    n_early = mixed(ck, rank, world, g, gloo, "eager")
    mixed(ck, rank, world, waits, gloo, "eager off")
    counted = torch_smddp.stats(g)["early_gathers"]
    want = 240 + n_early if has_pool else 0
    ck.check("early_gathers counts the calls that could leave early", counted == want,
             f"{counted}, want {want}{'' if has_pool else ' (no pool: nothing staged)'}")
    ck.check("early_gathers: none with SMDDP_EAGER_GATHER_BYTES=0",
             torch_smddp.stats(waits)["early_gathers"] == 0,
             str(torch_smddp.stats(waits)["early_gathers"]))
    dist.destroy_process_group(g)
    dist.destroy_process_group(waits)
