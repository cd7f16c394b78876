"""Ranks of test_torchft.py: torch_smddp.torchft.ProcessGroupSmddp driven as
torchft's Manager drives it, its ranks threads of one process."""

from __future__ import annotations

import datetime
import threading
import time


def _two_ranks(fn) -> None:
    """fn(0) and fn(1) on two threads, the ranks of one group; a thread
    still running after 60 s leaves its result unset, which the test
    reports."""
    ths = [threading.Thread(target=fn, args=(r,), daemon=True) for r in range(2)]
    for t in ths:
        t.start()
    for t in ths:
        t.join(timeout=60)


def abort_while_forming(rank: int, world: int) -> dict:
    """configure() at world 2 whose peer never comes, aborted from another
    thread; then a group of two threads on a new prefix, a closed-form
    all_reduce, errored() before and after an abort."""
    import torch
    import torch.distributed as dist

    from torch_smddp.torchft import ProcessGroupSmddp

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    addr = f"127.0.0.1:{store.port}"
    timeout = datetime.timedelta(seconds=60)
    out: dict = {}

    # A group formed with a cancel handle but not keep_spare (only the
    # torchft wrapper asks): no spare endpoint is wanted after it.
    from torch_smddp import _C

    plain_sums = [None, None]

    def plain(r):
        sub = dist.PrefixStore("plain", dist.TCPStore("127.0.0.1", store.port, is_master=False))
        pg = _C.ProcessGroupSmddp(sub, r, 2, timeout, "plain", cancel=_C.FormationCancel())
        t = torch.full((4,), float(r + 1))
        pg.allreduce([t]).wait()
        plain_sums[r] = t.tolist()
        pg.shutdown()

    _two_ranks(plain)
    out["plain_sums"] = plain_sums
    out["spares_after_plain"] = _C.spare_endpoint_counts()

    lonely = ProcessGroupSmddp(timeout=timeout)
    raised: list[str] = []

    def form():
        try:
            lonely.configure(f"{addr}/forming", "0", 0, 2)
            raised.append("formed")
        except Exception as e:  # noqa: BLE001
            raised.append(f"{type(e).__name__}: {e}")

    th = threading.Thread(target=form)
    th.start()
    time.sleep(0.5)
    t0 = time.monotonic()
    lonely.abort()
    th.join(timeout=30)
    out["forming_raised"] = raised[0] if raised else "still forming"
    out["abort_to_raise_s"] = time.monotonic() - t0
    out["errored_after_abort"] = str(lonely.errored())

    pgs = [ProcessGroupSmddp(timeout=timeout) for _ in range(2)]
    # The aborted wrapper forms again too: rank 0 of the new group.
    pgs[0] = lonely
    sums = [None, None]

    def rank_main(r):
        pgs[r].configure(f"{addr}/quorum1", "0", r, 2)
        t = torch.full((8,), float(r + 1))
        pgs[r].allreduce([t], dist.ReduceOp.SUM).wait()
        sums[r] = t.tolist()

    _two_ranks(rank_main)
    out["sums"] = sums
    out["errored_healthy"] = [str(p.errored()) for p in pgs]
    out["backend_name"] = pgs[0].getBackendName()

    # Each formation asked for a spare endpoint for the next (the ranks
    # share a process, so they use tcp;ofi_rxm): two, opened after a pause.
    deadline = time.monotonic() + 20
    while _C.spare_endpoint_counts()["ready"] < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    out["spares_before_reform"] = _C.spare_endpoint_counts()
    sums2 = [None, None]

    def reform(r):
        pgs[r].configure(f"{addr}/quorum2", "0", r, 2)
        t = torch.arange(1000, dtype=torch.float32) * (r + 1)
        pgs[r].allreduce([t], dist.ReduceOp.SUM).wait()
        sums2[r] = bool(torch.equal(t, torch.arange(1000, dtype=torch.float32) * 3))

    _two_ranks(reform)
    out["spares_after_reform"] = _C.spare_endpoint_counts()
    out["sums_on_spares"] = sums2

    # A group with an error: rank 0 calls alone and times out. The first
    # errored() that reports it starts releasing the group on a thread of
    # its own (once); the error stays; abort() after it is prompt.
    import torch_smddp.torchft as tft

    released: list[tuple[str, bool]] = []  # (thread, finished)
    real_abort = tft._abort_backend

    def counting_abort(pg):
        released.append((threading.current_thread().name, False))
        real_abort(pg)
        released.append((threading.current_thread().name, True))

    tft._abort_backend = counting_abort
    pgs[0].set_timeout(datetime.timedelta(seconds=1))
    lone = torch.ones(4)
    pgs[0].allreduce([lone], dist.ReduceOp.SUM).wait()
    errs = [str(pgs[0].errored()) for _ in range(3)]
    deadline = time.monotonic() + 30
    while len(released) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.2)  # a second release would have begun by now
    tft._abort_backend = real_abort
    out["failed_errors"] = errs
    out["releases"] = released
    out["error_after_release"] = str(pgs[0].errored())
    t0 = time.monotonic()
    pgs[0].abort()
    out["abort_after_release_s"] = time.monotonic() - t0
    for p in pgs:
        p.abort()
    out["errored_aborted"] = [str(p.errored()) for p in pgs]
    return out


