"""Rank functions of test_device_sim.py (run by mp_harness.run_world), on the
simulated device that follows CUDA's rules (torch_smddp.testing). A host
read of a collective's result is made only after sim_synchronize() (or an
event that orders it), as a CUDA test would after torch.cuda.synchronize().
The harness itself checks, after every rank function, that no rule of
CUDA's was broken and that the rank made a context only on its own device.
The NCCL route's cases (SMDDP_INTRA=nccl) are in cases_nccl_route.py.
"""
import os
import time


def _settle():
    import torch_smddp.testing as sim
    sim.sim_synchronize()


def device_errors(rank, world):
    """Calls on devices the backend cannot serve fail at once, naming the
    collective and the device; the group still works afterwards."""
    import torch
    import torch.distributed as dist

    import torch_smddp

    out = {"built_with_cuda": torch_smddp._C.built_with_cuda()}
    cases = {
        "mixed all_gather": lambda: dist.all_gather(
            [torch.zeros(4, device="meta") for _ in range(world)], torch.ones(4)),
    }
    for name, fn in cases.items():
        try:
            fn()
            out[name] = None
        except Exception as e:  # noqa: BLE001
            out[name] = f"{type(e).__name__}: {e}"
    t = torch.ones(8)
    dist.all_reduce(t)
    _settle()
    out["after_ok"] = bool(torch.equal(t, torch.full((8,), float(world))))
    return out


def cuda_rules(rank, world):
    """Each of the GPU path's rules, checked in one job; returns
    {check: None when it held, else what was seen}."""
    import torch
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import _coalescing_manager

    import torch_smddp.testing as sim

    res = {}
    total = float(sum(r + 1 for r in range(world)))

    # A kernel on the caller's stream writes the input; the collective is
    # issued right behind it and must read what the kernel wrote.
    t = torch.zeros(70000)
    sim.sim_fill_(t, float(rank + 1))
    dist.all_reduce(t)
    sim.sim_synchronize()
    res["readiness"] = None if bool((t == total).all()) else f"got {t[:3].tolist()}, want {total}"

    # Chained calls on one tensor, no host wait between: the stream orders them.
    t = torch.full((40000,), float(rank + 1))
    w1 = dist.all_reduce(t, async_op=True)
    w1.wait()
    w2 = dist.all_reduce(t, async_op=True)
    w2.wait()
    sim.sim_synchronize()
    res["chained"] = None if bool((t == total * world).all()) else f"got {t[:3].tolist()}"

    # PREMUL_SUM with a factor tensor a kernel writes: the factor reaches
    # the host through a device copy, behind the readiness event.
    factor = torch.zeros(1)
    sim.sim_fill_(factor, 0.5)
    t = torch.full((5000,), float(rank + 1))
    dist.all_reduce(t, op=dist._make_nccl_premul_sum(factor))
    sim.sim_synchronize()
    copies = sim.sim_copies_from(factor)
    good = bool(torch.allclose(t, torch.full_like(t, 0.5 * total))) and copies >= 1
    res["premul_factor"] = None if good else f"got {t[:2].tolist()}, copies from the factor {copies}"

    # A collective under graph capture: a clear error naming it, and the
    # group still works afterwards.
    try:
        with sim.sim_capture():
            dist.all_reduce(torch.ones(8))
        res["capture"] = "no error under capture"
    except RuntimeError as e:
        msg = str(e)
        res["capture"] = None if ("all_reduce" in msg and "captur" in msg) else msg[:300]
    t = torch.ones(8)
    dist.all_reduce(t)
    sim.sim_synchronize()
    if not bool((t == world).all()):
        res["capture"] = f"group broken after the refused capture: {t.tolist()}"

    # channels_last tensors, as NCCL takes them.
    x = torch.arange(2 * 3 * 4 * 5, dtype=torch.float32).reshape(2, 3, 4, 5) + rank
    x = x.to(memory_format=torch.channels_last)
    want = (torch.arange(2 * 3 * 4 * 5, dtype=torch.float32).reshape(2, 3, 4, 5) * world
            + world * (world - 1) / 2)
    dist.all_reduce(x)
    outs = [torch.empty(2, 3, 4, 5).to(memory_format=torch.channels_last) for _ in range(world)]
    src = (torch.ones(2, 3, 4, 5) * rank).to(memory_format=torch.channels_last)
    dist.all_gather(outs, src)
    sim.sim_synchronize()
    ok = torch.equal(x, want) and all(torch.equal(o, torch.ones(2, 3, 4, 5) * r) for r, o in enumerate(outs))
    res["channels_last"] = None if ok else "wrong results for channels_last tensors"

    # FSDP's collectives are chunked: many copies from one large input.
    n = 48 << 10  # 192 KiB of float32 per rank, 16 KiB chunks
    inp = torch.arange(n, dtype=torch.float32) + rank * n
    gathered = torch.empty(world * n)
    dist.all_gather_into_tensor(gathered, inp)
    big = torch.arange(world * n, dtype=torch.float32) + rank
    part = torch.empty(n)
    dist.reduce_scatter_tensor(part, big)
    sim.sim_synchronize()
    gather_ok = torch.equal(gathered, torch.arange(world * n, dtype=torch.float32))
    want_part = (torch.arange(n, dtype=torch.float32) + rank * n) * world + world * (world - 1) / 2
    copies = sim.sim_copies_from(inp)
    ok = gather_ok and torch.equal(part, want_part) and copies > 4
    res["fsdp_chunked"] = None if ok else f"gather {gather_ok}, copies from the input {copies}"

    # barrier() orders device work, as NCCL's does: after it, a host read
    # of an earlier async call's result is correct with no synchronize.
    t = torch.full((200000,), float(rank + 1))
    dist.all_reduce(t, async_op=True)
    dist.barrier()
    res["barrier_orders"] = None if bool((t == total).all()) else f"read after barrier: {t[:2].tolist()}"

    # Any-source receive names its sender.
    if world >= 2 and rank in (0, 1):
        buf = torch.zeros(16)
        if rank == 1:
            dist.send(torch.full((16,), 9.0), dst=0)
            res["any_source"] = None
        else:
            src_rank = dist.recv(buf)
            sim.sim_synchronize()
            ok = src_rank == 1 and bool((buf == 9).all())
            res["any_source"] = None if ok else f"recv() returned {src_rank}, data {buf[:2].tolist()}"

    # The profiler sees the call under its title, begun and finished.
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        dist.all_reduce(torch.ones(64))
        sim.sim_synchronize()
    names = {e.key for e in prof.key_averages()}
    res["profiler"] = None if any("smddp:all_reduce" in k for k in names) else sorted(names)[:20]

    res["contexts"] = None if sim.sim_contexts() == [rank] else sim.sim_contexts()
    return res


