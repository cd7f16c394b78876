"""Standalone reduction servers (docs/design.md, "Standalone reduction
servers"; ``python -m torch_smddp.server``).

Two settings. Without namespaces (runs anywhere): ranks split into pretend
hosts by SMDDP_HOST_ID on this machine, the server on loopback. On a
scripts/cluster.sh cluster (marked ``cluster``, skipped where namespaces
cannot be made): workers on hosts h0 and h1, the server alone on h2.

Oracles: closed forms and the rank-then-host-ordered sum computed from
every rank's seeded inputs (server_worker.py), sha256 of every result
compared across ranks, the engine's stats (the servers carried bytes), the
parent's own wall clock for the kill, and the server's address, which the
parent knows, in every error. Every process has a hard deadline and is
killed with its children in the end.
"""

import json
import os
import signal
import struct
import subprocess
import sys
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from mp_harness import REPO_ROOT, backend_under_test, find_free_port, worker  # noqa: E402
import hostile_client as hc  # noqa: E402
from server_harness import (Procs, env as _env, hosts_line as _hosts_line,  # noqa: E402
                            key_file, start_job, start_server as _start_server,
                            wait_results as _wait_results)

pytestmark = pytest.mark.skipif("smddp" not in backend_under_test(),
                                reason="standalone reduction servers are smddp's")

PY = sys.executable
WORKER = worker("server_worker.py")


@pytest.fixture
def procs():
    p = Procs()
    try:
        yield p
    finally:
        p.kill()


def _local_world(procs, world, mode, out_dir, env_extra, args=()):
    start_job(procs, world, [PY, WORKER, mode, str(out_dir), *args],
              lambda r, port: _env(RANK=r, WORLD_SIZE=world, LOCAL_RANK=0, LOCAL_WORLD_SIZE=1,
                                   MASTER_ADDR="127.0.0.1", MASTER_PORT=port,
                                   SMDDP_HOST_ID=f"h{r}", **env_extra),
              lambda r: os.path.join(out_dir, f"{mode}.{r}.log"),
              [os.path.join(out_dir, f"{mode}.{r}.json") for r in range(world)])


def _check_results(got, server_hosts):
    results = list(got.values())
    for res in results:
        assert "crashed" not in res and "init_error" not in res, res
        assert res["path"] == "shared-memory", res  # the hierarchical path takes the servers
        assert not res["bad"], (res["rank"], res["bad"])
        st = res["stats"]
        assert st["standalone_server_steps"] > 0 and st["standalone_server_bytes"] > 0, st
    hashes = [dict(r["cases"]) for r in results]
    for h in hashes[1:]:
        assert h == hashes[0], "ranks disagree bitwise: " + str(
            [c for c in h if h[c] != hashes[0][c]])
    return results


# -- without namespaces: pretend hosts on this machine -----------------------

def test_help_explains_both_rendezvous():
    r = subprocess.run([PY, "-m", "torch_smddp.server", "--help"], capture_output=True,
                       text=True, timeout=120, env=_env(), cwd=REPO_ROOT)
    assert r.returncode == 0, r.stderr
    for word in ("SMDDP_SERVER_HOSTS", "--rendezvous", "--job", "--servers", "SMDDP_SERVER_COUNT"):
        assert word in r.stdout, (word, r.stdout)


def test_two_pretend_hosts_reduce_through_two_servers(procs, tmp_path):
    _, hosts = _start_server(procs, ["--bind", "127.0.0.1", "--servers", "2", "--job", "j1"])
    assert len(hosts.split(",")) == 2
    # 40 %: both the hosts' own servers and the standalone ones take pieces
    # (two hosts would otherwise hand the servers everything).
    _local_world(procs, 2, "check", tmp_path,
                 {"SMDDP_SERVER_HOSTS": hosts, "SMDDP_SERVER_JOB": "j1",
                  "SMDDP_SERVER_SHARE": 40})
    got = _wait_results(tmp_path, ["check.0.json", "check.1.json"], 240)
    _check_results(got, hosts)


# What check's closed forms put on the wire as f32 (server_worker.py: rank
# r holds (r + 1) * (i % 7 + 1)): rank 0's and rank 1's pieces, their sum.
PLAINTEXT = tuple(struct.pack("<4f", *(k * v for v in (1, 2, 3, 4))) for k in (1, 2, 3))


