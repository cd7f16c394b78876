"""dist.shrink_group across hosts, on a cluster of network namespaces
(scripts/cluster.sh): 3 hosts of 2 ranks (world 6), the ranks started by
the parent itself, since torchrun's agents stop every worker when one dies.

1. cases_shrink.py's cases (cluster_shrink_worker.py): a sub-group shrunk
   without a live rank (rank 3, on h1) with SHRINK_DEFAULT refused while a
   call is in flight, SHRINK_ABORT, and SHRINK_DEFAULT on an idle group;
   then every process of host h2 (ranks 4 and 5) killed while the
   survivors are inside an all_reduce, and the default group shrunk
   without them. test_shrink.check_shrink's closed forms over the ranks
   that remain are the oracle.
2. examples/shrink_on_failure.py, one process per rank: rank 5 (h2)
   SIGKILLs itself in the middle of step 4, the survivors shrink and redo
   the step, and rank 0 compares the parameters with the example's
   one-process replay.

Every job has a hard deadline; the cluster's reset kills whatever is left.
"""

import json
import os
import secrets
import sys
import time

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cluster as cl  # noqa: E402  (torch-free)
from mp_harness import REPO_ROOT, backend_under_test, worker  # noqa: E402
from test_shrink import check_shrink  # noqa: E402

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.skipif("smddp" not in backend_under_test(), reason="shrink_group is smddp's"),
]

HOSTS, NPROC = 3, 2
WORLD = HOSTS * NPROC
START_S = 180.0   # torch imports of six ranks, the group's formation (loaded machine)
DONE_S = 90.0
WORKER = worker("cluster_shrink_worker.py")


@pytest.fixture(scope="module")
def cluster():
    why = cl.why_unavailable()
    if why:
        pytest.skip(f"no cluster of network namespaces here: {why}")
    c = cl.Cluster(HOSTS, "2gbit").up()
    try:
        yield c
    finally:
        c.down()


def _start(cluster, out: str, cmd: list[str], env: dict | None = None) -> list:
    procs = []
    for r in range(WORLD):
        e = dict(env or {}, RANK=r, LOCAL_RANK=r % NPROC, WORLD_SIZE=WORLD,
                 SMDDP_CLUSTER_OUT=out, PYTHONPATH=REPO_ROOT)
        procs.append(cluster.spawn(r // NPROC, [sys.executable, *cmd],
                                   os.path.join(out, f"rank{r}.log"), env=e, cwd=out))
    return procs


def _logs(out: str) -> str:
    return "\n".join(f"--- {n}\n{cl.tail(os.path.join(out, n))}"
                     for n in sorted(os.listdir(out)) if n.endswith(".log"))


def test_shrink_group_across_hosts_after_a_whole_host_dies(cluster, tmp_path):
    out = str(tmp_path)
    excluded, victims = 3, [4, 5]
    survivors = [r for r in range(WORLD) if r not in victims]
    store = f"{cluster.addr('hub')}:{cl.STORE_PORT}"
    try:
        _start(cluster, out, [WORKER, store, f"shrink-{secrets.token_hex(3)}/", str(excluded),
                              ",".join(map(str, victims))])
        inside = [os.path.join(out, f"inside.{r}") for r in survivors]
        assert cl.wait_for_files(inside, time.monotonic() + START_S, cluster.jobs_alive), (
            "the survivors never reached the all_reduce the victims skip:\n" + _logs(out))
        time.sleep(0.3)  # inside it
        t_kill = time.time()
        cluster.kill_host(2)
        with open(os.path.join(out, "killed_at.tmp"), "w") as f:
            json.dump(t_kill, f)
        os.replace(os.path.join(out, "killed_at.tmp"), os.path.join(out, "killed_at"))
        paths = [os.path.join(out, f"result.{r}") for r in survivors]
        cl.wait_for_files(paths, time.monotonic() + DONE_S)
        results = {r: cl.read_json(p) for r, p in zip(survivors, paths)}
    finally:
        cluster.reset()
    missing = [r for r, g in results.items() if g is None]
    assert not missing, f"rank(s) {missing} hung or died:\n" + _logs(out)
    crashed = {r: g["crashed"] for r, g in results.items() if "crashed" in g}
    assert not crashed, crashed
    for r, g in results.items():
        assert g["host"] == f"h{r // NPROC}", (r, g["host"])
    problems = check_shrink(results, WORLD, excluded=excluded, victims=victims)
    times = [round(results[r]["default"]["kill_to_step_s"], 2) for r in survivors]
    assert not problems, f"{problems}; kill to first step after the shrink (s): {times}"
    print(f"\nhost h2 killed: kill to the first call on the shrunk group {times} s")


def test_the_shrink_example_across_hosts_matches_one_process(cluster, tmp_path):
    out = str(tmp_path)
    port = 30000 + secrets.randbelow(20000)
    cmd = [os.path.join(REPO_ROOT, "examples", "shrink_on_failure.py"), "--kill-rank", "5",
           "--kill-step", "4", "--steps", "8", "--timeout", "30", "--check"]
    try:
        procs = _start(cluster, out, cmd, {"MASTER_ADDR": cluster.addr(0), "MASTER_PORT": port})
        codes = cluster.wait_jobs(START_S + DONE_S, jobs=procs)
    finally:
        cluster.reset()
    assert codes[5] not in (0, None), f"rank 5 did not die: {codes}"
    assert all(c == 0 for r, c in enumerate(codes) if r != 5), f"{codes}\n{_logs(out)}"
    with open(os.path.join(out, "rank0.log")) as f:
        lines = [x for x in f.read().splitlines() if x.startswith("{")]
    assert lines, "rank 0 printed no verdict:\n" + _logs(out)
    verdict = json.loads(lines[-1])
    assert verdict["ok"], verdict
    assert verdict["members_at"] == [list(range(6))] * 4 + [list(range(5))] * 4, verdict
    print(f"\nrank 5 (h2) killed mid-step: kill to the next step {verdict['recovered_s']:.2f} s")
