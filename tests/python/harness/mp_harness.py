"""Multi-process launcher for the Python tests of torch-smddp.

``run_world(world_size, "module:function", ...)`` starts ``world_size`` fresh
Python processes (one per rank, each in its own session so that it and any
children it forks can be killed as a unit), rendezvouses them through the
usual env:// variables, runs ``function(rank, world_size, *args)`` in each one
after ``init_process_group`` and returns the per-rank results (whatever JSON
the function returned), indexed by rank.

Guarantees the tests rely on:

* hard wall-clock deadline for the whole job: on timeout, or as soon as any
  rank fails, every rank's process group is SIGKILLed and an AssertionError is
  raised that names every rank's exit status and the tail of its stderr (a
  rank that raised also reports its traceback; a rank that hangs dumps its
  Python stacks into stderr shortly before the deadline, via faulthandler);
* the children never share a pipe with the parent (output goes to files), so
  a chatty child can neither block nor be lost;
* ``torch_smddp`` is imported only when the backend string mentions smddp, so
  the harness itself can be exercised with gloo alone;
* ranks are forked from the session's zygote (zygote.py), which imported
  torch once, unless they run under a wrapper command or zygote.py says
  their environment needs a fresh interpreter.

The module is imported both by pytest (parent side) and by the children; it
must not import torch at module level. The small helpers (ports, a command
under a deadline, the build's tools, captured stderr) are in mp_helpers.py,
and every test imports them from here.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from typing import Any, Iterable, NamedTuple, Sequence

_SELF = os.path.dirname(os.path.abspath(__file__))
if _SELF not in sys.path:
    sys.path.insert(0, _SELF)
# The small helpers live in mp_helpers.py; tests import them from here.
from mp_helpers import (  # noqa: E402,F401
    CASES, HARNESS, HERE, REPO_ROOT, SUPPORT_PATH, WORKERS, backend_under_test, build_tool,
    captured_stderr, descendants, expect_raises, find_free_port, needs_smddp, put_support_on_path,
    run_with_deadline, says_port_clash, worker, _kill_tree)

# Whoever imports the harness can import the cases and workers by name.
put_support_on_path()

try:  # pytest fixture, usable as `from mp_harness import free_port`
    from mp_helpers import free_port  # noqa: F401
except ImportError:  # children do not need pytest
    pass


# Name of the env var that carries the path of the per-rank spec file.
_SPEC_ENV = "SMDDP_HARNESS_SPEC"
# Exit code of a child whose target raised (its traceback is in the result file).
_EXIT_TARGET_FAILED = 17
_STDERR_TAIL_LINES = 40

from zygote import zygote_for  # noqa: E402


# --------------------------------------------------------------------------
# parent side
# --------------------------------------------------------------------------

class _Rank:
    def __init__(self, rank: int, proc: subprocess.Popen, out_path: str, err_path: str,
                 result_path: str):
        self.rank = rank
        self.proc = proc
        self.out_path = out_path
        self.err_path = err_path
        self.result_path = result_path


def _tail(path: str, lines: int = _STDERR_TAIL_LINES) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 64 * 1024))
            data = f.read().decode("utf-8", "replace")
    except OSError as e:
        return f"<cannot read {path}: {e}>"
    return "\n".join(data.splitlines()[-lines:])


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "still running (killed by the harness)"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    if code == _EXIT_TARGET_FAILED:
        return "exit 17 (target raised)"
    return f"exit {code}"


def _kill_all(ranks: Iterable[_Rank]) -> None:
    ranks = list(ranks)
    # Snapshot the trees first: once a child dies its descendants are
    # re-parented and can no longer be found.
    extra = [p for r in ranks if r.proc.poll() is None for p in descendants(r.proc.pid)]
    for r in ranks:
        # Each child leads its own session, so its pid is also its pgid: this
        # takes down anything it spawned too...
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(r.proc.pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            r.proc.kill()
    for pid in extra:  # ...except helpers that started sessions of their own
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    for r in ranks:
        with contextlib.suppress(Exception):
            r.proc.wait(timeout=10)


def _read_result(path: str) -> dict | None:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _looks_like_port_clash(ranks: Sequence[_Rank]) -> bool:
    return says_port_clash(_tail(ranks[0].err_path, 200))


def run_world(
    world_size: int,
    target: str,
    *,
    timeout: float = 120,
    backend: str = "smddp",
    env: dict | None = None,
    args: Sequence[Any] = (),
    expect_failure: bool = False,
    pg_timeout: float | None = None,
    keep_logs: bool | None = None,
    allow_exit: Iterable[int] = (),
    wrap: dict | None = None,
) -> list[Any]:
    """Run ``target(rank, world_size, *args)`` on ``world_size`` fresh ranks.

    ``target`` is ``"module:function"``; the module is imported in the child
    with harness/, cases/ and workers/ on sys.path. ``args`` must be JSON
    serialisable. ``env`` is merged over the inherited environment of every
    child (values are str()-ed; a value of None removes the variable).

    ``timeout`` is a hard deadline, in seconds, for the whole job including
    interpreter start-up and teardown. ``pg_timeout`` is the timeout handed
    to init_process_group (default: a bit less than ``timeout``, so a stuck
    collective fails inside the child with a useful message before the
    harness has to kill it).

    ``expect_failure=True`` is for bad-input tests: the target must itself
    provoke and catch the error (see ``expect_raises``) and return the
    message(s); the harness then checks that every rank returned something
    non-empty and skips destroy_process_group, which a backend that has just
    reported an error need not survive. A target that does not raise is the
    target's job to report (``expect_raises`` raises AssertionError).

    ``allow_exit`` names ranks that may end at any moment, with any status
    (a signal included), without failing the job: for tests in which a rank
    dies on purpose. Such a rank's entry in the returned list is its result
    when it exited 0 after writing one, else an ``ExitedRank(rank,
    returncode)`` (returncode < 0: killed by that signal), so the test can
    check that the death really happened. Everything else is unchanged: the
    other ranks must succeed, the hard deadline still kills everyone.

    ``keep_logs`` says what becomes of the job's directory (specs, results,
    each rank's stdout and stderr): by default it is removed once the job
    has succeeded, and kept when it failed (the report names its files);
    True keeps it always, False removes it always (for tests that expect
    the job to fail).

    ``wrap`` maps a rank to a command prefix its interpreter runs under
    (e.g. ``["unshare", "-p", "-f", "--mount-proc", "--kill-child"]`` to put
    that rank in a PID namespace of its own).

    Returns the list of per-rank results. Raises AssertionError on any
    failure, timeout included.
    """
    if world_size < 1:
        raise ValueError("world_size must be >= 1")
    if ":" not in target:
        raise ValueError(f"target must be 'module:function', got {target!r}")
    json.dumps(list(args))  # fail early, in the parent, on unserialisable args
    if pg_timeout is None:
        pg_timeout = max(5.0, min(timeout - 10.0, timeout * 0.8))
    # SMDDP_TEST_PG_TIMEOUT caps it (scripts/gpu_check.sh: 60 s on a lent
    # machine, so a hang fails its step well inside the step's bound).
    cap = os.environ.get("SMDDP_TEST_PG_TIMEOUT")
    if cap:
        pg_timeout = min(pg_timeout, float(cap))
    allowed = frozenset(int(r) for r in allow_exit)
    if not allowed <= set(range(world_size)):
        raise ValueError(f"allow_exit {sorted(allowed)} names ranks outside 0..{world_size - 1}")
    if len(allowed) == world_size:
        raise ValueError("allow_exit must leave at least one rank whose success is checked")

    last_error: AssertionError | None = None
    for attempt in range(3):  # retry only when the picked port was stolen
        port = find_free_port()
        try:
            return _run_once(world_size, target, timeout, backend, env, list(args),
                             expect_failure, pg_timeout, port, keep_logs, allowed, wrap or {})
        except _PortClash as e:
            last_error = AssertionError(str(e))
            continue
    assert last_error is not None
    raise last_error


class _PortClash(Exception):
    pass


class ExitedRank(NamedTuple):
    """run_world's entry for an ``allow_exit`` rank that ended without a result."""
    rank: int
    returncode: int


