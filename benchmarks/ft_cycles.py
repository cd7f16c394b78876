"""Many replica deaths in one torchft job, with a digest of every replica's
state at every step: does any replica ever end a step with weights that
differ from another's? (The one divergence seen once at 1786d94 was never
reproduced.) On a cluster of network namespaces (scripts/cluster.sh; root),
or with --one-host, every replica a process group on this host.

    sudo .venv/bin/python benchmarks/ft_cycles.py --cycles 500 [--pg smddp]
    .venv/bin/python benchmarks/ft_cycles.py --one-host --cycles 100

--replicas replicas (one per host, or one per process group with --one-host) train the demo model through torchft
(benchmarks/ft_replica.py with FT_REPLICA_DIGESTS=1), a lighthouse in the
hub. Each cycle kills one replica's whole host, the victims taking turns
(replica 0, torchft's primary, included), alternately in the middle of a
step and right after the victim commits one; waits until the survivors
commit a step; starts the replica again, and waits until it commits a step
in the full quorum. At the end every replica stops at the same step.

Checked: at every step two replicas both committed, their digests agree
(ft_recovery._check_step_digests, over the whole run, restarts included);
every replica ends with the same state. Printed: cycles, the pairs of
states compared, any divergence (the run stops at the first), and the
seconds per cycle.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import ft_recovery as fr  # noqa: E402  (torch-free)

cl = fr.cl


class OneHost:
    """The cluster's interface (addr, spawn, kill_host, reset) on this
    host: each replica in a session of its own on loopback, "killing its
    host" SIGKILLs that session. The replicas' smddp group then runs on one
    host's paths (the host segment), not across links."""

    def __init__(self):
        self._jobs: dict = {}

    def addr(self, host) -> str:
        return "127.0.0.1"

    def spawn(self, host, cmd, log_path, env=None, cwd=None):
        child_env = dict(os.environ, PYTHONUNBUFFERED="1")
        child_env.update({k: str(v) for k, v in (env or {}).items()})
        with open(log_path, "ab") as log:
            p = subprocess.Popen(cmd, env=child_env, stdin=subprocess.DEVNULL, stdout=log,
                                 stderr=subprocess.STDOUT, start_new_session=True,
                                 cwd=cwd or fr.REPO)
        self._jobs.setdefault(host, []).append(p)
        return p

    def kill_host(self, host) -> None:
        for p in self._jobs.get(host, []):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, signal.SIGKILL)
            with contextlib.suppress(Exception):
                p.wait(timeout=10)

    def reset(self) -> None:
        for host in list(self._jobs):
            self.kill_host(host)
        self._jobs.clear()


