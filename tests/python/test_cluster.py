"""Failure across hosts, on a cluster of network namespaces (docs/design.md,
"Failure model"; scripts/cluster.sh): 2 hosts of 2 ranks, each host with its
own address and a 2gbit tbf link to the hub, each running its own torchrun
against a rendezvous store in the hub.

While every rank runs 4 MiB all_reduces back to back, the test kills a rank
on host h1 (SIGKILL), or every process of host h1, or takes h1's link down.
A fourth job, on 3 hosts of one rank, kills h1's rank while those calls run
in pairwise rounds on the network-only path (docs/design.md).
Oracles, independent of the backend: the parent's own record of what it did
and when (wall clock, shared with the ranks), and which ranks live where.
Every surviving rank must raise, naming a rank that really is on the lost
host and that host, within the deadline: 1 s for a process the kernel
closed (the required bound), SMDDP_PEER_TIMEOUT + 1 s for silence (beats and
checks come at most 0.6 s + 0.3 s late); no rank may hang (the whole job has
a hard deadline), the next call must fail at once, and destroy must return.

Each job costs about 25 s on a loaded 2-core machine (torch imports); the
four scenarios are one job each.
"""

import os
import re
import secrets
import subprocess
import sys
import time

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cluster as cl  # noqa: E402  (torch-free)
from mp_harness import backend_under_test  # noqa: E402

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.skipif("smddp" not in backend_under_test(),
                       reason="liveness across hosts is smddp's (docs/design.md)"),
]

HOSTS, NPROC = 2, 2
WORLD = HOSTS * NPROC
LOOP_S = 40.0        # a worker gives up looping after this (then the test fails)
START_S = 150.0      # torchrun start-up, torch imports, rendezvous (loaded machine)
DEATH_DEADLINE_S = 1.0
PEER_TIMEOUT_S = 3   # SMDDP_PEER_TIMEOUT of the link-down job
SILENCE_MARGIN_S = 1.0


def host_of(rank: int, nproc: int = NPROC) -> int:
    return rank // nproc


def _cluster_of(hosts: int):
    """A module's cluster of `hosts` hosts at 2gbit (skips where none can be made)."""
    why = cl.why_unavailable()
    if why:
        pytest.skip(f"no cluster of network namespaces here: {why}")
    c = cl.Cluster(hosts, "2gbit").up()
    try:
        yield c
    finally:
        c.down()


@pytest.fixture(scope="module")
def cluster():
    yield from _cluster_of(HOSTS)


def _logs(out_dir: str) -> str:
    parts = []
    for name in sorted(os.listdir(out_dir)):
        if name.endswith(".log") or name.startswith("result."):
            parts.append(f"--- {name}\n{cl.tail(os.path.join(out_dir, name))}")
    return "\n".join(parts)


def _run(cluster, out_dir, act, survivors, env=None, result_wait_s=20.0, nproc=NPROC,
         path="shared-memory",
         schedule="through each host's shared-memory segment, then across hosts over libfabric"):
    """Starts the job (`nproc` ranks on each of the cluster's hosts), checks
    the warm-up and that the group took the allreduce path `path`
    (stats()["allreduce_path"], and the schedule's description that
    begins with `schedule`), does `act(infos)` once every rank is in its
    loop, and returns (t_action, infos, results of `survivors`)."""
    out_dir = str(out_dir)
    world = cluster.hosts * nproc
    try:
        cl.run_worker(cluster, f"job-{secrets.token_hex(4)}", [str(LOOP_S)], nproc, out_dir, env)
        ready = [os.path.join(out_dir, f"ready.{r}") for r in range(world)]
        assert cl.wait_for_files(ready, time.monotonic() + START_S, cluster.jobs_alive), (
            "the ranks did not all start:\n" + _logs(out_dir))
        infos = [cl.read_json(p) for p in ready]
        for r, info in enumerate(infos):
            assert info["host"] == f"h{host_of(r, nproc)}", (r, info)
            assert info["provider"] == "tcp;ofi_rxm", (r, info)
            assert info["allreduce_path"] == path, (r, info)
            assert info["allreduce_schedule"].startswith(schedule), (r, info)
            assert info["closed_form_ok"], (r, info)
            others = [p for p in range(world) if host_of(p, nproc) != host_of(r, nproc)]
            assert info["liveness_peers"] == others, (r, info)
        time.sleep(0.5)  # well inside the all_reduce loop
        t_action = time.time()
        act(infos)
        results = [os.path.join(out_dir, f"result.{r}") for r in survivors]
        cl.wait_for_files(results, time.monotonic() + result_wait_s)
        got = {r: cl.read_json(p) for r, p in zip(survivors, results)}
        missing = [r for r, g in got.items() if g is None]
        assert not missing, f"rank(s) {missing} hung or died:\n" + _logs(out_dir)
        return t_action, infos, got
    finally:
        cluster.reset()