def _run_once(world_size, target, timeout, backend, env, args, expect_failure, pg_timeout,
              port, keep_logs, allowed=frozenset(), wrap=None):
    workdir = tempfile.mkdtemp(prefix="smddp-mp-")
    base_env = dict(os.environ)
    base_env.update({
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "WORLD_SIZE": str(world_size),
        "LOCAL_WORLD_SIZE": str(world_size),
        "GROUP_RANK": "0",
        "ROLE_RANK": "0",
        "OMP_NUM_THREADS": base_env.get("OMP_NUM_THREADS", "1"),
        "PYTHONUNBUFFERED": "1",
        "PYTHONFAULTHANDLER": "1",
    })
    for k, v in (env or {}).items():
        if v is None:
            base_env.pop(k, None)
        else:
            base_env[k] = str(v)

    ranks: list[_Rank] = []
    start = time.monotonic()
    deadline = start + timeout
    ok = False
    clash = False  # the port was stolen: run_world retries in a new directory
    try:
        for rank in range(world_size):
            spec = {
                "rank": rank,
                "world_size": world_size,
                "target": target,
                "args": args,
                "backend": backend,
                "pg_timeout": pg_timeout,
                "job_timeout": timeout,
                "expect_failure": expect_failure,
                "result_path": os.path.join(workdir, f"result.{rank}.json"),
                "sys_path": SUPPORT_PATH + [HERE],
                "repo_root": REPO_ROOT,
            }
            spec_path = os.path.join(workdir, f"spec.{rank}.json")
            with open(spec_path, "w") as f:
                json.dump(spec, f)
            child_env = dict(base_env)
            # A callable env value is evaluated per rank (e.g. SMDDP_HOST_ID
            # to split one machine into pretend hosts).
            for key, value in (env or {}).items():
                if callable(value):
                    child_env[key] = str(value(rank))
            child_env.update({"RANK": str(rank), "LOCAL_RANK": str(rank), _SPEC_ENV: spec_path})
            out_path = os.path.join(workdir, f"stdout.{rank}")
            err_path = os.path.join(workdir, f"stderr.{rank}")
            zygote = None if (wrap or {}).get(rank) else zygote_for(child_env)
            if zygote is not None:
                proc = zygote.spawn(child_env, workdir, out_path, err_path)
            else:
                with open(out_path, "wb") as out, open(err_path, "wb") as err:
                    proc = subprocess.Popen(
                        [*(wrap or {}).get(rank, []), sys.executable, "-c",
                         f"import sys; sys.path.insert(0, {HARNESS!r}); "
                         "import mp_harness; mp_harness._child_main()"],
                        env=child_env, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                        start_new_session=True, cwd=workdir,
                    )
            ranks.append(_Rank(rank, proc, out_path, err_path, spec["result_path"]))

        failed_first: int | None = None
        timed_out = False
        while True:
            codes = [r.proc.poll() for r in ranks]
            if all(c == 0 or (i in allowed and c is not None) for i, c in enumerate(codes)):
                break
            bad = [i for i, c in enumerate(codes) if c not in (None, 0) and i not in allowed]
            if bad:
                failed_first = bad[0]
                # Give the others a moment to finish writing their own error
                # (a peer's failure usually makes them fail too), then kill.
                grace = min(deadline, time.monotonic() + 2.0)
                while time.monotonic() < grace and any(r.proc.poll() is None for r in ranks):
                    time.sleep(0.05)
                break
            if time.monotonic() >= deadline:
                timed_out = True
                break
            time.sleep(0.02)

        elapsed = time.monotonic() - start
        if failed_first is None and not timed_out:
            results = []
            problems = []
            for r in ranks:
                res = _read_result(r.result_path)
                if r.rank in allowed:
                    code = r.proc.returncode
                    if code == 0 and res is not None and res.get("ok"):
                        results.append(res["value"])
                    else:
                        results.append(ExitedRank(r.rank, code))
                    continue
                if res is None or "ok" not in res:
                    problems.append(f"rank {r.rank}: exited 0 but wrote no result")
                elif not res["ok"]:
                    problems.append(f"rank {r.rank}: {res.get('error')}")
                else:
                    results.append(res["value"])
            if not problems:
                ok = True
                return results
            raise AssertionError(_report(ranks, target, backend, world_size, elapsed,
                                         "ranks exited 0 but reported problems: " + "; ".join(problems)))

        # Failure path: kill everything first, then collect what we can.
        _kill_all(ranks)
        if failed_first is not None and _looks_like_port_clash(ranks) and elapsed < 30:
            clash = True
            raise _PortClash(_report(ranks, target, backend, world_size, elapsed,
                                     f"MASTER_PORT {port} was taken"))
        why = (f"hard timeout of {timeout:.0f}s reached" if timed_out
               else f"rank {failed_first} failed first")
        raise AssertionError(_report(ranks, target, backend, world_size, elapsed, why))
    finally:
        _kill_all(ranks)  # also reaps stragglers after success (e.g. forked helpers)
        if keep_logs is False or (keep_logs is None and (ok or clash)):
            shutil.rmtree(workdir, ignore_errors=True)  # with what the ranks made in it


