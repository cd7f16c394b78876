"""Child-side failure scenarios, run by mp_harness.run_world in every rank.

The children only *observe*: each scenario provokes a failure, catches what
every rank raises (type, message, how long it took) and returns it as JSON;
test_failures.py (the parent) asserts on it. The case tables below are plain
data so the parent can import this module without importing torch (torch is
imported inside the functions).

Scenarios (docs/design.md, "Failure model"):

* ``mismatches``: ranks disagree on a collective (element count, dtype, op,
  which collective). Every rank whose call cannot complete correctly must
  raise a mismatch error naming both calls; afterwards a matching
  all_reduce on the same group must still work (a mismatch does not poison
  the group, only timeouts and lost peers do).
* ``peer_death``: rank 2 SIGKILLs itself (or os._exit()s) while the others
  are inside a collective; they must fail fast, naming rank 2, and so must
  every later call.
* ``timeout``: rank 1 arrives 6 s late with a 2 s group timeout.
* ``bad_env``: malformed SMDDP_* variables make init_process_group fail with
  a message naming the variable.
* ``init_methods``: env://, tcp://, file://, store=TCPStore, store=FileStore.
"""

from __future__ import annotations

import os
import re
import time

from mp_helpers import env_set

# --------------------------------------------------------------------------
# mismatch cases (plain data: the parent imports these)
# --------------------------------------------------------------------------
#
# A call is (collective, dtype, numel, extra): extra is the reduce op for
# all_reduce and the root for broadcast. In every case one rank, ``odd``
# ("last" = world-1, or a rank number), makes call ``odd_call`` and all the
# others make ``call``. ``tokens`` must all appear in the message of every
# rank that raises (they tell the two calls apart). ``may_complete`` names
# the ranks allowed to return normally: a broadcast root only sends, and
# when all its sends completed it cannot know that a receiver disagreed
# (KNOWN LIMITATION, see docs/design.md: only receivers detect it). A
# rank that returns normally must hold exactly what a correct call would
# have left there (a root: its own input, unchanged).
#
# Collective mixes are run once per residue of the sequence number modulo
# the world size (``parities``): the small all_reduce goes whole to reduction
# server seq % world, which decides which ranks only receive, so each
# residue exercises a different detection path (a data frame with the wrong
# signature, a stall probe, a probe answered after the fact). The children
# count the calls they make on the group (its sequence numbers start at 0)
# and pad with matching all_reduces to reach each residue; the parent checks
# the residues against the "at sequence N" of the messages.

