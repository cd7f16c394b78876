"""`python -m torch_smddp.trace stragglers`: a world-4 job where rank 2
sleeps 20 ms before each allreduce names rank 2 first, with about 20 ms of
wait caused per call; the same calls without the sleep show no rank
holding the others back (cases_stragglers.py)."""

import os
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mp_harness import REPO_ROOT, backend_under_test, run_world  # noqa: E402

pytestmark = pytest.mark.skipif("smddp" not in backend_under_test(),
                                reason="the timeline is smddp's")

WORLD = 4


def test_the_sleeping_rank_is_named_and_an_even_job_shows_none(tmp_path):
    from torch_smddp.trace import stragglers

    results = run_world(WORLD, "cases_stragglers:stragglers", timeout=180,
                        env={"SMDDP_TIMELINE": str(tmp_path / "timeline.json")})
    assert all(r["bad"] == 0 for r in results), results
    names = results[0]["names"]
    got = stragglers(str(tmp_path))
    slow, even = got[names["slow"]], got[names["even"]]
    calls = 30
    assert slow["calls"] == calls and even["calls"] == calls, got
    assert slow["ranks"] == list(range(WORLD))
    # Rank 2 first: last to call nearly every time, and the wait it caused
    # is its sleep (20 ms a call, less what the others spent meanwhile).
    top = slow["rows"][0]
    assert top["rank"] == 2, slow
    assert top["share"] >= 0.9, slow
    assert top["caused_ms"] / calls >= 12, slow
    # No sleep: no rank causes a wait anywhere near a sleeping rank's.
    for row in even["rows"]:
        assert row["caused_ms"] / calls < 5, even
    assert even["rows"][0]["caused_ms"] < top["caused_ms"] / 4, (even, slow)
    # The command prints the same ranking.
    out = subprocess.run([sys.executable, "-m", "torch_smddp.trace", "stragglers", str(tmp_path),
                          "--group", names["slow"]], capture_output=True, text=True,
                         cwd=REPO_ROOT, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith(f"group {names['slow']}: {calls} collective(s)"), out.stdout
    assert lines[2].split()[0] == "2", out.stdout
