"""Children of test_resources.py: the host's resources and environment.

Torch-free at import time (mp_harness imports the module in every child and
the test imports it in the parent). Run as a script, it is the driver that
test_resources.py starts inside a private mount (and PID) namespace::

    python cases_resources.py world WORLD TARGET ARGS_JSON ENV_JSON
    python cases_resources.py sweep

and it prints one JSON line with what it found.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
# Run as a program too (the sweeper and the small /dev/shm): its cases and
# the harness by name (mp_helpers.SUPPORT_PATH).
_HARNESS = os.path.join(os.path.dirname(HERE), "harness")
if _HARNESS not in sys.path:
    sys.path.insert(0, _HARNESS)
from mp_helpers import REPO_ROOT, put_support_on_path  # noqa: E402

put_support_on_path()

from cases_failures import DEATH_DELAY, _attempt  # noqa: E402


def _closed_form_allreduces(rank: int, world: int, sizes) -> list:
    """Allreduce rank+1 at each size; the indices whose result is not the
    closed form world*(world+1)/2 (an empty list when all are right)."""
    import torch
    import torch.distributed as dist

    want = float(world * (world + 1) // 2)
    wrong = []
    for n in sizes:
        t = torch.full((n,), float(rank + 1))
        dist.all_reduce(t)
        if not bool(torch.all(t == want)):
            wrong.append(n)
    return wrong


def _stats() -> dict:
    import torch_smddp

    s = torch_smddp.stats()
    return {"path": s["allreduce_path"], "provider": torch_smddp._backend_of().provider}


# --------------------------------------------------------------------------
# 1. a /dev/shm too small for the host segment
# --------------------------------------------------------------------------

def small_shm(rank: int, world: int) -> dict:
    # 4M floats (16 MiB) crosses every slot of the segment many times over.
    wrong = _closed_form_allreduces(rank, world, [7, 300_001, 4 << 20, 5])
    return {"wrong": wrong, **_stats()}


# --------------------------------------------------------------------------
# 2. two group instances over one raw store
# --------------------------------------------------------------------------

def store_reuse(rank: int, world: int, store_path: str) -> dict:
    """Two successive smddp default groups on one FileStore: the first one's
    keys are left in the store. Rank 0 comes to the second group late, so
    every other rank reads the store while only the first group's keys are
    there."""
    import datetime

    import torch
    import torch.distributed as dist

    dist.destroy_process_group()  # the harness's group; ours replace it
    store = dist.FileStore(store_path, world)
    timeout = datetime.timedelta(seconds=15)
    want = float(world * (world + 1) // 2)
    got = []
    for instance in range(2):
        if instance == 1 and rank == 0:
            time.sleep(1.5)
        dist.init_process_group("smddp", store=store, rank=rank, world_size=world,
                                timeout=timeout)
        for n in (7, 300_001):
            t = torch.full((n,), float(rank + 1) * (instance + 1))
            dist.all_reduce(t)
            got.append(bool(torch.all(t == want * (instance + 1))))
        if instance == 0:
            dist.barrier()
            dist.destroy_process_group()
    return {"right": got}


# --------------------------------------------------------------------------
# 3. ranks in different PID namespaces
# --------------------------------------------------------------------------

def pid_namespaces(rank: int, world: int, victim: int) -> dict:
    """Correct results while one rank lives in another PID namespace (and
    waits long enough for the liveness check to run), then ``victim`` dies
    and the others must fail fast, naming it."""
    import torch
    import torch.distributed as dist

    if rank == 0:
        time.sleep(1.0)  # the others wait in the call, checking rank 0's liveness
    wrong = _closed_form_allreduces(rank, world, [7, 300_001])
    t = torch.ones(3)
    dist.all_reduce(t)  # everyone is past the checks before the victim dies
    info = {"wrong": wrong, **_stats()}
    if rank == victim:
        time.sleep(DEATH_DELAY)
        os.kill(os.getpid(), signal.SIGKILL)
    first = _attempt(lambda: dist.all_reduce(torch.ones(1000)))
    info["first"] = {k: first[k] for k in ("raised", "msg", "elapsed")}
    return info


# --------------------------------------------------------------------------
# 4. the sweeper (run inside a private /dev/shm)
# --------------------------------------------------------------------------

_HOLDER = r"""
import datetime, sys, torch, torch.distributed as dist
sys.path.insert(0, {repo!r})
import torch_smddp
dist.init_process_group("smddp", store=dist.HashStore(), rank=0, world_size=1,
                        timeout=datetime.timedelta(seconds=20))