def _server_behind_a_relay(procs, encrypt, tries=3):
    """A server at 127.0.0.1:P advertising 127.0.0.2, and a passive relay
    at 127.0.0.2:P. The kernel picks P free on 127.0.0.1 only: when
    127.0.0.2:P is taken (ci68: EADDRINUSE, with SO_REUSEADDR), that
    server stops and another picks a new port."""
    for attempt in range(tries):
        server, hosts = _start_server(
            procs, ["--bind", "127.0.0.1", "--advertise", "127.0.0.2", "--job", "enc"],
            env=_env(SMDDP_WIRE_ENCRYPT=encrypt))
        port = int(hosts.rsplit(":", 1)[1])
        assert hosts == f"127.0.0.2:{port}", hosts
        try:
            return server, hosts, hc.Relay(port, host="127.0.0.2", port=port, look_for=PLAINTEXT)
        except OSError as e:
            server.kill()
            server.wait(timeout=10)
            if attempt == tries - 1:
                raise AssertionError(f"127.0.0.2:{port} was taken on each of {tries} tries") from e


@pytest.mark.parametrize("encrypt", [1, 0])
def test_an_eavesdropper_sees_no_plaintext_with_wire_encryption(procs, tmp_path, encrypt):
    """Every byte between the workers and the server goes through a relay
    (hostile_client.Relay) that records it: the address the workers dial
    (127.0.0.2:P) forwards to the server (127.0.0.1:P), which --advertise
    lets prove itself there, as behind NAT. With SMDDP_WIRE_ENCRYPT=1 on
    both, check's cases (one job) match their oracles and the relay sees
    none of the closed forms' f32 runs; without it, it sees them (the
    relay can see plaintext)."""
    server, hosts, relay = _server_behind_a_relay(procs, encrypt)
    try:
        _local_world(procs, 2, "check", tmp_path,
                     {"SMDDP_SERVER_HOSTS": hosts, "SMDDP_SERVER_JOB": "enc",
                      "SMDDP_SERVER_SHARE": 50, "SMDDP_SERVER_REQUIRED": 1,
                      "SMDDP_WIRE_ENCRYPT": encrypt})
        got = _wait_results(tmp_path, ["check.0.json", "check.1.json"], 240)
    finally:
        relay.close()
    results = _check_results(got, hosts)
    assert relay.connections >= 2
    # The servers' share of every step crossed the relay.
    assert relay.forwarded >= sum(r["stats"]["standalone_server_bytes"] for r in results) > 0
    if encrypt:
        assert relay.seen == {p: 0 for p in PLAINTEXT}, relay.seen
    else:
        assert all(n > 0 for n in relay.seen.values()), relay.seen
    assert server.poll() is None


def test_pretend_hosts_narrow_cross_in_bf16_and_fp16_through_the_servers(procs, tmp_path):
    """cross_host_dtype with standalone servers: their pieces cross in the
    narrow wire form too (the servers' bytes are those of bf16), results
    match server_worker.py's oracles, and bf16's are the same bits as a
    run without servers (every element rounded the same way whoever
    reduces it)."""
    _, hosts = _start_server(procs, ["--bind", "127.0.0.1", "--servers", "2", "--job", "jn"])
    got = {}
    for name, extra in (("servers", {"SMDDP_SERVER_HOSTS": hosts, "SMDDP_SERVER_JOB": "jn",
                                     "SMDDP_SERVER_SHARE": 50}),
                        ("none", {"SMDDP_SERVER_HOSTS": ""})):
        out = tmp_path / name
        out.mkdir()
        _local_world(procs, 3, "narrow", out, extra)
        got[name] = _wait_results(out, [f"narrow.{r}.json" for r in range(3)], 240)
    for name, res in got.items():
        for r in res.values():
            assert "crashed" not in r and "init_error" not in r, r
            # Without servers, one rank per host takes the network-only
            # path, which narrows the same way (rank order = host order).
            assert r["path"] == ("shared-memory" if name == "servers" else "tcp;ofi_rxm"), r
            assert not r["bad"], (name, r["rank"], r["bad"])
    st = got["servers"]["narrow.0.json"]["stats"]
    assert st["standalone_server_steps"] > 0, st
    assert got["none"]["narrow.0.json"]["stats"]["standalone_server_steps"] == 0
    # The servers' half of the f32 bytes crossed as bf16 and fp16 (a
    # 4-byte scale per piece): under 0.55 of what f32 pieces would carry.
    n_total = sum(3 * n for n in (1, 1000, (1 << 16) + 3, (1 << 20) + 5)) * 2  # 3 calls, 2 wires
    assert st["standalone_server_bytes"] < 0.55 * 0.5 * 4 * n_total, st
    for name in got:
        hashes = [dict(r["cases"]) for r in got[name].values()]
        assert all(h == hashes[0] for h in hashes), name
    with_servers, without = (dict(got[k]["narrow.0.json"]["cases"]) for k in ("servers", "none"))
    for case, digest in with_servers.items():
        if case.startswith("bf16"):
            assert digest == without[case], case


