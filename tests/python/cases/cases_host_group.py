"""The device path's private host group (backend/host_group_formation.h):
formed in the background from the group's creation. Run under
SMDDP_DEVICE_SIM (test_device_sim.py)."""
import time

_left_forming = None


def _victim_exits(rank, world, victim, key):
    """Every rank arrives here; then `victim` exits, and the others go on
    once all have arrived."""
    import os

    import torch.distributed as dist

    store = dist.distributed_c10d._get_default_store()
    store.add(key, 1)
    if rank == victim:
        os._exit(0)
    while store.add(key, 0) < world:
        time.sleep(0.001)


def _attempt(call):
    """What `call` raised (its message), and how long it took."""
    start = time.monotonic()
    try:
        call()
        res = {"raised": False}
    except Exception as e:  # noqa: BLE001 - what it raised is the result
        res = {"raised": True, "msg": str(e)[:400]}
    res["elapsed"] = time.monotonic() - start
    return res


def host_group_in_background(rank, world):
    """The device path's host group forms on a thread of its own from the
    group's creation: new_group returns without it, a first device call
    waits for it, and groups destroyed while theirs still forms neither
    hang nor leave threads behind."""
    import os

    import torch
    import torch.distributed as dist

    import torch_smddp
    import torch_smddp.testing as sim

    def threads():
        return len(os.listdir("/proc/self/task"))

    def thread_names():
        names = {}
        for tid in os.listdir("/proc/self/task"):
            try:
                with open(f"/proc/self/task/{tid}/comm") as f:
                    names[tid] = f.read().strip()
            except OSError:
                pass
        return names

    res = {}
    g = dist.new_group(backend="smddp")
    res["after_new_group"] = torch_smddp.stats(g)["device_host_group"]
    t = torch.full((3000,), float(rank + 1))
    dist.all_reduce(t, group=g)
    sim.sim_synchronize()
    res["sum_ok"] = bool((t == world * (world + 1) / 2).all())
    res["after_call"] = torch_smddp.stats(g)["device_host_group"]
    dist.destroy_process_group(g)
    # The world group's host group forms in the background too, and under
    # load may complete only now: its threads are not the cycles'.
    deadline = time.monotonic() + 30.0
    while torch_smddp.stats()["device_host_group"] == "forming" and time.monotonic() < deadline:
        time.sleep(0.01)
    res["world_host_group"] = torch_smddp.stats()["device_host_group"]
    before = threads()
    names_before = thread_names()
    start = time.monotonic()
    for _ in range(3):
        dist.destroy_process_group(dist.new_group(backend="smddp"))
    res["cycles_s"] = time.monotonic() - start
    deadline = time.monotonic() + 5.0
    while threads() > before and time.monotonic() < deadline:
        time.sleep(0.05)
    res["threads_left"] = threads() - before
    res["threads_new"] = sorted(n for tid, n in thread_names().items() if tid not in names_before)
    t = torch.ones(10)
    dist.all_reduce(t)
    sim.sim_synchronize()
    res["world_ok"] = bool((t == world).all())
    # Left to destroy_process_group(), which may find it still forming.
    global _left_forming
    _left_forming = dist.new_group(backend="smddp")
    return res


def host_group_peer_lost(rank, world, victim):
    """`victim` dies right after a new group forms, before that group's
    host group can: a device call on it fails at once naming the rank, and
    once the formation gives up (the group's 8 s timeout) the group reports
    it."""
    import datetime

    import torch
    import torch.distributed as dist

    import torch_smddp

    g = dist.new_group(backend="smddp", timeout=datetime.timedelta(seconds=8))
    _victim_exits(rank, world, victim, "host_group_peer_lost")
    res = {"state_before": torch_smddp.stats(g)["device_host_group"]}
    # An all-gather: the first allreduce would agree on its intra-host route
    # first (intra_route_peer_lost).
    res.update(_attempt(lambda: dist.all_gather_into_tensor(torch.empty(10 * world), torch.ones(10),
                                                            group=g)))
    backend = torch_smddp._backend_of(g)
    deadline = time.monotonic() + 30.0
    while torch_smddp.stats(g)["device_host_group"] == "forming" and time.monotonic() < deadline:
        time.sleep(0.1)
    res["state_after"] = torch_smddp.stats(g)["device_host_group"]
    res["errored"] = backend.errored()
    res["error_type"] = str(backend.get_error())
    return res


def intra_route_peer_lost(rank, world, victim):
    """The host group has formed (a device all-gather ran on every rank);
    then `victim` dies before its first device allreduce. The others' first
    allreduce agrees on the intra-host route through the store (intra.cc),
    waiting for every rank: it fails at once naming the rank, not at the
    group's 8 s timeout."""
    import datetime

    import torch
    import torch.distributed as dist

    import torch_smddp.testing as sim

    g = dist.new_group(backend="smddp", timeout=datetime.timedelta(seconds=8))
    out = torch.empty(10 * world)
    dist.all_gather_into_tensor(out, torch.full((10,), float(rank)), group=g)
    sim.sim_synchronize()
    res = {"gather_ok": bool((out == torch.arange(world).repeat_interleave(10).float()).all())}
    _victim_exits(rank, world, victim, "intra_route_peer_lost")

    def first_allreduce():
        dist.all_reduce(torch.ones(10), group=g)
        sim.sim_synchronize()

    res.update(_attempt(first_allreduce))
    # Every survivor stays until all of them have their result: one that
    # left first would be a second lost rank to the others, and might be
    # named before the victim (rank 0 also hosts the store).
    # Rank 0 leaves last, once the others no longer need the store.
    store = dist.distributed_c10d._get_default_store()
    deadline = time.monotonic() + 10.0

    def wait_for(key, count):
        while store.add(key, 0) < count and time.monotonic() < deadline:
            time.sleep(0.01)

    store.add("intra_route_peer_lost/done", 1)
    wait_for("intra_route_peer_lost/done", world - 1)
    if rank == 0:
        wait_for("intra_route_peer_lost/seen", world - 2)
    else:
        store.add("intra_route_peer_lost/seen", 1)
    return res
