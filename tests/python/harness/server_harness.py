"""What the tests of the standalone reduction servers share
(test_servers.py, test_server_security.py): the processes a test starts and
kills, the shared key file, each process's environment, a server started
with ``python -m torch_smddp.server`` and the line it prints, and the
result files the workers write. Never imports torch.
"""

from __future__ import annotations

import atexit
import json
import os
import re
import select
import signal
import subprocess
import sys
import tempfile
import time

import socket

from mp_harness import HERE, REPO_ROOT, descendants, find_free_port, says_port_clash

PY = sys.executable
START_S = 90.0  # torch imports on a loaded 2-core machine


class Procs:
    """Every process a test starts; kill() ends them and their children."""

    def __init__(self):
        self.procs = []
        self.files = []  # logs made here, removed by kill()

    def scratch_log(self, prefix: str) -> str:
        """A new empty file for a process's output, removed by kill()."""
        fd, path = tempfile.mkstemp(prefix=f"smddp-{prefix}-", suffix=".log")
        os.close(fd)
        self.files.append(path)
        return path

    def start(self, cmd, env=None, log=None, **kw):
        out = open(log, "wb") if log else subprocess.DEVNULL
        # A server's stdout is a pipe the test reads only until the hosts
        # line: its stderr (warnings) must not fill that pipe.
        piped = kw.get("stdout") == subprocess.PIPE
        err = kw.pop("stderr", subprocess.DEVNULL if piped else subprocess.STDOUT)
        p = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL,
                             stdout=kw.pop("stdout", out), stderr=err,
                             start_new_session=True, cwd=REPO_ROOT, **kw)
        if log:
            out.close()
        self.procs.append(p)
        return p

    def kill(self):
        for p in self.procs:
            for pid in descendants(p.pid) + [p.pid]:
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        for path in self.files:
            try:
                os.remove(path)
            except FileNotFoundError:
                pass


_KEY_FILE = None


def key_file() -> str:
    """A key file (mode 0600) shared by the servers and workers of these
    tests, made once per process and removed at its exit."""
    global _KEY_FILE
    if _KEY_FILE is None:
        fd, path = tempfile.mkstemp(prefix="smddp-test-key-")
        os.write(fd, os.urandom(32).hex().encode())
        os.close(fd)
        os.chmod(path, 0o600)
        atexit.register(os.unlink, path)
        _KEY_FILE = path
    return _KEY_FILE


def env(keyed=True, **extra) -> dict:
    """The environment of a test's server or worker; `keyed`: with the
    shared key file (SMDDP_SERVER_KEY_FILE), else servers found in a store
    use the job's key from there."""
    e = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO_ROOT, HERE]),
             PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    for k in ("SMDDP_SERVER_HOSTS", "SMDDP_SERVER_COUNT", "SMDDP_SERVER_JOB",
              "SMDDP_SERVER_KEY_FILE", "SMDDP_SERVER_INTEGRITY", "SMDDP_SERVER_INSECURE",
              "SMDDP_WIRE_ENCRYPT"):
        e.pop(k, None)
    if keyed:
        e["SMDDP_SERVER_KEY_FILE"] = key_file()
    e.update({k: str(v) for k, v in extra.items()})
    return e


_default_env = env


def _tails(paths) -> str:
    """The last lines of each file in `paths`, for a failure's message."""
    out = []
    for path in paths:
        try:
            with open(path, "rb") as f:
                out.append(f"--- {path}\n" + f.read()[-3000:].decode("utf-8", "replace"))
        except OSError as e:
            out.append(f"--- {path}: {e}")
    return "\n".join(out)


def hosts_line(p, what, logs=()) -> str:
    """The SMDDP_SERVER_HOSTS=... line a starting server prints, read with a
    deadline (never a blocking readline); a failure quotes `logs` (the
    server's stderr, and whatever else the test names)."""
    deadline = time.monotonic() + START_S
    fd = p.stdout.fileno()
    text = b""
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.5)
        if ready:
            chunk = os.read(fd, 4096)
            if not chunk:
                break
            text += chunk
            m = re.search(rb"^SMDDP_SERVER_HOSTS=(\S+)$", text, re.M)
            if m:
                return m.group(1).decode()
    raise AssertionError(f"{what} did not start in {START_S:.0f} s (exit {p.poll()}): "
                         f"{text[-2000:]!r}\n{_tails(logs)}")


