"""The multi-process tests' small helpers, apart from the launcher
(mp_harness.py, which re-exports every name here so tests import them from
one place): the backend under test, free ports, a command run under a hard
deadline with nothing it started left alive, the build's tools, and
captured stderr. Imported by pytest and by the ranks; must not import torch
at module level.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
from typing import Any, Callable

# tests/python holds the test files; beside them harness/ (this file's),
# cases/ (what the ranks run) and workers/ (scripts started as programs).
HARNESS = os.path.dirname(os.path.abspath(__file__))
HERE = os.path.dirname(HARNESS)
CASES = os.path.join(HERE, "cases")
WORKERS = os.path.join(HERE, "workers")
REPO_ROOT = os.path.dirname(os.path.dirname(HERE))
# What a process needs on sys.path to import any of them by name.
SUPPORT_PATH = [HARNESS, CASES, WORKERS]


def put_support_on_path() -> None:
    """Make harness/, cases/ and workers/ importable by name (in that order
    of precedence) in this process: pytest's conftest.py, the launcher and
    the scripts run as programs call it."""
    for p in reversed(SUPPORT_PATH):
        if p not in sys.path:
            sys.path.insert(0, p)


def write_everyones(res: dict, out: str, gloo) -> None:
    """A cluster worker's end: every rank's `res` gathered over `gloo`,
    rank 0 writes the list to `out` as JSON, then the group goes."""
    import json

    import torch.distributed as dist

    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, res, group=gloo)
    if dist.get_rank() == 0:
        with open(out, "w") as f:
            json.dump(everyone, f)
    dist.barrier(group=gloo)
    dist.destroy_process_group()


def worker(name: str) -> str:
    """The path of workers/<name>, a script the tests start as a program."""
    return os.path.join(WORKERS, name)


def build_tool(name: str) -> str:
    """A program or library the CMake build leaves beside the tests
    (smddp_wire_intruder, libsmddp_wire_tamper.so): in SMDDP_BUILD_DIR when
    set, else the checkout's build/."""
    return os.path.join(os.environ.get("SMDDP_BUILD_DIR", os.path.join(REPO_ROOT, "build")), name)


def backend_under_test(default: str = "smddp") -> str:
    """The backend the tests exercise: $SMDDP_TEST_BACKEND, else ``default``."""
    return os.environ.get("SMDDP_TEST_BACKEND", "").strip() or default


def needs_smddp(backend: str) -> bool:
    return "smddp" in backend


# --------------------------------------------------------------------------
# ports
# --------------------------------------------------------------------------

# Ports handed out by this process, never handed out twice while the
# range below the ephemeral one has others left.
_HANDED_OUT: set[int] = set()
_BELOW_EPHEMERAL = 8192  # how many ports under the ephemeral range to pick from


def _ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _bindable(host: str, port: int) -> bool:
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True


def find_free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago, from just below the kernel's
    ephemeral range. A port the OS picks (bind to 0) lies inside that range,
    from which every outgoing connection on the machine takes its source
    port: between the pick and a rank's bind, one of them (a flood test, the
    sanitizer ctest that `make test` runs beside pytest) can hold it. Then
    a rank's bind fails, and torchrun's c10d rendezvous silently turns
    client of a store that nobody hosts (CI stop 71). A port below the
    range is taken only by a bind that names it."""
    import random

    top = _ephemeral_low()
    bottom = max(1024, top - _BELOW_EPHEMERAL)
    if top - bottom > 64:
        if len(_HANDED_OUT) > (top - bottom) // 2:
            _HANDED_OUT.clear()
        for _ in range(200):
            port = random.randrange(bottom, top)
            if port not in _HANDED_OUT and _bindable(host, port):
                _HANDED_OUT.add(port)
                return port
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((host, 0))
        return s.getsockname()[1]


try:  # pytest fixture, usable as `from mp_harness import free_port`
    import pytest

    @pytest.fixture
    def free_port() -> int:
        return find_free_port()
except ImportError:  # children do not need pytest
    pass


# --------------------------------------------------------------------------
# process trees
# --------------------------------------------------------------------------

def descendants(pid: int) -> list[int]:
    """pids of every live descendant of ``pid`` (read from /proc)."""
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def says_port_clash(text: str) -> bool:
    """Whether a process's output says it could not bind its port."""
    return "EADDRINUSE" in text or "ddress already in use" in text


# --------------------------------------------------------------------------
# a launcher (torchrun) under a deadline

def _kill_tree(proc):
    """torchrun starts each worker in a session of its own, so killing
    torchrun's process group is not enough: snapshot the tree, let torchrun
    tear its workers down (SIGTERM), then SIGKILL whatever is left."""
    tree = descendants(proc.pid)
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)
    for pid in [proc.pid] + tree:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)  # no-op unless pid leads a group
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    proc.wait()


def run_with_deadline(cmd, timeout, env, cwd=REPO_ROOT):
    """Run cmd (in cwd) in its own session with a hard deadline; returns
    (exit code, timed out?, combined output). Nothing it started survives."""
    with tempfile.TemporaryFile() as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env, cwd=cwd, start_new_session=True)
        timed_out = False
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            _kill_tree(proc)
        out.seek(0)
        text = out.read().decode("utf-8", "replace")
    return proc.returncode, timed_out, text


@contextlib.contextmanager
def captured_stderr(lines: list[str]):
    """Appends to ``lines`` what this process writes to fd 2 (where the
    C++ logger writes) inside the block."""
    with tempfile.TemporaryFile() as f:
        saved = os.dup(2)
        os.dup2(f.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            f.seek(0)
            lines.extend(f.read().decode(errors="replace").splitlines())


@contextlib.contextmanager
def env_set(**values: str):
    """Sets the variables in this process's environment inside the block
    and puts back what was there (or nothing) after it: for a group made
    with one ``SMDDP_*`` setting (the C library reads it at ``new_group``)."""
    before = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def expect_raises(fn: Callable[[], Any], exc: type | tuple = Exception,
                  what: str = "") -> str:
    """Call ``fn``; it must raise ``exc``. Returns the exception's message.

    Meant for targets run with ``expect_failure=True``. Raises AssertionError
    when ``fn`` returns normally (or raises something not in ``exc``, which
    then propagates as the test failure).
    """
    try:
        fn()
    except exc as e:  # noqa: PERF203
        msg = f"{type(e).__name__}: {e}"
        return msg if str(e) else f"{type(e).__name__}: <empty message>"
    raise AssertionError(f"expected {exc} to be raised{' by ' + what if what else ''}, "
                         "but the call returned normally")
