"""Child side of test_stuck.py: a group stuck on a peer that stopped or died.

Like cases_failures.py, the children only observe (what raised, how long it
took) and the parent asserts. Torch is imported inside the functions.

* ``abort_while_stuck``: the victim is SIGSTOPped while both ranks run large
  all_reduces, so the survivor's calls stall on it; the survivor then
  destroys or aborts the group, which must not wait out the group timeout.
  The survivor always SIGKILLs the victim before it returns (the harness's
  deadline kills it too, stopped or not).
* ``p2p_dead_peer``: the victim exits while the survivor has a receive from
  it posted; that receive, and sends and receives posted afterwards, must
  fail naming the victim instead of hanging.
"""

from __future__ import annotations

import os
import signal
import time

BIG = 1 << 22  # float32 elements per all_reduce (16 MiB): several pipeline steps


def _attempt(fn) -> dict:
    t0 = time.monotonic()
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - reported to the parent
        return {"raised": True, "elapsed": time.monotonic() - t0, "type": type(e).__name__,
                "msg": str(e)}
    return {"raised": False, "elapsed": time.monotonic() - t0, "type": None, "msg": ""}


def abort_while_stuck(rank: int, world: int, how: str, victim: int = 1) -> dict:
    import torch
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    store = c10d._get_default_store()
    warm = torch.full((4,), float(rank + 1))
    dist.all_reduce(warm)
    if rank == victim:
        store.set("stuck/victim-pid", str(os.getpid()))
    works = [dist.all_reduce(torch.ones(BIG), async_op=True) for _ in range(4)]
    if rank == victim:
        for w in works:
            w.wait()
        time.sleep(120)  # the survivor stops and kills this process first
        return {"victim": "not stopped"}
    pid = int(store.get("stuck/victim-pid"))
    try:
        works[0].wait()  # the victim is in these calls too
        os.kill(pid, signal.SIGSTOP)
        # With the victim stopped, this one cannot complete, whatever the
        # timing of the ones before it.
        works.append(dist.all_reduce(torch.ones(BIG), async_op=True))
        time.sleep(0.5)
        pending = sum(not w.is_completed() for w in works)
        t0 = time.monotonic()
        if how == "destroy":
            dist.destroy_process_group()
        else:
            c10d._abort_process_group()
        teardown_s = time.monotonic() - t0
        waits = [_attempt(w.wait) for w in works]
    finally:
        os.kill(pid, signal.SIGCONT)
        os.kill(pid, signal.SIGKILL)
    return {"pending": pending, "teardown_s": teardown_s, "waits": waits}


P2P_DEATH_DELAY = 0.5


def p2p_dead_peer(rank: int, world: int, victim: int = 1) -> dict:
    """Rank ``victim`` exits P2P_DEATH_DELAY s after a warm-up exchange; rank
    0 has an irecv from it posted by then, and sends/receives after."""
    import torch
    import torch.distributed as dist

    t = torch.full((8,), float(rank + 1))
    if rank == 0:
        dist.send(t, victim)
        back = torch.zeros(8)
        dist.recv(back, victim)
        warm_ok = back.tolist() == [float(victim + 1)] * 8
    else:
        got = torch.zeros(8)
        dist.recv(got, 0)
        dist.send(t, 0)
        time.sleep(P2P_DEATH_DELAY)
        os._exit(3)
    big = torch.zeros(1 << 20)
    pending = dist.irecv(big, victim)  # posted while the victim lives
    out = {"warm_ok": warm_ok, "irecv_posted": _attempt(pending.wait)}
    time.sleep(0.5)  # the victim is certainly gone now
    out["send_small"] = _attempt(lambda: dist.send(torch.ones(4), victim))
    out["send_big"] = _attempt(lambda: dist.send(torch.ones(1 << 20), victim))
    out["recv"] = _attempt(lambda: dist.recv(torch.zeros(4), victim))
    out["isend"] = _attempt(lambda: dist.isend(torch.ones(1 << 20), victim).wait())
    return out


# A call in pieces (SMDDP_STAGE_BYTES=1M) of PIECES_PART_ELEMS float32 per
# rank: 64 pieces of 1 MiB.
PIECES_PART_ELEMS = 1 << 24
STOP_S, RUN_S = 0.8, 0.002


def pieces_under_one_timeout(rank: int, world: int, op: str, victim: int = 1) -> dict:
    """Every rank makes one large one-host call in pieces; from just before
    its own call until it returns, rank 0 stops the victim for STOP_S at a
    time and lets it run for RUN_S in between, so each piece waits less
    than the group timeout but the call as a whole much longer. Reports
    how each call ended, and how many stop cycles rank 0 ran."""
    import threading

    import torch
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    store = c10d._get_default_store()
    n = PIECES_PART_ELEMS
    if op == "all_gather":
        inp, out = torch.full((n,), float(rank + 1)), torch.empty(n * world)
        call = lambda: dist.all_gather_into_tensor(out, inp)  # noqa: E731
    else:
        inp, out = torch.full((n * world,), float(rank + 1)), torch.empty(n)
        call = lambda: dist.reduce_scatter_tensor(out, inp)  # noqa: E731
    dist.barrier()
    if rank == victim:
        store.set("pieces/victim-pid", str(os.getpid()))
    pid = int(store.get("pieces/victim-pid"))
    done = threading.Event()
    cycles = [0]

    def stop_and_go():  # from now on: the victim may be stopped before its call
        while not done.is_set():
            os.kill(pid, signal.SIGSTOP)
            done.wait(STOP_S)
            os.kill(pid, signal.SIGCONT)
            cycles[0] += 1
            time.sleep(RUN_S)

    stopper = threading.Thread(target=stop_and_go, daemon=True)
    if rank == 0:
        stopper.start()
    try:
        result = _attempt(call)
    finally:
        done.set()
        if rank == 0:
            stopper.join()
            os.kill(pid, signal.SIGCONT)
    result["cycles"] = cycles[0]
    return result