RACE_ROUNDS = 20


def abort_races_configure(rank: int, world: int) -> dict:
    """abort() hammered against configure() from another thread, torchft's
    own pattern (the Manager aborts from its thread while the quorum
    thread configures). Each round: rank 0's wrapper configures at world 2,
    its partner joins 0.2 s later, and the main thread aborts rank 0 at a
    random moment around the end of the formation. Whichever wins, the
    abort is never lost: the wrapper then holds no group, errored()
    reports the abort, and a configure that returned saw its group
    aborted (an all_reduce on the wrapper fails, never runs)."""
    import random

    import torch
    import torch.distributed as dist

    from torch_smddp.torchft import ProcessGroupSmddp

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    addr = f"127.0.0.1:{store.port}"
    timeout = datetime.timedelta(seconds=30)
    rng = random.Random(20261202)
    out: dict = {"lost": [], "configure_returned": 0, "configure_raised": 0, "stuck": 0}
    for i in range(RACE_ROUNDS):
        w = [ProcessGroupSmddp(timeout=timeout) for _ in range(2)]
        said: dict = {}

        def configure(r, delay):
            time.sleep(delay)
            try:
                w[r].configure(f"{addr}/race{i}", "0", r, 2)
                said[r] = "formed"
            except Exception as e:  # noqa: BLE001
                said[r] = f"{type(e).__name__}: {e}"

        ths = [threading.Thread(target=configure, args=(r, 0.2 * r), daemon=True)
               for r in range(2)]
        for t in ths:
            t.start()
        time.sleep(max(0.0, 0.2 + rng.uniform(-0.1, 0.4)))
        w[0].abort()
        ths[0].join(timeout=40)
        # Its partner is gone: stop it forming or drop its group. An abort
        # before its configure() began would be no abort of that configure
        # (torchft aborts, then configures the next quorum), which would
        # then wait out the timeout for rank 0: wait until it has begun.
        begun = time.monotonic() + 5
        while (w[1]._forming is None and w[1]._pg is None and ths[1].is_alive()
               and time.monotonic() < begun):
            time.sleep(0.002)
        w[1].abort()
        ths[1].join(timeout=40)
        if any(t.is_alive() for t in ths):
            out["stuck"] += 1
            continue
        out["configure_returned" if said.get(0) == "formed" else "configure_raised"] += 1
        problems = []
        if w[0]._pg is not None:
            problems.append("a group is installed after the abort")
        if w[0].errored() is None:
            problems.append("errored() is None after the abort")
        if said.get(0) == "formed":
            try:
                w[0].allreduce([torch.ones(4)], dist.ReduceOp.SUM).wait()
                problems.append("an all_reduce ran on the aborted wrapper")
            except Exception:  # noqa: BLE001 - any error is the abort seen
                pass
        if problems:
            out["lost"].append({"round": i, "configure": said.get(0), "problems": problems})
    return out


def torchft_flight_dump(rank: int, world: int) -> dict:
    """A torchft group of two threads, its global ranks [4, 7]: rank 0's
    all_reduce times out (rank 1 never calls), which writes torch's
    flight-recorder dump (TORCH_FR_DUMP_TEMP_FILE, set by the test). The
    dump's group entry, as torch's tools read it."""
    import os
    import pickle

    import torch
    import torch.distributed as dist

    from torch_smddp.torchft import ProcessGroupSmddp

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    addr = f"127.0.0.1:{store.port}"
    w = [ProcessGroupSmddp(timeout=datetime.timedelta(seconds=1)) for _ in range(2)]
    errors: list = [None, None]

    def rank_main(r):
        w[r].configure(f"{addr}/fr", "0", r, 2, quorum_id=3, global_ranks=[4, 7])
        if r == 0:
            try:
                w[r].allreduce([torch.ones(4)], dist.ReduceOp.SUM).wait()
            except Exception as e:  # noqa: BLE001 - torchft's Work reports it below instead
                errors[r] = str(e)
            errors[r] = errors[r] or str(w[r].errored())

    _two_ranks(rank_main)
    path = os.environ["TORCH_FR_DUMP_TEMP_FILE"] + os.environ.get("RANK", "0")
    with open(path, "rb") as f:
        dump = pickle.load(f)
    for wr in w:
        wr.abort()
    groups = {name: dict(cfg) for name, cfg in dump["pg_config"].items()}
    return {"error": errors[0], "groups": groups}


def servers_in_quorum_store(rank: int, world: int) -> dict:
    """SMDDP_SERVER_COUNT (set by the test) without SMDDP_SERVER_RENDEZVOUS:
    configure() refuses at once, naming the fix, instead of waiting for
    servers in the quorum's store (which its primary's death would take)."""
    import torch.distributed as dist

    from torch_smddp.torchft import ProcessGroupSmddp

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    pg = ProcessGroupSmddp(timeout=datetime.timedelta(seconds=30))
    t0 = time.monotonic()
    try:
        pg.configure(f"127.0.0.1:{store.port}/q", "0", 0, 1)
        said = "formed"
    except Exception as e:  # noqa: BLE001
        said = f"{type(e).__name__}: {e}"
    return {"said": said, "seconds": time.monotonic() - t0}
