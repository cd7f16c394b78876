"""Child side of test_surface.py: the c10d surface beyond single collectives,
in one job at world 4, every result checked against a closed form.

  groups      new_group({0,1}), new_group({1,2}), new_subgroups(2) and
              new_subgroups_by_enumeration([[0,3],[1,2]]) beside the world
              group: each has its own sequence space, and async collectives
              issued on overlapping groups in a different interleaving on
              every rank all complete correctly;
  device      init_process_group("cpu:smddp") (the job runs with that string)
              really routes CPU collectives, and sub-groups', to smddp;
  premul      PREMUL_SUM (double and tensor factor) in all_reduce, reduce,
              reduce_scatter (list and tensor) and coalesced all_reduce, on the
              world and on a sub-group; inputs are left untouched; integer
              dtypes are refused with an error naming the op;
  coalescing  _coalescing_manager(device=cpu) (startCoalescing/endCoalescing)
              and batch_isend_irecv on the world and a sub-group;
  monitored   ProcessGroup.monitored_barrier waits for a late rank, and names
              a missing rank within its timeout;
  refusals    what smddp still refuses (sparse tensors, float8 reductions, misuse of
              coalescing blocks) raises an error naming the op, and the group
              keeps working.
"""

import random
import re
import time
from datetime import timedelta

import torch
import torch.distributed as dist

CPU = torch.device("cpu")


class Checker:
    def __init__(self, rank):
        self.rank, self.cases, self.failures = rank, 0, []

    def same(self, case, got, want, tol=0.0):
        self.cases += 1
        ok = got.shape == want.shape and (
            torch.allclose(got.double(), want.double(), rtol=tol, atol=tol) if tol
            else torch.equal(got, want))
        if not ok:
            self.failures.append(f"rank {self.rank} {case}: got {got.flatten()[:6].tolist()} "
                                 f"want {want.flatten()[:6].tolist()}")

    def true(self, case, cond, detail=""):
        self.cases += 1
        if not cond:
            self.failures.append(f"rank {self.rank} {case}: {detail}")

    def raises(self, case, fn, *words, pattern=None):
        self.cases += 1
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - the message is what is checked
            msg = str(e)
            if not all(w in msg for w in words) or (pattern and not re.search(pattern, msg)):
                self.failures.append(f"rank {self.rank} {case}: error lacks {words} "
                                     f"/{pattern}/: {msg[:300]}")
            return
        self.failures.append(f"rank {self.rank} {case}: no error raised")


def value(q, rnd, gid, n, dtype=torch.float64):
    """Rank q's input in round rnd on group gid: small integers, exact sums."""
    return ((q + 1) * 1000 + rnd * 10 + gid + torch.arange(n) % 5).to(dtype)


# --------------------------------------------------------------------------
# device spec
# --------------------------------------------------------------------------

def check_device_spec(ck, groups):
    import torch_smddp
    want = dist.get_backend_config()
    if "smddp" not in want:  # the job runs on another backend ($SMDDP_TEST_BACKEND)
        return
    ck.true("backend config", want == "cpu:smddp", want)
    for name, g in groups.items():
        backend = g._get_backend(CPU)
        ck.true(f"{name} backend is smddp", isinstance(backend, torch_smddp.ProcessGroupSmddp),
                type(backend).__name__)


# --------------------------------------------------------------------------
# groups: sequence spaces and interleaved async collectives
# --------------------------------------------------------------------------

def issue(g, gid, rnd, n, rank, kind):
    """Issue one async collective on g; return (work, check(ck))."""
    members = dist.get_process_group_ranks(g)
    m = len(members)
    me = members.index(rank)
    if kind == "all_reduce":
        t = value(rank, rnd, gid, n)
        w = dist.all_reduce(t, group=g, async_op=True)
        want = sum(value(q, rnd, gid, n) for q in members)
        return w, lambda ck: ck.same(f"g{gid} r{rnd} all_reduce n={n}", t, want)
    if kind == "broadcast":
        root = rnd % m
        t = value(rank, rnd, gid, n)
        w = dist.broadcast(t, group_src=root, group=g, async_op=True)
        want = value(members[root], rnd, gid, n)
        return w, lambda ck: ck.same(f"g{gid} r{rnd} broadcast root={root} n={n}", t, want)
    if kind == "all_gather":
        out = torch.empty(m * n, dtype=torch.float64)
        w = dist.all_gather_into_tensor(out, value(rank, rnd, gid, n), group=g, async_op=True)
        want = torch.cat([value(q, rnd, gid, n) for q in members])
        return w, lambda ck: ck.same(f"g{gid} r{rnd} all_gather n={n}", out, want)
    if kind == "reduce_scatter":
        out = torch.empty(n, dtype=torch.float64)
        w = dist.reduce_scatter_tensor(out, value(rank, rnd, gid, m * n), group=g, async_op=True)
        want = sum(value(q, rnd, gid, m * n) for q in members)[me * n:(me + 1) * n]
        return w, lambda ck: ck.same(f"g{gid} r{rnd} reduce_scatter n={n}", out, want)
    raise ValueError(kind)


