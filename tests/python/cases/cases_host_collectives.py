"""Child side: all-gather and reduce-scatter through the host segment (on one
host, all-gather through each rank's ring once a rank receives 4 MiB at world
3 and up, the rest reading the peers' buffers), in one job per world size; on a cluster
of namespace hosts (run_on_hosts), in the hierarchy across hosts.

Oracles, on the same inputs in the same job:
- Gloo;
- the same collectives on an smddp group made with SMDDP_SHM_COLLECTIVES=0,
  which runs them over the network: on one host, reduce-scatter combines in
  rank order with the same kernel on both paths, so the bits must match
  (across hosts the orders differ, so the two agree within rounding);
- a closed form for sums: every rank regenerates every rank's inputs and
  adds them as the path says it does (each host's ranks in rank order,
  rounded to the dtype, then the hosts in order), so the bits must match;
- this path's own out-of-place result, for the in-place and overlapping
  forms, and a second run, for determinism.
"""

import os
import time
import zlib

import torch
import torch.distributed as dist

import torch_smddp
from collective_oracle import settle
from mp_helpers import env_set

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.int32]
# Sizes straddle the 256 KiB pieces reduce-scatter reads in, with odd tails.
SIZES = [0, 1, 13, 4099, 65536 + 3, 300007]


def make(key, rank, dtype, n):
    g = torch.Generator().manual_seed(zlib.crc32(f"{key}/{rank}".encode()))
    if dtype.is_floating_point:
        return torch.randn(n, generator=g).to(dtype)
    return torch.randint(-50, 50, (n,), generator=g).to(dtype)


class Checker:
    def __init__(self, rank, world):
        self.rank, self.world = rank, world
        self.cases, self.failures = 0, []

    def check(self, case, ok, detail=""):
        self.cases += 1
        if not ok:
            self.failures.append(f"rank {self.rank} {case} {detail}")

    def equal(self, case, got, want):
        settle()
        self.check(case, torch.equal(got, want),
                   f"got {got.flatten()[:4].tolist()} want {want.flatten()[:4].tolist()}")

    def close(self, case, got, want):
        settle()
        tol = 2e-2 if got.dtype in (torch.float16, torch.bfloat16) else 1e-5
        self.check(case, torch.allclose(got.double(), want.double(), rtol=tol, atol=tol),
                   f"max diff {(got.double() - want.double()).abs().max().item() if got.numel() else 0}")


def network_group(off=True):
    """An smddp group made with SMDDP_SHM_COLLECTIVES=0 on this rank (or not)."""
    with env_set(SMDDP_SHM_COLLECTIVES="0" if off else "1"):
        return dist.new_group(backend="smddp")


def one_rank_off(ck, rank, world, gloo):
    """SMDDP_SHM_COLLECTIVES=0 on the last rank only: every rank agrees on
    the network, and the results still match Gloo's."""
    mixed = network_group(off=rank == world - 1)
    path = torch_smddp.stats(mixed)["gather_scatter_path"]
    ck.check("one rank off: every rank takes the network", path.startswith("network"), path)
    x = make("mixed", rank, torch.float32, 999)
    got, want = torch.empty(999 * world), torch.empty(999 * world)
    dist.all_gather_into_tensor(got, x, group=mixed)
    dist.all_gather_into_tensor(want, x, group=gloo)
    ck.equal("one rank off: all_gather", got, want)
    dist.destroy_process_group(mixed)


