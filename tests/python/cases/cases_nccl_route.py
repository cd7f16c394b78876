"""Rank functions of test_device_sim.py's NCCL-route tests (SMDDP_INTRA=nccl
at 2 pretend hosts x 2 GPUs; run by mp_harness.run_world), on the simulated
device and the simulated NCCL (torch_smddp.testing): the route each group
takes inside the host, its bootstrap, formation and the order of its
kernels. The harness checks, after every rank function, that no rule of
CUDA's was broken and that the rank made a context only on its own device.
The host route's cases are in cases_device_sim.py.
"""
import os
import time


def leave_right_after_forming(rank, world):
    """Run with the rail group's formation held back on local ranks 1
    (SMDDP_DEVICE_SIM_RAIL_DELAY_MS): each host's rank 0 forms its part of
    the NCCL route first, queues an allreduce, aborts the group and leaves
    the job (rank 0 takes the store with it). The route is formed on every
    rank before any rank's first call returns, so its peers are never left
    forming through a store that is gone. Before that rule, ranks 1 and 3
    failed in their rail group's formation (broken pipe to the store)."""
    import torch
    import torch.distributed as dist

    g = dist.new_group(backend="smddp")
    t = torch.full((50000,), float(rank + 1))
    dist.all_reduce(t, group=g, async_op=True)
    g._get_backend(torch.device("cpu")).abort()
    dist.destroy_process_group(g)
    return {"rank": rank}


def intra_route(rank, world, dtype="float32"):
    """The route the first device allreduce took inside the host, and
    allreduces of every size class against the closed form through it, in
    `dtype` (small integers: every sum and mean here is exact in fp16 and
    bf16 too, whatever the order)."""
    import torch
    import torch.distributed as dist

    import torch_smddp
    import torch_smddp.testing as sim

    from mp_harness import captured_stderr

    res = {}
    dt = getattr(torch, dtype)
    g = torch.Generator().manual_seed(11)
    # Exact: small integers, sums of at most a few ranks.
    for n in (1, 3, 4, 7, 1000, 4099, 70001):
        xs = [torch.randint(-8, 8, (n,), generator=g).to(dt) for _ in range(world)]
        t = xs[rank].clone()
        if n == 1:  # the first device allreduce decides the route, and logs
            lines = []
            with captured_stderr(lines):
                dist.all_reduce(t)
            res["unproven_warning"] = any("not yet been proven on hardware" in l for l in lines)
        else:
            dist.all_reduce(t)
        for op, name in ((dist.ReduceOp.MAX, "max"), (dist.ReduceOp.AVG, "avg")):
            u = xs[rank].clone()
            dist.all_reduce(u, op=op)
            sim.sim_synchronize()
            stacked = torch.stack(xs).double()
            want = stacked.amax(0) if name == "max" else stacked.mean(0)
            if not torch.equal(u.double(), want):
                res[f"{name} n={n}"] = (u[:3].tolist(), want[:3].tolist())
        sim.sim_synchronize()
        if not torch.equal(t.double(), torch.stack(xs).double().sum(0)):
            res[f"sum n={n}"] = (t[:3].tolist(), torch.stack(xs).double().sum(0)[:3].tolist())
    # Coalesced, several tensors of odd sizes.
    ts = [torch.full((k,), float(rank + 1), dtype=dt) for k in (5, 1, 333)]
    dist.all_reduce_coalesced(ts)
    sim.sim_synchronize()
    total = float(sum(r + 1 for r in range(world)))
    if not all(bool((t == total).all()) for t in ts):
        res["coalesced"] = [t[:2].tolist() for t in ts]
    res["route"] = torch_smddp.stats()["intra_route"]
    return res


def first_allreduce_error(rank, world):
    import torch
    import torch.distributed as dist

    try:
        dist.all_reduce(torch.ones(4))
        msg = ""
    except Exception as e:  # noqa: BLE001
        msg = f"{type(e).__name__}: {e}"
    # Rank 0 holds the store: every rank must be done with it first (the
    # others' last use of it is their "left"; rank 0 waits for all of them).
    store = dist.distributed_c10d._get_default_store()
    deadline = time.monotonic() + 30
    store.add("first_allreduce_error/arrived", 1)
    while store.add("first_allreduce_error/arrived", 0) < world and time.monotonic() < deadline:
        time.sleep(0.05)
    store.add("first_allreduce_error/left", 1)
    while rank == 0 and store.add("first_allreduce_error/left", 0) < world and time.monotonic() < deadline:
        time.sleep(0.05)
    return msg


def _store_barrier(store, key, world, rank, timeout=60.0):
    """Every rank arrives; rank 0, which hosts the store, also waits until
    every rank has seen that (so it never leaves with the store under them)."""
    deadline = time.monotonic() + timeout
    for step in ("arrived", "left"):
        store.add(f"{key}/{step}", 1)
        while (step == "arrived" or rank == 0) and store.add(f"{key}/{step}", 0) < world:
            if time.monotonic() > deadline:
                raise TimeoutError(f"store barrier {key}: {store.add(f'{key}/{step}', 0)} of {world} {step}")
            time.sleep(0.02)


