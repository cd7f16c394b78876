"""Child side of test_staging_order.py: every collective keeps call order
when its input is a non-contiguous view (or a PREMUL_SUM-scaled copy) of
memory that an earlier queued call writes.

Each case queues `all_reduce(s, async_op=True)` on a large storage `s`, then
the collective under test, also async, on a non-contiguous view of `s`. The
collective must read the all-reduced values (call order, as NCCL and MPI
give), not the values `s` held when it was called. The oracle is closed
form: after the all-reduce, element i of `s` is
world * (i % 7) + world * (world + 1) / 2 on every rank, and each case's
expected result is computed from that locally with plain torch ops.

One rank per case (a different one each time) issues its calls late, so on
every other rank the all-reduce cannot have finished when the collective
under test is called: a backend that copies the view at call time reads the
rank's own, not yet reduced, values there.
"""

import time

import torch
import torch.distributed as dist

COLS = 1024


def _start(rank, world):
    """Rank `rank`'s storage before the all-reduce: (world * 512, COLS)."""
    n = world * 512 * COLS
    i = torch.arange(n, dtype=torch.float32)
    return ((i % 7) + rank + 1).reshape(world * 512, COLS)


def _reduced(world):
    """The storage after the all-reduce, identical on every rank."""
    i = torch.arange(world * 512 * COLS, dtype=torch.float32)
    return (world * (i % 7) + world * (world + 1) / 2).reshape(world * 512, COLS)


def _premul(factor):
    return dist._make_nccl_premul_sum(factor)


# Each case: fn(rank, world, s, A, root) -> (work or list of works, check)
# where `s` is this rank's storage with the all-reduce already queued on it,
# A the oracle's reduced storage, and check() -> "" or what differs, run
# after every work completed.


def _broadcast(rank, world, s, A, root):
    w = dist.broadcast(s.t(), src=root, async_op=True)
    return w, lambda: "" if torch.equal(s, A) else "s differs from the reduced storage"


def _broadcast_strided(rank, world, s, A, root):
    v = s[::2, 1::3]
    w = dist.broadcast(v, src=root, async_op=True)
    return w, lambda: "" if torch.equal(s, A) else "s differs from the reduced storage"


