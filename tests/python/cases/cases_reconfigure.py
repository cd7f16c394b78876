"""Ranks of test_reconfigure.py: groups aborted and made again on new store
prefixes, as torchft reconfigures its process group after a failure.

The driver (rank 0 of a world of 1 under the harness) hosts a TCPStore and
makes one group per cycle, at world 2, with a helper process as rank 1.
Each cycle has a plan:

- ``normal``: two all_reduces against the closed form, then abort;
- ``abort_blocked``: the helper makes no second call; a thread of the driver
  waits on an all_reduce that cannot complete, and the driver aborts the
  group: the wait must raise, and errored() must name the abort;
- ``kill``: the helper is SIGKILLed while the driver's all_reduce waits: the
  wait must raise naming rank 1, and errored() must report it before the
  abort; a spare helper, started ahead, takes over from the next cycle;
- ``forming``: the helper never joins; another thread cancels the forming
  group, whose constructor must raise (not wait out the timeout).

After each cycle the driver counts its threads (/proc/self/task) and open
fds (/proc/self/fd); the test checks they do not grow.
"""

from __future__ import annotations

import datetime
import gc
import os
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
GROUP_TIMEOUT = datetime.timedelta(seconds=30)


def _counts() -> tuple[int, int]:
    return len(os.listdir("/proc/self/task")), len(os.listdir("/proc/self/fd"))


def _make(store, prefix, rank, cancel=None):
    import torch.distributed as dist
    import torch_smddp

    return torch_smddp._C.ProcessGroupSmddp(dist.PrefixStore(prefix, store), rank, 2,
                                            GROUP_TIMEOUT, prefix, cancel=cancel)


def _allreduce_checked(pg, rank) -> None:
    import torch
    import torch.distributed as dist

    t = torch.arange(64, dtype=torch.float32) * (rank + 1)
    opts = dist.AllreduceOptions()
    pg.allreduce([t], opts).wait()
    expect = torch.arange(64, dtype=torch.float32) * 3
    if not torch.equal(t, expect):
        raise AssertionError(f"rank {rank}: all_reduce gave {t[:4].tolist()}..., "
                             f"expected {expect[:4].tolist()}...")


def plan(cycles: int) -> list[str]:
    kinds = ["normal", "abort_blocked", "forming", "normal", "kill"]
    return [kinds[i % len(kinds)] for i in range(cycles)]


def helper_main(port: int, helper_id: int) -> None:
    """Rank 1 of every cycle it is told to take (``go/<id>``)."""
    import torch  # noqa: F401
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(300))
    store.set(f"started/{helper_id}", "1")
    i = int(store.get(f"go/{helper_id}"))
    while True:
        kind = store.get(f"plan/{i}").decode()
        if kind == "end":
            return
        if kind != "forming":
            pg = _make(store, f"c{i}", 1)
            _allreduce_checked(pg, 1)
            if kind == "normal":
                _allreduce_checked(pg, 1)
            elif kind == "abort_blocked":
                store.get(f"done/{i}")
            elif kind == "kill":
                store.set(f"doomed/{i}", str(os.getpid()))
                time.sleep(3600)  # the driver kills this process
            pg.abort()
            del pg
        store.set(f"helper-done/{i}", "1")
        i += 1


def _spawn_helper(port: int, helper_id: int) -> subprocess.Popen:
    code = (f"import sys; sys.path.insert(0, {HERE!r}); import cases_reconfigure as c; "
            f"c.helper_main({port}, {helper_id})")
    return subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=sys.stderr)


def abort_cycles(rank: int, world: int, cycles: int) -> dict:
    import torch
    import torch.distributed as dist

    import torch_smddp
    from mp_harness import find_free_port

    port = find_free_port()
    store = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False,
                          timeout=datetime.timedelta(300))
    helpers = [_spawn_helper(port, 0), _spawn_helper(port, 1)]
    active, spare = 0, 1
    store.set("go/0", "0")
    kinds = plan(cycles)
    samples: list[tuple[int, int]] = []
    report: list[dict] = []
    for i, kind in enumerate(kinds):
        store.set(f"plan/{i}", kind)
        entry = {"cycle": i, "kind": kind}
        if kind == "forming":
            cancel = torch_smddp._C.FormationCancel()
            timer = threading.Timer(0.3, cancel.cancel)
            timer.start()
            t0 = time.monotonic()
            try:
                _make(store, f"c{i}", 0, cancel)
                raise AssertionError("a group whose peer never came formed")
            except RuntimeError as e:
                entry["raised"] = str(e)
            entry["seconds"] = time.monotonic() - t0
            timer.join()
        else:
            pg = _make(store, f"c{i}", 0)
            _allreduce_checked(pg, 0)
            entry["errored_healthy"] = pg.errored()
            if kind == "normal":
                _allreduce_checked(pg, 0)
            elif kind in ("abort_blocked", "kill"):
                if kind == "kill":
                    victim = int(store.get(f"doomed/{i}"))
                t = torch.ones(16)
                work = pg.allreduce([t], dist.AllreduceOptions())
                caught: list[str] = []

                def waiter():
                    try:
                        work.wait()
                        caught.append("returned")
                    except Exception as e:  # noqa: BLE001
                        caught.append(f"raised: {e}")

                th = threading.Thread(target=waiter)
                th.start()
                time.sleep(0.3)  # blocked in wait() by now
                if kind == "kill":
                    os.kill(victim, 9)
                    th.join(timeout=20)
                    entry["errored"] = pg.errored()
                    entry["error_type"] = str(pg.get_error())
                    pg.abort()
                else:
                    t0 = time.monotonic()
                    pg.abort()
                    th.join(timeout=20)
                    entry["abort_to_raise_s"] = time.monotonic() - t0
                    entry["errored"] = pg.errored()
                    entry["error_type"] = str(pg.get_error())
                entry["waiter"] = caught[0] if caught else "still waiting"
                if kind == "kill":
                    # The spare takes over from the next cycle; start another.
                    entry["victim_exit"] = helpers[active].wait(timeout=20)
                    active, spare = spare, len(helpers)
                    store.set(f"go/{active}", str(i + 1))
                    helpers.append(_spawn_helper(port, spare))
                else:
                    store.set(f"done/{i}", "1")
            pg.abort()
            del pg
        if kind != "kill":
            store.get(f"helper-done/{i}")
        gc.collect()
        samples.append(_counts())
        report.append(entry)
    store.set(f"plan/{len(kinds)}", "end")
    helpers[active].wait(timeout=60)
    helpers[spare].kill()  # the last spare was never given a cycle
    helpers[spare].wait()
    return {"cycles": report, "samples": samples}