def all_gathers(ck, rank, world, net, gloo, dtype, n):
    x = make(f"ag{dtype}{n}", rank, dtype, n)
    want = torch.empty(n * world, dtype=dtype)
    dist.all_gather_into_tensor(want, x, group=gloo)
    got = torch.empty(n * world, dtype=dtype)
    dist.all_gather_into_tensor(got, x)
    ck.equal(f"all_gather_into_tensor {dtype} n={n} vs gloo", got, want)
    alt = torch.empty(n * world, dtype=dtype)
    dist.all_gather_into_tensor(alt, x, group=net)
    ck.equal(f"all_gather_into_tensor {dtype} n={n} network path vs gloo", alt, want)
    outs = [torch.empty(n, dtype=dtype) for _ in range(world)]
    dist.all_gather(outs, x)
    ck.equal(f"all_gather list {dtype} n={n}", torch.cat(outs), want)
    # FSDP2's form: the input is this rank's own chunk of the output.
    buf = torch.zeros(n * world, dtype=dtype)
    buf.narrow(0, n * rank, n).copy_(x)
    dist.all_gather_into_tensor(buf, buf.narrow(0, n * rank, n))
    ck.equal(f"all_gather in place {dtype} n={n}", buf, want)
    # The input lies in the next rank's chunk of the output: the peers must
    # still read it as it was.
    clash = torch.zeros(n * world, dtype=dtype)
    mine = clash.narrow(0, n * ((rank + 1) % world), n)
    mine.copy_(x)
    dist.all_gather_into_tensor(clash, mine)
    ck.equal(f"all_gather input inside a peer's output chunk {dtype} n={n}", clash, want)


def ordered_sum(tensors, dtype):
    """Sums in the given order as reduceOrdered does: floats accumulate in
    f32 (16-bit ones rounded once at the end), integers in their own type."""
    if not dtype.is_floating_point:
        acc = tensors[0].clone()
        for t in tensors[1:]:
            acc += t
        return acc
    acc = tensors[0].float()
    for t in tensors[1:]:
        acc = acc + t.float()
    return acc.to(dtype)


def closed_form_block(key, dtype, n, world, hosts, owner, absolute=False, source=None):
    """Rank `owner`'s block of a SUM reduce-scatter of every rank's
    make(key, r, source or dtype, n * world), as the path adds it in
    `dtype` (of the absolute values with `absolute`)."""
    block = [make(key, r, source or dtype, n * world).narrow(0, n * owner, n).to(dtype)
             for r in range(world)]
    if absolute:
        block = [b.abs() for b in block]
    return hierarchy_sum(block, dtype, world, hosts)


def hierarchy_sum(block, dtype, world, hosts):
    """Every rank's block (by rank) summed as the path does: each host's
    ranks in rank order, then the hosts in order."""
    per_host = world // hosts
    if hosts == 1:
        return ordered_sum(block, dtype)
    sums = [ordered_sum(block[h * per_host:(h + 1) * per_host], dtype) for h in range(hosts)]
    return ordered_sum(sums, dtype)