def _check_survivor(rank, res, t_action, lost_host, lost_ranks, verb, deadline_s, nproc=NPROC):
    where = f"rank {rank} (host h{host_of(rank, nproc)})"
    assert "crashed" not in res, (where, res)
    assert res["raised"], f"{where}: its all_reduces went on after the failure: {res}"
    msg = res["msg"]
    named = {int(x) for x in re.findall(r"\brank (\d+) on host", msg)}
    assert named and named <= set(lost_ranks), f"{where}: names no lost rank: {msg!r}"
    assert f"host h{lost_host}" in msg, f"{where}: does not name host h{lost_host}: {msg!r}"
    assert re.search(verb, msg), f"{where}: cause not named ({verb}): {msg!r}"
    assert "allreduce" in msg, f"{where}: the call is not named: {msg!r}"
    assert "timed out" not in msg, f"{where}: waited for the group timeout: {msg!r}"
    latency = res["t"] - t_action
    assert 0 <= latency < deadline_s, f"{where}: raised {latency:.2f} s after the failure: {msg!r}"
    later = res["later"]
    assert later["raised"] and later["elapsed"] < 1.0, (where, later)
    assert res["destroy_s"] < 5.0, (where, res["destroy_s"])
    return latency


def test_sigkill_of_a_rank_on_another_host_fails_every_survivor_within_1s(cluster, tmp_path):
    victim = 3  # on h1; its host's other rank is killed by its torchrun agent soon after

    def act(infos):
        os.kill(infos[victim]["pid"], 9)

    t_action, _, got = _run(cluster, tmp_path, act, survivors=[0, 1])
    lat = [_check_survivor(r, got[r], t_action, 1, [victim], r"died", DEATH_DEADLINE_S)
           for r in (0, 1)]
    for r in (0, 1):
        assert "liveness connection closed" in got[r]["msg"], got[r]["msg"]
    print(f"\nSIGKILL of rank {victim} on h1: ranks 0, 1 on h0 raised after "
          f"{', '.join(f'{x:.3f}' for x in lat)} s")


def test_a_whole_host_killed_fails_every_survivor_within_1s(cluster, tmp_path):
    t_action, _, got = _run(cluster, tmp_path, lambda infos: cluster.kill_host(1),
                            survivors=[0, 1])
    lat = [_check_survivor(r, got[r], t_action, 1, [2, 3], r"died", DEATH_DEADLINE_S)
           for r in (0, 1)]
    print(f"\nhost h1 killed: ranks 0, 1 on h0 raised after "
          f"{', '.join(f'{x:.3f}' for x in lat)} s")


@pytest.fixture(scope="module")
def cluster_1x3():
    """3 hosts of one rank: the network-only path, whose calls of 4 MiB and
    up (the worker's loop) run in pairwise rounds (docs/design.md)."""
    yield from _cluster_of(3)


def test_sigkill_of_a_rank_mid_pairwise_rounds_fails_every_survivor_within_1s(
        cluster_1x3, tmp_path):
    # In rounds a rank's sends wait for what arrives from the others, so a
    # dead peer stalls every survivor's sends, not only its own exchange.
    victim = 1

    def act(infos):
        os.kill(infos[victim]["pid"], 9)

    # stats()["allreduce_path"] names the provider for the network-only path,
    # and its schedule the calls that go in rounds (SMDDP_ROUNDS_MIN_BYTES).
    t_action, infos, got = _run(cluster_1x3, tmp_path, act, survivors=[0, 2], nproc=1,
                                path="tcp;ofi_rxm", schedule="over libfabric only")
    for info in infos:
        assert "pairwise rounds for calls of 4096 KiB and up" in info["allreduce_schedule"], info
    lat = []
    for r in (0, 2):
        res = got[r]
        lat.append(_check_survivor(r, res, t_action, 1, [victim], r"died", DEATH_DEADLINE_S,
                                   nproc=1))
        # Every loop call ran in rounds, the one the death cut short included
        # when it had started (the warm-up is too small for rounds).
        assert res["calls"] >= 1 and res["rounds_calls"] in (res["calls"], res["calls"] + 1), res
    print(f"\nSIGKILL of rank {victim} (h1) mid pairwise rounds: ranks 0, 2 raised after "
          f"{', '.join(f'{x:.3f}' for x in lat)} s")