MISMATCH_CASES = [
    dict(name="count_small", call=("all_reduce", "float32", 10, "SUM"),
         odd_call=("all_reduce", "float32", 11, "SUM"),
         tokens=["10 elements", "11 elements"]),
    dict(name="count_small_async", call=("all_reduce", "float32", 10, "SUM"),
         odd_call=("all_reduce", "float32", 11, "SUM"),
         tokens=["10 elements", "11 elements"], use_async=True),
    dict(name="count_large", call=("all_reduce", "float32", 1 << 20, "SUM"),
         odd_call=("all_reduce", "float32", (1 << 20) + 3, "SUM"),
         tokens=[f"{1 << 20} elements", f"{(1 << 20) + 3} elements"]),
    dict(name="count_empty_vs_one", call=("all_reduce", "float32", 0, "SUM"),
         odd_call=("all_reduce", "float32", 1, "SUM"),
         tokens=["0 elements", "1 elements"]),
    dict(name="dtype_f32_vs_f64", call=("all_reduce", "float32", 10, "SUM"),
         odd_call=("all_reduce", "float64", 10, "SUM"),
         tokens=["float32", "float64"]),
    dict(name="dtype_f32_vs_i32_same_bytes", call=("all_reduce", "float32", 10, "SUM"),
         odd_call=("all_reduce", "int32", 10, "SUM"),
         tokens=["float32", "int32"]),
    dict(name="op_sum_vs_max", call=("all_reduce", "float32", 10, "SUM"),
         odd_call=("all_reduce", "float32", 10, "MAX"),
         tokens=["SUM", "MAX"]),
    dict(name="op_sum_vs_max_large", call=("all_reduce", "float32", 1 << 18, "SUM"),
         odd_call=("all_reduce", "float32", 1 << 18, "MAX"),
         tokens=["SUM", "MAX"]),
    # all_reduce everywhere except one broadcast receiver (root 0)
    dict(name="allreduce_vs_broadcast_receiver", call=("all_reduce", "float32", 10, "SUM"),
         odd_call=("broadcast", "float32", 10, 0),
         tokens=["allreduce", "broadcast"], parities=True),
    # the root broadcasts, everybody else all_reduces: the root may complete
    dict(name="broadcast_root_vs_allreduce", odd=0, odd_call=("broadcast", "float32", 10, 0),
         call=("all_reduce", "float32", 10, "SUM"),
         tokens=["allreduce", "broadcast"], parities=True, may_complete=[0]),
    # broadcast with the root disagreeing with all receivers
    dict(name="broadcast_count_root_smaller", odd=0, odd_call=("broadcast", "float32", 10, 0),
         call=("broadcast", "float32", 11, 0),
         tokens=["10 elements", "11 elements"], may_complete=[0]),
    dict(name="broadcast_count_root_larger", odd=0, odd_call=("broadcast", "float32", 11, 0),
         call=("broadcast", "float32", 10, 0),
         tokens=["10 elements", "11 elements"], may_complete=[0]),
    dict(name="broadcast_dtype", odd=0, odd_call=("broadcast", "float32", 10, 0),
         call=("broadcast", "int32", 10, 0),
         tokens=["float32", "int32"], may_complete=[0]),
    # Roots disagree: rank 0 says root 0, the others root 1. Nobody waits
    # for anything rank 0 sends, so NOBODY is told (KNOWN LIMITATION, same
    # cause as above); every rank returns holding what its own call promised
    # (a root its input, a receiver root 1's data). Checked as such.
    dict(name="broadcast_roots_disagree", odd=0, odd_call=("broadcast", "float32", 10, 0),
         call=("broadcast", "float32", 10, 1),
         tokens=["root 0", "root 1"], may_complete="all"),
    dict(name="all_gather_count", call=("all_gather", "float32", 10, None),
         odd_call=("all_gather", "float32", 11, None),
         tokens=["10 elements", "11 elements"]),
    dict(name="barrier_vs_allreduce", call=("barrier", "uint8", 0, None),
         odd_call=("all_reduce", "float32", 10, "SUM"),
         tokens=["barrier", "allreduce"], parities=True),
]


def odd_rank(case: dict, world: int) -> int:
    odd = case.get("odd", "last")
    return world - 1 if odd == "last" else int(odd)


def expand_cases(world: int) -> list[dict]:
    """The cases as run at ``world``: collective mixes once per residue."""
    out = []
    for case in MISMATCH_CASES:
        if case.get("parities"):
            for residue in range(world):
                out.append(dict(case, name=f"{case['name']}@seq%{world}={residue}",
                                residue=residue, base=case["name"]))
        else:
            out.append(dict(case, residue=None, base=case["name"]))
    return out


def call_for(case: dict, rank: int, world: int):
    return case["odd_call"] if rank == odd_rank(case, world) else case["call"]


# --------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------

def _describe_error(e: BaseException) -> dict:
    import torch.distributed as dist

    return {"type": type(e).__name__, "msg": str(e),
            "is_runtime_error": isinstance(e, RuntimeError),
            "is_dist_backend_error": isinstance(e, dist.DistBackendError)}


def _attempt(fn) -> dict:
    """Run fn(); report whether/what it raised and how long it took."""
    t0 = time.monotonic()
    try:
        value = fn()
    except Exception as e:  # noqa: BLE001 - reported to the parent
        return dict(raised=True, elapsed=time.monotonic() - t0, value=None, **_describe_error(e))
    return dict(raised=False, elapsed=time.monotonic() - t0, value=value, type=None, msg="",
                is_runtime_error=False, is_dist_backend_error=False)


def _survivor_barrier(rank: int, ranks: list[int], key: str, timeout: float = 20.0) -> None:
    """Wait for ``ranks`` through the default group's Store (not through the
    backend, which may be unusable): keeps every survivor alive until all
    have finished their checks, so no message blames a rank that merely
    finished first. Rank 0 hosts the store (env://), so it leaves last."""
    import torch.distributed.distributed_c10d as c10d

    store = c10d._get_default_store()
    deadline = time.monotonic() + timeout

    def wait_for(k):
        while int(store.add(k, 0)) < len(ranks):
            if time.monotonic() > deadline:
                raise TimeoutError(f"survivor barrier {k}: only {store.add(k, 0)} of {ranks}")
            time.sleep(0.02)

    store.add(key, 1)
    wait_for(key)
    store.add(key + "/out", 1)
    if rank == 0:
        wait_for(key + "/out")