def reduce_scatters(ck, rank, world, net, gloo, dtype, n, hosts=1):
    flat = make(f"rs{dtype}{n}", rank, dtype, n * world)
    ops = [("SUM", dist.ReduceOp.SUM), ("MAX", dist.ReduceOp.MAX)]
    if dtype.is_floating_point:
        ops.append(("AVG", dist.ReduceOp.AVG))
    for name, op in ops:
        case = f"reduce_scatter_tensor {name} {dtype} n={n}"
        got = torch.empty(n, dtype=dtype)
        dist.reduce_scatter_tensor(got, flat.clone(), op=op)
        alt = torch.empty(n, dtype=dtype)
        dist.reduce_scatter_tensor(alt, flat.clone(), op=op, group=net)
        if hosts == 1 or not dtype.is_floating_point or name == "MAX":
            ck.equal(case + " vs the network path (bitwise)", got, alt)
        elif dtype == torch.float32:  # 16-bit: the closed form and Gloo's bound below
            ck.close(case + " vs the network path", got, alt)
        if name == "SUM":
            want = closed_form_block(f"rs{dtype}{n}", dtype, n, world, hosts, rank)
            ck.equal(case + " vs the closed form (bitwise)", got, want)
        again = torch.empty(n, dtype=dtype)
        dist.reduce_scatter_tensor(again, flat.clone(), op=op)
        ck.equal(case + " run twice (bitwise)", again, got)
        if op != dist.ReduceOp.AVG:  # Gloo has no AVG
            ref = torch.empty(n, dtype=dtype)
            dist.reduce_scatter_tensor(ref, flat.clone(), op=op, group=gloo)
            if dtype in (torch.float16, torch.bfloat16) and name == "SUM":
                # Both round to 16 bits along the way (Gloo at every step):
                # each is within (world + 1) roundings of sum |x| of the
                # exact sum, so they are within twice that of each other.
                eps = 2.0 ** -8 if dtype == torch.bfloat16 else 2.0 ** -11
                absum = closed_form_block(f"rs{dtype}{n}", torch.float64, n, world, 1, rank,
                                          absolute=True, source=dtype)
                settle()
                err = (got.double() - ref.double()).abs()
                ck.check(case + " vs gloo (within 16-bit rounding)",
                         bool((err <= 2 * (world + 1) * eps * absum + 1e-6).all()),
                         f"max diff {err.max().item() if n else 0}")
            else:
                (ck.equal if not dtype.is_floating_point else ck.close)(case + " vs gloo", got, ref)
        inplace = flat.clone()
        dist.reduce_scatter_tensor(inplace.narrow(0, n * rank, n), inplace, op=op)
        ck.equal(case + " in place", inplace.narrow(0, n * rank, n), got)
        # The output is the next rank's block of the input, which that rank
        # reads while this one writes.
        clash = flat.clone()
        dist.reduce_scatter_tensor(clash.narrow(0, n * ((rank + 1) % world), n), clash, op=op)
        ck.equal(case + " output inside a peer's block", clash.narrow(0, n * ((rank + 1) % world), n), got)
    ins = [make(f"rsl{dtype}{n}{q}", rank, dtype, n) for q in range(world)]
    got = torch.empty(n, dtype=dtype)
    dist.reduce_scatter(got, [t.clone() for t in ins])
    alt = torch.empty(n, dtype=dtype)
    dist.reduce_scatter(alt, [t.clone() for t in ins], group=net)
    if hosts == 1 or not dtype.is_floating_point:
        ck.equal(f"reduce_scatter list {dtype} n={n} vs the network path", got, alt)
    elif dtype == torch.float32:
        ck.close(f"reduce_scatter list {dtype} n={n} vs the network path", got, alt)
    want = hierarchy_sum([make(f"rsl{dtype}{n}{rank}", r, dtype, n) for r in range(world)],
                         dtype, world, hosts)
    ck.equal(f"reduce_scatter list {dtype} n={n} vs the closed form (bitwise)", got, want)


