"""Hostile clients against a live standalone reduction server
(``python -m torch_smddp.server``, run under RLIMIT_NOFILE=256) and a live
2-rank job on loopback (docs/design.md, "Security").

Each attack runs in its own round of the job (security_worker.py), with a
bounded loop and a deadline of its own, while the job allreduces through
the server (every result checked) unless the attack says otherwise. After
every attack:

* the server is alive;
* its fds, threads and RSS (/proc/PID/fd, /proc/PID/task, /proc/PID/status)
  are back to their level before the attack within 2 s of the attacker
  leaving;
* a following group of the job (new connections, handshake and stream)
  gets the closed forms and the host-order sums of seeded inputs, through
  the server (its steps counted), within a no-hang bound of its usual time.

The attacker (hostile_client.py) is written from the wire's spec with
Python's hmac, independently of the library. The rogue-registration attack
runs a job of its own (it must fail naming the rogue). The flood of every
peer-monitor listener while a group forms is test_liveness_flood.py. Every
process has a hard deadline and is killed with its children in the end;
traffic goes to 127.0.0.1 only.
"""

import os
import re
import resource
import socket
import sys
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import hostile_client as hc  # noqa: E402
from security_live import JOB, Live, accept_cpu_seconds, snapshot  # noqa: E402
from mp_harness import backend_under_test, find_free_port, worker  # noqa: E402
from server_harness import PY, Procs, env, key_file, start_job, start_server, wait_results  # noqa: E402

pytestmark = pytest.mark.skipif("smddp" not in backend_under_test(),
                                reason="standalone reduction servers are smddp's")

@pytest.fixture(scope="module")
def live(tmp_path_factory):
    procs = Procs()
    try:
        lv = Live(procs, str(tmp_path_factory.mktemp("live")))
        yield lv
        lv.close()
    finally:
        procs.kill()


def answers(s, wait=0.5):
    """Every error text the server sent on `s` before closing it (or `wait`)."""
    s.settimeout(wait)
    out = []
    while True:
        got = hc.read_frame(s)
        if got is None:
            return out
        out.append(got[1].decode("utf-8", "replace"))


# -- the attacks ------------------------------------------------------------------------

def test_unauthenticated_clients_get_nothing_and_learn_nothing(live):
    # Garbage, a protocol-1 hello, an oversized challenge, a hello with no
    # challenge, a hello with a guessed proof, and a hello recorded from a
    # real session replayed on a new one: 300 connections in all.
    s = hc.connect(live.port)
    nw, pw = os.urandom(32), os.urandom(32)
    dialled = hc.endpoint(s)
    s.sendall(hc.challenge(nw, dialled, pw=pw))
    f, body = hc.read_frame(s)
    hello = hc.header(hc.HELLO, group=1, hosts=2, host=0, count=1 << 20, payload=32)
    recorded = hc.challenge(nw, dialled, pw=pw), hello + hc.mac(
        hc.identity_key(live.key, b"", dialled), b"smddp server v5: worker proof", nw,
        body[:32], pw, body[32:64], hello)
    s.close()
    lines_before = live.log_text().count("\n")
    texts = []

    def attack():
        end = time.monotonic() + 20
        for i in range(300):
            if time.monotonic() > end:
                break
            c = hc.connect(live.port)
            try:
                kind = i % 6
                if kind == 0:
                    c.sendall(b"GET / HTTP/1.1\r\n\r\n".ljust(64, b"x"))
                elif kind == 1:
                    c.sendall(hc.header(hc.HELLO, version=1, hosts=2, payload=len(JOB)) +
                              JOB.encode())
                elif kind == 2:
                    c.sendall(hc.header(hc.CHALLENGE, payload=256 << 20))
                elif kind == 3:
                    c.sendall(hello + bytes(32))
                elif kind == 4:
                    c.sendall(hc.challenge(os.urandom(32), hc.endpoint(c)))
                    hc.read_frame(c)
                    c.sendall(hello + bytes(32))
                else:
                    c.sendall(recorded[0])
                    hc.read_frame(c)
                    c.sendall(recorded[1])
                texts.extend(answers(c))
            except OSError:
                pass
            finally:
                c.close()
        return None

    live.round(attack)
    assert texts, "the server answered none of the bad clients"
    assert any("bad magic" in t for t in texts), texts[:6]
    assert any("authentication failed" in t for t in texts), texts[:6]
    for t in texts:
        assert JOB not in t and live.key.decode() not in t and key_file() not in t, t
    log = live.log_text()
    assert live.key.decode() not in log
    # 300 refusals, at most 20 lines per 10 s (and the line saying how many
    # more there were).
    assert log.count("\n") - lines_before <= 2 * 21, log[-4000:]


