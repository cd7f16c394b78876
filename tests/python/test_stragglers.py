"""`python -m torch_smddp.trace stragglers`: a world-4 job where rank 2
sleeps 20 ms before each allreduce names rank 2 first, with about 20 ms of
wait caused per call; the same calls without the sleep show no rank
holding the others back (cases_stragglers.py). The same from
torch_smddp.stats()["stragglers"] live, on every rank, and the
SMDDP_STRAGGLER_REPORT log line: once for a window with a sleeping rank,
never for an even one."""

import os
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mp_harness import REPO_ROOT, backend_under_test, run_world  # noqa: E402

pytestmark = pytest.mark.skipif("smddp" not in backend_under_test(),
                                reason="the timeline is smddp's")

WORLD = 4


def _check_ranking(where, slow, even, calls):
    # Rank 2 first: last to call nearly every time, and the wait it caused
    # is its sleep (20 ms a call, less what the others spent meanwhile).
    # No sleep: no rank causes a wait anywhere near a sleeping rank's.
    top = slow["rows"][0]
    assert top["rank"] == 2, (where, slow)
    assert top["share"] >= 0.9, (where, slow)
    assert top["caused_ms"] / calls >= 12, (where, slow)
    for row in even["rows"]:
        assert row["caused_ms"] / calls < 5, (where, even)
    assert even["rows"][0]["caused_ms"] < top["caused_ms"] / 4, (where, even, slow)


def test_the_sleeping_rank_is_named_offline_and_live_and_an_even_job_shows_none(tmp_path):
    from torch_smddp.trace import stragglers

    results = run_world(WORLD, "cases_stragglers:stragglers", timeout=180,
                        env={"SMDDP_TIMELINE": str(tmp_path / "timeline.json"),
                             "SMDDP_STRAGGLER_REPORT": "75"})
    assert all(r["bad"] == 0 for r in results), results
    names = results[0]["names"]
    got = stragglers(str(tmp_path))
    slow, even = got[names["slow"]], got[names["even"]]
    calls = 30
    assert slow["calls"] == calls and even["calls"] == calls, got
    assert slow["ranks"] == list(range(WORLD))
    _check_ranking("offline", slow, even, calls)
    # The command prints the same ranking.
    out = subprocess.run([sys.executable, "-m", "torch_smddp.trace", "stragglers", str(tmp_path),
                          "--group", names["slow"]], capture_output=True, text=True,
                         cwd=REPO_ROOT, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith(f"group {names['slow']}: {calls} collective(s)"), out.stdout
    assert lines[2].split()[0] == "2", out.stdout
    # Live: every rank's stats() gives the same counts (the host's ranks
    # share them) and the same ranking.
    live = results[0]["live"]
    for rank, r in enumerate(results):
        assert r["live"] == live, f"rank {rank} reads other counts than rank 0"
    for phase in ("slow", "even"):
        assert live[phase]["calls"] == calls, live
        assert live[phase]["ranks"] == list(range(WORLD)), live
        assert sum(row["last"] for row in live[phase]["rows"]) == calls, live
    _check_ranking("live", live["slow"], live["even"], calls)
    # SMDDP_STRAGGLER_REPORT=75: one line on the host after a window of 256
    # calls with rank 1 sleeping 2 ms, naming rank 1; none after an even one.
    slow_lines = [ln for r in results for ln in r["report"]["slow"]]
    even_lines = [ln for r in results for ln in r["report"]["even"]]
    assert len(slow_lines) == 1, slow_lines
    assert "rank 1 was the last to issue" in slow_lines[0], slow_lines
    assert even_lines == [], even_lines
    print("\n" + slow_lines[0])
