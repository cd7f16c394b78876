"""Child-side scenarios for test_robust.py ("never hang, never corrupt").

Like cases_failures.py, the children only observe and report JSON; the
parent asserts. Torch is imported inside the functions so the parent can
import this module cheaply.

* ``init_destroy_cycles``: many init_process_group("smddp") /
  destroy_process_group cycles in one process, sampling threads, fds, memory
  maps, VmRSS and VmSize after each.
* ``wire_intrusion``: with the tcp provider, a foreign thread connects to the
  library's listening TCP ports (127.0.0.1 only) and sends garbage while the
  job runs allreduces checked against the closed form.
* ``wire_libfabric_intrusion``: a foreign libfabric process
  (tests/cpp/wire_intruder.cc) sends hostile frames that reach the frame
  layer.
* ``run_death_trial`` (parent side): one randomized peer-death trial over
  cases_failures.peer_death, shared by test_robust.py and
  scripts/peer_death_trials.py.
"""

from __future__ import annotations

import os
import random
import re
import socket
import threading
import time


def _sum_is_wrong(n, rank, want):
    """All-reduces n copies of rank + 1; 1 if any element differs from want."""
    import torch  # lazily, like the rest of this module
    import torch.distributed as dist

    t = torch.full((n,), float(rank + 1))
    dist.all_reduce(t)
    return int(not bool(torch.all(t == want)))


# --------------------------------------------------------------------------
# process resources
# --------------------------------------------------------------------------

def proc_sample() -> dict:
    status = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmSize"):
                status[key] = int(rest.split()[0]) * 1024
    with open("/proc/self/maps") as f:
        lines = f.readlines()
    maps = len(lines)
    # smddp's /dev/shm objects this process still maps or holds open (its
    # names carry an owner tag, not the pid; test_resources checks that no
    # name outlives its jobs).
    shm = sum(1 for ln in lines if "/dev/shm/smddp-" in ln)
    for fd in os.listdir("/proc/self/fd"):
        try:
            shm += os.readlink(f"/proc/self/fd/{fd}").startswith("/dev/shm/smddp-")
        except OSError:
            pass
    return {"threads": len(os.listdir("/proc/self/task")), "fds": len(os.listdir("/proc/self/fd")),
            "maps": maps, "rss": status.get("VmRSS", 0), "vsize": status.get("VmSize", 0),
            "shm": shm}


def settled_sample(first, within_s: float = 1.0) -> dict:
    """proc_sample() once the thread and fd counts are back to those of
    ``first`` (the previous cycle's), or after ``within_s``. A group's last
    threads end a moment after destroy returns (a desync answering thread
    leaves once the store has delivered its wake-up; the TCPStore server
    in rank 0 closes its side of a closed connection when it notices), so
    an immediate sample can catch one still on its way out; a real leak
    never settles and shows as growth."""
    deadline = time.monotonic() + within_s
    while True:
        s = proc_sample()
        if first is None or time.monotonic() >= deadline or (
                s["threads"] <= first["threads"] and s["fds"] <= first["fds"]):
            return s
        time.sleep(0.01)


# --------------------------------------------------------------------------
# 1. init/destroy cycles
# --------------------------------------------------------------------------

def init_destroy_cycles(rank: int, world: int, cycles: int) -> dict:
    """``cycles`` init/allreduce/destroy cycles on one persistent TCPStore
    (each cycle under its own key prefix, so no cycle reads another's
    addresses). After each cycle: a resource sample and whether both
    allreduces (one small, one sharded and chunked) equal the closed form."""
    import datetime

    import torch
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    store = c10d._get_default_store()
    if rank == 0:
        from mp_harness import find_free_port

        store.set("cycles/port", str(find_free_port()))
    port = int(store.get("cycles/port").decode())
    dist.barrier()
    dist.destroy_process_group()
    base = dist.TCPStore("127.0.0.1", port, world, rank == 0,
                         timeout=datetime.timedelta(seconds=30))
    want = float(world * (world + 1) // 2)
    n_big = 300_001  # sharded over the servers and pipelined in chunks
    samples, wrong = [], []
    for i in range(cycles):
        dist.init_process_group("smddp", store=dist.PrefixStore(f"cycle{i}/", base), rank=rank,
                                world_size=world, timeout=datetime.timedelta(seconds=30))
        small = torch.full((7,), float(rank + 1))
        dist.all_reduce(small)
        big = torch.full((n_big,), float(rank + 1))
        dist.all_reduce(big)
        if not (bool(torch.all(small == want)) and bool(torch.all(big == want))):
            wrong.append(i)
        dist.destroy_process_group()
        del small, big
        samples.append(settled_sample(samples[-1] if samples else None))
    # Leave a default group for the harness's destroy_process_group.
    dist.init_process_group("smddp", store=dist.PrefixStore("final/", base), rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=30))
    dist.barrier()
    return {"samples": samples, "wrong": wrong}


