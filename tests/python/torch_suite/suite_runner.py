"""Parent side: run a list of PyTorch distributed_test tests in subprocesses.

No torch import here: this module is imported by pytest
(tests/python/test_torch_suite.py) and also works as a CLI::

    .venv/bin/python tests/python/torch_suite/suite_runner.py [--backend smddp]
        [--set default|full|skipped|all|test_a,test_b] [--world-size 3]
        [--start forkserver|spawn] [--budget SECONDS] [--json out.json]

The tests run in a ``run_suite.py`` child started in its own session (so it,
the multiprocessing forkserver and every rank can be SIGKILLed as a unit).
The child logs each test's start and end to a JSON-lines file; the parent
watches that file, and when a test outlives its hard timeout, or the child
dies, or the overall budget runs out, it kills the whole session, records the
in-flight test as failed ("hard timeout" / "driver died" / "budget exhausted
while the test was running") and starts a new child for the tests that are
left (tests that never started before the budget ran out are reported as not
run). ``gate_problems`` is the pass rule: every selected test must pass.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
SELECTION_FILE = os.path.join(HERE, "selection.txt")
DRIVER = os.path.join(HERE, "run_suite.py")

# Harness-level per-test timeout (MultiProcessTestCase terminates the ranks
# after it and fails the test); the hard kill comes HARD_GRACE s later.
DEFAULT_TEST_TIMEOUT = 90
HARD_GRACE = 30
# PyTorch's CI runs this suite for gloo on CPU-only machines at WORLD_SIZE=3.
DEFAULT_WORLD = 3


# --------------------------------------------------------------------------
# selection file
# --------------------------------------------------------------------------

@dataclass
class Selection:
    run: list = field(default_factory=list)  # every selected test, file order
    default: list = field(default_factory=list)  # the bounded subset
    ungate: list = field(default_factory=list)  # run despite a backend-name skip
    world: dict = field(default_factory=dict)  # test -> WORLD_SIZE when not DEFAULT_WORLD
    skip: dict = field(default_factory=dict)  # test -> reason

    def names(self, which: str) -> list:
        if which == "default":
            return list(self.default)
        if which == "full":
            return list(self.run)
        if which == "skipped":
            return list(self.skip)
        if which == "all":
            return list(self.run) + list(self.skip)
        return [n.strip() for n in which.split(",") if n.strip()]


def load_selection(path: str = SELECTION_FILE) -> Selection:
    """Parse selection.txt: ``run <test> [default] [ungate] [world=N]`` / ``skip <test> <reason>``."""
    sel = Selection()
    seen = set()
    with open(path, encoding="utf-8") as f:
        for lineno, raw in enumerate(f, 1):
            line = raw.split("#", 1)[0].strip() if raw.lstrip().startswith("#") else raw.strip()
            if not line:
                continue
            parts = line.split(None, 2)
            where = f"{path}:{lineno}"
            if len(parts) < 2 or parts[0] not in ("run", "skip"):
                raise ValueError(f"{where}: expected 'run <test> [default]' or 'skip <test> <reason>'")
            kind, name = parts[0], parts[1]
            if name in seen:
                raise ValueError(f"{where}: {name} listed twice")
            seen.add(name)
            if kind == "run":
                extras = parts[2].split() if len(parts) > 2 else []
                for e in list(extras):
                    if re.fullmatch(r"world=\d+", e):
                        sel.world[name] = int(e.split("=")[1])
                        extras.remove(e)
                bad = [e for e in extras if e not in ("default", "ungate")]
                if bad:
                    raise ValueError(f"{where}: unexpected {bad} after run {name}")
                sel.run.append(name)
                if "default" in extras:
                    sel.default.append(name)
                if "ungate" in extras:
                    sel.ungate.append(name)
            else:
                if len(parts) < 3 or not parts[2].strip():
                    raise ValueError(f"{where}: skip {name} needs a reason")
                sel.skip[name] = parts[2].strip()
    return sel


# --------------------------------------------------------------------------
# running
# --------------------------------------------------------------------------

@dataclass
class Outcome:
    test: str
    status: str  # passed | failed | skipped | not_run
    message: str = ""
    duration: float = 0.0
    leaked_shm: int = 0  # /dev/shm regions its ranks left behind
    world: int = DEFAULT_WORLD

    @property
    def summary(self) -> str:
        return summarize_message(self.message) if self.status == "failed" else self.message


@dataclass
class Report:
    backend: str
    world_size: int
    start: str
    outcomes: list
    wall: float
    inventory: list | None
    log_path: str
    stale_shm_swept: int = 0  # found (from earlier runs) when the driver started

    def count(self, status: str) -> int:
        return sum(1 for o in self.outcomes if o.status == status)

    @property
    def ran(self) -> int:
        return self.count("passed") + self.count("failed")

    def counts_line(self) -> str:
        s = (f"{self.count('passed')} passed, {self.count('failed')} failed, "
             f"{self.count('skipped')} skipped")
        s = f"torch distributed_test result on {self.backend}: {s}"
        if self.count("not_run"):
            s += f", {self.count('not_run')} not run (budget)"
        return s


def _kill_session(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pass


def _read_events(path: str, offset: int):
    """New complete JSON lines of ``path`` from byte ``offset``."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
    except FileNotFoundError:
        return [], offset
    end = data.rfind(b"\n") + 1
    events = []
    for line in data[:end].splitlines():
        try:
            events.append(json.loads(line))
        except ValueError:
            continue
    return events, offset + end