def narrow_crossing(ck, rank, world, hosts, gloo):
    """A group whose f32 sums cross hosts in bf16 (cross_host_dtype): each
    host's sum of a reduce-scatter block is rounded to bf16 once (this
    host's own too) and the hosts' are added in f32, in host order; an
    all-gather and every other dtype are not narrowed."""
    narrow = dist.new_group(backend="smddp",
                            pg_options=torch_smddp.Options(cross_host_dtype="bf16"))
    path = torch_smddp.stats(narrow)["gather_scatter_path"]
    ck.check("bf16 crossing: the path says so", "cross in bf" in path, path)
    per_host = world // hosts
    for n in (13, 70001):
        key = f"narrow{n}"
        flat = make(key, rank, torch.float32, n * world)
        got = torch.empty(n)
        dist.reduce_scatter_tensor(got, flat.clone(), group=narrow)
        block = [make(key, r, torch.float32, n * world).narrow(0, n * rank, n) for r in range(world)]
        sums = [ordered_sum(block[h * per_host:(h + 1) * per_host], torch.float32)
                for h in range(hosts)]
        want = ordered_sum([s.to(torch.bfloat16).float() for s in sums], torch.float32)
        ck.equal(f"bf16 crossing: reduce_scatter SUM n={n} vs the closed form (bitwise)", got, want)
        exact = ordered_sum(block, torch.float64)
        ck.check(f"bf16 crossing: reduce_scatter SUM n={n} did round",
                 hosts == 1 or not torch.equal(got.double(), exact.float().double()))
        avg = torch.empty(n)
        dist.reduce_scatter_tensor(avg, flat.clone(), op=dist.ReduceOp.AVG, group=narrow)
        ck.close(f"bf16 crossing: reduce_scatter AVG n={n} is the SUM over the world", avg,
                 want / world)
        same = torch.empty(n * world)
        dist.all_gather_into_tensor(same, flat.narrow(0, 0, n), group=narrow)
        ref = torch.empty(n * world)
        dist.all_gather_into_tensor(ref, flat.narrow(0, 0, n), group=gloo)
        ck.equal(f"bf16 crossing: all_gather f32 n={n} is not narrowed", same, ref)
        for dtype in (torch.bfloat16, torch.int32):
            x = make(key, rank, dtype, n * world)
            a, b = torch.empty(n, dtype=dtype), torch.empty(n, dtype=dtype)
            dist.reduce_scatter_tensor(a, x.clone(), group=narrow)
            dist.reduce_scatter_tensor(b, x.clone())
            ck.equal(f"bf16 crossing: reduce_scatter {dtype} n={n} as without it", a, b)
    dist.destroy_process_group(narrow)


def pairwise_rounds(ck, rank, world, hosts, gloo):
    """A group made with SMDDP_ROUNDS_MIN_BYTES=1 crosses hosts in pairwise
    rounds (round k to host + k, clocked by what arrives) for every call:
    the schedule changes, not the sums, so all-gather is Gloo's and
    reduce-scatter the closed form, bitwise, with the narrow crossing too."""
    with env_set(SMDDP_ROUNDS_MIN_BYTES="1"):
        rounds = dist.new_group(backend="smddp")
        narrow = dist.new_group(backend="smddp",
                                pg_options=torch_smddp.Options(cross_host_dtype="bf16"))
    path = torch_smddp.stats(rounds)["gather_scatter_path"]
    ck.check("rounds: the path says so", "pairwise rounds for calls of 0 KiB" in path, path)
    before = torch_smddp.stats(rounds)["rounds_calls"]
    calls = 0
    for dtype in (torch.float32, torch.bfloat16, torch.int32):
        for n in (13, 70001):
            x = make(f"rounds{dtype}{n}", rank, dtype, n)
            got, want = torch.empty(n * world, dtype=dtype), torch.empty(n * world, dtype=dtype)
            dist.all_gather_into_tensor(got, x, group=rounds)
            dist.all_gather_into_tensor(want, x, group=gloo)
            ck.equal(f"rounds: all_gather {dtype} n={n} vs gloo", got, want)
            key = f"roundsrs{dtype}{n}"
            flat = make(key, rank, dtype, n * world)
            out = torch.empty(n, dtype=dtype)
            dist.reduce_scatter_tensor(out, flat.clone(), group=rounds)
            ck.equal(f"rounds: reduce_scatter SUM {dtype} n={n} vs the closed form (bitwise)",
                     out, closed_form_block(key, dtype, n, world, hosts, rank))
            calls += 2
    n = 70001
    flat = make("roundsnarrow", rank, torch.float32, n * world)
    got = torch.empty(n)
    dist.reduce_scatter_tensor(got, flat.clone(), group=narrow)
    block = [make("roundsnarrow", r, torch.float32, n * world).narrow(0, n * rank, n)
             for r in range(world)]
    per_host = world // hosts
    sums = [ordered_sum(block[h * per_host:(h + 1) * per_host], torch.float32) for h in range(hosts)]
    want = ordered_sum([s.to(torch.bfloat16).float() for s in sums], torch.float32)
    ck.equal("rounds: bf16 crossing reduce_scatter vs the closed form (bitwise)", got, want)
    ran = torch_smddp.stats(rounds)["rounds_calls"] - before
    ck.check("rounds: every call ran in rounds", ran == calls, f"{ran} of {calls}")
    ck.check("rounds: the default group does not (4 MiB and up only)",
             "pairwise rounds for calls of 4096 KiB" in torch_smddp.stats()["gather_scatter_path"],
             torch_smddp.stats()["gather_scatter_path"])
    dist.destroy_process_group(narrow)
    dist.destroy_process_group(rounds)