def test_fd_exhaustion_under_rlimit_256_backs_off_logs_once_and_recovers(live):
    held = []
    cpu = {}

    def attack():
        end = time.monotonic() + 10
        for i in range(400):
            if time.monotonic() > end:
                break
            c = socket.socket()
            c.setblocking(False)
            try:
                # From 10 loopback addresses: one source alone may hold only
                # SMDDP_SERVER_UNPROVEN_PER_SOURCE (64) unproven connections.
                c.bind((f"127.0.0.{2 + i % 10}", 0))
                c.connect(("127.0.0.1", live.port))
            except BlockingIOError:
                pass
            except OSError:
                c.close()
                continue
            held.append(c)
        time.sleep(0.5)
        t0, c0 = time.monotonic(), accept_cpu_seconds(live.server.pid)
        time.sleep(2.0)  # the server is out of fds all along
        cpu["share"] = (accept_cpu_seconds(live.server.pid) - c0) / (time.monotonic() - t0)
        cpu["fds"] = snapshot(live.server.pid)["fds"]
        for c in held:
            c.close()

    live.round(attack)
    assert cpu["fds"] >= 250, cpu  # it really ran out
    # An accept loop retrying accept4 on EMFILE at once spins a whole core.
    assert cpu["share"] < 0.5, cpu
    log = live.log_text()
    assert log.count("cannot accept connections") == 1, log[-3000:]
    assert "Too many open files" in log
    assert "accepting connections again" in log, log[-3000:]


def _stream(live, group, hosts=2, joined=None, **kw):
    """`joined` (default all) hosts of a stream of `hosts`, each proved
    with the key: their sessions."""
    out = []
    for h in range(hosts if joined is None else joined):
        s = hc.connect(live.port)
        session, why = hc.handshake(s, live.key, hosts=hosts, host=h, group=group,
                                    job=JOB.encode(), **kw)
        assert session, why
        out.append(session)
    return out


def test_headers_that_announce_256_mib_take_no_memory(live):
    seen = {}

    def attack():
        socks = []
        # Without the key: a challenge or a hello that announces a huge
        # payload is refused before a byte of it is read.
        for i in range(100):
            c = hc.connect(live.port)
            c.sendall(hc.header(hc.CHALLENGE, payload=256 << 20) if i % 2 else
                      hc.header(hc.HELLO, hosts=2, payload=1 << 62))
            socks.append(c)
        # With it (an insider): four streams whose hosts say pieces are up
        # to 256 MiB, each host announcing one and sending 4 KiB of it.
        for g in range(4):
            for session in _stream(live, 900 + g, max_piece=256 << 20):
                session.send(hc.header(hc.DATA, dtype=hc.UINT8, op=hc.SUM, group=900 + g,
                                       count=256 << 20, payload=256 << 20), os.urandom(4096))
                socks.append(session.sock)
        time.sleep(1.0)
        seen["during"] = snapshot(live.server.pid)
        for c in socks:
            c.close()

    before, _, _ = live.round(attack)
    # 2 GiB announced; what a zero-filled buffer per header would have cost.
    assert seen["during"]["rss_kib"] - before["rss_kib"] < 64 * 1024, (before, seen)


