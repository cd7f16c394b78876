"""Child-side driver: run named tests of dist_suite one by one, log JSON lines.

Usage (normally started by suite_runner.py, never by pytest directly)::

    python run_suite.py --backend smddp --world-size 3 --results out.jsonl \\
        [--list] test_a test_b ...

For every test it appends ``{"event": "start", "test": ...}`` and then
``{"event": "end", "test": ..., "status": ..., "message": ..., "duration": ...}``
(status: passed, failed, skipped) to ``--results``, flushed and fsynced, so
the parent can tell which test was in flight if this process hangs or dies
and has to be killed.  ``--list`` writes ``{"event": "inventory", "tests":
[...]}`` (every test the suite defines) first.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
import traceback
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))


class _Log:
    def __init__(self, path: str):
        self._f = open(path, "a", encoding="utf-8")

    def write(self, **record) -> None:
        record["t"] = time.time()
        self._f.write(json.dumps(record) + "\n")
        self._f.flush()
        os.fsync(self._f.fileno())


class _LoggingResult(unittest.TestResult):
    """Logs each test's start and outcome as it happens."""

    def __init__(self, log: _Log):
        super().__init__()
        self._log = log
        self._status = None
        self._message = ""
        self._t0 = 0.0

    @staticmethod
    def _name(test) -> str:
        return test.id().rsplit(".", 1)[-1]

    def startTest(self, test):
        super().startTest(test)
        self._status, self._message, self._t0 = None, "", time.time()
        print(f"=== {self._name(test)}", file=sys.stderr, flush=True)
        self._log.write(event="start", test=self._name(test))

    def stopTest(self, test):
        super().stopTest(test)
        leftovers = _reap_ranks()
        leaked = [n for n, pid in _sweep_stale_shm() if pid in getattr(test, "_rank_pids", ())]
        self._log.write(
            event="end",
            test=self._name(test),
            status=self._status or "failed",
            message=self._message if self._status else "no result recorded",
            duration=round(time.time() - self._t0, 2),
            leftover_ranks=leftovers,
            leaked_shm=leaked,
        )

    def addSuccess(self, test):
        self._status = "passed"

    def addSkip(self, test, reason):
        self._status, self._message = "skipped", str(reason)

    def addFailure(self, test, err):
        self._status, self._message = "failed", self._exc_info_to_string(err, test)

    def addError(self, test, err):
        # Errors in setUpClass/tearDownClass come with a _ErrorHolder, not a test.
        if not isinstance(test, unittest.TestCase):
            self._log.write(event="class_error", message=self._exc_info_to_string(err, test))
            return
        self._status, self._message = "failed", self._exc_info_to_string(err, test)

    def addExpectedFailure(self, test, err):
        self._status, self._message = "passed", "expected failure"

    def addUnexpectedSuccess(self, test):
        self._status, self._message = "failed", "unexpected success"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="smddp")
    ap.add_argument("--world-size", default="3")
    ap.add_argument("--results", required=True)
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--ungate", default="", help="comma-separated tests to ungate, or ALL")
    ap.add_argument("tests", nargs="*")
    args = ap.parse_args(argv)

    # dist_suite and distributed_test read these at import time.
    os.environ["BACKEND"] = args.backend
    os.environ["WORLD_SIZE"] = str(args.world_size)
    sys.path.insert(0, HERE)
    log = _Log(args.results)
    try:
        import dist_suite
    except Exception:
        log.write(event="import_error", message=traceback.format_exc())
        raise
    if args.list:
        log.write(event="inventory", tests=dist_suite.all_test_names())
    stale = _sweep_stale_shm()
    if stale:
        log.write(event="shm_sweep", removed=len(stale))

    cls = dist_suite.TestDistBackendWithSpawn
    known = set(dist_suite.all_test_names())
    here = known & set(args.tests)  # only this run's tests (others may need another WORLD_SIZE)
    if args.ungate == "ALL":
        removed = dist_suite.ungate(sorted(here), strict=False)
    else:
        removed = dist_suite.ungate([n for n in args.ungate.split(",") if n in here])
    if removed:
        log.write(event="ungated", tests=removed)
    suite = unittest.TestSuite()
    for name in args.tests:
        if name in known:
            suite.addTest(cls(name))
        else:  # e.g. renamed or removed upstream
            log.write(event="start", test=name)
            log.write(event="end", test=name, status="failed", duration=0.0,
                      message=f"unknown test: {cls.__name__} has no method {name}")
    # A suite (not test.run()) so that setUpClass runs: TestDistBackend sets
    # MASTER_ADDR there, without which every rank spends seconds resolving
    # the host name.
    suite.run(_LoggingResult(log))
    return 0


_SHM_DIR = "/dev/shm"
_SHM_NAME = re.compile(r"^(\d+):\d+:\d+$")  # libfabric shm provider: "<pid>:<n>:<n>"


def _sweep_stale_shm() -> list:
    """Remove libfabric shm regions whose owning process is gone.

    The shm provider names its region after the owner's pid; a process that
    exits without closing its endpoint (killed, crashed, or os._exit without
    destroy_process_group) leaves it behind, and a later process that gets
    the same pid then fails in fi_enable with EBUSY.  Returns [(name, pid)]
    removed.  SMDDP_TORCH_SUITE_SHM_SWEEP=0 disables it.
    """
    if os.environ.get("SMDDP_TORCH_SUITE_SHM_SWEEP", "1") == "0":
        return []
    removed = []
    try:
        names = os.listdir(_SHM_DIR)
    except OSError:
        return removed
    uid = os.getuid()
    for name in names:
        m = _SHM_NAME.match(name)
        if not m:
            continue
        pid = int(m.group(1))
        try:
            os.kill(pid, 0)
            continue  # owner alive (or not ours to judge)
        except ProcessLookupError:
            pass
        except PermissionError:
            continue
        path = os.path.join(_SHM_DIR, name)
        try:
            if os.stat(path).st_uid != uid:
                continue
            os.unlink(path)
            removed.append((name, pid))
        except OSError:
            pass
    return removed


def _reap_ranks(grace: float = 3.0) -> int:
    """SIGKILL ranks still alive after their test (returns how many).

    When one rank fails, the harness SIGTERMs the others and moves on without
    joining them; a rank that does not die on SIGTERM would otherwise pile up
    and, at exit, make multiprocessing's atexit join() wait for it forever.
    """
    import multiprocessing

    deadline = time.time() + grace
    alive = multiprocessing.active_children()
    while alive and time.time() < deadline:
        time.sleep(0.1)
        alive = multiprocessing.active_children()
    for p in alive:
        print(f"run_suite: rank pid {p.pid} ({p.name}) still alive {grace:.0f} s after "
              "its test; SIGKILL", file=sys.stderr, flush=True)
        p.kill()
        p.join(5)
    return len(alive)


if __name__ == "__main__":
    rc = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown: nothing is left to clean up that the parent
    # does not kill anyway, and atexit handlers of the loaded libraries have
    # been seen to hang.
    os._exit(rc)
