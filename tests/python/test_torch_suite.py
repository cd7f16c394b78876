"""PyTorch's own distributed test suite (distributed_test.py) against smddp.

Runs the tests listed in torch_suite/selection.txt through upstream's
TestDistBackend harness with BACKEND=smddp, in subprocesses with a hard
time budget (see torch_suite/README.md):

    SMDDP_TORCH_SUITE=default   (the default) the `default`-tagged subset, budget 240 s
    SMDDP_TORCH_SUITE=full      every `run` test of selection.txt, budget 1800 s
    SMDDP_TORCH_SUITE=off       skip
    SMDDP_TORCH_SUITE=test_a,test_b   just these
    SMDDP_TORCH_SUITE_BUDGET=<seconds>     override the budget
    SMDDP_TORCH_SUITE_START=spawn          upstream's start method (slow) instead of forkserver
    SMDDP_TEST_BACKEND=gloo                run the same selection on gloo (harness check)

The test fails unless every selected test passed: a failure, a test still
running when the budget ran out (counted as failed), a test the budget left
unstarted (not run) and a run-time skip each fail it
(suite_runner.gate_problems). The counts and every failure (test name +
exception) are printed either way.
"""

from __future__ import annotations

import os
import sys
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "torch_suite"))

import suite_runner  # noqa: E402

MODE = os.environ.get("SMDDP_TORCH_SUITE", "default").strip() or "default"
BACKEND = os.environ.get("SMDDP_TEST_BACKEND", "").strip() or "smddp"
START = os.environ.get("SMDDP_TORCH_SUITE_START", "forkserver")
BUDGETS = {"default": 240.0, "full": 1800.0}


def test_selection_file_is_consistent():
    sel = suite_runner.load_selection()  # raises on syntax errors and duplicates
    assert sel.run, "selection.txt selects no test"
    assert set(sel.default) <= set(sel.run)
    assert set(sel.ungate) <= set(sel.run)
    assert not set(sel.run) & set(sel.skip)
    assert all(w in (2, 3, 4, 8) for w in sel.world.values()), sel.world


@pytest.mark.skipif(MODE == "off", reason="SMDDP_TORCH_SUITE=off")
def test_torch_distributed_suite(capsys):
    sel = suite_runner.load_selection()
    names = sel.names(MODE)
    assert names, f"SMDDP_TORCH_SUITE={MODE!r} selects no test"
    budget = float(os.environ.get("SMDDP_TORCH_SUITE_BUDGET", BUDGETS.get(MODE, 1800.0)))

    report = suite_runner.run_selection(names, sel, backend=BACKEND, start=START, budget=budget)

    lines = []

    class _Sink:
        def write(self, s):
            lines.append(s)

    suite_runner.print_report(report, sel, file=_Sink())
    text = "".join(lines)
    with capsys.disabled():
        sys.stdout.write(f"\n[torch_suite {MODE}] {text}")
        sys.stdout.flush()

    # Every test the suite defines must be listed once in selection.txt, so a
    # torch upgrade that adds, renames or removes tests shows up here.
    if report.inventory is not None:
        listed = set(sel.run) | set(sel.skip)
        new = sorted(set(report.inventory) - listed)
        gone = sorted(listed - set(report.inventory))
        assert not new and not gone, (
            f"selection.txt is out of date with torch's distributed_test: "
            f"not listed: {new}; listed but not defined: {gone}")

    problems = suite_runner.gate_problems(report, names)
    assert not problems, (
        f"{len(problems)} of the {len(names)} selected tests did not pass "
        f"({report.counts_line()}):\n  " + "\n  ".join(problems))


# ---- the gate's own counting, on a fake driver (no torch, a few seconds) ----

FAKE_DRIVER = r"""
import argparse, json, sys, time
ap = argparse.ArgumentParser()
ap.add_argument("--backend"); ap.add_argument("--world-size"); ap.add_argument("--results")
ap.add_argument("--list", action="store_true"); ap.add_argument("--ungate", default="")
ap.add_argument("tests", nargs="*")
a = ap.parse_args()
def log(**ev):
    with open(a.results, "a") as f:
        f.write(json.dumps(ev) + "\n")
for t in a.tests:
    log(event="start", test=t)
    if t.startswith("test_hangs"):
        time.sleep(600)  # still running when the budget runs out
    status = "skipped" if t.startswith("test_skips") else "passed"
    log(event="end", test=t, status=status, message="", duration=0.0)
"""


def _fake_run(tmp_path, monkeypatch, tests, budget):
    driver = tmp_path / "fake_driver.py"
    driver.write_text(FAKE_DRIVER)
    monkeypatch.setattr(suite_runner, "DRIVER", str(driver))
    return suite_runner.run_tests(tests, backend="fake", budget=budget, test_timeout=300,
                                  log_dir=str(tmp_path / "logs"))


def test_gate_fails_a_test_still_running_at_the_budget_end(tmp_path, monkeypatch):
    tests = ["test_passes", "test_hangs", "test_never_started"]
    t0 = time.time()
    report = _fake_run(tmp_path, monkeypatch, tests, budget=3.0)
    assert time.time() - t0 < 60
    status = {o.test: o.status for o in report.outcomes}
    assert status == {"test_passes": "passed", "test_hangs": "failed",
                      "test_never_started": "not_run"}, report.outcomes
    hung = next(o for o in report.outcomes if o.test == "test_hangs")
    assert "budget exhausted while the test was running" in hung.message
    assert report.ran == 2  # the killed test counts among those that ran
    problems = suite_runner.gate_problems(report, tests)
    assert [p.split(":")[0] for p in problems] == ["test_hangs", "test_never_started"], problems


def test_gate_requires_every_selected_test_to_pass(tmp_path, monkeypatch):
    report = _fake_run(tmp_path, monkeypatch, ["test_a", "test_b"], budget=60.0)
    assert [o.status for o in report.outcomes] == ["passed", "passed"]
    assert suite_runner.gate_problems(report, ["test_a", "test_b"]) == []
    # A selected test with no outcome, or one skipped at run time, fails it.
    assert suite_runner.gate_problems(report, ["test_a", "test_b", "test_c"]) == [
        "test_c: no outcome recorded"]
    skipped = _fake_run(tmp_path, monkeypatch, ["test_a", "test_skips"], budget=60.0)
    problems = suite_runner.gate_problems(skipped, ["test_a", "test_skips"])
    assert len(problems) == 1 and problems[0].startswith("test_skips: skipped"), problems