def test_servers_found_in_the_jobs_store(procs, tmp_path):
    # Workers first: rank 0 hosts the store the server then registers in.
    # No key file on either side: the job's key, generated in its store,
    # which SMDDP_SERVER_INSECURE=1 must accept on both.
    world = 2
    port = start_job(procs, world, [PY, WORKER, "check", str(tmp_path)],
                     lambda r, port: _env(keyed=False, SMDDP_SERVER_INSECURE=1, RANK=r,
                                          WORLD_SIZE=world, LOCAL_WORLD_SIZE=1,
                                          MASTER_ADDR="127.0.0.1", MASTER_PORT=port,
                                          SMDDP_HOST_ID=f"h{r}", SMDDP_SERVER_COUNT=1,
                                          SMDDP_SERVER_JOB="storejob"),
                     lambda r: os.path.join(tmp_path, f"check.{r}.log"),
                     [os.path.join(tmp_path, f"check.{r}.json") for r in range(world)])
    _start_server(procs, ["--bind", "127.0.0.1", "--job", "storejob",
                          "--rendezvous", f"127.0.0.1:{port}"],
                  env=_env(keyed=False, SMDDP_SERVER_INSECURE=1))
    got = _wait_results(tmp_path, ["check.0.json", "check.1.json"], 240)
    _check_results(got, None)
    # The addresses went from the store to the engine, not into os.environ.
    assert all(r["env_server_hosts"] is None for r in got.values()), got


def test_servers_found_at_torchruns_rendezvous_endpoint(procs, tmp_path):
    # torchrun's c10d rendezvous: the workers' store is on a port chosen at
    # run time, so the server registers at the rendezvous endpoint and the
    # workers look there (SMDDP_SERVER_RENDEZVOUS).
    port = find_free_port()
    env = _env(keyed=False, SMDDP_SERVER_INSECURE=1, SMDDP_SERVER_COUNT=1,
               SMDDP_SERVER_JOB="rdzvjob",
               SMDDP_SERVER_RENDEZVOUS=f"127.0.0.1:{port}", SERVER_TEST_HOST_PER_RANK=1)
    procs.start([PY, "-m", "torch.distributed.run", "--rdzv-backend", "c10d", "--rdzv-endpoint",
                 f"127.0.0.1:{port}", "--nnodes", "1", "--nproc-per-node", "2",
                 "--max-restarts", "0", WORKER, "check", str(tmp_path)], env=env,
                log=os.path.join(tmp_path, "torchrun.log"))
    _start_server(procs, ["--bind", "127.0.0.1", "--job", "rdzvjob",
                          "--rendezvous", f"127.0.0.1:{port}"],
                  env=_env(keyed=False, SMDDP_SERVER_INSECURE=1),
                  logs=[os.path.join(tmp_path, "torchrun.log")])
    got = _wait_results(tmp_path, ["check.0.json", "check.1.json"], 240)
    results = _check_results(got, None)
    assert all(r["standalone_servers"] == 1 for r in results), results
    # A value that is no HOST:PORT is named before anything waits.
    bad = tmp_path / "bad"
    bad.mkdir()
    _local_world(procs, 2, "init", bad, {"SMDDP_SERVER_COUNT": 1, "SMDDP_SERVER_JOB": "x",
                                         "SMDDP_SERVER_RENDEZVOUS": "nowhere"})
    for res in _wait_results(bad, ["init.0.json", "init.1.json"], 120).values():
        assert "SMDDP_SERVER_RENDEZVOUS='nowhere'" in res.get("init_error", ""), res