def _log_tail(path: str, lines: int = 25) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.path.getsize(path) - 64 * 1024))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    keep = [l for l in text.splitlines() if "USDT:" not in l]
    return "\n".join(keep[-lines:])


def run_tests(
    tests,
    backend: str = "smddp",
    world_size: int = 3,
    start: str = "forkserver",
    test_timeout: int = DEFAULT_TEST_TIMEOUT,
    budget: float = 3600.0,
    log_dir: str | None = None,
    want_inventory: bool = False,
    progress=None,
    ungate=(),
) -> Report:
    """Run ``tests`` (names of TestDistBackendWithSpawn methods); never hangs
    longer than ``budget`` + a few seconds."""
    t_start = time.time()
    deadline = t_start + budget
    user_progress = progress

    def progress(o: Outcome) -> None:  # noqa: F811
        o.world = world_size
        if user_progress:
            user_progress(o)

    if log_dir is None:
        log_dir = tempfile.mkdtemp(prefix="smddp-torch-suite-")
    os.makedirs(log_dir, exist_ok=True)
    results_path = os.path.join(log_dir, "results.jsonl")
    log_path = os.path.join(log_dir, "driver.log")
    for p in (results_path, log_path):
        if os.path.exists(p):
            os.unlink(p)

    env = dict(os.environ)
    env["DISTRIBUTED_TESTS_DEFAULT_TIMEOUT"] = str(test_timeout)
    env["SMDDP_TORCH_SUITE_START"] = start
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTORCH_PRINT_REPRO_ON_FAILURE"] = "0"
    env.pop("PYTEST_CURRENT_TEST", None)

    remaining = list(tests)
    outcomes: dict = {}
    inventory = None
    swept = 0
    offset = 0
    first = True
    while remaining and time.time() < deadline:
        cmd = [sys.executable, DRIVER, "--backend", backend, "--world-size", str(world_size),
               "--results", results_path]
        if first and want_inventory:
            cmd.append("--list")
        if ungate:
            cmd += ["--ungate", ungate if isinstance(ungate, str) else ",".join(ungate)]
        cmd += remaining
        first = False
        with open(log_path, "ab") as log:
            # cwd: libinfinipath (pulled in by libfabric) drops *.btr crash
            # reports into the cwd of a rank that dies on a signal.
            proc = subprocess.Popen(cmd, cwd=log_dir, env=env, stdin=subprocess.DEVNULL,
                                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        current, current_since = None, time.time()
        killed_reason = None
        started_any = False  # did this driver get as far as starting a test?
        while True:
            events, offset = _read_events(results_path, offset)
            for ev in events:
                kind = ev.get("event")
                if kind == "inventory":
                    inventory = ev["tests"]
                elif kind == "import_error":
                    _kill_session(proc)
                    raise RuntimeError(f"run_suite.py could not import the suite:\n{ev['message']}")
                elif kind == "shm_sweep":
                    swept += ev["removed"]
                elif kind == "start":
                    current, current_since = ev["test"], time.time()
                    started_any = True
                elif kind == "end":
                    current_since = time.time()
                    o = Outcome(ev["test"], ev["status"], ev.get("message", ""), ev.get("duration", 0.0),
                                len(ev.get("leaked_shm", ())))
                    outcomes[o.test] = o
                    if o.test in remaining:
                        remaining.remove(o.test)
                    current = None
                    progress(o)
            rc = proc.poll()
            if rc is not None:
                # Drain what the child wrote just before exiting.
                events, offset = _read_events(results_path, offset)
                if events:
                    continue
                if current is not None:
                    killed_reason = f"driver died (exit code {rc}) during the test"
                elif remaining and rc != 0:
                    killed_reason = f"driver died (exit code {rc}) between tests"
                break
            now = time.time()
            if current is None and not remaining:
                # Every test reported; the driver only has to exit.
                if now - current_since > 30:
                    _kill_session(proc)
                    break
            if current is not None and now - current_since > test_timeout + HARD_GRACE:
                killed_reason = f"hard timeout: no result after {test_timeout + HARD_GRACE} s (killed)"
                _kill_session(proc)
                break
            if current is None and remaining and now - current_since > test_timeout + HARD_GRACE:
                # Hung while importing the suite or between two tests.
                killed_reason = (f"hard timeout: driver started no test for "
                                 f"{test_timeout + HARD_GRACE} s (killed)")
                _kill_session(proc)
                break
            if now > deadline:
                killed_reason = "budget exhausted (killed)"
                _kill_session(proc)
                break
            time.sleep(0.2)
        if proc.poll() is None:
            _kill_session(proc)
        if killed_reason and current is not None:
            # A test still running when the budget ran out did not pass: it
            # may be the very hang the budget exists to stop. It counts as a
            # failure, never as "not run", so it cannot drop out of the count.
            if killed_reason.startswith("budget"):
                killed_reason = "budget exhausted while the test was running (killed)"
            o = Outcome(current, "failed", f"{killed_reason}\n--- driver log tail ---\n{_log_tail(log_path)}",
                        round(time.time() - current_since, 2))
            outcomes[current] = o
            if current in remaining:
                remaining.remove(current)
            progress(o)
        elif killed_reason and remaining and not started_any and not killed_reason.startswith("budget"):
            # Died while setting up (bad selection, import error...): restarting
            # would only fail the same way, so fail everything left at once.
            msg = f"driver failed before its first test: {killed_reason}\n{_log_tail(log_path)}"
            for name in remaining:
                outcomes[name] = Outcome(name, "failed", msg)
                progress(outcomes[name])
            remaining = []
        elif killed_reason and remaining:
            # Died outside a test: charge it to the next test so we make progress.
            victim = remaining.pop(0)
            outcomes[victim] = Outcome(victim, "failed",
                                       f"{killed_reason}\n{_log_tail(log_path)}")
    for name in remaining:
        outcomes[name] = Outcome(name, "not_run", "budget exhausted before the test started")
    ordered = [outcomes[n] for n in tests if n in outcomes]
    for o in ordered:
        o.world = world_size
    return Report(backend, world_size, start, ordered, round(time.time() - t_start, 1), inventory,
                  log_path, swept)


def gate_problems(report: Report, names) -> list:
    """Why ``report`` does not pass the gate for the selected ``names``: one
    line per selected test that did not pass (failed, including a test killed
    by the budget; not run; skipped at run time; or missing), empty when every
    selected test passed."""
    by_name = {o.test: o for o in report.outcomes}
    problems = []
    for name in names:
        o = by_name.get(name)
        if o is None:
            problems.append(f"{name}: no outcome recorded")
        elif o.status == "failed":
            problems.append(f"{name}: failed: {o.summary}")
        elif o.status == "not_run":
            problems.append(f"{name}: not run ({o.message})")
        elif o.status != "passed":
            problems.append(f"{name}: {o.status} at run time: {o.message}")
    if not names:
        problems.append("no test was selected")
    return problems


def default_log_dir(backend: str) -> str:
    """build/torch_suite/<backend> (emptied first) when build/ exists, else a temp dir."""
    build = os.path.join(REPO_ROOT, "build")
    if not os.path.isdir(build):
        return tempfile.mkdtemp(prefix="smddp-torch-suite-")
    path = os.path.join(build, "torch_suite", backend)
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    return path


def run_selection(names, sel: Selection, backend: str = "smddp", start: str = "forkserver",
                  test_timeout: int = DEFAULT_TEST_TIMEOUT, budget: float = 3600.0,
                  log_dir: str | None = None, progress=None, world_override: int | None = None,
                  ungate=None) -> Report:
    """Run ``names`` at the world size the selection gives each (3 unless
    ``world=N``), one driver per world size, within one overall ``budget``."""
    t0 = time.time()
    if log_dir is None:
        log_dir = default_log_dir(backend)
    groups: dict = {}
    for n in names:
        ws = world_override or sel.world.get(n, DEFAULT_WORLD)
        groups.setdefault(ws, []).append(n)
    merged = None
    for ws in sorted(groups):
        left = budget - (time.time() - t0)
        rep = run_tests(groups[ws], backend, ws, start, test_timeout, max(left, 0.0),
                        os.path.join(log_dir, f"world{ws}"), want_inventory=merged is None,
                        progress=progress, ungate=sel.ungate if ungate is None else ungate)
        if merged is None:
            merged = rep
            merged.log_paths = [rep.log_path]
        else:
            merged.outcomes += rep.outcomes
            merged.stale_shm_swept += rep.stale_shm_swept
            merged.log_paths.append(rep.log_path)
    if merged is None:
        return Report(backend, DEFAULT_WORLD, start, [], 0.0, None, "", 0)
    merged.world_size = "/".join(str(w) for w in sorted(groups))
    merged.wall = round(time.time() - t0, 1)
    order = {n: i for i, n in enumerate(names)}
    merged.outcomes.sort(key=lambda o: order.get(o.test, 0))
    return merged


def list_tests(backend: str = "smddp", world_size: int = 3, timeout: float = 180) -> list:
    """Every test name TestDistBackendWithSpawn defines (imports the suite in a child)."""
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "inv.jsonl")
        subprocess.run([sys.executable, DRIVER, "--backend", backend, "--world-size", str(world_size),
                        "--results", path, "--list"], cwd=REPO_ROOT, check=True, timeout=timeout,
                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        events, _ = _read_events(path, 0)
    for ev in events:
        if ev.get("event") == "inventory":
            return ev["tests"]
    raise RuntimeError("run_suite.py --list wrote no inventory")


# --------------------------------------------------------------------------
# failure messages
# --------------------------------------------------------------------------

_PROC_BLOCK = re.compile(r"Process (\d+) exited with error code \d+ and exception:\n")


def _final_exception_line(tb: str) -> str:
    """The exception line that ends the last traceback in ``tb``."""
    idx = tb.rfind("Traceback (most recent call last):")
    lines = tb[idx:].splitlines()[1:] if idx >= 0 else tb.splitlines()
    for i, line in enumerate(lines):
        if line and not line.startswith((" ", "\t")):
            # Multi-line messages: keep continuation lines up to C++ frames.
            out = [line]
            for more in lines[i + 1:i + 4]:
                if not more.strip() or more.startswith(("Exception raised from", "frame #", "  ")):
                    break
                out.append(more.strip())
            return " ".join(out)
    return lines[-1].strip() if lines else tb.strip()[:200]


def summarize_message(message: str, limit: int = 400) -> str:
    """One line: the exception each failing rank raised (deduplicated)."""
    if not message:
        return ""
    if message.startswith("driver failed before"):
        tail = [l for l in message.splitlines()[1:] if l.strip()]
        return message.splitlines()[0] + (f": {tail[-1].strip()}" if tail else "")
    if message.startswith(("hard timeout", "driver died", "budget")):
        return message.splitlines()[0]
    blocks = _PROC_BLOCK.split(message)
    if len(blocks) > 1:
        per_msg: dict = {}
        for i in range(1, len(blocks), 2):
            rank, body = blocks[i], blocks[i + 1]
            per_msg.setdefault(_final_exception_line(body), []).append(rank)
        parts = [f"rank {','.join(r)}: {m}" for m, r in per_msg.items()]
        text = " | ".join(parts)
    else:
        text = _final_exception_line(message)
    text = re.sub(r"\s+", " ", text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


# --------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------

def print_report(report: Report, sel: Selection | None = None, file=sys.stdout) -> None:
    p = lambda *a: print(*a, file=file)  # noqa: E731
    p(f"torch distributed_test on {report.backend} (WORLD_SIZE={report.world_size}, "
      f"start={report.start}): {len(report.outcomes)} tests in {report.wall} s")
    for status in ("failed", "skipped", "not_run"):
        items = [o for o in report.outcomes if o.status == status]
        if items:
            p(f"-- {status} ({len(items)}):")
            for o in items:
                p(f"   {o.test}: {o.summary}")
    leaky = [o for o in report.outcomes if o.leaked_shm]
    if leaky:
        p(f"-- {len(leaky)} tests left {sum(o.leaked_shm for o in leaky)} libfabric /dev/shm regions "
          "behind (a rank exited without closing its endpoint); removed after each test: "
          + ", ".join(o.test for o in leaky))
    if report.stale_shm_swept:
        p(f"-- removed {report.stale_shm_swept} stale /dev/shm regions of dead processes before the run")
    for path in getattr(report, "log_paths", [report.log_path]):
        p(f"driver log: {path}")
    p(report.counts_line())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", default="smddp")
    ap.add_argument("--world-size", type=int, default=None,
                    help="run every test at this WORLD_SIZE (default: per selection.txt, else 3)")
    ap.add_argument("--set", default="full", help="default | full | skipped | all | comma-separated names")
    ap.add_argument("--start", default=os.environ.get("SMDDP_TORCH_SUITE_START", "forkserver"),
                    choices=("forkserver", "spawn"))
    ap.add_argument("--test-timeout", type=int, default=DEFAULT_TEST_TIMEOUT)
    ap.add_argument("--budget", type=float, default=3 * 3600)
    ap.add_argument("--log-dir")
    ap.add_argument("--json", help="write every outcome (with full messages) here")
    ap.add_argument("--inventory", action="store_true",
                    help="run every test the suite defines (ignores --set)")
    ap.add_argument("--ungate-all", action="store_true",
                    help="ungate every test whose only import-time skip is a backend-name "
                         "allowlist (default: the tests marked 'ungate' in selection.txt)")
    args = ap.parse_args(argv)

    sel = load_selection()
    names = list_tests(args.backend) if args.inventory else sel.names(args.set)

    def progress(o: Outcome) -> None:
        print(f"{o.status:8s} {o.duration:6.1f}s w{o.world} {o.test}"
              + (f"  -- {o.summary[:200]}" if o.status in ("failed", "skipped") else ""), flush=True)

    report = run_selection(names, sel, args.backend, args.start, args.test_timeout, args.budget,
                           args.log_dir, progress=progress, world_override=args.world_size,
                           ungate="ALL" if args.ungate_all else None)
    print_report(report, sel)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"backend": report.backend, "world_size": report.world_size,
                       "start": report.start, "wall": report.wall,
                       "inventory": report.inventory,
                       "outcomes": [dict(asdict(o), summary=o.summary) for o in report.outcomes]},
                      f, indent=1)
    return 0 if not gate_problems(report, names) else 1


if __name__ == "__main__":
    sys.exit(main())
