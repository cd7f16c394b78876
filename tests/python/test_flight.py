"""The flight recorder, the desync report and the offline analyzer.

Checked against the calls the ranks made (cases_flight.py): every entry's
sequence, collective, dtype, size and state; a timeout's error names the rank
that is behind, on which call; every rank's dump is written; and
``python -m torch_smddp.trace analyze`` prints the same report offline.
"""

import json
import os
import re
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mp_harness import REPO_ROOT, backend_under_test, run_world  # noqa: E402

BACKEND = backend_under_test()
pytestmark = pytest.mark.skipif("smddp" not in BACKEND, reason="smddp's own diagnostics")

EXPECTED = [  # (collective, dtype, numel) of sequences 0..5, as cases_flight calls them
    ("allreduce", "float32", 10), ("allreduce", "float32", 1000), ("allreduce", "float32", 3),
    ("broadcast", "float64", 7), ("allgather", "int32", 5), ("barrier", None, 0),
]


def test_flight_recorder_and_desync_report(tmp_path):
    dump_dir = tmp_path / "dumps"
    dump_dir.mkdir()
    torch_dir = tmp_path / "torch_fr"
    torch_dir.mkdir()
    results = run_world(3, "cases_flight:flight_job", backend=BACKEND, timeout=90,
                        pg_timeout=4.0, expect_failure=True,
                        env={"SMDDP_DEBUG_DIR": str(dump_dir),
                             "TORCH_FR_DUMP_TEMP_FILE": str(torch_dir / "smddp_fr_")})
    problems = []
    for rank, res in enumerate(results):
        es = res["entries"]
        if [e["seq"] for e in es] != list(range(6)):
            problems.append(f"rank {rank}: sequences {[e['seq'] for e in es]}")
            continue
        for e, (coll, dtype, numel) in zip(es, EXPECTED):
            where = f"rank {rank} seq {e['seq']}"
            if (e["collective"], e["dtype"], e["numel"]) != (coll, dtype, numel):
                problems.append(f"{where}: {e['collective']} {e['dtype']} {e['numel']}")
            if e["state"] != "completed" or e["error"] is not None:
                problems.append(f"{where}: state {e['state']} {e['error']}")
            if not (e["queued"] <= e["started"] <= e["ended"] <= res["now"]):
                problems.append(f"{where}: times out of order {e}")
            if e["bytes"] != numel * {"float32": 4, "float64": 8, "int32": 4, None: 0}[dtype]:
                problems.append(f"{where}: bytes {e['bytes']}")
        # allreduces run through the host segment; a batch lists its calls
        for e in es[:3]:
            if e["path"] != "shared-memory" or not (e["batch"] <= e["seq"] < e["batch"] + e["batch_calls"]):
                problems.append(f"rank {rank} seq {e['seq']}: path {e['path']} batch {e['batch']}+{e['batch_calls']}")
        # so does the allgather (each rank reads its peers' buffers)
        if es[4]["path"] != "shared-memory":
            problems.append(f"rank {rank}: allgather path {es[4]['path']}")
    assert not problems, "\n".join(problems)

    # The timeout: ranks 0 and 1 fail; the report says rank 2 finished the
    # barrier (sequence 5) and never called sequence 6.
    behind = ("rank 2 has finished sequence 5 (barrier, 0 B, completed) and issued nothing "
              "after it")
    waiting = "ranks 0-1 wait at sequence 6 (allreduce(SUM, float32, 250 elements), 1.0 kB, started)"
    for rank in (0, 1):
        err = results[rank]["error"]
        assert err and "Desync report:" in err, f"rank {rank}: {err}"
        assert behind in err, f"rank {rank}: {err}"
        assert waiting in err, f"rank {rank}: {err}"
        last = results[rank]["after"][-1]
        assert (last["seq"], last["state"]) == (6, "failed"), last
        # the timeout, then at most half of it for the report
        assert results[rank]["elapsed"] < 4.0 * 1.5 + 2.0, results[rank]["elapsed"]
    assert results[2]["after"][-1]["seq"] == 5

    # Every rank dumped (ranks 0 and 1 on failing, rank 2 when asked).
    files = sorted(os.listdir(dump_dir))
    # The name every doc gives: smddp_trace_rank<R>_g<group>.json.
    assert len(files) == 3 and all(re.fullmatch(r"smddp_trace_rank[0-2]_g\w+\.json", f)
                                   for f in files), files
    dumps = {}
    for f in files:
        d = json.loads((dump_dir / f).read_text())
        dumps[d["rank"]] = d
    assert sorted(dumps) == [0, 1, 2]
    assert dumps[0]["entries"][-1]["state"] == "failed"
    assert "timed out" in dumps[0]["reason"]
    assert [e["seq"] for e in dumps[2]["entries"]] == list(range(6))

    # Offline: the same report.
    out = subprocess.run([sys.executable, "-m", "torch_smddp.trace", "analyze", str(dump_dir)],
                         capture_output=True, text=True, timeout=60, cwd=REPO_ROOT)
    assert out.returncode == 0, out.stderr
    report = results[0]["error"].split("Desync report: ", 1)[1].split("\n")[0]
    assert f"desync report: {report}" in out.stdout, out.stdout
    assert "rank 2 (pid" in out.stdout

    # torch's own analyzer reads the torch-format dumps as they are, and
    # names the rank that never issued the all_reduce and that all_reduce.
    assert sorted(os.listdir(torch_dir)) == ["smddp_fr_0", "smddp_fr_1", "smddp_fr_2"]
    out = subprocess.run([sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace",
                          str(torch_dir), "--prefix", "smddp_fr_"],
                         capture_output=True, text=True, timeout=120, cwd=REPO_ROOT)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-3000:]
    assert re.search(r"all_reduce", text), text[-3000:]
    assert re.search(r"[Mm]issing ranks?[^\n]*\b2\b|\{2\}", text), text[-3000:]


def test_torch_debug_detail_wraps_smddp():
    """TORCH_DISTRIBUTED_DEBUG=DETAIL: collectives stay right, stats() and
    flight_recorder() see through torch's wrapper, and the wrapper's own
    cross-rank check reports mismatched sizes."""
    results = run_world(2, "cases_flight:detail_job", backend=BACKEND, timeout=90,
                        env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"})
    for rank, res in enumerate(results):
        assert res["sum"] == [3.0, 3.0, 3.0], (rank, res)  # 1 + 2
        assert res["stat_keys"], (rank, res)
        assert (0, "allreduce") in [tuple(e) for e in res["entries"]], (rank, res)
        assert res["mismatch"] and "mismatch" in res["mismatch"].lower(), (rank, res["mismatch"])
