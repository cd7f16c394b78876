"""Recovery from a dead replica on a cluster of network namespaces
(scripts/cluster.sh; root): DDP over smddp going on through
``dist.shrink_group``, torchft with smddp, torchft with Gloo, and a plain
``torchrun --max-restarts`` job that restarts from a checkpoint.

    sudo .venv/bin/python benchmarks/ft_recovery.py                 # all four, 3 hosts
    sudo .venv/bin/python benchmarks/ft_recovery.py --modes smddp --replicas 2

Each host trains the demo model (examples/train_ddp.py's CharTransformer),
one rank per host. Once every host has completed --kill-at steps, the
whole of the last host is SIGKILLed mid-step (cluster.sh kill: every
process in its namespace).

- torchft modes (benchmarks/ft_replica.py): one replica group per host,
  a lighthouse in the hub. The survivors go on without restarting;
  --replace-after seconds after they have, a replacement starts on the dead
  host, heals from a live peer and trains to --steps with them.
- shrink mode (benchmarks/ft_shrink_worker.py): plain DDP over smddp, one
  rank per host, started by this driver with the hub's store (torchrun's
  agents would stop the survivors). The survivors' failed step names the
  dead rank; they shrink the default group without it, wrap the model in
  DDP again and redo the step. No replacement joins.
- torchrun mode (benchmarks/ft_torchrun_worker.py): one torchrun per host,
  --max-restarts 3, a checkpoint every --ckpt-every steps. Only the last
  host's worker is SIGKILLed, not its torchrun agent, which restarts it (a
  host whose agent died needs a new node to join the job): the kindest
  case for torchrun. Every agent restarts its worker, and the new workers
  resume from the checkpoint.

Reported per mode:
- steps lost: step computations thrown away. torchft: the survivors'
  attempts that did not commit after the kill. torchrun: the steps done
  again after the restart (last completed before the kill minus the
  checkpoint's step) plus the one in flight. shrink: the survivors' failed
  attempts (the step in flight, done again on the smaller group).
- recovery s: from the kill to the moment every survivor has completed its
  next step (torchrun: every rank of the restarted job).
- quorum to step ms (torchft): the part the backend owns. Most of the
  recovery is torchft's: the lighthouse hands out the new quorum about 1 s
  after the kill (its join timeout), give or take 50 ms. This column starts
  when the survivors begin to configure on that quorum (the abort of their
  old group) and ends at their first completed step; "form ms" is the new
  group's formation within it. The largest over the survivors. In shrink
  mode "form ms" is dist.shrink_group's own time.

Checked, and a failure exits non-zero: the survivors never restarted
(torchft), their step count went on from where it was and the loss did not
go back to where training started; every replica that trained to the end,
the replacement included, ends with bitwise identical weights and
optimizer state (torchft). tests/python/test_ft_cluster.py runs the same
scenario, smaller, as a test of these checks.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import secrets
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "tests", "python", "harness"))
import cluster as cl  # noqa: E402  (torch-free)

LIGHTHOUSE_PORT = 29510


class ScenarioError(AssertionError):
    pass


def _read_steps(path: str) -> list[dict]:
    try:
        with open(path) as f:
            return [json.loads(line) for line in f if line.strip().endswith("}")]
    except OSError:
        return []


def _logs(out: str) -> str:
    parts = []
    for name in sorted(os.listdir(out)):
        if name.endswith(".log"):
            parts.append(f"--- {name}\n{cl.tail(os.path.join(out, name), 25)}")
    return "\n".join(parts)


def _wait(cond, deadline: float, what: str, out: str, poll: float = 0.1, procs=()):
    """cond()'s first true value; fails at the deadline, or as soon as one
    of `procs` (processes that must keep running) has ended."""
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        ended = [p for p in procs if p.poll() is not None]
        if ended and not cond():
            raise ScenarioError(f"a process ended (exit {ended[0].returncode}) while waiting "
                                f"for {what}\n{_logs(out)}")
        time.sleep(poll)
    raise ScenarioError(f"timed out waiting for {what}\n{_logs(out)}")


def _steps_done(rows: list[dict]) -> int:
    """The highest step count reached (committed) in these rows."""
    return max((r["after"] for r in rows if "after" in r), default=0)


def _after_quorum(paths: list[str], survivors: list[int], t_kill: float) -> dict:
    """The part of the recovery the backend owns, from the survivors' step
    logs: from the configure that torchft began on the new quorum (its
    abort of the old group) to the first step completed after it, and the
    formation of the new group within that; the largest over survivors.
    Empty when the kill fell between steps and no group was formed again."""
    after, form = [], []
    for r in survivors:
        rows = _read_steps(paths[r])
        forms = [x for x in rows if x.get("event") == "form" and x["t"] > t_kill]
        if not forms:
            return {}
        f = forms[0]
        aborts = [x for x in rows if x.get("event") in ("abort", "configure")
                  and x["t"] <= f["t"] - f["s"]]
        steps = [x for x in rows if x.get("committed") and x["t"] > f["t"]]
        if not aborts or not steps:
            return {}
        start = aborts[-1]["t"] - aborts[-1]["s"]
        after.append(steps[0]["t"] - start)
        form.append(f["s"])
    return {"after_quorum_s": max(after), "form_s": max(form)}


def _check_step_digests(paths: list[str]) -> int:
    """With FT_REPLICA_DIGESTS=1 every step row carries a digest of the
    state after it: any two replicas that committed the same step must hold
    the same state there. Returns the number of pairs compared."""
    seen: dict[int, tuple[int, str]] = {}
    pairs = 0
    for r, path in enumerate(paths):
        for x in _read_steps(path):
            if not x.get("committed") or "digest" not in x:
                continue
            first = seen.setdefault(x["after"], (r, x["digest"]))
            if first[0] != r:
                pairs += 1
                if first[1] != x["digest"]:
                    raise ScenarioError(f"replicas {first[0]} and {r} hold different states "
                                        f"after step {x['after']}")
    return pairs


def run_torchft(cluster, mode: str, out: str, replicas: int, steps: int, kill_at: int,
                replace_after: float, deadline_s: float, timeout_s: float = 30.0,
                between: bool = False, digests: bool = False, victim: int | None = None,
                extra_env: dict | None = None) -> dict:
    """One torchft scenario; returns its figures, raises ScenarioError.
    between: the victim SIGKILLs itself right after it commits step
    kill_at, before it asks for the next quorum (no step fails), instead of
    dying mid-step. digests: every replica logs a digest of its state at
    every step, and any two that committed a step must agree there (also
    FT_REPLICA_DIGESTS=1). victim: the replica killed (default the last;
    0 is torchft's primary, whose store the quorum uses). extra_env: for
    every replica (standalone servers' settings, say)."""
    deadline = time.monotonic() + deadline_s
    hub = cluster.addr("hub")
    lighthouse = f"http://{hub}:{LIGHTHOUSE_PORT}"
    code = ("import time\nfrom torchft._torchft import LighthouseServer\n"
            f"l = LighthouseServer(bind='[::]:{LIGHTHOUSE_PORT}', min_replicas={max(1, replicas - 1)}, "
            "join_timeout_ms=1000, heartbeat_timeout_ms=2000)\n"
            "print('lighthouse', l.address(), flush=True)\ntime.sleep(3600)\n")
    cluster.spawn("hub", [sys.executable, "-c", code], os.path.join(out, "lighthouse.log"))
    victim = replicas - 1 if victim is None else victim
    env = {"GLOO_SOCKET_IFNAME": "eth0", "PYTHONPATH": REPO,
           "FT_REPLICA_DIGESTS": "1" if digests else os.environ.get("FT_REPLICA_DIGESTS", ""),
           **(extra_env or {})}

    def start(r: int, die_after: int = 0):
        cmd = [sys.executable, os.path.join(HERE, "ft_replica.py"), "--pg", mode,
               "--replica", str(r), "--addr", cluster.addr(r), "--lighthouse", lighthouse,
               "--steps", str(steps), "--min-replicas", "1", "--timeout", str(timeout_s),
               "--out", out, "--die-after", str(die_after)]
        return cluster.spawn(r, cmd, os.path.join(out, f"replica{r}.log"), env=env, cwd=out)

    procs = [start(r, kill_at if between and r == victim else 0) for r in range(replicas)]
    paths = [os.path.join(out, f"steps.{r}.jsonl") for r in range(replicas)]
    # Between steps the victim ends by itself once it has committed kill_at,
    # which can be before the others have logged that step: only they must
    # keep running meanwhile, and the victim only until it logged kill_at.
    # (Counting its end as a failure failed one run of a batch of 36.)
    def reached():
        done = [_steps_done(_read_steps(p)) for p in paths]
        if between and procs[victim].poll() is not None and done[victim] < kill_at:
            raise ScenarioError(f"replica {victim} ended (exit {procs[victim].returncode}) "
                                f"before step {kill_at}\n{_logs(out)}")
        return all(d >= kill_at for d in done)

    others = [p for r, p in enumerate(procs) if not (between and r == victim)]
    _wait(reached, deadline, f"every replica to reach step {kill_at}", out, procs=others)
    if between:
        _wait(lambda: procs[victim].poll() is not None, deadline,
              f"replica {victim} to kill itself after step {kill_at}", out, poll=0.005)
    # Otherwise mid-step: the replicas train back to back.
    t_kill = time.time()
    cluster.kill_host(victim)  # between steps: already dead; this only tidies up
    survivors = [r for r in range(replicas) if r != victim]

    def recovered():
        firsts = []
        for r in survivors:
            after = [x for x in _read_steps(paths[r]) if x.get("t", 0) > t_kill and "after" in x]
            ok = [x for x in after if x["committed"]]
            if not ok:
                return None
            firsts.append((ok[0]["t"], after.index(ok[0])))
        return firsts

    live = [procs[r] for r in survivors]
    firsts = _wait(recovered, deadline, "the survivors to commit a step after the kill", out,
                   procs=live)
    recovery_s = max(t for t, _ in firsts) - t_kill
    # Where each survivor was at the kill, read only now: a step that ended
    # just before the kill may have reached its log just after.
    at_kill = {r: _steps_done([x for x in _read_steps(paths[r]) if x["t"] <= t_kill])
               for r in survivors}
    lost = max(n for _, n in firsts)
    time.sleep(replace_after)
    t_replace = time.time()
    procs[victim] = start(victim)
    # Once the replacement trains in the survivors' quorum, every replica
    # stops a few steps later, at the same step.
    def joined_quorum():
        rows = [x for x in _read_steps(paths[victim]) if x.get("t", 0) > t_replace]
        return any(x.get("committed") and x["participants"] == replicas for x in rows)

    _wait(joined_quorum, deadline, "the replacement to train in the survivors' quorum", out,
          procs=procs)
    last = max(_steps_done(_read_steps(p)) for p in paths) + 5
    with open(os.path.join(out, "stop_at.tmp"), "w") as f:
        f.write(str(last))
    os.replace(os.path.join(out, "stop_at.tmp"), os.path.join(out, "stop_at"))
    finals = [os.path.join(out, f"final.{r}.json") for r in range(replicas)]
    _wait(lambda: all(os.path.exists(p) for p in finals), deadline,
          "every replica, the replacement included, to finish", out, poll=0.5)
    for r in survivors:
        procs[r].wait(timeout=30)
    result = {"mode": f"torchft + {mode}", "steps_lost": lost, "recovery_s": recovery_s,
              "t_kill": t_kill, "survivors": survivors}
    result.update(_after_quorum(paths, survivors, t_kill))
    # --- checks ---
    for r in survivors:
        rows = _read_steps(paths[r])
        starts = [x for x in rows if x.get("event") == "start"]
        if len(starts) != 1:
            raise ScenarioError(f"replica {r} restarted ({len(starts)} starts)")
        counts = [x["after"] for x in rows if "after" in x]
        if any(b < a for a, b in zip(counts, counts[1:])):
            raise ScenarioError(f"replica {r}'s step count went back: {counts}")
        post = [x for x in rows if x.get("t", 0) > t_kill and x.get("committed")]
        if post[0]["step"] != at_kill[r]:
            raise ScenarioError(f"replica {r} went on from step {post[0]['step']}, "
                                f"not from {at_kill[r]} where it was")
        first_loss = next(x["loss"] for x in rows if "loss" in x)
        if post[0]["loss"] > 0.9 * first_loss:
            raise ScenarioError(f"replica {r}'s loss went back to {post[0]['loss']:.3f} "
                                f"(it started at {first_loss:.3f})")
        result.setdefault("loss_before_kill",
                          [x["loss"] for x in rows if "loss" in x and x["t"] <= t_kill][-1])
        result.setdefault("loss_after", post[0]["loss"])
    result["step_pairs_compared"] = _check_step_digests(paths)
    if mode == "smddp":
        # How many survivors re-formed on a spare endpoint: one more taken
        # by the first step committed after the kill than before it.
        def taken(rows):
            return rows[-1].get("spares_taken", 0) if rows else 0

        result["survivors_on_spares"] = 0
        for r in survivors:
            rows = [x for x in _read_steps(paths[r]) if "after" in x]
            before = taken([x for x in rows if x["t"] <= t_kill])
            first = [x for x in rows if x["t"] > t_kill and x["committed"]][:1]
            result["survivors_on_spares"] += taken(first) > before
    got = {r: json.load(open(finals[r])) for r in range(replicas)}
    if len({g["digest"] for g in got.values()}) != 1 or {g["step"] for g in got.values()} != {last}:
        raise ScenarioError(f"the replicas ended with different states: {got}")
    replacement = [x for x in _read_steps(paths[victim]) if x.get("t", 0) > t_replace]
    joined = [x for x in replacement if x.get("committed")]
    if not joined:
        raise ScenarioError("the replacement never committed a step")
    # It heals to the survivors' step, then commits it with them.
    result["replacement_joined_at_step"] = joined[0]["after"] - 1
    # From its process start (after Python's and torch's imports) to that.
    result["replacement_s"] = joined[0]["t"] - replacement[0]["t"]
    result["final_step"] = last
    return result


def run_torchrun(cluster, out: str, hosts: int, steps: int, kill_at: int, ckpt_every: int,
                 deadline_s: float, timeout_s: float = 30.0) -> dict:
    deadline = time.monotonic() + deadline_s
    victim = hosts - 1
    job = f"ftbase-{secrets.token_hex(3)}"
    cmd = [os.path.join(HERE, "ft_torchrun_worker.py"), "--steps", str(steps), "--ckpt-every",
           str(ckpt_every), "--timeout", str(timeout_s)]
    cluster.torchrun(job, cmd, 1, out, max_restarts=3)
    paths = [os.path.join(out, f"steps.{r}.jsonl") for r in range(hosts)]
    _wait(lambda: all(_steps_done(_read_steps(p)) >= kill_at for p in paths), deadline,
          f"every rank to reach step {kill_at}", out)
    # The victim host's worker, not its torchrun agent: the agent is what
    # restarts it (a host whose agent died needs a new node in the job).
    pid = [x for x in _read_steps(paths[victim]) if x.get("event") == "start"][-1]["pid"]
    t_kill = time.time()
    os.kill(pid, 9)
    done_before = max(_steps_done([x for x in _read_steps(p) if x["t"] <= t_kill]) for p in paths)

    def recovered():
        # Every rank's first step after its worker was started again.
        ts = []
        resume = None
        for p in paths:
            rows = [x for x in _read_steps(p) if x.get("t", 0) > t_kill]
            starts = [i for i, x in enumerate(rows) if x.get("event") == "start"]
            done = [x for x in rows[starts[0]:] if "after" in x] if starts else []
            if not done:
                return None
            resume = rows[starts[0]]["resume"]
            ts.append(done[0]["t"])
        return ts, resume

    ts, resume = _wait(recovered, deadline, "the restarted job's first step", out)
    codes = cluster.wait_jobs(max(1.0, deadline - time.monotonic()))
    rows0 = _read_steps(paths[0])
    if _steps_done(rows0) != steps:
        raise ScenarioError(f"the restarted job did not finish: {codes}\n{_logs(out)}")
    return {"mode": "torchrun --max-restarts + smddp", "steps_lost": done_before - resume + 1,
            "recovery_s": max(ts) - t_kill, "checkpoint_step": resume}


def run_shrink(cluster, out: str, hosts: int, steps: int, kill_at: int, deadline_s: float,
               timeout_s: float = 30.0) -> dict:
    """DDP over smddp, one rank per host, started here (no torchrun, whose
    agents stop every worker when one dies); the last host is killed mid-step
    and the survivors go on through dist.shrink_group (ft_shrink_worker.py).
    Returns its figures, raises ScenarioError."""
    deadline = time.monotonic() + deadline_s
    victim = hosts - 1
    job = f"ftshrink-{secrets.token_hex(3)}/"
    store = f"{cluster.addr('hub')}:{cl.STORE_PORT}"
    env = {"PYTHONPATH": REPO}

    def start(r: int):
        cmd = [sys.executable, os.path.join(HERE, "ft_shrink_worker.py"), "--rank", str(r),
               "--world", str(hosts), "--store", store, "--job", job, "--steps", str(steps),
               "--out", out, "--timeout", str(timeout_s)]
        return cluster.spawn(r, cmd, os.path.join(out, f"rank{r}.log"), env=env, cwd=out)

    procs = [start(r) for r in range(hosts)]
    paths = [os.path.join(out, f"steps.{r}.jsonl") for r in range(hosts)]
    _wait(lambda: all(_steps_done(_read_steps(p)) >= kill_at for p in paths), deadline,
          f"every rank to reach step {kill_at}", out, procs=procs)
    t_kill = time.time()
    cluster.kill_host(victim)  # the ranks train back to back: mid-step
    survivors = [r for r in range(hosts) if r != victim]
    at_kill = {r: _steps_done([x for x in _read_steps(paths[r]) if x["t"] <= t_kill])
               for r in survivors}

    def recovered():
        firsts = []
        for r in survivors:
            after = [x for x in _read_steps(paths[r]) if x.get("t", 0) > t_kill and "after" in x]
            if not after:
                return None
            firsts.append(after[0]["t"])
        return firsts

    live = [procs[r] for r in survivors]
    firsts = _wait(recovered, deadline, "the survivors to complete a step after the kill", out,
                   procs=live)
    finals = [os.path.join(out, f"final.{r}.json") for r in survivors]
    _wait(lambda: all(os.path.exists(p) for p in finals), deadline,
          "the survivors to finish", out, poll=0.5, procs=live)
    codes = cluster.wait_jobs(max(1.0, deadline - time.monotonic()), jobs=live)
    if any(c != 0 for c in codes):
        raise ScenarioError(f"a survivor failed: exit codes {codes}\n{_logs(out)}")
    result = {"mode": "shrink_group + smddp", "recovery_s": max(firsts) - t_kill}
    # --- checks ---
    lost, shrink_s = 0, []
    for r in survivors:
        rows = _read_steps(paths[r])
        if len([x for x in rows if x.get("event") == "start"]) != 1:
            raise ScenarioError(f"rank {r} restarted")
        failed = [x for x in rows if x.get("event") == "failed"]
        shrunk = [x for x in rows if x.get("event") == "shrunk"]
        if len(shrunk) != 1 or shrunk[0]["lost"] != [victim] or shrunk[0]["world"] != hosts - 1:
            raise ScenarioError(f"rank {r} did not shrink the group once, without rank "
                                f"{victim}: {shrunk}")
        shrink_s.append(shrunk[0]["s"])
        lost = max(lost, len(failed))  # step computations thrown away
        post = [x for x in rows if x.get("t", 0) > t_kill and "after" in x]
        if post[0]["step"] != at_kill[r] or post[0]["participants"] != hosts - 1:
            raise ScenarioError(f"rank {r} went on from step {post[0]['step']} on "
                                f"{post[0]['participants']} ranks, not from {at_kill[r]} "
                                f"on {hosts - 1}")
        first_loss = next(x["loss"] for x in rows if "loss" in x)
        if post[0]["loss"] > 0.9 * first_loss:
            raise ScenarioError(f"rank {r}'s loss went back to {post[0]['loss']:.3f} "
                                f"(it started at {first_loss:.3f})")
    result.update(steps_lost=lost, shrink_s=max(shrink_s),
                  step_pairs_compared=_check_step_digests(paths))
    got = {r: json.load(open(os.path.join(out, f"final.{r}.json"))) for r in survivors}
    if len({g["digest"] for g in got.values()}) != 1 or {g["step"] for g in got.values()} != {steps}:
        raise ScenarioError(f"the survivors ended with different states: {got}")
    return result


def git_commit() -> str:
    try:
        return subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, timeout=10).stdout.strip()
    except OSError:
        return "?"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--modes", default="shrink,smddp,gloo,torchrun")
    p.add_argument("--replicas", type=int, default=3)
    p.add_argument("--steps", type=int, default=100000,
                   help="torchft: a bound; they stop a few steps after the replacement joined")
    p.add_argument("--torchrun-steps", type=int, default=60, help="torchrun: the job's steps")
    p.add_argument("--shrink-steps", type=int, default=40, help="shrink: the job's steps")
    p.add_argument("--kill-at", type=int, default=20)
    p.add_argument("--kill-between", action="store_true",
                   help="torchft: the last host's replica SIGKILLs itself between steps (after "
                        "it commits --kill-at, before its next quorum), so no step fails")
    p.add_argument("--ckpt-every", type=int, default=10)
    p.add_argument("--replace-after", type=float, default=3.0)
    p.add_argument("--rate", default="2gbit")
    p.add_argument("--cc", default=cl.DEFAULT_CC,
                   help=f"the hosts' TCP congestion control (default {cl.DEFAULT_CC})")
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--json", help="also write the results here")
    args = p.parse_args(argv)
    why = cl.why_unavailable()
    if why:
        print(f"no cluster of network namespaces here: {why}", file=sys.stderr)
        return 2
    results = []
    with cl.Cluster(args.replicas, args.rate, cc=args.cc) as cluster:
        for rep in range(args.repeat):
            for mode in args.modes.split(","):
                out = tempfile.mkdtemp(prefix=f"ft-{mode}-")
                try:
                    if mode == "shrink":
                        res = run_shrink(cluster, out, args.replicas, args.shrink_steps,
                                         args.kill_at, deadline_s=600)
                    elif mode == "torchrun":
                        res = run_torchrun(cluster, out, args.replicas, args.torchrun_steps,
                                           args.kill_at,
                                           args.ckpt_every, deadline_s=600)
                    else:
                        res = run_torchft(cluster, mode, out, args.replicas, args.steps,
                                          args.kill_at, args.replace_after, deadline_s=600,
                                          between=args.kill_between)
                except ScenarioError as e:
                    print(f"{mode}: FAILED: {e}", file=sys.stderr)
                    return 1
                finally:
                    cluster.reset()
                res["run"] = rep
                results.append(res)
                print(json.dumps(res), flush=True)
    print(f"\n# {args.replicas} hosts, 1 rank each, links {args.rate}, tcp {args.cc}, demo model; "
          f"host h{args.replicas - 1} "
          f"killed once every host completed {args.kill_at} steps"
          f"{' (torchft: between steps, by itself)' if args.kill_between else ''} (torchrun: its worker); "
          f"commit {git_commit()}, {platform.node()} ({os.cpu_count()} cores)")
    print(f"{'mode':34s} {'run':>3s} {'steps lost':>10s} {'recovery s':>11s} {'replacement s':>14s} "
          f"{'quorum to step ms':>18s} {'form ms':>8s}")
    for r in results:
        repl = f"{r['replacement_s']:14.2f}" if "replacement_s" in r else f"{'-':>14s}"
        after = (f"{1e3 * r['after_quorum_s']:18.1f} {1e3 * r['form_s']:8.1f}"
                 if "after_quorum_s" in r else
                 f"{'-':>18s} {1e3 * r['shrink_s']:8.1f}" if "shrink_s" in r else
                 f"{'-':>18s} {'-':>8s}")
        print(f"{r['mode']:34s} {r['run']:3d} {r['steps_lost']:10d} {r['recovery_s']:11.2f} {repl} "
              f"{after}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