def test_steps_in_flight_outgrow_the_sockets_without_a_deadlock(procs, tmp_path):
    # 4 MiB shared-memory steps, 16 in flight, 90 % of each to the server:
    # about 58 MiB posted to it per host before the first result can come
    # back. A worker that blocked in its send while the server blocked
    # sending it an earlier result would deadlock here (then time out).
    _, hosts = _start_server(procs, ["--bind", "127.0.0.1"])
    _local_world(procs, 2, "big", tmp_path,
                 {"SMDDP_SERVER_HOSTS": hosts, "SMDDP_SERVER_SHARE": 90,
                  "SMDDP_SHM_SLOT_BYTES": 4 << 20, "SMDDP_SHM_DEPTH": 16,
                  "SERVER_TEST_TIMEOUT_S": 60})
    got = _wait_results(tmp_path, ["big.0.json", "big.1.json"], 240)
    for res in got.values():
        assert "crashed" not in res and "init_error" not in res, res
        assert res["path"] == "shared-memory", res
        assert res["bad"] == [], res
        st = res["stats"]
        # 3 calls x 16 steps, each through the server; 90 % of 64 MiB each
        assert st["standalone_server_steps"] == 48, st
        assert st["standalone_server_bytes"] >= 3 * 0.89 * (64 << 20), st


def test_a_killed_server_fails_every_worker_naming_it(procs, tmp_path):
    server, hosts = _start_server(procs, ["--bind", "127.0.0.1"])
    _local_world(procs, 2, "loop", tmp_path, {"SMDDP_SERVER_HOSTS": hosts}, args=["60"])
    _wait_results(tmp_path, ["ready.0.json", "ready.1.json"], 180)
    time.sleep(1.0)
    t_kill = time.time()
    os.kill(server.pid, signal.SIGKILL)
    got = _wait_results(tmp_path, ["loop.0.json", "loop.1.json"], 60)
    for res in got.values():
        assert res.get("raised"), res
        msg = res["msg"]
        assert "standalone reduction server 0" in msg and hosts in msg, msg
        assert "timed out" not in msg, msg
        assert res["t"] - t_kill < 5.0, (res["t"] - t_kill, msg)
        assert res["destroy_s"] < 10.0, res


def test_a_server_whose_narrow_results_carry_a_bad_scale_fails_every_worker_naming_it(
        procs, tmp_path):
    """A server that holds the key but answers bf16 pieces with a scale
    that is not a power of two (hostile_client.Liar): no worker widens
    those bytes into a result; each one's call fails, naming the server
    and the scale."""
    liar = hc.Liar(open(key_file(), "rb").read().strip())
    hosts = f"127.0.0.1:{liar.port}"
    try:
        # The liar writes no tags (hostile_client has no AES-GMAC): the
        # workers do not ask for them, so that the bad scale itself is caught.
        _local_world(procs, 2, "badscale", tmp_path,
                     {"SMDDP_SERVER_HOSTS": hosts, "SMDDP_SERVER_SHARE": 50,
                      "SMDDP_SERVER_INTEGRITY": 0})
        got = _wait_results(tmp_path, ["badscale.0.json", "badscale.1.json"], 120)
    finally:
        liar.close()
    assert liar.answered > 0
    for res in got.values():
        assert res.get("raised"), res
        msg = res["msg"]
        assert "invalid scale for bfloat16" in msg and hosts in msg, msg
        assert "standalone reduction server 0" in msg, msg


