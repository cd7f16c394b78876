"""A cluster of hosts on this machine for tests and benchmarks
(scripts/cluster.sh): each host a network namespace with its own address
and a tbf-shaped link to a hub, where a TCPStore serves as the rendezvous.
Each host runs its own torchrun against it. Needs root and a source
checkout (the script lives in scripts/); development tooling, not part of
the installed package (tests/python/harness/cluster.py and
`benchmarks/bench_hosts.py` load it from the checkout).

``Cluster`` is used as a context manager (or through a pytest fixture that
calls ``down()`` in its teardown), so the namespaces and every process in
them go away even when a test fails. Names carry a prefix unique to this
process, so clusters of concurrent test runs (other worktrees) never meet.
The module must not import torch (it runs in the pytest process and in
the benchmark's parent).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO_ROOT, "scripts", "cluster.sh")
STORE_PORT = 29400  # inside the hub's namespace: no one else's port


def why_unavailable() -> str | None:
    """None when network namespaces can be made here, else why not."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if not os.path.exists(SCRIPT):
        return f"{SCRIPT} is missing (the cluster needs a source checkout)"
    name = f"smx-probe-{os.getpid()}-{secrets.token_hex(2)}"
    try:
        r = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True,
                           timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"`ip netns add` cannot run: {e}"
    if r.returncode != 0:
        return f"`ip netns add` failed: {r.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30)
    return None


def sweep_stale_clusters() -> None:
    """Removes the clusters of test processes that died without their
    teardown (SIGKILL): names carry the creator's pid."""
    r = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30)
    prefixes = set()
    for line in r.stdout.splitlines():
        m = re.match(r"^(smx-(\d+)-[0-9a-f]{4})-(hub|h\d+)\b", line)
        if m and not os.path.exists(f"/proc/{m.group(2)}"):
            prefixes.add(m.group(1))
    for prefix in prefixes:
        subprocess.run([SCRIPT, "down"], env=dict(os.environ, SMDDP_CLUSTER=prefix),
                       capture_output=True, timeout=60)


# The namespaces' TCP congestion control unless a caller names another
# (scripts/cluster.sh, ensure_cc: it changes what the cluster measures).
DEFAULT_CC = "cubic"