def seq_of(g):
    # ProcessGroup::getSequenceNumberForGroup only forwards for gloo/nccl/ucc
    # ("ProcessGroup undefined does not yet support sequence numbers"), so
    # ask the CPU backend itself.
    return g._get_backend(CPU)._get_sequence_number_for_group()


KINDS = ["all_reduce", "broadcast", "all_gather", "reduce_scatter"]


def check_groups(ck, rank, mine):
    """mine: {gid: group} for the groups this rank belongs to."""
    seq0 = {gid: seq_of(g) for gid, g in mine.items()}
    # Each group runs a different number of collectives per round, so a
    # shared sequence counter would show up in the deltas.
    per_round = {gid: 1 + gid % 3 for gid in mine}
    rounds = 5
    pending, issued = [], {gid: 0 for gid in mine}
    rng = random.Random(rank)  # a different interleaving on every rank
    for rnd in range(rounds):
        order = list(mine)
        rng.shuffle(order)
        for gid in order:
            for k in range(per_round[gid]):
                kind = KINDS[(rnd + k + gid) % len(KINDS)]
                n = 70001 if (rnd + k) % 3 == 0 else 7  # several chunks, or tiny
                pending.append(issue(mine[gid], gid, rnd * 10 + k, n, rank, kind))
                issued[gid] += 1
    for w, check in reversed(pending):  # wait out of issue order
        w.wait()
    for w, check in pending:
        check(ck)
    for gid, g in mine.items():
        delta = seq_of(g) - seq0[gid]
        ck.true(f"g{gid} sequence advanced by its own calls", delta == issued[gid],
                f"delta {delta}, issued {issued[gid]}")


# --------------------------------------------------------------------------
# PREMUL_SUM
# --------------------------------------------------------------------------

def check_premul(ck, rank, g, gid):
    members = dist.get_process_group_ranks(g)
    m, me = len(members), members.index(rank)
    for dtype, tol in ((torch.float32, 0.0), (torch.float64, 0.0), (torch.bfloat16, 1e-2)):
        for fname, factor in (("double", 0.25), ("tensor", torch.tensor([0.5]))):
            f = float(factor) if isinstance(factor, float) else factor.item()
            op = dist._make_nccl_premul_sum(factor)
            tag = f"g{gid} premul {dtype} {fname}"
            n = 4099
            x = value(rank, 1, gid, n, dtype)
            want = sum(value(q, 1, gid, n) * f for q in members).to(dtype)
            t = x.clone()
            dist.all_reduce(t, op=op, group=g)
            ck.same(f"{tag} all_reduce", t, want, tol)
            # reduce: the root gets the result, the others keep their input
            root = (gid + 1) % m
            t = x.clone()
            dist.reduce(t, group_dst=root, op=op, group=g)
            ck.same(f"{tag} reduce root={root}", t, want if me == root else x, tol)
            # reduce_scatter, tensor and list forms; the input is not modified
            big = value(rank, 2, gid, m * n, dtype)
            keep = big.clone()
            out = torch.empty(n, dtype=dtype)
            dist.reduce_scatter_tensor(out, big, op=op, group=g)
            full = sum(value(q, 2, gid, m * n) * f for q in members).to(dtype)
            ck.same(f"{tag} reduce_scatter_tensor", out, full[me * n:(me + 1) * n], tol)
            ck.same(f"{tag} reduce_scatter_tensor input untouched", big, keep)
            out = torch.empty(n, dtype=dtype)
            dist.reduce_scatter(out, list(big.chunk(m)), op=op, group=g)
            ck.same(f"{tag} reduce_scatter", out, full[me * n:(me + 1) * n], tol)
            ck.same(f"{tag} reduce_scatter input untouched", big, keep)
            # coalesced all_reduce (fast path -> allreduce_coalesced)
            ts = [value(rank, 3 + i, gid, 5 + i, dtype) for i in range(3)]
            with dist._coalescing_manager(group=g, async_ops=True) as cm:
                for t in ts:
                    dist.all_reduce(t, op=op, group=g)
            cm.wait()
            for i, t in enumerate(ts):
                w = sum(value(q, 3 + i, gid, 5 + i) * f for q in members).to(dtype)
                ck.same(f"{tag} coalesced all_reduce[{i}]", t, w, tol)
    ck.raises(f"g{gid} premul int64 refused",
              lambda: dist.all_reduce(torch.ones(3, dtype=torch.int64),
                                      op=dist._make_nccl_premul_sum(2.0), group=g),
              "all_reduce", "PREMUL_SUM")