def test_connections_and_streams_cost_no_thread_until_a_stream_serves(live):
    seen = {}

    def attack():
        socks = [hc.connect(live.port) for _ in range(60)]  # idle, unproven
        for g in range(60):  # streams that never complete: one host of two
            socks += [s.sock for s in _stream(live, 1000 + g, joined=1)]
        for g in range(10):  # complete streams that say nothing
            socks += [s.sock for s in _stream(live, 2000 + g)]
        time.sleep(0.5)
        seen["during"] = snapshot(live.server.pid)
        for c in socks:
            c.close()

    before, _, _ = live.round(attack)
    # A thread per complete stream, none per connection or waiting stream.
    assert seen["during"]["threads"] <= before["threads"] + 10, (before, seen)
    assert seen["during"]["fds"] >= before["fds"] + 60 + 60 + 20 - 5, (before, seen)


def test_a_key_holder_is_refused_past_the_host_cap_and_the_memory_budget(live):
    # A worker that holds the key asks for a group of 65535 hosts, then
    # holds waiting hosts that each announce 256 MiB pieces (a GiB of the
    # server's memory budget each, half the machine's memory by default)
    # until the server refuses one, while the job reduces through it.
    refusals = {}

    def attack():
        s = hc.connect(live.port)
        session, refusals["hosts"] = hc.handshake(s, live.key, hosts=65535, host=0, group=5000,
                                                  job=JOB.encode())
        assert session is None
        s.close()
        socks = []
        for g in range(64):  # 64 GiB asked: past any machine this runs on
            s = hc.connect(live.port)
            session, why = hc.handshake(s, live.key, hosts=2, host=0, group=5100 + g,
                                        job=JOB.encode(), max_piece=256 << 20)
            socks.append(s)
            if session is None:
                refusals["budget"] = why
                break
        refusals["held"] = len(socks) - 1
        for c in socks:
            c.close()

    live.round(attack)
    assert "a group of 65535 hosts" in refusals["hosts"], refusals
    assert "2 to 4096" in refusals["hosts"], refusals
    assert "SMDDP_SERVER_MEMORY_BUDGET" in refusals.get("budget", ""), refusals
    assert refusals["held"] >= 1, refusals


def test_a_memory_limit_refuses_streams_not_the_server(live):
    # Under RLIMIT_AS: 40 complete streams (a thread each) and a stream that
    # announces 200 MiB pieces. Streams it cannot give a thread or a buffer
    # are refused with an error to their hosts; the server lives on.
    pid = live.server.pid
    errors = []

    def attack():
        with open(f"/proc/{pid}/status") as f:
            vm = int(re.search(r"^VmSize:\s+(\d+)", f.read(), re.M).group(1)) * 1024
        old = resource.prlimit(pid, resource.RLIMIT_AS)
        resource.prlimit(pid, resource.RLIMIT_AS, (vm + (160 << 20), old[1]))
        try:
            threads = snapshot(pid)["threads"]
            streams = [_stream(live, 3000 + g) for g in range(40)]
            for st in streams:
                for session in st:
                    errors.extend(answers(session.sock, wait=0.05))
            for st in streams:
                for session in st:
                    session.sock.close()
            # Their threads end (and leave their stacks for the next).
            end = time.monotonic() + 5
            while snapshot(pid)["threads"] > threads and time.monotonic() < end:
                time.sleep(0.05)
            big = _stream(live, 4000, max_piece=200 << 20)
            for session in big:
                session.send(hc.header(hc.DATA, dtype=hc.UINT8, op=hc.SUM, group=4000,
                                       count=200 << 20, payload=200 << 20))
            for session in big:
                errors.extend(answers(session.sock, wait=2.0))
                session.sock.close()
        finally:
            resource.prlimit(pid, resource.RLIMIT_AS, old)

    live.round(attack, cmd="idle")
    assert any("cannot start a thread" in e for e in errors), errors[:5]
    assert any("ran out of memory" in e for e in errors), errors[:5]