def intra_bootstrap(rank, world):
    """The intra-host route's bootstrap keys, on 2 hosts x 2 GPUs with
    SMDDP_INTRA=nccl, in one job:
    - a group formed twice with the same name on the same store reduces
      right both times; the second time local rank 0 of each host comes
      late, so a local rank 1 that read keys without the instance's nonce
      would take the first instance's unique id (and hang);
    - a group whose rank 3 asks for SMDDP_INTRA=shm while the others ask
      for nccl fails its first device allreduce on every rank, quickly,
      with one error naming both values.
    Returns {check: None when it held, else what was seen}, and the
    mismatch's message and time per rank."""
    import datetime

    import torch
    import torch.distributed as dist

    import torch_smddp
    import torch_smddp.testing as sim

    base = dist.distributed_c10d._get_default_store()
    timeout = datetime.timedelta(seconds=12)
    res = {}

    def allreduce(pg, n):
        t = torch.arange(n, dtype=torch.float32) + rank
        pg.allreduce([t], dist.AllreduceOptions()).wait()
        sim.sim_synchronize()
        want = torch.arange(n, dtype=torch.float32) * world + world * (world - 1) / 2
        return None if torch.equal(t, want) else f"got {t[:3].tolist()}, want {want[:3].tolist()}"

    for round_ in range(2):
        pg = torch_smddp._C.ProcessGroupSmddp(dist.PrefixStore("reform/", base), rank, world,
                                              timeout, "reformed")
        if round_ == 1 and rank % 2 == 0:
            time.sleep(1.5)  # the first instance's keys are there to be read meanwhile
        start = time.monotonic()
        try:
            res[f"reformed {round_}"] = allreduce(pg, 4099)
            route = pg.stats()["intra_route"]
            if route != "nccl":
                res[f"reformed {round_}"] = f"route {route}"
        except Exception as e:  # noqa: BLE001
            res[f"reformed {round_}"] = (f"{type(e).__name__} after {time.monotonic() - start:.1f} s: "
                                         f"{str(e)[:300]}")
        pg.shutdown()
        _store_barrier(base, f"reformed/{round_}", world, rank)

    os.environ["SMDDP_INTRA"] = "shm" if rank == 3 else "nccl"
    pg = torch_smddp._C.ProcessGroupSmddp(dist.PrefixStore("mismatch/", base), rank, world,
                                          timeout, "mismatched")
    start = time.monotonic()
    try:
        res["mismatch_error"] = f"no error: {allreduce(pg, 1000)}"
    except Exception as e:  # noqa: BLE001
        res["mismatch_error"] = f"{type(e).__name__}: {e}"
    res["mismatch_seconds"] = time.monotonic() - start
    os.environ["SMDDP_INTRA"] = "nccl"
    pg.abort()
    _store_barrier(base, "mismatched", world, rank)
    return res


def two_groups_opposite_order(rank, world):
    """Two groups on the NCCL route inside the host, their calls issued in
    opposite orders by the two GPUs of each host: local rank 0 issues on
    group A, then (0.3 s later, its reduce-scatter already queued and
    waiting for the peer) on group B; local rank 1 on B, then A. Each
    intra-host communicator's kernels must not queue behind the other's
    on a shared stream (issue 53, defect 3). Returns {check: None when it
    held, else what was seen}."""
    import torch
    import torch.distributed as dist

    import torch_smddp.testing as sim

    import datetime

    res = {}
    timeout = datetime.timedelta(seconds=15)  # new_group's own default is 30 minutes
    groups = [dist.new_group(backend="smddp", timeout=timeout) for _ in range(2)]
    for g in groups:  # the route is decided at each group's first allreduce, in one order
        t = torch.ones(8)
        dist.all_reduce(t, group=g)
    sim.sim_synchronize()
    n = 3000
    order = (0, 1) if rank % 2 == 0 else (1, 0)
    tensors = {i: torch.arange(n, dtype=torch.float32) * (i + 1) + rank for i in order}
    works = {}
    for k, i in enumerate(order):
        if k == 1:
            time.sleep(0.3)
        works[i] = dist.all_reduce(tensors[i], group=groups[i], async_op=True)
    for i in order:
        start = time.monotonic()
        try:
            works[i].wait()
            res[f"group {i}"] = None
        except Exception as e:  # noqa: BLE001
            res[f"group {i}"] = f"{type(e).__name__} after {time.monotonic() - start:.1f} s: {str(e)[:200]}"
    try:
        sim.sim_synchronize(timeout=10)
    except RuntimeError as e:
        res["synchronize"] = str(e)[:200]
    for i in order:
        want = torch.arange(n, dtype=torch.float32) * (i + 1) * world + world * (world - 1) / 2
        if res[f"group {i}"] is None and not torch.equal(tensors[i], want):
            res[f"group {i}"] = f"got {tensors[i][:3].tolist()}, want {want[:3].tolist()}"
    return res


def failed_formation(rank, world):
    """The intra-host communicator's formation fails once (a stand-in
    hook): the first allreduce raises, and so does every later one, with
    the same error and at once, rather than forming again (issue 53,
    defect 8). Returns each call's error (or None) and duration."""
    import torch
    import torch.distributed as dist

    out = []
    for _ in range(3):
        start = time.monotonic()
        try:
            dist.all_reduce(torch.ones(4))
            msg = None
        except Exception as e:  # noqa: BLE001
            msg = f"{type(e).__name__}: {e}"
        out.append({"msg": msg, "elapsed": time.monotonic() - start})
    first_allreduce_error(rank, world)  # leave the store together
    return out