def _make_input(coll, dtype_name, numel, rank):
    import torch

    dtype = getattr(torch, dtype_name)
    if coll == "barrier":
        return None
    return (torch.arange(numel, dtype=torch.float64) % 7 + rank + 1).to(dtype)


def _run_call(call, rank, world, use_async=False):
    """Issue ``call``; return (tensor after the call, outputs) or raise."""
    import torch
    import torch.distributed as dist

    coll, dtype_name, numel, extra = call
    t = _make_input(coll, dtype_name, numel, rank)
    if coll == "all_reduce":
        work = dist.all_reduce(t, op=getattr(dist.ReduceOp, extra), async_op=use_async)
        outs = None
    elif coll == "broadcast":
        work = dist.broadcast(t, extra, async_op=use_async)
        outs = None
    elif coll == "all_gather":
        outs = [torch.full_like(t, -1) for _ in range(world)]
        work = dist.all_gather(outs, t, async_op=use_async)
    elif coll == "barrier":
        work = dist.barrier(async_op=use_async)
        outs = None
    else:
        raise ValueError(coll)
    if use_async:
        work.wait()
    return t, outs


# --------------------------------------------------------------------------
# 1. mismatches
# --------------------------------------------------------------------------

def mismatches(rank: int, world: int) -> list[dict]:
    """Every case of MISMATCH_CASES, in order, on the default group.

    Per case: what this rank's call did (raised? message? elapsed), whether
    a non-raising rank's tensor holds what a correct call leaves there, and
    whether a matching all_reduce right after worked (value checked here
    against the closed form)."""
    import torch
    import torch.distributed as dist

    out = []
    issued = 0  # calls made on the default group so far = next sequence number
    for case in expand_cases(world):
        while case["residue"] is not None and issued % world != case["residue"]:
            dist.all_reduce(torch.ones(1))  # shift the sequence number
            issued += 1
        call = call_for(case, rank, world)
        box = {}

        def go():
            box["t"], box["outs"] = _run_call(call, rank, world, case.get("use_async", False))

        res = _attempt(go)
        rec = {"case": case["name"], "call": list(call), "raised": res["raised"],
               "type": res["type"], "msg": res["msg"], "elapsed": round(res["elapsed"], 3),
               "is_runtime_error": res["is_runtime_error"],
               "is_dist_backend_error": res["is_dist_backend_error"]}
        if not res["raised"]:
            # Only allowed for may_complete ranks (checked by the parent);
            # whatever it left must be what a correct call leaves.
            coll, dtype_name, numel, extra = call
            if coll == "broadcast":  # root: its input; receiver: the root's input
                expect = _make_input(coll, dtype_name, numel, extra)
                rec["output_ok"] = bool(torch.equal(box["t"], expect))
            else:
                rec["output_ok"] = None  # no closed form when ranks disagreed
        # The group must still work: a matching all_reduce with a closed form.
        x = torch.full((5,), float(rank + 1))
        after = _attempt(lambda: dist.all_reduce(x))
        issued += 2
        rec["after_raised"] = after["raised"]
        rec["after_msg"] = after["msg"]
        rec["after_ok"] = (not after["raised"]) and x.tolist() == [world * (world + 1) / 2] * 5
        m = re.search(r"at sequence (\d+)", rec["msg"])
        rec["seq"] = int(m.group(1)) if m else None
        rec["expected_seq"] = issued - 2
        out.append(rec)
    return out


def mismatch_job(rank: int, world: int) -> dict:
    return {"cases": mismatches(rank, world), "future": async_future_error(rank, world)}


def async_future_error(rank: int, world: int) -> dict:
    """A mismatched async all_reduce: wait() and the future must both fail."""
    import torch
    import torch.distributed as dist

    t = torch.ones(11 if rank == world - 1 else 10)
    work = dist.all_reduce(t, async_op=True)
    fut = _attempt(lambda: work.get_future().wait())
    wait = _attempt(lambda: work.wait())
    x = torch.full((3,), float(rank + 1))
    dist.all_reduce(x)
    return {"future": {k: fut[k] for k in ("raised", "type", "msg")},
            "wait": {k: wait[k] for k in ("raised", "type", "msg")},
            "after_ok": x.tolist() == [world * (world + 1) / 2] * 3}