def _report(ranks, target, backend, world_size, elapsed, why) -> str:
    parts = [f"multi-process job {target} (backend={backend}, world_size={world_size}) "
             f"failed after {elapsed:.1f}s: {why}"]
    for r in ranks:
        code = r.proc.returncode if r.proc.returncode is not None else r.proc.poll()
        parts.append(f"--- rank {r.rank}: {_describe_exit(code)}")
        res = _read_result(r.result_path)
        tail_lines = _STDERR_TAIL_LINES
        if res is not None and not res.get("ok", True):
            parts.append(f"    error: {res.get('error')}")
            tb = res.get("traceback")
            if tb:
                parts.append("    traceback:\n" + _indent(tb.rstrip()))
                tail_lines = 12  # the traceback is also at the end of stderr
        tail = _tail(r.err_path, tail_lines)
        if tail.strip():
            parts.append(f"    stderr tail ({r.err_path}):\n" + _indent(tail))
    return "\n".join(parts)


def _indent(text: str, prefix: str = "      ") -> str:
    return "\n".join(prefix + line for line in text.splitlines())


# --------------------------------------------------------------------------
# child side
# --------------------------------------------------------------------------

def write_atomic(path: str, text: str) -> None:
    """Writes `path` whole (a temporary file, then a rename): a reader
    polling for it never sees it created but not yet written."""
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def _write_json_atomic(path: str, obj: Any) -> None:
    write_atomic(path, json.dumps(obj))