def queued(ck, rank, world, gloo):
    """Async calls queue and complete in any wait order."""
    xs = [make(f"q{i}", rank, torch.float32, 1000 + 17 * i) for i in range(6)]
    outs = [torch.empty(x.numel() * world) for x in xs]
    works = [dist.all_gather_into_tensor(o, x, async_op=True) for o, x in zip(outs, xs)]
    rs_in = make("qrs", rank, torch.float32, 4096 * world)
    rs_out = torch.empty(4096)
    works.append(dist.reduce_scatter_tensor(rs_out, rs_in.clone(), async_op=True))
    for w in reversed(works):
        w.wait()
    for i, (o, x) in enumerate(zip(outs, xs)):
        want = torch.empty_like(o)
        dist.all_gather_into_tensor(want, x, group=gloo)
        ck.equal(f"queued all_gather {i}", o, want)
    ref = torch.empty(4096)
    dist.reduce_scatter_tensor(ref, rs_in.clone(), group=gloo)
    ck.close("queued reduce_scatter", rs_out, ref)


def rings(ck, rank, world):
    """All-gather on one host takes each rank's ring in the host segment (8
    slots of 128 KiB) once a rank receives 4 MiB ((world - 1) x the part)
    at world 3 and up, and reads the peers' buffers below (and at world 2): parts of many ring turns, ending in a partial slot or a whole
    one, in three dtypes, queued back to back with small parts and a
    reduce-scatter between, each against the parts regenerated here. The
    last part (17 MiB) is past the size from which the wire's chunking
    (splitChunks) would cut chunks larger than a slot."""
    shapes = [(torch.float32, 2_000_003), (torch.bfloat16, 2_097_153), (torch.int64, 16384),
              (torch.uint8, 7), (torch.float32, 1 << 20), (torch.int64, 524_291)]
    calls = [(f"ring{i}", dtype, n) for i, (dtype, n) in enumerate(shapes * 2)]
    calls.append(("ringbig", torch.uint8, 18_000_001))
    works, outs = [], []
    rs_in = make("ringrs", rank, torch.float32, 70001 * world)
    rs_out = torch.empty(70001)
    for i, (key, dtype, n) in enumerate(calls):
        out = torch.empty(n * world, dtype=dtype)
        works.append(dist.all_gather_into_tensor(out, make(key, rank, dtype, n), async_op=True))
        outs.append(out)
        if i == 4:
            works.append(dist.reduce_scatter_tensor(rs_out, rs_in.clone(), async_op=True))
    for w in works:
        w.wait()
    for (key, dtype, n), out in zip(calls, outs):
        want = torch.cat([make(key, r, dtype, n) for r in range(world)])
        ck.equal(f"ring all_gather {key} ({dtype}, {n})", out, want)
    want = closed_form_block("ringrs", torch.float32, 70001, world, 1, rank)
    ck.equal("reduce_scatter between ring all_gathers", rs_out, want)


def mismatch(ck, rank, world):
    """Different sizes on one rank: every rank fails, naming it; the group
    is still usable afterwards."""
    n = 10 if rank == 0 else 12
    try:
        dist.all_gather_into_tensor(torch.empty(n * world), torch.ones(n))
        ck.check("mismatched all_gather raises", False, "no error")
    except Exception as e:  # noqa: BLE001
        text = str(e)
        ck.check("mismatched all_gather names the other call", "rank" in text and "elements" in text, text[:300])
    x = torch.full((5,), float(rank))
    out = torch.empty(5 * world)
    dist.all_gather_into_tensor(out, x)
    ck.equal("all_gather after a mismatch", out,
             torch.cat([torch.full((5,), float(q)) for q in range(world)]))


