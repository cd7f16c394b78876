"""The host's resources and environment: a /dev/shm too small for the
segment, clean-up on every path and a sweeper that spares live jobs, ranks
in different PID namespaces, and group instances that reuse one store
(docs/design.md, "Hosts, interfaces and containers").

The /dev/shm and PID-namespace cases run inside private namespaces
(`unshare`), so they neither see nor touch the machine's own /dev/shm; they
are skipped, with the reason, where unshare is not permitted.
"""

import json
import os
import re
import signal
import subprocess
import sys
import tempfile

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mp_harness import ExitedRank, backend_under_test, run_world  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
BACKEND = backend_under_test()
smddp_only = pytest.mark.skipif("smddp" not in BACKEND, reason="smddp's own resources")

PIDNS = ["unshare", "-p", "-f", "--mount-proc", "--kill-child"]
# A rank under this prefix is pid 2 of its namespace, below a shell: pid 1
# (init) would ignore even its own SIGKILL.
PIDNS_RANK = PIDNS + ["sh", "-c", '"$@"; exit $?', "sh"]


def _unshare_works() -> str:
    """Empty when private mount+PID namespaces with a tmpfs work here, else why not."""
    try:
        r = subprocess.run(PIDNS + ["sh", "-c", "mount -t tmpfs -o size=1m tmpfs /dev/shm"],
                           capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"unshare unavailable: {e}"
    return "" if r.returncode == 0 else f"unshare not permitted: {r.stderr.strip()}"


_WHY_NOT = _unshare_works()
needs_unshare = pytest.mark.skipif(bool(_WHY_NOT), reason=_WHY_NOT or "ok")


def _in_private_shm(args, shm_size: str, logdir: str, timeout: float = 150) -> dict:
    """Runs ``cases_resources.py ARGS`` in private mount and PID namespaces
    with a fresh tmpfs of ``shm_size`` on /dev/shm; returns its JSON line.
    The PID namespace takes every process of the run down with it."""
    script = (f"mount -t tmpfs -o size={shm_size} tmpfs /dev/shm && "
              f"exec {sys.executable} {os.path.join(HERE, 'cases', 'cases_resources.py')} "
              + " ".join("'" + a.replace("'", "'\\''") + "'" for a in args))
    env = dict(os.environ, TMPDIR=logdir)
    p = subprocess.Popen(PIDNS + ["--propagation", "private", "sh", "-c", script],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                         start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        raise AssertionError(f"namespace run timed out; stderr tail:\n{err[-4000:]}")
    lines = [ln for ln in out.splitlines() if ln.startswith("{")]
    assert p.returncode == 0 and lines, f"exit {p.returncode}; stderr tail:\n{err[-4000:]}"
    return json.loads(lines[-1])


# ---------------------------------------------------------------------------
# 1. /dev/shm too small for the host segment
# ---------------------------------------------------------------------------

@smddp_only
@needs_unshare
@pytest.mark.parametrize("shm_size", ["16m", "44m"])
def test_small_dev_shm_falls_back_to_the_network_on_every_rank_with_one_warning(shm_size):
    # 2 servers x 3 slots x depth 8 x 1 MiB = 48 MiB of segment, and the two
    # ranks' all-gather rings (1 MiB each): 50 MiB, in a 16 or 44 MiB /dev/shm: today the first writes past the free space SIGBUS, or
    # libfabric's shm provider refuses the small one and init fails. At 44
    # MiB libfabric's check can pass on one rank and fail on the other.
    env = {"SMDDP_SHM_SLOT_BYTES": "1048576", "SMDDP_SHM_DEPTH": "8"}
    with tempfile.TemporaryDirectory() as logdir:
        res = _in_private_shm(["world", "2", "cases_resources:small_shm", "[]", json.dumps(env)],
                              shm_size, logdir)
        assert res["ok"], res.get("error")
        warnings = []
        for root, _, files in os.walk(logdir):
            for f in files:
                if f.startswith("stderr."):
                    with open(os.path.join(root, f), errors="replace") as fh:
                        warnings += [ln for ln in fh if "--shm-size" in ln]
    for rank, r in enumerate(res["results"]):
        assert r["wrong"] == [], f"rank {rank}: wrong allreduce results at sizes {r['wrong']}"
        assert r["path"] != "shared-memory", f"rank {rank} kept the shared-memory path"
    assert len(warnings) == 1, f"want one --shm-size warning in the job, got {warnings}"
    mib = [float(m) for m in re.findall(r"(\d+(?:\.\d+)?) MiB", warnings[0])]
    assert any(50 <= m < 51 for m in mib), f"warning does not name the size needed: {warnings[0]}"


# ---------------------------------------------------------------------------
# 2. clean-up: a constructor that throws, and the sweeper
# ---------------------------------------------------------------------------

@smddp_only
def test_failed_constructor_does_not_leak_the_overflow_sink():
    env = dict(os.environ, SMDDP_FI_PROVIDER="no-such-provider")
    r = subprocess.run([sys.executable, os.path.join(HERE, "cases", "cases_resources.py"), "sink"],
                       capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr[-4000:]
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert len(res["errors"]) == 3 and all("no-such-provider" in e for e in res["errors"]), res
    assert res["growth_kib"] < 256 * 1024, f"address space grew by {res['growth_kib']} KiB"


@smddp_only
@needs_unshare
def test_sweeper_removes_dead_jobs_objects_and_spares_live_ones_across_pid_namespaces():
    with tempfile.TemporaryDirectory() as logdir:
        res = _in_private_shm(["sweep"], "64m", logdir)
    assert res["a_names"] and res["b_names"], f"the jobs made no smddp- objects: {res}"
    missing = set(res["a_names"]) - set(res["after_c"])
    assert not missing, f"a live job's objects were swept: {sorted(missing)}"
    stale = set(res["b_names"]) & set(res["after_c"])
    assert not stale, f"a dead job's objects were left: {sorted(stale)}"
    assert res["a_ok"] and res["c_ok"], res
    assert res["left"] == [], f"objects left after every job ended: {res['left']}"


# ---------------------------------------------------------------------------
# 3. ranks in different PID namespaces
# ---------------------------------------------------------------------------

@smddp_only
@needs_unshare
@pytest.mark.parametrize("ns_rank", [0, 1])
def test_rank_in_another_pid_namespace_works_and_its_death_is_seen(ns_rank):
    world, victim = 2, 1
    results = run_world(world, "cases_resources:pid_namespaces", backend=BACKEND, timeout=60,
                        pg_timeout=30, args=(victim,), expect_failure=True,
                        allow_exit={victim}, wrap={ns_rank: PIDNS_RANK})
    assert isinstance(results[victim], ExitedRank), results[victim]
    r = results[0]
    assert r["wrong"] == [], r
    first = r["first"]
    assert first["raised"], "rank 0 returned normally from a call its peer never made"
    assert re.search(rf"\brank {victim}\b", first["msg"]), first["msg"]
    assert re.search(r"exited|lost|died", first["msg"]) and "timed out" not in first["msg"], first
    assert first["elapsed"] < 5.0, first


# ---------------------------------------------------------------------------
# 4. group instances over one store
# ---------------------------------------------------------------------------

@smddp_only
def test_second_group_on_a_reused_store_ignores_the_first_ones_keys(tmp_path):
    results = run_world(2, "cases_resources:store_reuse", backend=BACKEND, timeout=60,
                        args=(str(tmp_path / "store"),))
    for rank, r in enumerate(results):
        assert r["right"] == [True] * 4, f"rank {rank}: {r['right']}"