def _child_main() -> None:
    import faulthandler
    import importlib

    with open(os.environ[_SPEC_ENV]) as f:
        spec = json.load(f)
    rank, world = spec["rank"], spec["world_size"]
    result_path = spec["result_path"]
    for p in spec["sys_path"]:
        if p not in sys.path:
            sys.path.insert(0, p)
    # In-tree torch_smddp (where CMake drops _C) is found last, after any
    # installed copy.
    if spec["repo_root"] not in sys.path:
        sys.path.append(spec["repo_root"])

    faulthandler.enable()
    # Dump every thread's Python stack shortly before the parent's deadline so
    # a hang shows where it is stuck in the stderr tail.
    faulthandler.dump_traceback_later(max(1.0, spec["job_timeout"] - 4.0), exit=False)

    stage = "import torch"
    try:
        import datetime

        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        backend = spec["backend"]
        if needs_smddp(backend):
            stage = "import torch_smddp"
            import torch_smddp  # registers the backend

            if "smddp" not in dist.Backend.backend_list:
                where = getattr(torch_smddp, "__file__", None) or list(getattr(torch_smddp, "__path__", []))
                raise RuntimeError(f"torch_smddp was imported from {where} but did not register the "
                                   "'smddp' backend (is the extension built?)")
        # The simulated device follows CUDA's rules: each rank uses its own
        # device, as after torch.cuda.set_device(local_rank).
        sim = needs_smddp(backend) and os.environ.get("SMDDP_DEVICE_SIM") == "1"
        if sim:
            import torch_smddp.testing as sim_testing
            # SMDDP_TEST_SIM_DEVICE: ranks that share one device instead.
            device = int(os.environ.get("SMDDP_TEST_SIM_DEVICE", rank))
            sim_testing.sim_set_device(device)
            # SMDDP_TEST_SIM_TORCH_DEVICE: the stand-in is also torch's
            # "privateuseone" device, whose tensors the world group serves.
            if os.environ.get("SMDDP_TEST_SIM_TORCH_DEVICE") == "1":
                sim_testing.sim_torch_device()
        stage = "import target"
        mod_name, fn_name = spec["target"].split(":", 1)
        fn = getattr(importlib.import_module(mod_name), fn_name)
        stage = "init_process_group"
        dist.init_process_group(backend=backend, rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=spec["pg_timeout"]))
        stage = "target"
        value = fn(rank, world, *spec["args"])
        json.dumps(value)  # must be serialisable; fail here with a traceback otherwise
        if spec["expect_failure"]:
            if value in (None, "", [], {}):
                raise AssertionError("expect_failure target returned no message(s)")
        else:
            stage = "destroy_process_group"
            dist.destroy_process_group()
        if sim:
            stage = "the simulated device's rules"
            broken = sim_testing.sim_violations()
            if broken:
                raise AssertionError(f"{len(broken)} of CUDA's rules broken on the simulated device: "
                                     + "; ".join(broken[:5]))
            others = [d for d in sim_testing.sim_contexts() if d != device]
            if others:
                raise AssertionError(f"rank {rank} made contexts on simulated devices {others}, "
                                     f"not only on its own ({device})")
        _write_json_atomic(result_path, {"ok": True, "value": value})
    except BaseException as e:  # noqa: BLE001 - report everything, then exit non-zero
        tb = traceback.format_exc()
        with contextlib.suppress(Exception):
            _write_json_atomic(result_path, {"ok": False, "error": f"during {stage}: "
                                             f"{type(e).__name__}: {e}"[:4000],
                                             "traceback": tb[-20000:]})
        sys.stderr.write(f"[rank {rank}] failed during {stage}\n{tb}")
        sys.stderr.flush()
        os._exit(_EXIT_TARGET_FAILED)
    sys.stdout.flush()
    sys.stderr.flush()
    if spec["expect_failure"]:
        # A backend that has just reported errors need not shut down cleanly;
        # the messages are on disk, so skip interpreter teardown.
        os._exit(0)
    # Normal mode: a clean interpreter exit is part of what is tested (a
    # crash in the backend's destructors shows up as a signal exit status; a
    # hang runs into the parent's deadline, with stacks dumped just before).