# --------------------------------------------------------------------------
# 2. a foreign process on the library's TCP ports
# --------------------------------------------------------------------------

def listening_ports(pids) -> dict:
    """{pid: [port, ...]} of IPv4/IPv6 TCP sockets in LISTEN state owned by
    ``pids`` (socket inodes from /proc/<pid>/fd matched in /proc/net/tcp*)."""
    out = {}
    for pid in pids:
        inodes = set()
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
        ports = []
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            try:
                with open(table) as f:
                    next(f)
                    for line in f:
                        cols = line.split()
                        local, state, inode = cols[1], cols[3], cols[9]
                        if state == "0A" and inode in inodes:  # 0A = LISTEN
                            ports.append(int(local.rsplit(":", 1)[1], 16))
            except OSError:
                continue
        out[pid] = sorted(set(ports))
    return out


def _frame_bytes(kind: str, rng: random.Random) -> bytes:
    """Hostile payloads: random bytes, a truncated smddp frame header, a
    header claiming a huge payload, an oversized blob, and a header-shaped
    blob with our magic but a wrong secret."""
    import struct

    magic = 0x50444D53
    if kind == "garbage":
        return rng.randbytes(rng.randint(1, 4096))
    if kind == "truncated":
        hdr = struct.pack("<IHBBQQIIQQQQBBhi", magic, 1, 1, 1, rng.getrandbits(64), 0, 0, 0, 0,
                          1 << 20, 1, 0, 0, 0, 0, -1)
        return hdr[: rng.randint(1, len(hdr) - 1)]
    if kind == "huge_length":
        return struct.pack("<IHBBQQIIQQQQBBhi", magic, 1, 1, 1, rng.getrandbits(64), 0, 0, 0, 0,
                           (1 << 63) - 1, 1, 0, 0, 0, 0, -1) + rng.randbytes(64)
    if kind == "oversized":
        return rng.randbytes(1 << 20) * 4
    if kind == "wrong_secret":
        return struct.pack("<IHBBQQIIQQQQBBhi", magic, 1, 2, 1, rng.getrandbits(64), 0, 0, 0, 0,
                           16, 0, 0, 0, 0, 0, -1) + b"forged error msg"
    raise ValueError(kind)


INTRUSION_KINDS = ("garbage", "truncated", "huge_length", "oversized", "wrong_secret")


def _intruder(ports, log, seed, deadline, passes=2):
    """Bounded: ``passes`` passes, each sending every kind of hostile payload
    to every port on 127.0.0.1 over a fresh connection, reading what comes
    back (briefly), then closing. Records what happened."""
    rng = random.Random(seed)
    for _ in range(passes):
        for kind in INTRUSION_KINDS:
            for port in ports:
                if time.monotonic() > deadline:
                    return
                rec = {"port": port, "kind": kind}
                try:
                    with socket.create_connection(("127.0.0.1", port), timeout=1.0) as s:
                        rec["connected"] = True
                        data, sent = _frame_bytes(kind, rng), 0
                        try:
                            while sent < len(data):
                                k = s.send(data[sent:])
                                if k <= 0:
                                    break
                                sent += k
                                rec["sent"] = sent
                            s.settimeout(0.2)
                            rec["reply_bytes"] = len(s.recv(4096))  # 0: the peer closed on us
                        except (socket.timeout, OSError) as e:
                            rec["io_error"] = type(e).__name__
                except OSError as e:
                    rec["connected"] = False
                    rec["error"] = type(e).__name__
                log.append(rec)
                time.sleep(0.01)