def test_a_dead_server_is_left_out_when_torchrun_restarts_the_job(procs, tmp_path):
    # Two servers; the job (torchrun, two ranks, each its own pretend host)
    # runs on both until server 1 is killed. That attempt fails naming it;
    # torchrun restarts the job, which leaves the dead server out (every
    # rank agrees) and reduces through server 0 and the hosts' own.
    _, host_a = _start_server(procs, ["--bind", "127.0.0.1"])
    server_b, host_b = _start_server(procs, ["--bind", "127.0.0.1"])
    hosts = f"{host_a},{host_b}"
    env = _env(SMDDP_SERVER_HOSTS=hosts, SMDDP_SERVER_WAIT=3, SMDDP_SERVER_SHARE=40)
    log = os.path.join(tmp_path, "torchrun.log")
    procs.start([PY, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                 "--max-restarts", "1", "--monitor-interval", "0.5",
                 WORKER, "failover", str(tmp_path), "60"], env=env, log=log)
    first = _wait_results(tmp_path, ["ready.0.json", "ready.1.json"], 180)
    time.sleep(0.5)
    os.kill(server_b.pid, signal.SIGKILL)
    got = _wait_results(tmp_path, ["failover.0.json", "failover.1.json"], 240)
    # The first attempt: the ranks that wrote before torchrun stopped them
    # raised, and one named the dead server. (The other may name server 0,
    # which fails a stream once a host leaves it without a goodbye.)
    failed = [json.load(open(os.path.join(tmp_path, f"attempt0.{r}.json")))
              for r in range(2) if os.path.exists(os.path.join(tmp_path, f"attempt0.{r}.json"))]
    assert failed, first
    for res in failed:
        assert res["standalone_servers"] == 2 and res["raised"], res
    assert any("standalone reduction server 1 (" + host_b in res["msg"] for res in failed), failed
    # The restarted attempt: one server in use, every result right.
    _check_results(got, hosts)
    for res in got.values():
        assert res["attempt"] == 1, res
        assert res["standalone_servers"] == 1, res
        assert res["init_s"] < 3 + 30, res  # SMDDP_SERVER_WAIT, not the group timeout
    with open(log, "rb") as f:
        text = f.read().decode("utf-8", "replace")
    assert "goes on with 1 of 2 standalone reduction server(s)" in text, text[-3000:]
    assert "standalone reduction server 1 (" + host_b in text, text[-3000:]
    # SMDDP_SERVER_REQUIRED=1 turns the same miss into the group's error.
    req = tmp_path / "required"
    req.mkdir()
    _local_world(procs, 2, "init", req, {"SMDDP_SERVER_HOSTS": hosts, "SMDDP_SERVER_WAIT": 1,
                                         "SMDDP_SERVER_REQUIRED": 1})
    got = _wait_results(req, ["init.0.json", "init.1.json"], 120)
    for res in got.values():
        err = res.get("init_error", "")
        assert "SMDDP_SERVER_REQUIRED" in err and host_b in err and "cannot connect" in err, res


def test_a_group_rebuilt_after_a_server_died_goes_on_without_it_at_once(procs, tmp_path):
    # torchft's reconfigure: the group that lost server 1 mid-step is
    # replaced by a new one (new store prefix) in the same processes. Its
    # ranks carry the verdict: they try the dead server once, not for
    # SMDDP_SERVER_WAIT (30 s here), and reduce through server 0 and the
    # hosts' own.
    _, host_a = _start_server(procs, ["--bind", "127.0.0.1"])
    server_b, host_b = _start_server(procs, ["--bind", "127.0.0.1"])
    hosts = f"{host_a},{host_b}"
    _local_world(procs, 2, "reconfigure", tmp_path,
                 {"SMDDP_SERVER_HOSTS": hosts, "SMDDP_SERVER_WAIT": 30,
                  "SMDDP_SERVER_SHARE": 40, "SERVER_TEST_TIMEOUT_S": 120}, args=["60"])
    _wait_results(tmp_path, ["ready.0.json", "ready.1.json"], 180)
    time.sleep(0.5)
    os.kill(server_b.pid, signal.SIGKILL)
    got = _wait_results(tmp_path, ["reconfigure.0.json", "reconfigure.1.json"], 120)
    assert any("standalone reduction server 1 (" + host_b in r.get("msg", "") for r in got.values()), got
    for res in got.values():
        assert "crashed" not in res, res
        assert res["standalone_servers"] == 2 and res["raised"], res
        assert res["reformed_servers"] == 1, res
        assert res["reformed_ok"] and res["reformed_path"] == "shared-memory", res
        assert res["reformed_server_steps"] > 0, res  # server 0 still carries its share
        assert res["reform_s"] < 15, res  # SMDDP_SERVER_WAIT is 30 s