# --------------------------------------------------------------------------
# coalescing blocks and batch_isend_irecv
# --------------------------------------------------------------------------

def check_coalescing(ck, rank, g, gid):
    members = dist.get_process_group_ranks(g)
    m, me = len(members), members.index(rank)
    # NCCL-style block: every call inside runs, one Work covers them all
    ts = [value(rank, 7, gid, n) for n in (3, 70001, 0)]
    b = value(rank, 8, gid, 9)
    with dist._coalescing_manager(group=g, device=CPU, async_ops=True) as cm:
        for t in ts:
            dist.all_reduce(t, group=g)
    cm.wait()
    for t, n in zip(ts, (3, 70001, 0)):
        ck.same(f"g{gid} coalescing block all_reduce n={n}", t,
                sum(value(q, 7, gid, n) for q in members))
    # a call that is not fast-path coalesced runs inside the block too
    with dist._coalescing_manager(group=g, device=CPU, async_ops=True) as cm:
        dist.broadcast(b, group_src=m - 1, group=g)
    cm.wait()
    ck.same(f"g{gid} coalescing block broadcast", b, value(members[m - 1], 8, gid, 9))
    # batch_isend_irecv: a ring in both directions, two tensors each way
    right, left = (me + 1) % m, (me - 1) % m
    if m > 1:
        sends = [value(rank, 20 + i, gid, 1000 * i + 1) for i in range(2)]
        from_left = [torch.empty(1000 * i + 1, dtype=torch.float64) for i in range(2)]
        from_right = [torch.empty(1000 * i + 1, dtype=torch.float64) for i in range(2)]
        ops = []
        for i in range(2):
            ops.append(dist.P2POp(dist.isend, sends[i], group=g, group_peer=right))
            ops.append(dist.P2POp(dist.irecv, from_left[i], group=g, group_peer=left))
        if m > 2:  # the other direction (at m == 2 left == right: tags would clash)
            for i in range(2):
                ops.append(dist.P2POp(dist.isend, sends[i], group=g, group_peer=left, tag=1))
                ops.append(dist.P2POp(dist.irecv, from_right[i], group=g, group_peer=right,
                                      tag=1))
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        for i in range(2):
            ck.same(f"g{gid} batch_isend_irecv from left [{i}]", from_left[i],
                    value(members[left], 20 + i, gid, 1000 * i + 1))
            if m > 2:
                ck.same(f"g{gid} batch_isend_irecv from right [{i}]", from_right[i],
                        value(members[right], 20 + i, gid, 1000 * i + 1))


# --------------------------------------------------------------------------
# monitored barrier (c10d's dist.monitored_barrier accepts only Gloo, so it
# is called on the ProcessGroup, as that function would)
# --------------------------------------------------------------------------