# --------------------------------------------------------------------------
# 2. a rank dies inside a collective
# --------------------------------------------------------------------------

DEATH_DELAY = 0.5  # the victim dies this long after the warm-up all_reduce


def peer_death(rank: int, world: int, coll: str, victim: int, how: str,
               delay: float = DEATH_DELAY) -> dict:
    """``victim`` dies (``how``: "sigkill" or "exit") ``delay`` s after a
    warm-up all_reduce; the survivors are by then inside ``coll``."""
    import torch
    import torch.distributed as dist

    warm = torch.full((4,), float(rank + 1))
    dist.all_reduce(warm)
    warm_ok = warm.tolist() == [world * (world + 1) / 2] * 4
    if rank == victim:
        time.sleep(delay)
        if how == "sigkill":
            os.kill(os.getpid(), 9)
        os._exit(3)

    n = 1000
    t = torch.full((n,), float(rank + 1))

    def run():
        if coll == "all_reduce":
            dist.all_reduce(t)
        elif coll == "broadcast":
            dist.broadcast(t, victim)  # the data must come from the victim
        elif coll == "all_gather":
            dist.all_gather([torch.zeros(n) for _ in range(world)], t)
        elif coll == "barrier":
            dist.barrier()
        else:
            raise ValueError(coll)

    first = _attempt(run)
    # What a survivor reads next (shrink_on_failure.py): the group's error,
    # as torchft reads it, and the ranks it knows are gone.
    group = {}
    if dist.get_backend() == "smddp":
        import torch_smddp
        group = {"errored": torch_smddp._backend_of().errored(),
                 "lost": torch_smddp.lost_ranks()}
    # every later call fails too, fast, naming the lost rank
    later = _attempt(lambda: dist.all_reduce(torch.ones(3)))
    later_async = _attempt(lambda: dist.all_reduce(torch.ones(3), async_op=True).wait())
    assert victim != 0, "rank 0 hosts the store the survivors meet through"
    _survivor_barrier(rank, [r for r in range(world) if r != victim], f"death-{coll}")
    keep = ("raised", "type", "msg", "elapsed", "is_runtime_error", "is_dist_backend_error")
    return {"warm_ok": warm_ok, "group": group, "first": {k: first[k] for k in keep},
            "later": {k: later[k] for k in keep}, "later_async": {k: later_async[k] for k in keep}}


# --------------------------------------------------------------------------
# 3. timeout
# --------------------------------------------------------------------------

LATE_SLEEP = 6.0