def _init_job(tmp_path, log_name="init", **extra):
    """A fresh 2-rank `init` job of server_worker.py (each rank its own
    host), once rank 0's store listens: (procs, port)."""
    procs = Procs()
    port = start_job(procs, 2, [PY, worker("server_worker.py"), "init", str(tmp_path)],
                     lambda r, port: env(RANK=r, WORLD_SIZE=2, MASTER_ADDR="127.0.0.1",
                                         MASTER_PORT=port, FI_TCP_IFACE="lo",
                                         SERVER_TEST_HOST_PER_RANK=1, SERVER_TEST_TIMEOUT_S=60,
                                         **extra),
                     lambda r: os.path.join(tmp_path, f"{log_name}.{r}.log"),
                     [os.path.join(tmp_path, f"init.{r}.json") for r in range(2)])
    return procs, port


def test_a_rogue_server_registered_first_fails_the_job_and_hears_nothing(live, tmp_path):
    # A third party registers itself at index 0 of a job's servers in the
    # job's store before any real server does. The job holds a key file the
    # rogue does not: every rank fails at set-up naming the rogue, and the
    # rogue gets each rank's challenge (a header, a nonce, a key share, the
    # address dialled and the job id) and nothing else.
    rogue = hc.Rogue()
    procs, port = _init_job(tmp_path, SMDDP_SERVER_COUNT=1, SMDDP_SERVER_JOB="roguejob")
    try:
        import torch.distributed as dist  # the attacker's store client
        from datetime import timedelta

        store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=30))
        store.add("smddp_servers/roguejob/count", 1)
        store.set("smddp_servers/roguejob/0", f"127.0.0.1:{rogue.port}")
        got = wait_results(str(tmp_path), ["init.0.json", "init.1.json"], 150)
    finally:
        rogue.done.set()
        procs.kill()
    for res in got.values():
        err = res.get("init_error", "")
        assert f"standalone reduction server 0 (127.0.0.1:{rogue.port}" in err, res
        assert "failed authentication" in err, res
    challenge = 64 + 32 + 32 + len(f"127.0.0.1:{rogue.port}") + len("roguejob")
    assert rogue.got and all(n == challenge for n in rogue.got), rogue.got
    # The live server was never involved; it still serves a following group.
    live.round(lambda: None)


def _init_through(tmp_path, name, hosts, job, **extra):
    """A fresh 2-rank job (each rank its own host) with the key file that
    only joins its group through `hosts`; each rank's init error."""
    procs, _ = _init_job(tmp_path, log_name=name, SMDDP_SERVER_HOSTS=hosts,
                         SMDDP_SERVER_JOB=job, SMDDP_SERVER_REQUIRED=1, **extra)
    try:
        got = wait_results(str(tmp_path), ["init.0.json", "init.1.json"], 150)
    finally:
        procs.kill()
    return [res.get("init_error", "") for res in got.values()]


@pytest.mark.parametrize("name", ["127.0.0.1", "localhost"])
def test_a_relay_in_front_of_the_real_server_fails_the_job_naming_the_address(
        live, tmp_path, name):
    # A relay (registered first in the store, or reached through a host name
    # in SMDDP_SERVER_HOSTS that leads to it) forwards each rank's handshake
    # to the live server and every byte after it, changing one float of
    # each result; the workers' tags are off, as in the attack found. The
    # server proves itself for its own address, not the relay's: every
    # rank fails at set-up naming the address it dialled, and nothing
    # reaches the data path.
    relay = hc.Relay(live.port)
    try:
        errors = _init_through(tmp_path, "relay", f"{name}:{relay.port}", JOB,
                               SMDDP_SERVER_INTEGRITY=0)
    finally:
        relay.close()
    assert relay.connections > 0
    for err in errors:
        assert "failed authentication" in err, err
        assert f"{name}:{relay.port}" in err and f"127.0.0.1:{relay.port}" in err, err
    assert relay.altered == 0
    live.round(lambda: None)