def run(cluster, out: str, pg: str, replicas: int, cycles: int, seed: int,
        cycle_deadline_s: float = 120.0) -> dict:
    rng = random.Random(seed)
    hub = cluster.addr("hub")
    code = ("import time\nfrom torchft._torchft import LighthouseServer\n"
            f"l = LighthouseServer(bind='[::]:{fr.LIGHTHOUSE_PORT}', min_replicas={replicas - 1}, "
            "join_timeout_ms=1000, heartbeat_timeout_ms=2000)\n"
            "print('lighthouse', l.address(), flush=True)\ntime.sleep(86400)\n")
    cluster.spawn("hub", [sys.executable, "-c", code], os.path.join(out, "lighthouse.log"))
    env = {"PYTHONPATH": fr.REPO, "FT_REPLICA_DIGESTS": "1"}
    if not isinstance(cluster, OneHost):
        env["GLOO_SOCKET_IFNAME"] = "eth0"
    lighthouse = f"http://{hub}:{fr.LIGHTHOUSE_PORT}"

    def start(r: int):
        cmd = [sys.executable, os.path.join(HERE, "ft_replica.py"), "--pg", pg, "--replica",
               str(r), "--addr", cluster.addr(r), "--lighthouse", lighthouse, "--steps",
               "100000000", "--min-replicas", "1", "--timeout", "30", "--out", out,
               # Ports of its own per replica: on one host they share an address.
               "--store-port", str(29700 + 10 * r), "--manager-port", str(29701 + 10 * r)]
        return cluster.spawn(r, cmd, os.path.join(out, f"replica{r}.log"), env=env, cwd=out)

    procs = [start(r) for r in range(replicas)]
    paths = [os.path.join(out, f"steps.{r}.jsonl") for r in range(replicas)]

    def full_step_after(r: int, t: float):
        rows = fr._read_steps(paths[r])
        return any(x.get("committed") and x["t"] > t and x["participants"] == replicas
                   for x in rows)

    t0 = time.time()
    fr._wait(lambda: all(full_step_after(r, 0) for r in range(replicas)),
             time.monotonic() + 300, "every replica to commit a step together", out, procs=procs)
    kinds = {"mid-step": 0, "after a commit": 0}
    pairs = 0
    for c in range(cycles):
        deadline = time.monotonic() + cycle_deadline_s
        victim = c % replicas
        kind = "mid-step" if c % 2 == 0 else "after a commit"
        if kind == "mid-step":
            time.sleep(rng.uniform(0.0, 0.5))
        else:
            seen = fr._steps_done(fr._read_steps(paths[victim]))
            fr._wait(lambda: fr._steps_done(fr._read_steps(paths[victim])) > seen, deadline,
                     f"cycle {c}: replica {victim} to commit", out, poll=0.002)
        t_kill = time.time()
        cluster.kill_host(victim)
        kinds[kind] += 1
        survivors = [r for r in range(replicas) if r != victim]
        live = [procs[r] for r in survivors]
        fr._wait(lambda: all(any(x.get("committed") and x["t"] > t_kill
                                 for x in fr._read_steps(paths[r])) for r in survivors),
                 deadline, f"cycle {c}: the survivors to commit after the kill", out, procs=live)
        procs[victim] = start(victim)
        t_start = time.time()
        fr._wait(lambda: full_step_after(victim, t_start), deadline,
                 f"cycle {c}: replica {victim} to train in the full quorum again", out,
                 procs=procs)
        pairs = fr._check_step_digests(paths)  # raises at the first divergence
        if (c + 1) % 25 == 0:
            print(json.dumps({"cycles": c + 1, "pairs": pairs,
                              "s_per_cycle": round((time.time() - t0) / (c + 1), 2)}), flush=True)
    last = max(fr._steps_done(fr._read_steps(p)) for p in paths) + 3
    with open(os.path.join(out, "stop_at.tmp"), "w") as f:
        f.write(str(last))
    os.replace(os.path.join(out, "stop_at.tmp"), os.path.join(out, "stop_at"))
    finals = [os.path.join(out, f"final.{r}.json") for r in range(replicas)]
    fr._wait(lambda: all(os.path.exists(p) for p in finals), time.monotonic() + 120,
             "every replica to finish", out, poll=0.5)
    got = [json.load(open(p)) for p in finals]
    if len({g["digest"] for g in got}) != 1:
        raise fr.ScenarioError(f"the replicas ended with different states: {got}")
    return {"pg": pg, "cycles": cycles, "kills": kinds, "step_pairs_compared":
            fr._check_step_digests(paths), "final_step": got[0]["step"],
            "s_per_cycle": round((time.time() - t0) / max(1, cycles), 2)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cycles", type=int, default=500)
    p.add_argument("--replicas", type=int, default=3)
    p.add_argument("--pg", default="smddp", choices=["smddp", "gloo"])
    p.add_argument("--rate", default="2gbit")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--one-host", action="store_true",
                   help="every replica on this host (no namespaces, no root)")
    args = p.parse_args(argv)
    out = tempfile.mkdtemp(prefix="ft-cycles-")
    if args.one_host:
        hosts = OneHost()
        try:
            res = run(hosts, out, args.pg, args.replicas, args.cycles, args.seed)
        except fr.ScenarioError as e:
            print(f"FAILED (logs in {out}): {e}", file=sys.stderr)
            return 1
        finally:
            hosts.reset()
        res.update(commit=fr.git_commit(), where="one host")
        print(json.dumps(res))
        return 0
    why = cl.why_unavailable()
    if why:
        print(f"no cluster of network namespaces here: {why}", file=sys.stderr)
        return 2
    with cl.Cluster(args.replicas, args.rate) as cluster:
        try:
            res = run(cluster, out, args.pg, args.replicas, args.cycles, args.seed)
        except fr.ScenarioError as e:
            print(f"FAILED (logs in {out}): {e}", file=sys.stderr)
            return 1
        finally:
            cluster.reset()
    res.update(commit=fr.git_commit(), where=f"{args.replicas} namespace hosts at {args.rate}")
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