def check_monitored_barrier(ck, rank, world, gloo, g01):
    # Success, with a late rank: nobody leaves before the last one entered.
    late = 2
    dist.barrier(group=gloo)
    if rank == late:
        time.sleep(0.3)
    enter = time.time()
    dist.group.WORLD.monitored_barrier(timeout=timedelta(seconds=30), wait_all_ranks=True)
    leave = time.time()
    times = [None] * world
    dist.all_gather_object(times, (enter, leave), group=gloo)
    ck.true("monitored_barrier waits for the late rank",
            min(t[1] for t in times) >= max(t[0] for t in times), str(times))
    t = torch.full((2,), float(rank))
    dist.all_reduce(t)  # the group still works, in sequence
    ck.same("all_reduce after monitored_barrier", t, torch.full((2,), 6.0))
    # Failure: rank 1 never enters on {0,1}; rank 0 must fail in time with an
    # error naming rank 1. The group is not used again.
    if rank == 0:
        start = time.time()
        ck.raises("monitored_barrier names the missing rank",
                  lambda: g01.monitored_barrier(timeout=timedelta(seconds=1), wait_all_ranks=True),
                  # the engine names it "barrier(... root 0)": the monitored
                  # barrier is a barrier served by rank 0
                  "barrier", "timed out", pattern=r"waiting for rank\(s\) 1\b")
        ck.true("monitored_barrier fails within its timeout", time.time() - start < 15,
                f"{time.time() - start:.1f}s")
    dist.barrier(group=gloo)


# --------------------------------------------------------------------------
# what is still refused must say so, naming the op
# --------------------------------------------------------------------------

def check_refusals(ck, rank):
    pg = dist.group.WORLD
    sparse = torch.sparse_coo_tensor([[0, 2]], [1.0, 2.0], (4,))
    ck.raises("sparse all_reduce refused", lambda: dist.all_reduce(sparse), "all_reduce", "dense")
    # float8 moves (all_gather) but is not reduced.
    ck.raises("float8 all_reduce refused",
              lambda: dist.all_reduce(torch.zeros(2, dtype=torch.float8_e4m3fn)),
              "all_reduce", "dtype", "reduction")
    ck.raises("endCoalescing without start", lambda: pg._end_coalescing(CPU), "endCoalescing")
    pg._start_coalescing(CPU)
    ck.raises("nested startCoalescing", lambda: pg._start_coalescing(CPU), "startCoalescing",
              "nested")
    pg._end_coalescing(CPU).wait()
    # the group still works after the refusals
    t = torch.full((3,), float(rank))
    dist.all_reduce(t)
    ck.same("all_reduce after refusals", t, torch.full((3,), 6.0))


# --------------------------------------------------------------------------

def run(rank, world):
    assert world == 4, world
    ck = Checker(rank)
    # Every rank must call new_group/new_subgroups for every group, members or not.
    groups = {"world": dist.group.WORLD}
    gloo = dist.new_group(backend="gloo")  # for timing exchanges only
    g01 = dist.new_group([0, 1])
    g12 = dist.new_group([1, 2])
    sub, _ = dist.new_subgroups(group_size=2)  # {0,1} {2,3}
    enum, _ = dist.new_subgroups_by_enumeration([[0, 3], [1, 2]])
    mine = {0: dist.group.WORLD, 3: sub, 4: enum}
    if rank in (0, 1):
        mine[1] = g01
    if rank in (1, 2):
        mine[2] = g12
    ck.true("non-member gets NON_GROUP_MEMBER",
            (rank in (0, 1)) == (g01 != dist.GroupMember.NON_GROUP_MEMBER))
    for gid, g in mine.items():
        members = dist.get_process_group_ranks(g)
        ck.true(f"g{gid} group rank", dist.get_rank(g) == members.index(rank),
                f"{dist.get_rank(g)} vs {members}")
        if gid:
            # A new group starts its own sequence space at 0.
            s = seq_of(g)
            ck.true(f"g{gid} fresh sequence", s == 0, f"starts at {s}")
        groups[f"g{gid}"] = g
    check_device_spec(ck, groups)
    check_groups(ck, rank, mine)
    if "smddp" in dist.get_backend_config():  # Gloo has neither PREMUL_SUM nor coalescing blocks
        check_premul(ck, rank, dist.group.WORLD, 0)
        if 2 in mine:
            check_premul(ck, rank, g12, 2)
        check_coalescing(ck, rank, dist.group.WORLD, 0)
        check_coalescing(ck, rank, enum, 4)
        check_refusals(ck, rank)
        check_monitored_barrier(ck, rank, world, gloo, g01)
    dist.barrier()
    return {"failures": ck.failures, "cases": ck.cases}