def test_a_server_of_another_job_fails_the_job_before_its_hello(live, tmp_path):
    # The live server serves JOB; a job that names another id (the same key
    # file) is refused by its own workers: the server's proof is for JOB.
    errors = _init_through(tmp_path, "otherjob", f"127.0.0.1:{live.port}", "other-job")
    for err in errors:
        assert "failed authentication" in err and "job 'other-job'" in err, err
        assert JOB not in err, err
    live.round(lambda: None)


def test_no_secret_in_shm_names_command_lines_or_logs(live):
    watch = hc.ShmWatch()
    try:
        live.round(lambda: time.sleep(0.2))  # its following group makes a segment
    finally:
        watch.close()
    # This job's names (other jobs on the machine share /dev/shm).
    tags = {t for res in live.last for t in res["owner_tags"]}
    assert tags, live.last
    ours = [(n, m) for n, m in watch.seen if any(n.startswith(f"smddp-{t}-") for t in tags)]
    names = [n for n, _ in ours]
    segments = [n for n in names if "-seg-" in n]
    assert segments, watch.seen
    for name in segments:
        # The owner tag, then 32 random hex digits: no secret to read off.
        assert re.fullmatch(r"smddp-o[0-9a-f]{16}-seg-[0-9a-f]{32}", name), name
    for name, mode in ours:
        if mode is not None:
            assert mode & 0o077 == 0, (name, oct(mode))
    # The group secrets of the live job, read from its store as any rank
    # can: none is in a name (decimal, or hex as the segment name had it).
    secrets = {int(x) for res in live.last for x in res["secrets"]}
    assert secrets
    for name in names:
        for x in secrets:
            assert str(x) not in name and format(x, "016x") not in name, name
    # Nor is the key in a command line, an environment or the server's log.
    key = live.key
    for proc in [live.server] + live.ranks:
        for what in ("cmdline", "environ"):
            with open(f"/proc/{proc.pid}/{what}", "rb") as f:
                assert key not in f.read(), (proc.pid, what)
    assert key.decode() not in live.log_text()


def test_store_mode_without_a_key_file_is_refused_unless_insecure(tmp_path):
    # The job's key kept in the store can be read by whoever reaches the
    # store, who can then pass as a server: a server started with
    # --rendezvous and no key file refuses to start, naming the way out,
    # and starts with a warning only under SMDDP_SERVER_INSECURE=1.
    import subprocess

    import torch.distributed as dist
    from datetime import timedelta

    for attempt in range(3):  # a free port can be taken before the store binds it
        port = find_free_port()
        try:
            store = dist.TCPStore("127.0.0.1", port, is_master=True,
                                  timeout=timedelta(seconds=30), wait_for_workers=False)
            break
        except RuntimeError as e:
            if "EADDRINUSE" not in str(e) or attempt == 2:
                raise
    args = [PY, "-m", "torch_smddp.server", "--bind", "127.0.0.1", "--job", "insecurejob",
            "--rendezvous", f"127.0.0.1:{port}"]
    r = subprocess.run(args, env=env(keyed=False), capture_output=True, text=True, timeout=60)
    assert r.returncode != 0, r.stdout
    assert "SMDDP_SERVER_INSECURE=1" in r.stderr and "--key-file" in r.stderr, r.stderr
    # Nothing was registered, and no key was made in the store.
    assert not store.check(["smddp_servers/insecurejob/count", "smddp_servers/insecurejob/key"])
    procs = Procs()
    try:
        log = tmp_path / "server.err"
        _, hosts = start_server(procs, args[3:], env=env(keyed=False, SMDDP_SERVER_INSECURE=1),
                                stderr=open(log, "wb"))
        assert hosts.startswith("127.0.0.1:"), hosts
        assert store.check(["smddp_servers/insecurejob/0", "smddp_servers/insecurejob/key"])
        assert "warning: SMDDP_SERVER_INSECURE=1" in log.read_text()
    finally:
        procs.kill()