class Cluster:
    def __init__(self, hosts: int, rate: str = "2gbit", cc: str = DEFAULT_CC):
        self.hosts = hosts
        self.rate = rate
        self.cc = cc
        self.prefix = f"smx-{os.getpid()}-{secrets.token_hex(2)}"
        self.env = dict(os.environ, SMDDP_CLUSTER=self.prefix)
        self._store: subprocess.Popen | None = None
        self._jobs: list[subprocess.Popen] = []

    # -- lifetime -----------------------------------------------------------
    def up(self) -> "Cluster":
        sweep_stale_clusters()
        try:
            self._sh("up", str(self.hosts), self.rate, self.cc)
            self._start_store()
        except BaseException:
            self.down()
            raise
        return self

    def down(self) -> None:
        for p in self._jobs + ([self._store] if self._store else []):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, signal.SIGKILL)
        # Kills whatever is left inside (workers, agents, the store), then
        # removes the namespaces.
        subprocess.run([SCRIPT, "down"], env=self.env, capture_output=True, timeout=60)
        for p in self._jobs + ([self._store] if self._store else []):
            with contextlib.suppress(Exception):
                p.wait(timeout=10)
        self._jobs.clear()
        self._store = None

    def __enter__(self) -> "Cluster":
        return self.up()

    def __exit__(self, *exc) -> None:
        self.down()

    def reset(self) -> None:
        """Ends every job: kills every process on the hosts (the hub's
        store stays) and brings every link back up."""
        for p in self._jobs:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, signal.SIGKILL)
        for h in range(self.hosts):
            with contextlib.suppress(RuntimeError):
                self.kill_host(h)
            self.link(h, "up")
        for p in self._jobs:
            with contextlib.suppress(Exception):
                p.wait(timeout=10)
        self._jobs.clear()

    def jobs_alive(self) -> bool:
        return any(p.poll() is None for p in self._jobs)

    def wait_jobs(self, timeout: float, jobs: list | None = None) -> list[int | None]:
        """Waits up to `timeout` s in all for the launched torchruns (or
        `jobs`, as torchrun returned them) to end; their exit codes, None
        for one still running (left to down())."""
        deadline = time.monotonic() + timeout
        codes = []
        for p in self._jobs if jobs is None else jobs:
            try:
                codes.append(p.wait(timeout=max(0.1, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                codes.append(None)
        return codes

    # -- actions ------------------------------------------------------------
    def addr(self, host) -> str:
        return self._sh("addr", str(host)).strip()

    def link(self, host: int, state: str) -> None:
        self._sh("link", str(host), state)

    def kill_host(self, host: int) -> None:
        self._sh("kill", str(host))

    def socket_buffers(self, host: int, nbytes: int) -> None:
        """Caps every TCP socket buffer on host `host` at `nbytes` (tcp_wmem
        and tcp_rmem are per namespace): a provider's writes then often find
        the socket full and wait in user space for its next progress."""
        for key in ("net.ipv4.tcp_wmem", "net.ipv4.tcp_rmem"):
            self._sh("exec", str(host), "sysctl", "-q", "-w", f"{key}={nbytes} {nbytes} {nbytes}")

    def congestion_control(self, host: int) -> str:
        """The TCP congestion control that host `host`'s namespace uses."""
        return self._sh("cc", str(host)).strip()

    def spawn(self, host, cmd: list[str], log_path: str, env: dict | None = None,
              cwd: str | None = None) -> subprocess.Popen:
        """Starts CMD on host `host` (or "hub"), in a session of its own
        that down() and reset() kill, its output appended to log_path."""
        child_env = dict(self.env, PYTHONUNBUFFERED="1")
        child_env.update({k: str(v) for k, v in (env or {}).items()})
        where = ["hub"] if host == "hub" else ["exec", str(host)]
        with open(log_path, "ab") as log:
            p = subprocess.Popen([SCRIPT, *where, *cmd], env=child_env, stdin=subprocess.DEVNULL,
                                 stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                 cwd=cwd or REPO_ROOT)
        self._jobs.append(p)
        return p

    def pids(self, host: int) -> list[int]:
        r = subprocess.run(["ip", "netns", "pids", f"{self.prefix}-h{host}"],
                           capture_output=True, text=True, timeout=30)
        return [int(p) for p in r.stdout.split()]

    def torchrun(self, job: str, cmd: list[str], nproc: int, out_dir: str,
                 env: dict | None = None, pythonpath: tuple[str, ...] = (),
                 max_restarts: int = 0, hosts: list[int] | None = None,
                 nnodes: int | None = None) -> list[subprocess.Popen]:
        """Starts `torchrun CMD` on every host (CMD is a script and its
        arguments, or ["-m", module, ...]), all in one rendezvous `job` in
        the hub, from out_dir, where each host's log lands; returns the
        launchers. The workers find out_dir in SMDDP_CLUSTER_OUT and this
        checkout on their path. `hosts` starts only those (a replacement for
        a host that died; or the workers, the rest serving), in a job of
        `nnodes` hosts (default: all of them)."""
        hub = self.addr("hub")
        started = []
        for h in (range(self.hosts) if hosts is None else hosts):
            child_env = dict(self.env, SMDDP_CLUSTER_OUT=out_dir, PYTHONUNBUFFERED="1",
                             PYTHONPATH=os.pathsep.join([*pythonpath, REPO_ROOT]))
            child_env.update({k: str(v) for k, v in (env or {}).items()})
            log = open(os.path.join(out_dir, f"torchrun.h{h}.log"), "ab")
            self._jobs.append(subprocess.Popen(
                [SCRIPT, "exec", str(h), sys.executable, "-m", "torch.distributed.run",
                 "--nnodes", str(nnodes or self.hosts), "--nproc-per-node", str(nproc),
                 "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{hub}:{STORE_PORT}",
                 "--rdzv-id", job, "--rdzv-conf", "is_host=0",
                 # Ranks follow the agents' addresses (they sort by them):
                 # host h gets ranks h * nproc .. h * nproc + nproc - 1.
                 "--local-addr", self.addr(h), "--max-restarts", str(max_restarts),
                 *cmd],
                env=child_env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True, cwd=out_dir))
            started.append(self._jobs[-1])
            log.close()
        return started

    def start_servers(self, hosts: list[int], out_dir: str, port: int = 29600,
                      timeout: float = 120.0, env: dict | None = None) -> dict:
        """Starts one standalone reduction server (`python -m
        torch_smddp.server`) on each of `hosts`, with a key file made in
        out_dir (and `env`), and waits for each to print where it listens;
        returns the workers' environment for them (SMDDP_SERVER_HOSTS, in
        the order of `hosts`, and SMDDP_SERVER_KEY_FILE). A server that
        exits first fails this at once. The servers end with down()."""
        key = os.path.join(out_dir, "server.key")
        fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.write(fd, secrets.token_hex(32).encode())
        os.close(fd)
        env = dict(env or {}, SMDDP_SERVER_KEY_FILE=key, PYTHONPATH=REPO_ROOT)
        started = {}
        for h in hosts:
            log = os.path.join(out_dir, f"server.h{h}.log")
            started[log] = self.spawn(h, [sys.executable, "-m", "torch_smddp.server", "--port",
                                          str(port), "--advertise", self.addr(h)], log, env=env)
        found = {}
        deadline = time.monotonic() + timeout
        while len(found) < len(started) and time.monotonic() < deadline:
            for log, proc in started.items():
                try:
                    with open(log, "rb") as f:
                        text = f.read()
                except OSError:
                    text = b""
                m = re.search(rb"^SMDDP_SERVER_HOSTS=(\S+)$", text, re.M)
                if m:
                    found[log] = m.group(1).decode()
                elif proc.poll() is not None:
                    deadline = 0.0  # it exited without saying where it listens
            time.sleep(0.1)
        missing = [log for log in started if log not in found]
        if missing:
            raise RuntimeError("standalone server(s) did not start:\n" +
                               "\n".join(f"--- {log}:\n{tail(log)}" for log in missing))
        return {"SMDDP_SERVER_HOSTS": ",".join(found[log] for log in started),
                "SMDDP_SERVER_KEY_FILE": key}

    # -- helpers ------------------------------------------------------------
    def _sh(self, *args: str) -> str:
        r = subprocess.run([SCRIPT, *args], env=self.env, capture_output=True, text=True,
                           timeout=120)
        if r.returncode != 0:
            raise RuntimeError(f"cluster.sh {' '.join(args)} failed: {r.stderr.strip()}")
        return r.stdout

    def _start_store(self) -> None:
        hub = self.addr("hub")
        code = ("import time\nfrom torch.distributed import TCPStore\n"
                f"s = TCPStore({hub!r}, {STORE_PORT}, is_master=True, wait_for_workers=False)\n"
                "print('ready', flush=True)\ntime.sleep(3600)\n")
        self._store = subprocess.Popen([SCRIPT, "hub", sys.executable, "-c", code], env=self.env,
                                       stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                       stderr=subprocess.DEVNULL, start_new_session=True,
                                       text=True)
        line = self._store.stdout.readline()  # torch import: seconds on a loaded machine
        if line.strip() != "ready":
            raise RuntimeError("the rendezvous store in the hub did not start")


def parse_rate(rate: str) -> float:
    """A tc rate as scripts/cluster.sh takes it ("2gbit", "500mbit") in
    bits per second."""
    m = re.fullmatch(r"(\d+)(bit|kbit|mbit|gbit)?", rate.strip().lower())
    if not m:
        raise ValueError(f"rate {rate!r}: use a number with bit, kbit, mbit or gbit (e.g. 2gbit)")
    mult = {"bit": 1, None: 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9}[m.group(2)]
    return float(m.group(1)) * mult


def burst_bytes(rate: str) -> int:
    """The tbf bucket, in bytes, that scripts/cluster.sh gives each link at
    `rate`: traffic up to this much passes above the rate after the link
    has been idle (tools/smddp_model/ counts it)."""
    r = subprocess.run([SCRIPT, "burst", rate], capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        raise ValueError(f"cluster.sh burst {rate}: {r.stderr.strip()}")
    return int(r.stdout.strip())


def wait_for_files(paths, deadline: float, alive=lambda: True) -> bool:
    """True once every path exists; False at the deadline or when alive()
    turns false (the launchers ended without producing them)."""
    while time.monotonic() < deadline:
        if all(os.path.exists(p) for p in paths):
            return True
        if not alive():
            time.sleep(0.5)  # last writes
            return all(os.path.exists(p) for p in paths)
        time.sleep(0.05)
    return False


def read_json(path: str):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def tail(path: str, lines: int = 30) -> str:
    try:
        with open(path, "rb") as f:
            text = f.read()[-16384:].decode("utf-8", "replace")
    except OSError as e:
        return f"<{e}>"
    keep = [ln for ln in text.splitlines() if not ln.startswith("frame #")]
    return "\n".join(keep[-lines:])