def test_a_link_taken_down_mid_allreduce_fails_every_rank_within_the_peer_timeout(
        cluster, tmp_path):
    t_action, _, got = _run(cluster, tmp_path, lambda infos: cluster.link(1, "down"),
                            survivors=list(range(WORLD)),
                            env={"SMDDP_PEER_TIMEOUT": PEER_TIMEOUT_S},
                            result_wait_s=PEER_TIMEOUT_S + 30.0)
    lat = []
    for r in range(WORLD):
        other = 1 - host_of(r)
        lost = [p for p in range(WORLD) if host_of(p) == other]
        lat.append(_check_survivor(r, got[r], t_action, other, lost, r"lost|silent",
                                   PEER_TIMEOUT_S + SILENCE_MARGIN_S))
        # The silence detector, not something faster by chance: the last
        # beat came at most one beat interval (timeout / 5) before the cut.
        assert lat[-1] > 0.7 * PEER_TIMEOUT_S, (r, lat[-1], got[r]["msg"])
        assert "silent for" in got[r]["msg"], got[r]["msg"]
    print(f"\nh1's link down (SMDDP_PEER_TIMEOUT={PEER_TIMEOUT_S}): ranks 0-3 raised after "
          f"{', '.join(f'{x:.2f}' for x in lat)} s")


def _cc_inside(ns: str) -> str:
    """The congestion control a namespace uses, read there by the kernel's
    own file (not through cluster.sh)."""
    r = subprocess.run(["ip", "netns", "exec", ns, "cat", "/proc/sys/net/ipv4/tcp_congestion_control"],
                       capture_output=True, text=True, timeout=30, check=True)
    return r.stdout.strip()


def test_every_namespace_uses_the_congestion_control_it_was_given(cluster):
    # What the cluster measures depends on it (scripts/cluster.sh, ensure_cc),
    # so it must not be whatever the machine's default is.
    for ns in [f"{cluster.prefix}-hub"] + [f"{cluster.prefix}-h{h}" for h in range(HOSTS)]:
        assert _cc_inside(ns) == cl.DEFAULT_CC == "cubic", ns
    assert [cluster.congestion_control(h) for h in range(HOSTS)] == ["cubic"] * HOSTS
    with open("/proc/sys/net/ipv4/tcp_available_congestion_control") as f:
        available = f.read().split()
    other = next((c for c in ("bbr", "reno") if c in available), None)
    if other is not None:
        c = cl.Cluster(1, "1gbit", cc=other).up()
        try:
            assert _cc_inside(f"{c.prefix}-h0") == _cc_inside(f"{c.prefix}-hub") == other
        finally:
            c.down()
    with pytest.raises(RuntimeError, match=r"congestion control 'no-such-cc' is not available"):
        cl.Cluster(1, "1gbit", cc="no-such-cc").up()


def test_a_congestion_control_the_machine_does_not_allow_in_namespaces_is_allowed_first(cluster):
    # Outside the root namespace the kernel sets only an allowed congestion
    # control as a namespace's default (EPERM otherwise); a machine seen on
    # 2026-11-29 allowed "reno bbr" only, and every cluster failed to come up.
    # Oracle: the kernel's own files, before and after.
    path = "/proc/sys/net/ipv4/tcp_allowed_congestion_control"
    with open(path) as f:
        before = f.read().split()
    narrowed = [c for c in before if c != cl.DEFAULT_CC]
    if not narrowed:
        pytest.skip(f"{path} holds only {cl.DEFAULT_CC}; nothing to take away")
    with open(path, "w") as f:
        f.write(" ".join(narrowed))
    try:
        c = cl.Cluster(1, "1gbit").up()
        try:
            assert _cc_inside(f"{c.prefix}-h0") == _cc_inside(f"{c.prefix}-hub") == cl.DEFAULT_CC
        finally:
            c.down()
        with open(path) as f:
            assert cl.DEFAULT_CC in f.read().split()
    finally:
        with open(path, "w") as f:
            f.write(" ".join(before))