def any_rank(gloo, flag):
    """Whether `flag` holds on any rank (every rank gets the same answer)."""
    t = torch.tensor([1 if flag else 0])
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=gloo)
    return bool(t.item())


def caller_runs(ck, rank, world, gloo, counted=True):
    """Synchronous calls (async_op=False) of every collective run on the
    caller's thread when the engine is idle, as all_reduce's do: counted by
    stats()["calls_run_by_caller"]; results against closed forms. Async
    calls never do."""
    def ran(fn, reps=6):
        before = torch_smddp.stats()["calls_run_by_caller"]
        for _ in range(reps):
            fn()
        return torch_smddp.stats()["calls_run_by_caller"] - before

    def on_caller(name, fn):
        # At least half, not all: a caller waits at most 10 ms for the
        # engine thread to settle (docs/notes/2026-12-07-caller-convoy.md),
        # so under CI's load some calls may still queue. If any rank ran
        # fewer, every rank pauses, letting every engine thread park, and
        # runs the six again, up to three more times; a build whose calls
        # never run on the caller fails every try.
        tries = []
        while True:
            got = ran(fn)
            tries.append(got)
            if not counted or not any_rank(gloo, got < 3) or len(tries) == 4:
                break
            time.sleep(0.05)
        if counted:
            recent = [(e["on_caller"], e["state"]) for e in torch_smddp.flight_recorder()[-6:]]
            ck.check(f"synchronous {name} runs on the caller", got >= 3,
                     f"{got} of 6; tries {tries}; last six (on_caller, state) {recent}")

    n = 1000
    x = torch.full((n,), float(rank + 1))
    whole = torch.cat([torch.full((n,), float(q + 1)) for q in range(world)])
    out = torch.empty(n * world)
    rs_out = torch.empty(n)
    outs = [torch.empty(n) for _ in range(world)]
    b = torch.empty(n)
    a2a = torch.empty(n * world)
    calls = {
        "all_gather_into_tensor": lambda: dist.all_gather_into_tensor(out, x),
        "reduce_scatter_tensor": lambda: dist.reduce_scatter_tensor(rs_out, whole),
        "all_gather": lambda: dist.all_gather(outs, x),
        "broadcast": lambda: (b.fill_(float(rank)), dist.broadcast(b, src=world - 1)),
        "all_to_all_single": lambda: dist.all_to_all_single(a2a, whole),
    }
    for name, fn in calls.items():
        on_caller(name, fn)
    ck.equal("all_gather_into_tensor on the caller", out, whole)
    ck.equal("reduce_scatter_tensor on the caller", rs_out,
             torch.full((n,), float(world * (rank + 1))))  # every rank's block r is r + 1
    ck.equal("all_gather on the caller", torch.cat(outs), whole)
    ck.equal("broadcast on the caller", b, torch.full((n,), float(world - 1)))
    ck.equal("all_to_all_single on the caller", a2a, torch.full((n * world,), float(rank + 1)))
    got = ran(lambda: dist.all_gather_into_tensor(out, x, async_op=True).wait())
    ck.check("asynchronous all_gather_into_tensor stays on the engine thread", got == 0, str(got))
    if counted:
        first_calls_of_new_groups(ck, x, out)