t = torch.ones(4)
dist.all_reduce(t)
print("ready", flush=True)
sys.stdin.readline()  # hold the group until told
dist.all_reduce(t)
dist.destroy_process_group()
print("done", flush=True)
"""


def _smddp_names() -> set:
    return {n for n in os.listdir("/dev/shm") if n.startswith("smddp-")}


def _start_holder(prefix=()):
    p = subprocess.Popen([*prefix, sys.executable, "-c", _HOLDER.format(repo=REPO_ROOT)],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    line = p.stdout.readline().strip()
    if line != "ready":
        p.kill()
        raise RuntimeError(f"holder did not start: {line!r}")
    return p


def sweep_driver() -> dict:
    """A live job (A), a SIGKILLed job (B), then a third job (C) in a PID
    namespace of its own, which cannot see A's pid. After C has started:
    B's objects must be gone, A's must all be there and A must still work."""
    before = _smddp_names()
    a = _start_holder()
    a_names = _smddp_names() - before
    b = _start_holder()
    b_names = _smddp_names() - before - a_names
    b.kill()
    b.wait()
    c = _start_holder(["unshare", "-p", "-f", "--mount-proc", "--kill-child"])
    after_c = _smddp_names()
    c.stdin.write("\n")
    c.stdin.flush()
    c_ok = c.stdout.readline().strip() == "done"
    c.wait(timeout=30)
    a.stdin.write("\n")
    a.stdin.flush()
    a_ok = a.stdout.readline().strip() == "done"
    a.wait(timeout=30)
    return {"a_names": sorted(a_names), "b_names": sorted(b_names), "after_c": sorted(after_c),
            "a_ok": a_ok, "c_ok": c_ok, "left": sorted(_smddp_names())}


# --------------------------------------------------------------------------
# 5. the overflow sink of a communicator whose constructor throws
# --------------------------------------------------------------------------

def sink_leak_probe(attempts: int = 3) -> dict:
    """Constructs a world-1 group whose provider does not exist (the
    constructor throws after its 1 GiB sink is reserved) ``attempts`` times;
    returns the growth of the address space in KiB."""
    import datetime

    import torch.distributed as dist
    import torch_smddp

    def vm_size_kib() -> int:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmSize:"):
                    return int(line.split()[1])
        return 0

    before = vm_size_kib()
    errors = []
    for _ in range(attempts):
        try:
            torch_smddp.ProcessGroupSmddp(dist.HashStore(), 0, 1, datetime.timedelta(seconds=5),
                                          "bogus")
        except Exception as e:  # noqa: BLE001
            errors.append(str(e)[:200])
    return {"growth_kib": vm_size_kib() - before, "errors": errors}


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "world":
        from mp_harness import run_world

        world, target = int(sys.argv[2]), sys.argv[3]
        args, env = json.loads(sys.argv[4]), json.loads(sys.argv[5])
        try:
            res = run_world(world, target, args=args, env=env, timeout=90, keep_logs=True)
            print(json.dumps({"ok": True, "results": res}))
        except AssertionError as e:
            print(json.dumps({"ok": False, "error": str(e)[-6000:]}))
    elif mode == "sweep":
        print(json.dumps(sweep_driver()))
    elif mode == "sink":
        print(json.dumps(sink_leak_probe()))
    else:
        raise SystemExit(f"unknown mode {mode}")