def test_a_foreign_job_and_bad_addresses_are_refused_clearly(procs, tmp_path):
    _, hosts = _start_server(procs, ["--bind", "127.0.0.1", "--job", "alpha"])
    _local_world(procs, 2, "init", tmp_path,
                 {"SMDDP_SERVER_HOSTS": hosts, "SMDDP_SERVER_JOB": "beta",
                  "SERVER_TEST_TIMEOUT_S": 20})
    got = _wait_results(tmp_path, ["init.0.json", "init.1.json"], 120)
    for res in got.values():
        err = res.get("init_error", "")
        # The worker hears its own job named; the server's --job stays its own.
        assert "'beta'" in err and "alpha" not in err, res
    bad = tmp_path / "bad"
    bad.mkdir()
    _local_world(procs, 2, "init", bad, {"SMDDP_SERVER_HOSTS": "127.0.0.1:notaport"})
    got = _wait_results(bad, ["init.0.json", "init.1.json"], 120)
    for res in got.values():
        assert "SMDDP_SERVER_HOSTS" in res.get("init_error", ""), res
    # A key file others may read is refused, naming the variable and file.
    loose = tmp_path / "loose.key"
    loose.write_text("0123456789abcdef0123456789abcdef")
    loose.chmod(0o644)
    lk = tmp_path / "loosekey"
    lk.mkdir()
    _local_world(procs, 2, "init", lk, {"SMDDP_SERVER_HOSTS": hosts,
                                        "SMDDP_SERVER_KEY_FILE": str(loose)})
    for res in _wait_results(lk, ["init.0.json", "init.1.json"], 120).values():
        err = res.get("init_error", "")
        assert f"SMDDP_SERVER_KEY_FILE={loose}" in err and "mode 0644" in err, res


# -- on a cluster of network namespaces ---------------------------------------

@pytest.fixture(scope="module")
def cluster3():
    from cluster import why_unavailable, Cluster
    why = why_unavailable()
    if why:
        pytest.skip(f"no cluster of network namespaces here: {why}")
    c = Cluster(3, "2gbit").up()
    try:
        yield c
    finally:
        c.down()


def _cluster_script():
    return os.path.join(REPO_ROOT, "scripts", "cluster.sh")


def _cluster_job(procs, cluster, worker_hosts, nproc, mode, out_dir, env, args=()):
    """torchrun server_worker.py on `worker_hosts` hosts (0..), one
    rendezvous in the hub."""
    hub = cluster.addr("hub")
    job = f"srv-{os.getpid()}-{time.monotonic_ns() % 100000}"
    for h in range(worker_hosts):
        e = _env(SMDDP_CLUSTER=cluster.prefix, **env)
        procs.start([_cluster_script(), "exec", str(h), PY, "-m", "torch.distributed.run",
                     "--nnodes", str(worker_hosts), "--nproc-per-node", str(nproc),
                     "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{hub}:29400",
                     "--rdzv-id", job, "--rdzv-conf", "is_host=0",
                     "--local-addr", cluster.addr(h), "--max-restarts", "0",
                     WORKER, mode, str(out_dir), *args],
                    env=e, log=os.path.join(out_dir, f"torchrun.h{h}.log"))


@pytest.mark.cluster
def test_cluster_two_worker_hosts_and_a_server_host(procs, cluster3, tmp_path):
    addr = cluster3.addr(2)
    _, hosts = _start_server_on(procs, cluster3, 2, ["--servers", "2", "--port", "29600",
                                                     "--advertise", addr])
    assert hosts == f"{addr}:29600,{addr}:29601"
    _cluster_job(procs, cluster3, 2, 2, "check", tmp_path,
                 {"SMDDP_SERVER_HOSTS": hosts, "SMDDP_SERVER_SHARE": 50})
    got = _wait_results(tmp_path, [f"check.{r}.json" for r in range(4)], 400)
    _check_results(got, hosts)


@pytest.mark.cluster
def test_cluster_server_host_sigkilled_mid_allreduce(procs, cluster3, tmp_path):
    addr = cluster3.addr(2)
    _, hosts = _start_server_on(procs, cluster3, 2, ["--port", "29700", "--advertise", addr])
    _cluster_job(procs, cluster3, 2, 1, "loop", tmp_path, {"SMDDP_SERVER_HOSTS": hosts},
                 args=["60"])
    _wait_results(tmp_path, ["ready.0.json", "ready.1.json"], 240)
    time.sleep(1.0)
    t_kill = time.time()
    cluster3.kill_host(2)  # SIGKILL to every process on h2: the server
    got = _wait_results(tmp_path, ["loop.0.json", "loop.1.json"], 60)
    for res in got.values():
        assert res.get("raised"), res
        msg = res["msg"]
        assert "standalone reduction server 0" in msg and f"{addr}:29700" in msg, msg
        assert "timed out" not in msg, msg
        assert res["t"] - t_kill < 5.0, (res["t"] - t_kill, msg)