def timeout_case(rank: int, world: int, late: int = 1) -> dict:
    """Group timeout 2 s (set by the parent); rank ``late`` joins LATE_SLEEP s
    late. The timed-out call is the group's second (sequence 1)."""
    import torch
    import torch.distributed as dist

    s = float(world * (world + 1) // 2)
    warm = torch.full((4,), float(rank + 1))
    dist.all_reduce(warm)
    rec = {"warm_ok": warm.tolist() == [s] * 4, "group": dist.group.WORLD.group_name}
    if rank == late:
        time.sleep(LATE_SLEEP)
    t = torch.full((100,), float(rank + 1))
    first = _attempt(lambda: dist.all_reduce(t))
    rec["first"] = {k: first[k] for k in ("raised", "type", "msg", "elapsed",
                                          "is_runtime_error", "is_dist_backend_error")}
    # a rank that returned normally must hold the right sum
    rec["first"]["value_ok"] = t.tolist() == [s] * 100 if not first["raised"] else None
    second = _attempt(lambda: dist.all_reduce(torch.ones(3)))
    rec["second"] = {k: second[k] for k in ("raised", "type", "msg", "elapsed")}
    _survivor_barrier(rank, list(range(world)), "timeout-done", timeout=30)
    return rec


# --------------------------------------------------------------------------
# 4. bad SMDDP_* values, imports
# --------------------------------------------------------------------------

BAD_ENV = [
    # (variable, value, words the message must contain)
    ("SMDDP_CHUNK_BYTES", "banana", ["SMDDP_CHUNK_BYTES", "banana"]),
    ("SMDDP_CHUNK_BYTES", "12Q", ["SMDDP_CHUNK_BYTES", "12Q"]),
    ("SMDDP_CHUNK_BYTES", "100", ["SMDDP_CHUNK_BYTES", "100"]),          # below the minimum
    ("SMDDP_CHUNK_BYTES", "2G", ["SMDDP_CHUNK_BYTES", "2G"]),            # above the maximum
    ("SMDDP_MIN_SHARD_BYTES", "-1", ["SMDDP_MIN_SHARD_BYTES", "-1"]),
    ("SMDDP_SPIN_US", "-5", ["SMDDP_SPIN_US", "-5"]),
    ("SMDDP_SPIN_US", "1.5", ["SMDDP_SPIN_US", "1.5"]),
    ("SMDDP_SLEEP_US", "0", ["SMDDP_SLEEP_US", "0"]),
    ("SMDDP_FI_PROVIDER", "nonexistent", ["nonexistent", "provider"]),
]
# Valid spellings: the same variables must accept these (positive controls,
# so the rejections above are not just "everything fails").
GOOD_ENV = [
    ("SMDDP_CHUNK_BYTES", "64K"),
    ("SMDDP_CHUNK_BYTES", " 1MiB "),
    ("SMDDP_SPIN_US", "0"),
    ("SMDDP_SLEEP_US", "1"),
]


def _init_world1(timeout_s: float = 20):
    import datetime

    import torch.distributed as dist

    dist.init_process_group("smddp", store=dist.HashStore(), rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=timeout_s))


def bad_env(rank: int, world: int) -> dict:
    """World 1. The harness's group is destroyed first; then one
    init_process_group attempt per BAD_ENV / GOOD_ENV entry, each with only
    that variable set."""
    import torch
    import torch.distributed as dist

    assert world == 1
    dist.destroy_process_group()
    bad = []
    for var, value, _words in BAD_ENV:
        os.environ[var] = value
        try:
            res = _attempt(_init_world1)
        finally:
            del os.environ[var]
        leaked = dist.is_initialized()
        if leaked:  # should not happen; do not let it spoil the next attempt
            dist.destroy_process_group()
        bad.append({"var": var, "value": value, "raised": res["raised"], "type": res["type"],
                    "msg": res["msg"], "initialized_after": leaked})
    good = []
    for var, value in GOOD_ENV:
        os.environ[var] = value
        try:
            res = _attempt(_init_world1)
            ok = False
            if not res["raised"]:
                t = torch.arange(100000, dtype=torch.float32)
                dist.all_reduce(t)
                ok = torch.equal(t, torch.arange(100000, dtype=torch.float32))
                dist.destroy_process_group()
        finally:
            del os.environ[var]
        good.append({"var": var, "value": value, "raised": res["raised"], "msg": res["msg"],
                     "ok": ok})
    return {"bad": bad, "good": good, "imports": _imports_check()}


def _imports_check() -> dict:
    """`import torch_smddp` twice and importlib.reload are harmless."""
    import importlib

    import torch
    import torch.distributed as dist

    import torch_smddp
    import torch_smddp as again  # noqa: F401 - the second import is the point

    before = list(dist.Backend.backend_list)
    reloaded = importlib.reload(torch_smddp)
    after = list(dist.Backend.backend_list)
    res = {"same_module": again is torch_smddp, "reload_same": reloaded is torch_smddp,
           "count_before": before.count("smddp"), "count_after": after.count("smddp"),
           "available": dist.is_backend_available("smddp")}
    _init_world1()  # left in place: the harness destroys it (a clean exit is checked)
    t = torch.full((7,), 2.5)
    dist.all_reduce(t)
    res["backend"] = str(dist.get_backend())
    res["allreduce_ok"] = t.tolist() == [2.5] * 7
    res["stats_collectives"] = int(reloaded.stats()["collectives"])
    return res