def destroy_then_free(rank, world):
    """Groups come and go while tensors they touched live on: freeing them
    after the group is destroyed must not touch a stream that is gone, a
    Work must stay usable after its group, and an abort with copies in
    flight must not free memory they still write (the harness checks the
    stand-in's record of broken rules)."""
    import torch
    import torch.distributed as dist

    import torch_smddp.testing as sim

    res = {}
    g = dist.new_group(backend="smddp")
    kept = [torch.full((9000,), float(rank + i)) for i in range(4)]
    works = [dist.all_reduce(t, group=g, async_op=True) for t in kept]
    dist.destroy_process_group(g)
    # The Works outlive their group: wait() and the future still answer.
    answers = []
    for w in works:
        try:
            w.wait()
            answers.append(w.is_completed())
        except RuntimeError as e:
            answers.append(str(e)[:80])
    res["work_after_destroy"] = answers
    sim.sim_synchronize()
    del kept, works  # freed after the group's streams would be gone

    # Abort with slow copies in flight.
    g = dist.new_group(backend="smddp")
    busy = [torch.full((300000,), 1.0) for _ in range(3)]
    for t in busy:
        dist.all_reduce(t, group=g, async_op=True)
    g._get_backend(torch.device("cpu")).abort()
    dist.destroy_process_group(g)
    sim.sim_synchronize()
    del busy
    res["violations"] = sim.sim_violations()
    return res


