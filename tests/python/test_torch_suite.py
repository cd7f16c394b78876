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

The test fails if nothing ran or fewer than 90% of the tests that ran passed;
the counts and every failure (test name + exception) are printed either way.
"""

from __future__ import annotations

import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "torch_suite"))

import suite_runner  # noqa: E402

MODE = os.environ.get("SMDDP_TORCH_SUITE", "default").strip() or "default"
BACKEND = os.environ.get("SMDDP_TEST_BACKEND", "").strip() or "smddp"
START = os.environ.get("SMDDP_TORCH_SUITE_START", "forkserver")
MIN_PASS_RATE = 0.90
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

    ran = report.ran
    passed = report.count("passed")
    failures = "\n".join(f"  {o.test}: {o.summary}" for o in report.outcomes if o.status == "failed")
    assert ran > 0, f"no test ran ({report.counts_line()})\n{text}"
    assert passed / ran >= MIN_PASS_RATE, (
        f"only {passed}/{ran} of the tests that ran passed (< {MIN_PASS_RATE:.0%}):\n{failures}")