def first_calls_of_new_groups(ck, x, out, groups=10, calls=12):
    """A new group's first synchronous calls run on the caller too. A call
    that finds the engine thread still completing the call before (or not
    started yet) waits for it to park: queued instead, it kept the engine
    busy into the next call, whose caller then queued too, for up to 10 of
    12 calls (Communicator::engineSettling_). Each group may queue one
    call (a wait that ran out on a loaded machine)."""
    queued = []
    for _ in range(groups):
        g = dist.new_group(backend="smddp")
        before = torch_smddp.stats(g)["calls_run_by_caller"]
        for _ in range(calls):
            dist.all_gather_into_tensor(out, x, group=g)
        queued.append(calls - (torch_smddp.stats(g)["calls_run_by_caller"] - before))
        dist.destroy_process_group(g)
    ck.check("a new group's first synchronous calls run on the caller", max(queued) <= 1,
             f"queued of {calls}, per group: {queued}")


def run(rank, world, hosts=1, sizes=SIZES):
    """Every case; `hosts` hosts of world / hosts ranks each (rank r on host
    r // (world / hosts), as torchrun numbers them)."""
    ck = Checker(rank, world)
    gloo = dist.new_group(backend="gloo")
    net = network_group()
    path = torch_smddp.stats()["gather_scatter_path"]
    want_path, record_path = (("shared memory", "shared-memory") if hosts == 1
                              else ("hierarchy", "hierarchy"))
    ck.check(f"default group's path is {want_path}", path.startswith(want_path), path)
    if hosts == 1:
        # Two ranks read each other's buffers at every size (host_collectives.cc,
        # kRingsFromRanks).
        ck.check("one host's all-gather goes through the rings from three ranks",
                 ("ring" in path) == (world >= 3), path)
    net_path = torch_smddp.stats(net)["gather_scatter_path"]
    ck.check("SMDDP_SHM_COLLECTIVES=0 group uses the network", net_path.startswith("network"), net_path)
    for dtype in DTYPES:
        for n in sizes:
            all_gathers(ck, rank, world, net, gloo, dtype, n)
            reduce_scatters(ck, rank, world, net, gloo, dtype, n, hosts)
    if hosts > 1:
        narrow_crossing(ck, rank, world, hosts, gloo)
    if hosts > 2:
        pairwise_rounds(ck, rank, world, hosts, gloo)
    queued(ck, rank, world, gloo)
    if hosts == 1:
        rings(ck, rank, world)
    if hosts == 1 and os.environ.get("SMDDP_STAGE_BYTES"):
        from cases_pieces import fsdp_in_pieces, pieces  # it imports this module's oracles
        pieces(ck, rank, world)
        fsdp_in_pieces(ck, rank, world, gloo)
    if hosts == 1:
        from cases_eager import eager  # small all-gathers that leave early
        eager(ck, rank, world, gloo)
    record = [e for e in torch_smddp.flight_recorder()
              if e["collective"] in ("allgather", "reduce_scatter") and e["state"] == "completed"]
    ck.check(f"the flight recorder says {record_path}",
             bool(record) and all(e["path"] == record_path for e in record),
             str({e["path"] for e in record}))
    net_record = [e for e in torch_smddp.flight_recorder(net) if e["collective"] == "allgather"]
    ck.check("the network group's record says network",
             bool(net_record) and all(e["path"] == "network" for e in net_record))
    one_rank_off(ck, rank, world, gloo)
    mismatch(ck, rank, world)
    # Across hosts the engine thread may still be finishing the last call's
    # sends when the next comes (the call then queues): counted on one host.
    caller_runs(ck, rank, world, gloo, counted=hosts == 1)
    if os.environ.get("SMDDP_SHARED_POOL_BYTES") == "0":
        # The job without a pool: nothing is staged, every read is private.
        backend = dist.group.WORLD._get_backend(torch.device("cpu"))
        ck.check("no pool: smddp does not allocate tensors", not backend.supports_tensor_alloc(
            torch.device("cpu")))
        ck.check("no pool: nothing was read from a pool",
                 torch_smddp.stats()["pool_read_bytes"] == 0,
                 str(torch_smddp.stats()["pool_read_bytes"]))
    else:
        from cases_shared_pool import pooled  # it imports this module's oracles
        pooled(ck, rank, world, hosts)
    return {"cases": ck.cases, "failures": ck.failures}