def wire_intrusion(rank: int, world: int, rounds: int) -> dict:
    """Rank 0 finds every rank's listening TCP ports (pids shared through the
    Store) and runs a foreign client thread against them while every rank
    runs ``rounds`` allreduces (small and chunked) checked against the
    closed form. The intruder shares rank 0's process but not its library
    state: it speaks raw TCP, like any process on the host could."""
    import torch
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    import torch_smddp

    store = c10d._get_default_store()
    store.set(f"wire/pid/{rank}", str(os.getpid()))
    pids = [int(store.get(f"wire/pid/{r}").decode()) for r in range(world)]
    warm = torch.ones(4)
    dist.all_reduce(warm)  # endpoints exist and are connected
    # The harness's TCPStore (MASTER_PORT, in rank 0) is torch's, not ours.
    store_port = int(os.environ["MASTER_PORT"])
    ports = {pid: [p for p in pp if p != store_port]
             for pid, pp in listening_ports(pids).items()}
    before = torch_smddp.stats()["frames_rejected"]
    log = []
    intruder = None
    if rank == 0:
        flat = [p for pid in pids for p in ports[pid]]
        intruder = threading.Thread(target=_intruder,
                                    args=(flat, log, 1234, time.monotonic() + 60),
                                    daemon=True)
        intruder.start()
    want = float(world * (world + 1) // 2)
    wrong = 0
    i = 0
    while True:
        # Every rank learns through the group itself whether rank 0's
        # intruder is still at work (MAX of the flags), so all ranks make the
        # same calls; at least `rounds` data allreduces run under fire.
        busy = torch.tensor([1.0 if intruder is not None and intruder.is_alive() else 0.0])
        dist.all_reduce(busy, op=dist.ReduceOp.MAX)
        if i >= rounds and busy.item() == 0.0:
            break
        wrong += _sum_is_wrong(7 if i % 2 else 300_001, rank, want)
        i += 1
    if intruder is not None:
        intruder.join(timeout=10)
    wrong += _sum_is_wrong(300_001, rank, want)
    return {"provider": torch_smddp._backend_of().provider, "ports": ports[os.getpid()],
            "calls": i, "wrong": wrong, "rejected_delta": torch_smddp.stats()["frames_rejected"] - before,
            "log": log}


# --------------------------------------------------------------------------
# 3. randomized peer death (parent side; the children run
#    cases_failures.peer_death)
# --------------------------------------------------------------------------

DEATH_COLLECTIVES = ("all_reduce", "broadcast", "all_gather", "barrier")
ENGINE_NAME = {"all_reduce": "allreduce", "broadcast": "broadcast",
               "all_gather": "allgather", "barrier": "barrier"}
TRIAL_PG_TIMEOUT = 30.0


def draw_trial(rng: random.Random) -> dict:
    """One random trial. Rank 0 hosts the Store the survivors meet through,
    so it is never the victim; the delay is long enough for every survivor to
    finish the warm-up all_reduce (so the death lands in the drawn call)."""
    world = rng.choice((2, 3, 4))
    return {"world": world, "victim": rng.randrange(1, world),
            "coll": rng.choice(DEATH_COLLECTIVES), "how": rng.choice(("sigkill", "exit")),
            "delay": round(rng.uniform(0.1, 1.5), 3)}


def _names_rank(msg: str, victim: int, by_timeout_ok: bool) -> bool:
    if re.search(rf"(?<![\w.-])rank {victim}\b", msg):
        return True
    # A timeout names the ranks it waited for and those it never saw.
    return by_timeout_ok and any(
        victim in {int(x) for x in m.split(",")}
        for m in re.findall(r"rank\(s\) ([\d, ]+)", msg))


def run_death_trial(trial: dict, backend: str = "smddp", env: dict | None = None,
                    pg_timeout: float = TRIAL_PG_TIMEOUT, by_timeout_ok: bool = False) -> dict:
    """Runs one trial; returns {"problems": [...], "elapsed": {rank: s}}. A
    problem is any survivor that returned normally, raised without naming
    the lost rank and the collective, or took longer than the group
    timeout; and any later call that did not fail the same way.

    ``by_timeout_ok``: accept detection by the group timeout (an error that
    names the victim among the ranks it waited for or never saw, at most
    a second after the timeout). For ranks on different (pretend) hosts,
    where no process id can be checked; see the report in
    scripts/peer_death_trials.py."""
    from mp_harness import ExitedRank, run_world

    world, victim, coll = trial["world"], trial["victim"], trial["coll"]
    results = run_world(world, "cases_failures:peer_death", backend=backend,
                        timeout=pg_timeout + 30, pg_timeout=pg_timeout,
                        expect_failure=True, allow_exit={victim}, env=env,
                        args=(coll, victim, trial["how"], trial["delay"]))
    problems, elapsed = [], {}
    dead = results[victim]
    want_code = -9 if trial["how"] == "sigkill" else 3
    if not isinstance(dead, ExitedRank) or dead.returncode != want_code:
        problems.append(f"rank {victim} did not die as planned: {dead!r}")
    for rank, r in enumerate(results):
        if rank == victim:
            continue
        if not r["warm_ok"]:
            problems.append(f"rank {rank}: warm-up all_reduce gave a wrong result")
        first = r["first"]
        elapsed[rank] = round(first["elapsed"], 3)
        where = f"rank {rank}"
        if not first["raised"]:
            problems.append(f"{where}: {coll} returned normally although rank {victim} died")
            continue
        msg = first["msg"]
        if not first["is_dist_backend_error"]:
            problems.append(f"{where}: raised {first['type']}, not DistBackendError: {msg!r}")
        if not _names_rank(msg, victim, by_timeout_ok):
            problems.append(f"{where}: lost rank {victim} not named: {msg!r}")
        if ENGINE_NAME[coll] not in msg:
            problems.append(f"{where}: collective {ENGINE_NAME[coll]} not named: {msg!r}")
        if first["elapsed"] >= pg_timeout + (1.0 if by_timeout_ok else 0.0):
            problems.append(f"{where}: took {first['elapsed']:.1f}s, past the group timeout")
        for k in ("later", "later_async"):
            later = r[k]
            if not later["raised"]:
                problems.append(f"{where}: a call after the death ({k}) returned normally")
            elif not _names_rank(later["msg"], victim, by_timeout_ok):
                problems.append(f"{where}: {k} does not name rank {victim}: {later['msg']!r}")
    return {"problems": problems, "elapsed": elapsed}


def wire_libfabric_intrusion(rank: int, world: int, per_kind: int, intruder_bin: str) -> dict:
    """Every rank starts a foreign libfabric process (smddp_wire_intruder)
    aimed at its own endpoint: hostile frames on the error/probe tag and
    forged data frames on the data tags (see tests/cpp/wire_intruder.cc).
    Meanwhile the group runs allreduces checked against the closed form
    until every intruder has sent everything and every rank has counted
    every error-tag frame as rejected (or a deadline passes). The ranks
    agree on when to stop through the group itself (MAX of flags)."""
    import subprocess

    import torch
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    import torch_smddp

    # torch hands the backend PrefixStore("cpu/", <the default store>), and a
    # PrefixStore joins its prefix and the key with a "/".
    store = c10d._get_default_store()
    warm = torch.ones(4)
    dist.all_reduce(warm)
    provider = torch_smddp._backend_of().provider
    prefix = torch_smddp._backend_of().store_prefix  # this group instance's keys
    name = store.get(f"cpu//{prefix}addr/{rank}")
    secret = store.get(f"cpu//{prefix}secret").decode()
    before = torch_smddp.stats()["frames_rejected"]
    liveness = _forge_liveness_hellos(store, prefix, rank, world, int(secret))
    proc = subprocess.Popen([intruder_bin, provider, name.hex(), str(per_kind), secret, str(world)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    os.set_blocking(proc.stdout.fileno(), False)
    sent_line = ""
    want = float(world * (world + 1) // 2)
    wrong, calls = 0, 0
    deadline = time.monotonic() + 60
    expected = None
    slack = 0
    try:
        while True:
            if expected is None:
                try:
                    sent_line += os.read(proc.stdout.fileno(), 256).decode()
                except BlockingIOError:
                    pass
                if "\n" in sent_line:
                    expected = int(sent_line.split()[1])
                    parts = sent_line.split()
                    slack = int(parts[3]) if len(parts) > 3 else 0
            delta = torch_smddp.stats()["frames_rejected"] - before
            not_done = expected is None or delta < expected
            flags = torch.tensor([1.0 if not_done else 0.0,
                                  1.0 if time.monotonic() > deadline else 0.0])
            dist.all_reduce(flags, op=dist.ReduceOp.MAX)
            if flags[0].item() == 0.0 or flags[1].item() == 1.0:
                break
            wrong += _sum_is_wrong(7 if calls % 2 else 100_003, rank, want)
            calls += 1
        wrong += _sum_is_wrong(300_001, rank, want)
        delta = torch_smddp.stats()["frames_rejected"] - before
    finally:
        proc.stdin.close()
        try:
            code = proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait()
    return {"provider": provider, "sent": sent_line.strip(), "expected_rejects": expected,
            "slack": slack,
            "rejected_delta": delta, "wrong": wrong, "calls": calls, "intruder_exit": code,
            "errors": torch_smddp.stats()["errors"], "liveness": liveness}


def _forge_liveness_hellos(store, prefix, rank, world, secret):
    """Offers this rank's liveness listener (a group across hosts has one)
    hellos "from" every other rank that are not theirs: the layout before
    liveness messages carried a MAC, with the group's secret in the clear,
    and today's (48 bytes, version 3) with a MAC of zeros. Returns, per forgery, whether the
    listener closed it unanswered (it must; an answer is its own hello,
    which would mean the forger holds a link), or None without a listener."""
    import struct

    key = f"cpu//{prefix}liveness/{rank}"
    # One host: no liveness connections, and no key (a get would wait out
    # the store's timeout for it: 100 s of this test's 120 under shm).
    if not store.check([key]):
        return None
    entry = store.get(key).decode().split()
    if len(entry) < 2 or entry[0] == "-":
        return None
    address, port = entry[0], int(entry[1])
    magic = 0x4C444D53
    out = []
    for peer in range(world):
        if peer == rank:
            continue
        for msg in (struct.pack("<IBBHIIQ", magic, 1, 1, 0, peer, rank, secret),
                    struct.pack("<IBBHIIQQ", magic, 3, 1, 0, peer, rank, 1 << 40,
                                (1 << 64) - 1) + bytes(16)):
            with socket.create_connection((address, port), timeout=10) as s:
                s.sendall(msg)
                # Nothing more comes: the old layout is shorter than a message.
                s.shutdown(socket.SHUT_WR)
                try:
                    closed = s.recv(64) == b""
                except ConnectionResetError:
                    closed = True
                except socket.timeout:
                    closed = False
                out.append(closed)
    return out


def construct_while_churning(groups: int) -> dict:
    """Constructs `groups` world-1 groups and as many standalone servers on a
    thread (both constructors release the GIL while they work) while the
    main thread creates and frees pybind objects of this module, as
    torchft does when it configures a group on its quorum thread. A
    constructor that registered its instance without the GIL corrupted
    pybind's instance map: the process aborted within about 2 s
    ("pybind11_object_dealloc(): Tried to deallocate unregistered
    instance!"). Returns what was built and how much churn ran beside it."""
    import datetime

    import torch.distributed as dist

    from torch_smddp import _C

    built = {"groups": 0, "servers": 0, "sums": []}
    errors = []

    def construct():
        try:
            for i in range(groups):
                pg = _C.ProcessGroupSmddp(dist.HashStore(), 0, 1, datetime.timedelta(seconds=30),
                                          f"churn{i}")
                import torch
                t = torch.full((4,), float(i))
                pg.all_reduce_now(t, dist.ReduceOp.SUM)
                built["sums"].append(t.tolist())
                pg.shutdown()
                del pg
                built["groups"] += 1
                server = _C.StandaloneServer("127.0.0.1", 0, 1, "churn", key="k" * 64)
                server.stop()
                del server
                built["servers"] += 1
        except Exception as e:  # noqa: BLE001  (reported to the test)
            errors.append(f"{type(e).__name__}: {e}")

    worker = threading.Thread(target=construct)
    worker.start()
    churned = 0
    while worker.is_alive():
        objs = [_C.FormationCancel() for _ in range(200)]
        churned += len(objs)
        del objs
    worker.join()
    return {**built, "churned": churned, "errors": errors}


def smddp_group_with_key_files(rank: int, world: int) -> dict:
    """Under a gloo default group, makes an smddp group with this rank's
    SMDDP_SERVER_KEY_FILE (the parent gives each rank its own, or the
    same): with the same file the group forms and all-reduces; with
    different ones making it must fail on every rank, naming the key file.
    Returns what happened."""
    import torch
    import torch.distributed as dist

    import torch_smddp  # noqa: F401  (registers the backend)

    try:
        group = dist.new_group(backend="smddp")
    except Exception as e:  # noqa: BLE001 - the message is the result
        return {"formed": False, "error": f"{type(e).__name__}: {e}"}
    t = torch.full((5,), float(rank + 1))
    dist.all_reduce(t, group=group)
    dist.destroy_process_group(group)
    return {"formed": True, "sum_ok": bool(torch.all(t == world * (world + 1) / 2))}