def _all_gather(rank, world, s, A, root):
    outs = [torch.empty(s.shape[0], COLS // 2) for _ in range(world)]
    w = dist.all_gather(outs, s[:, ::2], async_op=True)
    want = A[:, ::2]
    return w, lambda: "" if all(torch.equal(o, want) for o in outs) else "outputs differ"


def _all_gather_into_tensor(rank, world, s, A, root):
    out = torch.empty(world * s.shape[0], COLS // 2)
    w = dist.all_gather_into_tensor(out, s[:, ::2], async_op=True)
    want = torch.cat([A[:, ::2]] * world)
    return w, lambda: "" if torch.equal(out, want) else "output differs"


def _all_gather_coalesced(rank, world, s, A, root):
    ins = [s[:, ::2], s[:64].t()]
    outs = [[torch.empty_like(t) for t in ins] for _ in range(world)]
    w = dist.all_gather_coalesced(outs, ins, async_op=True)
    want = [A[:, ::2], A[:64].t()]
    ok = lambda: all(torch.equal(o[k], want[k]) for o in outs for k in range(2))  # noqa: E731
    return w, lambda: "" if ok() else "outputs differ"


def _all_gather_into_tensor_coalesced(rank, world, s, A, root):
    outs = [torch.empty(world * s.shape[0], COLS // 2), torch.empty(world * 64, COLS)]
    with dist._coalescing_manager(async_ops=True) as cm:
        dist.all_gather_into_tensor(outs[0], s[:, ::2])
        dist.all_gather_into_tensor(outs[1], s[1::world * 8][:64])
    want = [torch.cat([A[:, ::2]] * world), torch.cat([A[1::world * 8][:64]] * world)]
    return cm, lambda: "" if all(torch.equal(o, x) for o, x in zip(outs, want)) else "outputs differ"


def _reduce_scatter(rank, world, s, A, root):
    k = s.shape[0] // world
    out = torch.empty(k, COLS // 2)
    w = dist.reduce_scatter(out, [s[r * k:(r + 1) * k, ::2] for r in range(world)], async_op=True)
    want = world * A[rank * k:(rank + 1) * k, ::2]
    return w, lambda: "" if torch.equal(out, want) else "output differs"


def _reduce_scatter_tensor(rank, world, s, A, root):
    n = s.numel() // world
    out = torch.empty(n)
    w = dist.reduce_scatter_tensor(out, s.t(), async_op=True)
    want = world * A.t().reshape(-1)[rank * n:(rank + 1) * n]
    return w, lambda: "" if torch.equal(out, want) else "output differs"


def _reduce_scatter_tensor_premul(rank, world, s, A, root):
    # Contiguous input: PREMUL_SUM scales a private copy, which is staging too.
    n = s.numel() // world
    out = torch.empty(n)
    w = dist.reduce_scatter_tensor(out, s.view(-1), op=_premul(0.5), async_op=True)
    want = world * 0.5 * A.reshape(-1)[rank * n:(rank + 1) * n]
    return w, lambda: "" if torch.equal(out, want) else "output differs"


def _reduce_scatter_tensor_coalesced(rank, world, s, A, root):
    k = s.shape[0] // world
    outs = [torch.empty(k, COLS // 2), torch.empty(k, COLS // 4)]
    with dist._coalescing_manager(async_ops=True) as cm:
        dist.reduce_scatter_tensor(outs[0], s[:, ::2])
        dist.reduce_scatter_tensor(outs[1], s[:, 1::4])
    want = [world * A[rank * k:(rank + 1) * k, ::2], world * A[rank * k:(rank + 1) * k, 1::4]]
    return cm, lambda: "" if all(torch.equal(o, x) for o, x in zip(outs, want)) else "outputs differ"


def _all_to_all(rank, world, s, A, root):
    k = s.shape[0] // world
    ins = [s[r * k:(r + 1) * k, ::2] for r in range(world)]
    outs = [torch.empty(k, COLS // 2) for _ in range(world)]
    w = dist.all_to_all(outs, ins, async_op=True)
    want = A[rank * k:(rank + 1) * k, ::2]
    return w, lambda: "" if all(torch.equal(o, want) for o in outs) else "outputs differ"


def _all_to_all_single(rank, world, s, A, root):
    cols = COLS - COLS % world  # dim 0 of the transposed view splits evenly
    out = torch.empty(cols, s.shape[0])
    w = dist.all_to_all_single(out, s[:, :cols].t(), async_op=True)
    k = cols // world
    want = torch.cat([A[:, :cols].t()[rank * k:(rank + 1) * k]] * world)
    return w, lambda: "" if torch.equal(out, want) else "output differs"


def _gather(rank, world, s, A, root):
    outs = [torch.empty(s.shape[0], COLS // 2) for _ in range(world)] if rank == root else None
    w = dist.gather(s[:, ::2], gather_list=outs, dst=root, async_op=True)
    want = A[:, ::2]

    def check():
        if rank != root:
            return ""
        return "" if all(torch.equal(o, want) for o in outs) else "outputs differ"
    return w, check


def _scatter(rank, world, s, A, root):
    k = s.shape[0] // world
    ins = [s[r * k:(r + 1) * k, ::2] for r in range(world)] if rank == root else None
    out = torch.empty(k, COLS // 2)
    w = dist.scatter(out, scatter_list=ins, src=root, async_op=True)
    want = A[rank * k:(rank + 1) * k, ::2]
    return w, lambda: "" if torch.equal(out, want) else "output differs"


def _reduce(rank, world, s, A, root):
    v = s.t()
    w = dist.reduce(v, dst=root, async_op=True)

    def check():
        if rank != root:
            return ""
        return "" if torch.equal(s, world * A) else "the root's tensor differs"
    return w, check


def _reduce_premul(rank, world, s, A, root):
    w = dist.reduce(s, dst=root, op=_premul(2.0), async_op=True)

    def check():
        if rank != root:
            return ""
        return "" if torch.equal(s, 2.0 * world * A) else "the root's tensor differs"
    return w, check


def _send_recv(rank, world, s, A, root):
    # root sends a transposed view of s to the next rank; every rank that is
    # neither only does the all-reduce.
    peer = (root + 1) % world
    if rank == root:
        return dist.isend(s.t(), dst=peer), lambda: ""
    if rank == peer:
        out = torch.empty(COLS, s.shape[0])
        w = dist.irecv(out, src=root)
        return w, lambda: "" if torch.equal(out, A.t()) else "received tensor differs"
    return None, lambda: ""


CASES = {
    "broadcast of a transposed view": _broadcast,
    "broadcast of a strided view": _broadcast_strided,
    "all_gather": _all_gather,
    "all_gather_into_tensor": _all_gather_into_tensor,
    "all_gather_coalesced": _all_gather_coalesced,
    "all_gather_into_tensor coalesced": _all_gather_into_tensor_coalesced,
    "reduce_scatter": _reduce_scatter,
    "reduce_scatter_tensor": _reduce_scatter_tensor,
    "reduce_scatter_tensor PREMUL_SUM": _reduce_scatter_tensor_premul,
    "reduce_scatter_tensor coalesced": _reduce_scatter_tensor_coalesced,
    "all_to_all": _all_to_all,
    "all_to_all_single": _all_to_all_single,
    "gather": _gather,
    "scatter": _scatter,
    "reduce": _reduce,
    "reduce PREMUL_SUM": _reduce_premul,
    "send/recv": _send_recv,
}


def run(rank, world):
    """Every case; returns the failures as [name, detail] and the case count."""
    A = _reduced(world)
    failures = []
    for k, (name, case) in enumerate(CASES.items()):
        late = k % world        # issues its calls late: the others' all-reduce waits for it
        root = (k + 1) % world  # never the late rank when world > 1
        dist.barrier()
        if rank == late and world > 1:
            time.sleep(0.3)
        s = _start(rank, world)
        first = dist.all_reduce(s, async_op=True)
        work, check = case(rank, world, s, A, root)
        first.wait()
        if work is not None:
            work.wait()
        why = check()
        if why:
            failures.append([name, f"rank {rank}: {why}"])
    dist.barrier()
    return {"failures": failures, "cases": len(CASES)}