def fi_provider_pair(rank: int, world: int) -> dict:
    """Run with FI_PROVIDER=tcp in every rank's environment from the start
    (libfabric reads it once, when it loads its providers), and
    SMDDP_FI_PROVIDER unset. The harness's group formed under it: report
    its provider, why, and an allreduce's closed form. Then every rank sets
    SMDDP_FI_PROVIDER=shm, which FI_PROVIDER=tcp hides, and forms another
    group: that must fail, on every rank, with the one message."""
    import torch
    import torch.distributed as dist

    import torch_smddp

    backend = torch_smddp._backend_of()
    t = torch.arange(1000, dtype=torch.float32) * (rank + 1)
    dist.all_reduce(t)
    expect = torch.arange(1000, dtype=torch.float32) * (world * (world + 1) // 2)
    res = {"provider": backend.provider, "reason": backend.provider_reason,
           "closed_form_ok": torch.equal(t, expect)}
    def second_group():
        g = dist.new_group(backend="smddp")
        dist.all_reduce(torch.ones(3), group=g)  # the first collective, if new_group passed

    with env_set(SMDDP_FI_PROVIDER="shm"):
        res["conflict"] = _attempt(second_group)
    _survivor_barrier(rank, list(range(world)), "fi-provider-done")  # rank 0 holds the store
    return res


# --------------------------------------------------------------------------
# 5. init methods
# --------------------------------------------------------------------------

def _check_allreduce(rank: int, world: int) -> dict:
    """all_reduce on the current default group, against closed forms: a
    small call (one reduction server) and a sharded, chunked one."""
    import torch
    import torch.distributed as dist

    small = torch.full((9,), float(rank + 1))
    dist.all_reduce(small)
    n = 300_001  # > servers x SMDDP_MIN_SHARD_BYTES and > one chunk: sharded, pipelined
    big = torch.arange(n, dtype=torch.float32) * (rank + 1)
    dist.all_reduce(big)
    s = world * (world + 1) // 2
    expect_big = torch.arange(n, dtype=torch.float32) * s  # exact: integers < 2^24
    return {"backend": str(dist.get_backend()), "world": dist.get_world_size(),
            "rank": dist.get_rank(),
            "small_ok": small.tolist() == [float(s)] * 9,
            "big_ok": bool(torch.equal(big, expect_big))}


def init_methods(rank: int, world: int) -> dict:
    import datetime
    import tempfile

    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    timeout = datetime.timedelta(seconds=30)
    out = {"env": _check_allreduce(rank, world)}  # the harness initialised through env://
    # Rank 0 picks the ports and the directory and shares them through the
    # harness's store (so both ranks agree, and nothing collides with
    # another job's picks made in another process).
    store = c10d._get_default_store()
    if rank == 0:
        from mp_harness import find_free_port

        ports = [find_free_port(), find_free_port()]
        # In the job's directory (the ranks' working directory), which the
        # harness removes once the job has passed.
        tmp = tempfile.mkdtemp(prefix="init-", dir=os.getcwd())
        store.set("init/info", f"{ports[0]} {ports[1]} {tmp}")
    info = store.get("init/info").decode().split()
    tcp_port, store_port, tmp = int(info[0]), int(info[1]), info[2]
    dist.barrier()
    dist.destroy_process_group()

    def cycle(name, **kwargs):
        dist.init_process_group("smddp", rank=rank, world_size=world, timeout=timeout, **kwargs)
        try:
            out[name] = _check_allreduce(rank, world)
        finally:
            dist.destroy_process_group()
        out[name]["initialized_after_destroy"] = dist.is_initialized()

    cycle("tcp", init_method=f"tcp://127.0.0.1:{tcp_port}")
    cycle("file", init_method=f"file://{os.path.join(tmp, 'init-file')}")
    cycle("tcpstore", store=dist.TCPStore("127.0.0.1", store_port, world, rank == 0,
                                          timeout=timeout))
    cycle("filestore", store=dist.FileStore(os.path.join(tmp, "file-store"), world))
    # Leave a default group for the harness's destroy_process_group.
    dist.init_process_group("smddp", rank=rank, world_size=world, timeout=timeout,
                            store=dist.FileStore(os.path.join(tmp, "last-store"), world))
    out["again"] = _check_allreduce(rank, world)
    return out


# --------------------------------------------------------------------------
# harness self-tests (gloo)
# --------------------------------------------------------------------------

def selftest_die(rank: int, world: int, victim: int, how: str):
    if rank == victim:
        if how == "sigkill":
            os.kill(os.getpid(), 9)
        elif how == "exit":
            os._exit(5)
        # how == "live": the allowed rank does not die after all
    return {"rank": rank}
