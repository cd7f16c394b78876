"""The live 2-rank job of test_server_security.py:
``security_worker.py OUT_DIR``, one process per rank, each rank its own
pretend host (SMDDP_HOST_ID), the standalone server in SMDDP_SERVER_HOSTS
(SMDDP_SERVER_REQUIRED=1: a server it cannot use fails it, never silently
left out).

The test drives it in rounds through files in OUT_DIR. For round N it
writes ``cmd.N``: ``live`` (allreduce over the world group, every result
checked, until ``stop.N`` appears), ``idle`` (no traffic until ``stop.N``)
or ``quit``. After the stop, the job makes a fresh group (new connections,
a new handshake and stream on the server: a following job as the server
sees it), checks its results against closed forms and the host-order sum
of seeded random inputs, destroys it and writes ``round.N.<rank>.json``.
Both ranks stop the live loop at the same call: each call is followed by a
MAX-allreduce of "has this rank seen stop.N". Every wait has a deadline.
"""

import datetime
import json
import os
import re
import sys
import time
import traceback

# Long enough that one test's stall (a port race, a slow attacker) never
# ends the live job every later test of the file uses; the test process
# kills the job at its end anyway.
WAIT_S = 900.0


def _write(out_dir, name, obj):
    tmp = os.path.join(out_dir, name + ".tmp")
    with open(tmp, "w") as f:
        json.dump(obj, f)
    os.replace(tmp, os.path.join(out_dir, name))


def _wait_file(path):
    end = time.monotonic() + WAIT_S
    while not os.path.exists(path):
        if time.monotonic() > end:
            raise TimeoutError(f"{path} never came")
        time.sleep(0.02)
    with open(path) as f:
        return f.read().strip()


def _closed_form(torch, rank, world, n):
    base = torch.arange(n, dtype=torch.int64) % 7 + 1
    return (base * (rank + 1)).to(torch.float32), (base * (world * (world + 1) // 2)).float()


def _live(torch, dist, out_dir, n, rank, world):
    """Allreduces until stop.N: (calls, wrong results)."""
    calls = bad = 0
    flag = torch.zeros(1)
    end = time.monotonic() + WAIT_S
    while time.monotonic() < end:
        t, want = _closed_form(torch, rank, world, 1 << 16)
        dist.all_reduce(t)
        calls += 1
        bad += int(not torch.equal(t, want))
        flag.fill_(1.0 if os.path.exists(os.path.join(out_dir, f"stop.{n}")) else 0.0)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if flag.item():
            return calls, bad
    raise TimeoutError(f"stop.{n} never came")


def _fresh_group(torch, dist, torch_smddp, rank, world):
    """A new group's results: closed forms, and seeded random floats against
    their host-order sum (each rank its own host: rank order)."""
    t0 = time.monotonic()
    g = dist.new_group(list(range(world)), backend="smddp")
    bad = []
    for n in (1, 1000, (1 << 18) + 3):
        t, want = _closed_form(torch, rank, world, n)
        dist.all_reduce(t, group=g)
        if not torch.equal(t, want):
            bad.append(f"closed n={n}")
        gen = torch.Generator().manual_seed(1000 + rank)
        x = torch.randn(n, generator=gen)
        expect = None
        for r in range(world):
            y = torch.randn(n, generator=torch.Generator().manual_seed(1000 + r))
            expect = y.clone() if expect is None else expect + y
        dist.all_reduce(x, group=g)
        if not torch.equal(x, expect):
            bad.append(f"random n={n}")
    st = torch_smddp.stats(g)
    # Every group secret in the job's store, read as any rank could: the
    # test looks for them where they must not be (/dev/shm names).
    root = dist.distributed_c10d._get_default_store()
    while isinstance(root, dist.PrefixStore):
        root = root.underlying_store
    secrets = [root.get(k).decode() for k in root.list_keys() if k.endswith("/secret")]
    # This process's /dev/shm owner tag (the lock file it holds open): the
    # test tells this job's names from other jobs' on the machine by it.
    tags = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        m = re.fullmatch(r"/dev/shm/smddp-(o[0-9a-f]{16})-lock", target)
        if m:
            tags.add(m.group(1))
    dist.destroy_process_group(g)
    return {"fresh_bad": bad, "fresh_s": time.monotonic() - t0,
            "fresh_servers": st["standalone_servers"],
            "fresh_server_steps": st["standalone_server_steps"], "secrets": secrets,
            "owner_tags": sorted(tags)}


def main():
    out_dir = sys.argv[1]
    rank = int(os.environ["RANK"])
    os.environ["SMDDP_HOST_ID"] = f"h{rank}"
    try:
        import torch
        import torch.distributed as dist

        import torch_smddp

        torch.set_num_threads(1)
        dist.init_process_group("smddp", timeout=datetime.timedelta(seconds=60))
        world = dist.get_world_size()
        n = 0
        while True:
            cmd = "live" if n == 0 else _wait_file(os.path.join(out_dir, f"cmd.{n}"))
            if cmd == "quit":
                break
            res = {"rank": rank, "round": n, "pid": os.getpid(), "live_calls": 0, "live_bad": 0}
            if cmd == "live" and n > 0:
                res["live_calls"], res["live_bad"] = _live(torch, dist, out_dir, n, rank, world)
            elif n > 0:
                _wait_file(os.path.join(out_dir, f"stop.{n}"))
            res.update(_fresh_group(torch, dist, torch_smddp, rank, world))
            _write(out_dir, f"round.{n}.{rank}.json", res)
            n += 1
        dist.destroy_process_group()
    except BaseException as e:  # noqa: BLE001 - reported to the test
        _write(out_dir, f"crashed.{rank}.json",
               {"rank": rank, "crashed": f"{type(e).__name__}: {e}",
                "traceback": traceback.format_exc()[-4000:]})


if __name__ == "__main__":
    main()