@pytest.mark.cluster
def test_cluster_server_host_link_down_fails_workers_within_the_peer_timeout(
        procs, cluster3, tmp_path):
    # The server host goes silent (its link down): no socket closes, so only
    # the bound on unanswered data (SMDDP_PEER_TIMEOUT, here 3 s) ends the
    # workers' push or pull; the group timeout (120 s here) must not.
    peer_timeout = 3
    addr = cluster3.addr(2)
    _, hosts = _start_server_on(procs, cluster3, 2, ["--port", "29800", "--advertise", addr])
    try:
        _cluster_job(procs, cluster3, 2, 1, "loop", tmp_path,
                     {"SMDDP_SERVER_HOSTS": hosts, "SMDDP_PEER_TIMEOUT": peer_timeout,
                      "SERVER_TEST_TIMEOUT_S": 120},
                     args=["60"])
        _wait_results(tmp_path, ["ready.0.json", "ready.1.json"], 240)
        time.sleep(1.0)
        t_cut = time.time()
        cluster3.link(2, "down")
        got = _wait_results(tmp_path, ["loop.0.json", "loop.1.json"], 60)
    finally:
        cluster3.reset()
    for res in got.values():
        assert res.get("raised"), res
        msg = res["msg"]
        assert "standalone reduction server 0" in msg and f"{addr}:29800" in msg, msg
        assert "silent" in msg and "SMDDP_PEER_TIMEOUT" in msg, msg
        assert "timed out" not in msg, msg
        # TCP_USER_TIMEOUT counts from the first unanswered segment, which
        # is at most a step after the cut; keepalive probes start idle/3.
        took = res["t"] - t_cut
        assert 0.5 * peer_timeout < took < peer_timeout + 3.0, (took, msg)
        assert res["destroy_s"] < 10.0, res
        print(f"\nserver host link down: a worker raised after {took:.2f} s: {msg}")


@pytest.mark.cluster
def test_cluster_a_server_host_cut_off_before_the_job_is_left_out(procs, cluster3, tmp_path):
    # The server runs, but its host's link is down when the job starts: its
    # connect gets no answer at all (not a refusal). The group waits
    # SMDDP_SERVER_WAIT, leaves it out on every rank and reduces on its own.
    addr = cluster3.addr(2)
    _, hosts = _start_server_on(procs, cluster3, 2, ["--port", "29900", "--advertise", addr])
    try:
        cluster3.link(2, "down")
        _cluster_job(procs, cluster3, 2, 1, "check", tmp_path,
                     {"SMDDP_SERVER_HOSTS": hosts, "SMDDP_SERVER_WAIT": 3})
        got = _wait_results(tmp_path, ["check.0.json", "check.1.json"], 240)
    finally:
        cluster3.reset()
    for res in got.values():
        assert "crashed" not in res and "init_error" not in res, res
        assert res["standalone_servers"] == 0 and res["bad"] == [], res
        assert res["stats"]["standalone_server_steps"] == 0, res["stats"]
        assert 3 <= res["init_s"] < 3 + 20, res
    hashes = [dict(r["cases"]) for r in got.values()]
    assert hashes[0] == hashes[1]
    with open(os.path.join(tmp_path, "torchrun.h0.log"), "rb") as f:
        text = f.read().decode("utf-8", "replace")
    assert "goes on with 0 of 1 standalone reduction server(s)" in text, text[-3000:]
    assert f"standalone reduction server 0 ({addr}:29900" in text, text[-3000:]


def _start_server_on(procs, cluster, host, args):
    env = _env(SMDDP_CLUSTER=cluster.prefix)
    p = procs.start([_cluster_script(), "exec", str(host), PY, "-m", "torch_smddp.server",
                     *args], env=env, stdout=subprocess.PIPE)
    return p, _hosts_line(p, f"the server on h{host}")
