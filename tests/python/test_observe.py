"""Observability: stats() per-collective counts and latency percentiles,
torch.profiler's record_param_comms events, the SMDDP_TIMELINE trace file and
`python -m torch_smddp.trace plot`. One world-2 job runs every case
(cases_observe.py); the checks here read what it returned and wrote."""

import json
import math
import os
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mp_harness import REPO_ROOT, backend_under_test, run_world  # noqa: E402

pytestmark = pytest.mark.skipif("smddp" not in backend_under_test(),
                                reason="stats and the timeline are smddp's")

WORLD = 2
SQRT2 = math.sqrt(2)


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    d = tmp_path_factory.mktemp("observe")
    results = run_world(WORLD, "cases_observe:observe", timeout=180, args=[str(d)],
                        env={"SMDDP_TIMELINE": str(d / "timeline.json")})
    return d, results


def _load_timeline(d, rank):
    with open(d / f"timeline.rank{rank}.json") as f:
        return json.load(f)  # a complete JSON array after destroy_process_group()


# ---- stats ---------------------------------------------------------------

def test_latency_bins_are_half_octaves():
    import torch_smddp  # noqa: F401
    from torch_smddp import _C
    for ns in [0, 999, 1000, 1414, 1415, 1999, 2000, 4096, 123456, 10**9, 3 * 10**12]:
        b, lo, hi = _C.latency_bin(ns)
        assert lo <= ns / 1000 < hi or (b == 63 and ns / 1000 >= lo), (ns, b, lo, hi)
        assert b == 0 or hi / lo == pytest.approx(SQRT2)