def p2p_any_order(rank, world):
    """Rings of isend/irecv in every order and batch_isend_irecv, checked
    against the closed form (run with one hardware queue)."""
    import torch
    import torch.distributed as dist

    import torch_smddp.testing as sim

    right, left = (rank + 1) % world, (rank - 1) % world
    res = {}
    for order in ("recv_first", "send_first", "by_parity"):
        out = torch.full((1 << 16,), float(rank))
        inp = torch.zeros(1 << 16)
        recv_first = order == "recv_first" or (order == "by_parity" and rank % 2 == 0)
        if recv_first:
            r = dist.irecv(inp, src=left)
            s = dist.isend(out, dst=right)
        else:
            s = dist.isend(out, dst=right)
            r = dist.irecv(inp, src=left)
        r.wait()
        s.wait()
        sim.sim_synchronize()
        res[order] = None if bool((inp == left).all()) else inp[:2].tolist()
    inp = torch.zeros(1000)
    ops = [dist.P2POp(dist.irecv, inp, left), dist.P2POp(dist.isend, torch.full((1000,), float(rank)), right)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    sim.sim_synchronize()
    res["batch"] = None if bool((inp == left).all()) else inp[:2].tolist()
    t = torch.full((100000,), 1.0)
    dist.all_reduce(t)
    sim.sim_synchronize()
    res["collective_after"] = None if bool((t == world).all()) else t[:2].tolist()
    return res


def compute_not_held(rank, world):
    """One hardware queue. Rank 1 joins an all_reduce late; meanwhile
    rank 0's kernels launched after the collective must run."""
    import torch
    import torch.distributed as dist

    import torch_smddp.testing as sim

    t = torch.ones(100000)
    if rank != 0:
        time.sleep(2.0)
        dist.all_reduce(t)
        sim.sim_synchronize()
        return {"ran_meanwhile": None, "result_ok": bool((t == world).all())}
    w = dist.all_reduce(t, async_op=True)
    z = torch.zeros(1000)
    sim.sim_fill_(z, 3.0)
    ev = sim.sim_record()
    start = time.monotonic()
    while not ev.query() and time.monotonic() - start < 1.5:
        time.sleep(0.001)
    ran = ev.query()
    w.wait()
    sim.sim_synchronize()
    return {"ran_meanwhile": ran and bool((z == 3).all()), "result_ok": bool((t == world).all())}


def sync_peer_death(rank, world, victim):
    """The victim is SIGKILLed while the others are inside a synchronous
    all_reduce: that call raises, and its tensor keeps its own input (no
    staging memory is ever copied into it)."""
    import torch
    import torch.distributed as dist

    import torch_smddp.testing as sim

    # Other calls' staging first, so a wrong copy back would show their data.
    for i in range(3):
        x = torch.full((50000,), 100.0 + i)
        dist.all_reduce(x)
    if rank == victim:
        time.sleep(1.0)
        os.kill(os.getpid(), 9)
    t = torch.full((50000,), float(rank + 1))
    start = time.monotonic()
    try:
        dist.all_reduce(t)
        raised, msg = False, ""
    except Exception as e:  # noqa: BLE001
        raised, msg = True, str(e)
    elapsed = time.monotonic() - start
    try:
        sim.sim_synchronize(timeout=10)
    except RuntimeError:
        pass
    return {"raised": raised, "msg": msg[:400], "elapsed": elapsed,
            "kept_input": bool((t == rank + 1).all()), "values": sorted(set(t.tolist()))[:4]}


def pair_first_call(rank, world):
    """World 3: ranks 0 and 1 make their first device call, a send/recv,
    while rank 2 makes none; they must not wait for rank 2."""
    import torch
    import torch.distributed as dist

    import torch_smddp.testing as sim

    if rank == 2:
        time.sleep(4.0)
        return {"elapsed": 0.0, "ok": True}
    start = time.monotonic()
    buf = torch.full((1000,), float(rank))
    if rank == 0:
        dist.send(buf, dst=1)
    else:
        dist.recv(buf, src=0)
    sim.sim_synchronize()
    return {"elapsed": time.monotonic() - start, "ok": bool((buf == 0).all())}


def coalesced_stream_order(rank, world):
    """Coalesced blocks (_coalescing_manager, batch_isend_irecv): the block's
    Work orders the caller's stream after every call's copies back. Run with
    slow copies back, so that an event recorded right after cm.wait()
    completes long before them unless the stream waits for them."""
    import torch
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import _coalescing_manager

    import torch_smddp.testing as sim

    res = {}
    total = float(sum(r + 1 for r in range(world)))
    a, b = torch.full((6000,), float(rank + 1)), torch.full((7,), float(rank + 1))
    # device= takes c10d's start/endCoalescing path (each call issued as it
    # comes, one Work from endCoalescing), as FSDP's and NCCL users' code does.
    with _coalescing_manager(device=torch.device("cpu"), async_ops=True) as cm:
        dist.all_reduce(a)
        dist.all_reduce(b)
    cm.wait()
    ev = sim.sim_record()
    deadline = time.monotonic() + 60
    while not ev.query() and time.monotonic() < deadline:
        time.sleep(0.001)
    ok = bool((a == total).all()) and bool((b == total).all())
    res["coalesced"] = None if ok else f"read after the stream's event: {a[:2].tolist()} {b.tolist()}"

    right, left = (rank + 1) % world, (rank - 1) % world
    inp = torch.zeros(3000)
    ops = [dist.P2POp(dist.irecv, inp, left), dist.P2POp(dist.isend, torch.full((3000,), float(rank)), right)]
    works = dist.batch_isend_irecv(ops)
    works[-1].wait()  # the block's Work, as DDP-free pipelines wait on it
    ev = sim.sim_record()
    while not ev.query() and time.monotonic() < deadline:
        time.sleep(0.001)
    res["batch_isend_irecv"] = None if bool((inp == left).all()) else f"read after the event: {inp[:2].tolist()}"

    # And after sim_synchronize(), whatever the stream did.
    c = [torch.full((1000 * (i + 1),), float(rank + i)) for i in range(3)]
    with _coalescing_manager(async_ops=True) as cm:
        for t in c:
            dist.all_reduce(t)
    cm.wait()
    sim.sim_synchronize()
    ok = all(bool((t == total - world + world * i).all()) for i, t in enumerate(c))
    res["after_synchronize"] = None if ok else [t[:1].tolist() for t in c]
    return res


def dropped_works(rank, world):
    """Calls whose Work and future the caller drops at once, so the
    library's own threads let go of the last reference (and with it the
    events of the call's copies back): every thread that does must be
    bound to the rank's device, or it makes a context on device 0, as
    torch's destroyEvent does on a GPU (issue 53, defect 2). The harness
    checks the contexts after the run."""
    import torch
    import torch.distributed as dist

    import torch_smddp.testing as sim

    kept = []
    for i in range(20):
        t = torch.full((3000,), float(rank + i))
        kept.append(t)
        w = dist.all_reduce(t, async_op=True)
        # A callback on the completion pool that outlasts the copies back,
        # so the pool's task lets go of the call's events last.
        w.get_future().then(lambda f: time.sleep(0.05))
        del w
    last = torch.ones(4)
    dist.all_reduce(last)  # calls end in order: every earlier one has too
    sim.sim_synchronize()
    time.sleep(0.2)  # the callbacks end
    total = float(sum(range(world)))
    ok = all(bool((t == total + world * i).all()) for i, t in enumerate(kept))
    return {"ok": ok, "contexts": sim.sim_contexts()}


def p2p_late_peer(rank, world):
    """A pipeline-parallel order that works on NCCL, at world 3 (issue 53,
    defect 6): rank 0 isends a large tensor to rank 1, then a small one to
    rank 2. Rank 2 waits for that small one before it sends to rank 1, and
    rank 1 posts its receive from rank 0 only after rank 2's has arrived.
    A send to one peer must therefore not wait behind a send to another.
    Also checks that sends to one peer keep their order (NCCL's rule)."""
    import torch
    import torch.distributed as dist

    import torch_smddp.testing as sim

    big, small = 1 << 22, 1000  # 16 MiB of float32, and 4 KB
    res = {}
    if rank == 0:
        works = [dist.isend(torch.arange(big, dtype=torch.float32), dst=1),
                 dist.isend(torch.full((small,), 7.0), dst=2),
                 dist.isend(torch.full((small,), 8.0), dst=2)]
        for w in works:
            w.wait()
    elif rank == 2:
        first, second = torch.zeros(small), torch.zeros(small)
        dist.recv(first, src=0)
        dist.recv(second, src=0)
        sim.sim_synchronize()
        res["in order from 0"] = None if bool((first == 7).all() and (second == 8).all()) else [
            first[0].item(), second[0].item()]
        dist.send(first + 1, dst=1)
    else:
        from2, from0 = torch.zeros(small), torch.zeros(big)
        dist.recv(from2, src=2)
        dist.recv(from0, src=0)
        sim.sim_synchronize()
        res["from 2"] = None if bool((from2 == 8).all()) else from2[:2].tolist()
        want = torch.arange(big, dtype=torch.float32)
        res["from 0"] = None if bool(torch.equal(from0, want)) else from0[:2].tolist()
    sim.sim_synchronize()
    return res


def barrier_orders_p2p(rank, world, warm=True):
    """A barrier orders this rank's earlier sends and receives too, as it
    orders its collectives (issue 53, defect 8): rank 0's irecv from rank
    1, which sends only after its own barrier and a pause, has completed
    with its data once rank 0's barrier returns. Before, the barrier
    waited for the collective lane alone. With warm=False no rank makes a
    collective first, so ranks 1 and 2 reach the barrier with no device
    call made: they must still take the device path rank 0's barrier takes
    (before, they ran it on the CPU path, which rank 0's never met, and
    every rank timed out)."""
    import torch
    import torch.distributed as dist

    n = 1 << 16
    res = {}
    if warm:
        dist.all_reduce(torch.ones(4))
    if rank == 0:
        got = torch.zeros(n)
        w = dist.irecv(got, src=1)
        dist.barrier()
        res["recv completed at the barrier"] = None if w.is_completed() else "still pending"
        res["data at the barrier"] = None if bool((got == 5).all()) else got[:2].tolist()
        w.wait()
    elif rank == 1:
        dist.barrier()
        time.sleep(0.5)  # makes a barrier that ignores the receive return first
        dist.send(torch.full((n,), 5.0), dst=0)
    else:
        dist.barrier()
    dist.all_reduce(torch.ones(4))  # no rank leaves (a lost peer) before rank 0's receive
    _settle()
    return res


MOVED_ONLY = ("int16", "uint16", "uint32", "uint64", "float8_e4m3fn", "float8_e5m2")


def moved_only_dtypes(rank, world):
    """int16, uint16/32/64 and float8 through the calls that only move
    data (broadcast, all_gather, all_gather_into_tensor, all_to_all_single,
    gather, scatter, send/recv), each checked bit for bit against the
    closed form of what every rank sent; a reduction of them is refused,
    naming the dtype (issue 53, defect 8). Runs on the CPU path and, under
    SMDDP_DEVICE_SIM, on the device path."""
    import torch
    import torch.distributed as dist

    n = 24  # elements per rank

    def data(dtype, src, count=n):
        es = torch.empty(0, dtype=dtype).element_size()
        b = (torch.arange(count * es) * 3 + 17 * src + 1) % 251
        return b.to(torch.uint8).view(dtype)

    def zeros(dtype, count=n):
        es = torch.empty(0, dtype=dtype).element_size()
        return torch.zeros(count * es, dtype=torch.uint8).view(dtype)

    def same(a, b):
        return bool(torch.equal(a.view(torch.uint8), b.view(torch.uint8)))

    res = {}
    for name in MOVED_ONLY:
        dt = getattr(torch, name)
        t = data(dt, rank) if rank == 0 else zeros(dt)
        dist.broadcast(t, src=0)
        _settle()
        res[f"{name} broadcast"] = None if same(t, data(dt, 0)) else "wrong bytes"
        outs = [zeros(dt) for _ in range(world)]
        dist.all_gather(outs, data(dt, rank))
        _settle()
        res[f"{name} all_gather"] = None if all(same(o, data(dt, r)) for r, o in enumerate(outs)) else "wrong bytes"
        flat = zeros(dt, n * world)
        dist.all_gather_into_tensor(flat, data(dt, rank))
        _settle()
        want = torch.cat([data(dt, r).view(torch.uint8) for r in range(world)])
        res[f"{name} all_gather_into_tensor"] = None if same(flat, want) else "wrong bytes"
        # all_to_all_single: rank r's block j is data(src = r * world + j).
        inp = torch.cat([data(dt, rank * world + j).view(torch.uint8) for j in range(world)]).view(dt)
        out = zeros(dt, n * world)
        dist.all_to_all_single(out, inp)
        _settle()
        want = torch.cat([data(dt, j * world + rank).view(torch.uint8) for j in range(world)])
        res[f"{name} all_to_all_single"] = None if same(out, want) else "wrong bytes"
        got = [zeros(dt) for _ in range(world)] if rank == 0 else None
        dist.gather(data(dt, rank), gather_list=got, dst=0)
        _settle()
        if rank == 0:
            res[f"{name} gather"] = None if all(same(g, data(dt, r)) for r, g in enumerate(got)) else "wrong bytes"
        piece = zeros(dt)
        dist.scatter(piece, scatter_list=[data(dt, 10 + r) for r in range(world)] if rank == 0 else None, src=0)
        _settle()
        res[f"{name} scatter"] = None if same(piece, data(dt, 10 + rank)) else "wrong bytes"
        right, left = (rank + 1) % world, (rank - 1) % world
        recv = zeros(dt)
        works = [dist.isend(data(dt, 100 + rank), dst=right), dist.irecv(recv, src=left)]
        for w in works:
            w.wait()
        _settle()
        res[f"{name} send/recv"] = None if same(recv, data(dt, 100 + left)) else "wrong bytes"
    try:
        dist.all_reduce(zeros(torch.uint16))
        res["uint16 all_reduce refused"] = "not refused"
    except Exception as e:  # noqa: BLE001
        msg = str(e)
        res["uint16 all_reduce refused"] = None if ("UInt16" in msg and "reduction" in msg) else msg[:300]
    t = torch.ones(4)
    dist.all_reduce(t)  # the group still works
    _settle()
    res["after"] = None if bool((t == world).all()) else t.tolist()
    return res
