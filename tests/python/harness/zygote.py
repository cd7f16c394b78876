"""The zygote mp_harness forks ranks from: a process that imported torch
once per test session (nothing else, and no thread running), so no rank
pays torch's import again. Each rank is still a process of its own, in a
session of its own, with the job's environment, working directory and
output files, and ends the way a fresh interpreter does.

``zygote_for(env)`` gives the session's zygote, or None where a rank with
that environment must start the plain way: it sets a variable read while
torch loads (TORCH_*, OMP_*, LD_*, PYTHON*, ...) differently from the
zygote, SMDDP_TEST_FORK=0, or the zygote could not start. Must not import
torch at module level (the parent side runs in pytest)."""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))

# Variables that torch, OpenMP/OpenBLAS, the loader or Python read while
# torch loads: a job that sets any of them differently from the zygote's
# environment is started the plain way.
_IMPORT_TIME_PREFIXES = ("TORCH_", "OMP_", "MKL_", "OPENBLAS_", "KMP_", "GOMP_", "LD_", "PYTHON",
                         "MALLOC", "GLIBC_", "CUDA_", "NCCL_", "PYTORCH_")
_PLAIN_KEYS = ("PYTHONUNBUFFERED", "PYTHONFAULTHANDLER")  # set again in every rank
_zygote: "_Zygote | None" = None
_zygote_failed = False


def _import_time_env(env: dict) -> dict:
    return {k: v for k, v in env.items()
            if k.startswith(_IMPORT_TIME_PREFIXES) and k not in _PLAIN_KEYS}


def zygote_for(child_env: dict) -> "_Zygote | None":
    """The session's zygote if this rank's environment lets it be forked
    from there (starting it on first use), else None."""
    global _zygote, _zygote_failed
    if os.environ.get("SMDDP_TEST_FORK", "1") == "0" or _zygote_failed:
        return None
    if _zygote is not None and not _zygote.alive():
        _zygote = None
    if _zygote is None:
        env = dict(os.environ)
        env["OMP_NUM_THREADS"] = child_env.get("OMP_NUM_THREADS", "1")
        env.update({"PYTHONUNBUFFERED": "1", "PYTHONFAULTHANDLER": "1"})  # as every rank's
        try:
            _zygote = _Zygote(env)
        except Exception as e:  # noqa: BLE001 - fall back to plain starts
            _zygote_failed = True
            sys.stderr.write(f"mp_harness: no zygote ({e}); starting ranks the plain way\n")
            return None
    if _import_time_env(child_env) != _zygote.import_env:
        return None
    return _zygote


class _ZygoteProc:
    """A forked rank, as much of subprocess.Popen as the harness uses. The
    zygote is its parent: it reaps it and reports the exit status (negative:
    the signal that ended it, as Popen's)."""

    def __init__(self, zygote: "_Zygote", pid: int):
        self.zygote = zygote
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.zygote.pump(0)
            self.returncode = self.zygote.codes.get(self.pid)
            if (self.returncode is None and self.zygote.lost
                    and not os.path.exists(f"/proc/{self.pid}")):
                self.returncode = -signal.SIGKILL  # ended unreported
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        end = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if end is not None and time.monotonic() >= end:
                raise subprocess.TimeoutExpired(f"rank pid {self.pid}", timeout)
            self.zygote.pump(0.02)
        return self.returncode

    def kill(self) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)


class _Zygote:
    def __init__(self, env: dict):
        self.import_env = _import_time_env(env)
        self.codes: dict[int, int] = {}
        self.lost = False
        self.buf = b""
        self.proc = subprocess.Popen(
            [sys.executable, "-c", f"import sys; sys.path.insert(0, {HERE!r}); "
             "import zygote; zygote.main()"],
            env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            start_new_session=True, cwd=tempfile.gettempdir())
        os.set_blocking(self.proc.stdout.fileno(), False)
        msg = self._next(lambda m: "ready" in m, timeout=120)
        if msg is None:
            self.close()
            raise RuntimeError("the zygote did not start")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def spawn(self, env: dict, cwd: str, out_path: str, err_path: str) -> _ZygoteProc:
        req = json.dumps({"env": env, "cwd": cwd, "out": out_path, "err": err_path}) + "\n"
        self.proc.stdin.write(req.encode())
        self.proc.stdin.flush()
        msg = self._next(lambda m: "forked" in m, timeout=30)
        if msg is None:
            raise RuntimeError("the zygote did not fork a rank")
        return _ZygoteProc(self, msg["forked"])

    def pump(self, timeout: float) -> list[dict]:
        """Reads what the zygote reported (within `timeout` s), recording exit
        statuses; returns the other messages."""
        other = []
        if select.select([self.proc.stdout], [], [], timeout)[0]:
            try:
                data = os.read(self.proc.stdout.fileno(), 65536)
            except BlockingIOError:
                data = b""
            self.buf += data
            if not data and self.proc.poll() is not None:
                self.lost = True  # ranks it had not reported are lost to it
        while b"\n" in self.buf:
            line, self.buf = self.buf.split(b"\n", 1)
            m = json.loads(line)
            if "exited" in m:
                self.codes[m["exited"]] = m["code"]
            else:
                other.append(m)
        return other

    def _next(self, want, timeout: float) -> dict | None:
        end = time.monotonic() + timeout
        pending: list[dict] = []
        while time.monotonic() < end and self.alive():
            pending += self.pump(0.05)
            for m in pending:
                if want(m):
                    return m
        return None

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.proc.kill()
            self.proc.wait(timeout=10)


def _close_zygote() -> None:
    if _zygote is not None:
        _zygote.close()


atexit.register(_close_zygote)


def main() -> None:
    """Imports torch, says ready, then forks a rank per request on stdin
    and reports each one's pid and, once it has reaped it, its exit status.
    Ends when stdin closes (the parent is gone)."""
    import torch  # noqa: F401 - what every rank would import
    import torch.distributed  # noqa: F401

    def say(obj: dict) -> None:
        os.write(1, (json.dumps(obj) + "\n").encode())

    say({"ready": True})
    buf = b""
    children: set[int] = set()
    while True:
        readable = select.select([0], [], [], 0.01)[0]
        if readable:
            data = os.read(0, 65536)
            if not data:
                break
            buf += data
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                req = json.loads(line)
                pid = os.fork()
                if pid == 0:
                    _zygote_child(req)  # never returns
                children.add(pid)
                say({"forked": pid})
        for pid in list(children):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                children.discard(pid)
                say({"exited": pid, "code": os.waitstatus_to_exitcode(status)})
    for pid in children:  # the parent is gone: so are its jobs
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)


def _zygote_child(req: dict) -> None:
    """A rank, forked: made into what a fresh interpreter started with the
    job's environment, directory and output files would be, then run."""
    code = 0
    try:
        os.setsid()
        os.chdir(req["cwd"])
        null = os.open(os.devnull, os.O_RDONLY)
        out = os.open(req["out"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        err = os.open(req["err"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(null, 0)
        os.dup2(out, 1)
        os.dup2(err, 2)
        for fd in (null, out, err):
            os.close(fd)
        os.environ.clear()
        os.environ.update(req["env"])
        if "numpy" in sys.modules:  # a fresh process seeds its own
            sys.modules["numpy"].random.seed()
        import mp_harness

        mp_harness._child_main()
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:  # noqa: BLE001
        traceback.print_exc()
        code = 1
    # A fresh interpreter's exit: atexit handlers, then module teardown (a
    # crash in the backend's destructors still shows as a signal).
    sys.stdout.flush()
    sys.stderr.flush()
    raise SystemExit(code)