def test_stats_counts_percentiles_and_reset(job):
    _d, results = job
    for rank, res in enumerate(results):
        ph = res["stats_phase"]
        # reset zeroes every count and histogram
        assert ph["after_reset"] == {"counts": {}, "latency": {}, "collectives": 0}, ph
        assert ph["after_stats_reset"] == {"counts": {}, "latency": {}, "collectives": 0}, ph
        st = ph["stats"]
        # one host: the shared-memory path, and its schedule in words (the
        # set-up log's), with nothing across hosts
        assert st["allreduce_path"] == "shared-memory", st
        sched = st["allreduce_schedule"]
        assert sched.startswith("through each host's shared-memory segment: "), sched
        assert "fusion buffer" in sched and "across hosts" not in sched, sched
        # counts equal the calls made (all_reduce: 25 sync of 4 KiB + 7 async of 64 B)
        assert st["collective_counts"] == {"allreduce": 32, "broadcast": 10, "barrier": 3}, st
        lat = st["latency"]
        by_class = {c["min_bytes"]: c for c in lat["allreduce"]}
        assert set(by_class) == {4096, 64}, lat
        four_k = by_class[4096]
        assert four_k["count"] == 25 and four_k["max_bytes"] == 16383
        assert by_class[64]["count"] == 7
        assert [c["count"] for c in lat["broadcast"]] == [10]
        assert lat["broadcast"][0]["min_bytes"] == 16  # 40 bytes: class [16, 64)
        assert [c["count"] for c in lat["barrier"]] == [3]
        # Each call's engine latency is part of its wall time measured in
        # Python, so each percentile is at most that of the wall times, up
        # to the bin's width (a factor sqrt(2)).
        wall = sorted(ph["wall_us"])
        assert 0 < four_k["p50_us"] <= wall[len(wall) // 2] * SQRT2 + 1e-9, (four_k, wall)
        assert four_k["p50_us"] <= four_k["p99_us"] <= wall[-1] * SQRT2 + 1e-9, (four_k, wall)
        assert four_k["mean_us"] <= sum(wall) / len(wall), (four_k, wall)


# ---- torch.profiler --------------------------------------------------------

def test_profiler_shows_record_param_comms(job):
    d, results = job
    for rank, res in enumerate(results):
        ph = res["profiler_phase"]
        assert ph["record_param_comms"] == 4, ph
        with open(ph["profile"]) as f:
            events = json.load(f)["traceEvents"]
        comms = [e for e in events if e.get("name") == "record_param_comms"]
        got = [(e["args"].get("Collective name"), e["args"].get("In msg nelems"),
                e["args"].get("Out msg nelems"), e["args"].get("dtype")) for e in comms]
        assert got == [("allreduce", 4096, 4096, "Float"),
                       ("broadcast", 100, 100, "Double"),
                       ("all_gather", 8, 8 * WORLD, "Float"),
                       ("allreduce", 4096, 4096, "Float")], got
        assert all(e["args"].get("Group size") == WORLD for e in comms), comms


# ---- timeline --------------------------------------------------------------

def _spans(events):
    """Collective spans by (group, seq): begin args and both timestamps."""
    begins = {e["id"]: e for e in events if e.get("ph") == "b" and e.get("cat") == "collective"}
    ends = {e["id"]: e for e in events if e.get("ph") == "e" and e.get("cat") == "collective"}
    assert set(begins) == set(ends)
    out = {}
    for i, b in begins.items():
        key = (b["args"]["group"], b["args"]["seq"])
        assert key not in out, key  # one span per call
        out[key] = {**b["args"], "begin": b["ts"], "end": ends[i]["ts"], "ok": ends[i]["args"]["ok"]}
    return out


def test_timeline_tracks_calls_batches_and_steps(job):
    d, results = job
    per_rank = []
    for rank, res in enumerate(results):
        ph = res["timeline_phase"]
        assert ph["bad"] == 0
        assert ph["timeline_path"] == str(d / f"timeline.rank{rank}.json")
        events = _load_timeline(d, rank)
        names = {e["args"]["name"] for e in events
                 if e.get("ph") == "M" and e["name"] == "thread_name"}
        assert "caller" in names and any(n.startswith("engine ") for n in names), names
        procs = [e["args"]["name"] for e in events
                 if e.get("ph") == "M" and e["name"] == "process_name"]
        assert procs == [f"rank {rank}"]
        spans = _spans(events)
        assert all(s["ok"] for s in spans.values())
        group = next(g for (g, _s) in spans if g.isdigit() or g == "default")
        mine = {s: v for (g, s), v in spans.items() if g == group}
        # the workload starts at the marker broadcast
        marker = max(s for s, v in mine.items()
                     if v["collective"] == "broadcast" and v["numel"] == 777)
        work = [mine[s] for s in sorted(mine) if s > marker]
        assert [v["collective"] for v in work] == ["allreduce"] * len(ph["issued_bytes"])
        assert [v["bytes"] for v in work] == ph["issued_bytes"]
        assert [v["seq"] for v in work] == list(range(marker + 1, marker + 1 + len(work)))
        assert all(v["path"] == "shared-memory" and v["dtype"] == "float32" and v["op"] == "SUM"
                   for v in work)
        # batch spans: their seqs are exactly the fused calls, each once
        batches = [e for e in events if e.get("cat") == "batch" and e["args"]["group"] == group
                   and e["args"]["seqs"][0] > marker]
        fused = [s for b in batches for s in b["args"]["seqs"]]
        assert sorted(fused) == [v["seq"] for v in work], (fused, batches)
        assert len(batches) == ph["stats"]["fusion_buffers_flushed"]
        assert len(fused) == ph["stats"]["fused_calls"]
        assert any(len(b["args"]["seqs"]) > 1 for b in batches), "nothing fused"
        steps = {e["name"] for e in events if e.get("cat") == "shm"}
        assert {"plan", "copy in", "combine", "copy out"} <= steps, steps
        per_rank.append((mine, [b["args"]["seqs"] for b in batches]))
    # every rank fused the same calls
    assert per_rank[0][1] == per_rank[1][1]
    # the two ranks' spans of one allreduce overlap in time (one clock per
    # host): neither rank can finish before the other issued it. (A
    # broadcast root may finish before a receiver issues its call.)
    (a, _), (b, _) = per_rank
    common = [s for s in set(a) & set(b) if a[s]["collective"] == "allreduce"]
    assert len(common) >= 40
    for seq in common:
        assert max(a[seq]["begin"], b[seq]["begin"]) <= min(a[seq]["end"], b[seq]["end"]), seq


def test_trace_plot_writes_a_png(job):
    d, _ = job
    out = d / "step.png"
    subprocess.run([sys.executable, "-m", "torch_smddp.trace", "plot", str(d), "--out", str(out)],
                   check=True, timeout=120, cwd=REPO_ROOT)
    with open(out, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
