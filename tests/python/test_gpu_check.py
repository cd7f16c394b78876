"""scripts/gpu_check.sh, the one command a lent GPU machine runs, runs here
too: with --sim every stage runs on the stand-in device with the CPU build
(issue 53, section 3), so a broken script fails CI, not a lent machine's
few minutes. The report must say every step passed, in every section,
within the script's own budget; and a budget too small to run the steps
must still end with a report that names what did not run, and fail."""

import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mp_harness import REPO_ROOT, run_with_deadline  # noqa: E402

SCRIPT = os.path.join(REPO_ROOT, "scripts", "gpu_check.sh")


def _run(args, env_extra, timeout):
    env = dict(os.environ, SMDDP_DEVICE_SIM="1", **env_extra)
    env.pop("PYTHONPATH", None)
    with tempfile.TemporaryDirectory(prefix="smddp-gpucheck-") as tmp:
        report = os.path.join(tmp, "report.md")
        code, timed_out, text = run_with_deadline([SCRIPT, "--sim", "--commit", "abc1234", *args, report],
                                                  timeout=timeout, env=env)
        body = open(report).read() if os.path.exists(report) else ""
    return code, timed_out, text, body


def test_the_gpu_check_runs_every_stage_on_the_stand_in_within_its_budget():
    code, timed_out, text, report = _run(["all"], {}, timeout=600)
    assert not timed_out, text[-4000:]
    assert report.startswith("# GPU check of torch-smddp abc1234"), report[:200]
    for section in ("## Machine", "## Build", "## The GPU path's collectives on the stand-in",
                    "## One rank per GPU, on both routes", "## The host path on CPU tensors", "## Summary"):
        assert section in report, (section, report[-4000:])
    for step in ("build", "test-sim", "multi-gpu", "host-bench"):
        assert f"\n{step}: exit 0 after" in report, (step, report[-6000:])
    # Both routes inside the host, against the closed form, and a killed
    # peer on the NCCL route failing the others in time.
    assert report.count("route 'shm', 0 wrong") == 4 and report.count("route 'nccl', 0 wrong") == 4, report[-6000:]
    assert "raised" in report and "<- FAILED" not in report, report[-6000:]
    assert "smddp/floor" in report, report[-3000:]
    summary = report.split("## Summary")[1]
    assert "every step passed" in summary, summary
    seconds = int(summary.split(" in ")[1].split(" s")[0])
    assert seconds <= 500, summary
    assert code == 0, text[-3000:]


def test_a_spent_budget_still_ends_in_a_report_that_says_what_did_not_run():
    code, timed_out, text, report = _run(["all"], {"GPU_CHECK_BUDGET": "25"}, timeout=120)
    assert not timed_out and code != 0, text[-3000:]
    assert "NOT RUN: the 25 s budget is spent" in report, report[-3000:]
    assert "FAILED:" in report.split("## Summary")[1], report[-2000:]