def start_server(procs, args, env=None, logs=(), **kw):
    """Starts ``python -m torch_smddp.server ARGS``; returns (proc, hosts).
    Its stderr goes to a file (never to the pipe the test reads), which a
    failure to start quotes along with `logs`."""
    mine = None
    if "stderr" not in kw:
        err_path = procs.scratch_log("server")
        kw["stderr"] = mine = open(err_path, "wb")
        logs = [err_path, *logs]
    try:
        p = procs.start([PY, "-m", "torch_smddp.server", *args], env=env or _default_env(),
                        stdout=subprocess.PIPE, **kw)
    finally:
        if mine is not None:
            mine.close()
    return p, hosts_line(p, "the server", logs)


def wait_results(out_dir, names, deadline_s, procs=None):
    """The JSON result files `names` in `out_dir`, once all are there (at
    most `deadline_s`); raises with every log's tail if some never came."""
    paths = [os.path.join(out_dir, n) for n in names]
    end = time.monotonic() + deadline_s
    while time.monotonic() < end and not all(os.path.exists(p) for p in paths):
        time.sleep(0.1)
    got = {}
    for n, p in zip(names, paths):
        try:
            with open(p) as f:
                got[n] = json.load(f)
        except (OSError, ValueError):
            got[n] = None
    missing = [n for n, v in got.items() if v is None]
    if missing:
        logs = []
        for name in sorted(os.listdir(out_dir)):
            if name.endswith(".log"):
                with open(os.path.join(out_dir, name), "rb") as f:
                    logs.append(f"--- {name}\n" + f.read()[-3000:].decode("utf-8", "replace"))
        raise AssertionError(f"no result from {missing} (hung or died):\n" + "\n".join(logs))
    return got


def _clashed(paths) -> bool:
    """Whether any of `paths` says its process could not bind a port."""
    for path in paths:
        try:
            with open(path, "rb") as f:
                text = f.read()[-20000:].decode("utf-8", "replace")
        except OSError:
            continue
        if says_port_clash(text):
            return True
    return False


def _store_up(port, rank0, watch) -> bool:
    """Waits (at most START_S) until rank 0's store listens on `port` or
    rank 0 got past it (True), or `watch` says it could not bind (False)."""
    end = time.monotonic() + START_S
    while time.monotonic() < end:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return True
        except OSError:
            pass
        if _clashed(watch):
            return False
        if rank0.poll() is not None or os.path.exists(watch[1]):
            return True
        time.sleep(0.05)
    return False


def start_job(procs, world, cmd, env_of, log_of, results, attempts=3):
    """Starts a `world`-rank job (`cmd`, env_of(rank, port), log_of(rank))
    whose rank 0 hosts its store on a free port; returns the port once that
    store listens, or once rank 0 got past it (exited, or wrote results[0]).
    A free port can be taken before rank 0 binds it (the floods of loopback
    connections some tests make take ephemeral ports from the same range):
    when rank 0 says EADDRINUSE, the job starts again on another port, and
    the files in `results` are cleared, as mp_harness.run_world does. The
    job's processes join `procs`."""
    for _ in range(attempts):
        port = find_free_port()
        job = Procs()
        for r in range(world):
            job.start(cmd, env=env_of(r, port), log=log_of(r))
        if _store_up(port, job.procs[0], [log_of(0), results[0]]):
            procs.procs.extend(job.procs)
            return port
        job.kill()
        for path in results:
            try:
                os.remove(path)
            except FileNotFoundError:
                pass
    raise AssertionError(f"rank 0 of {cmd[1:]} never had its store listening in {attempts} "
                         "attempts (ports taken, or it did not start)")
