"""The live standalone server and 2-rank job that test_server_security.py's
attacks run against, and the server process seen from /proc (its threads,
CPU and memory before and after an attack). Never imports torch.
"""

import os
import re
import resource
import time

from mp_harness import worker, write_atomic
from server_harness import PY, env, key_file, start_job, start_server, wait_results

JOB = "secret-job-name-7f3a"  # the server's --job: no refusal may echo it
SETTLE_S = 2.0
RSS_SLACK_KIB = 24 * 1024
ROUND_S = 180.0


# -- the server process, seen from /proc ---------------------------------------

def snapshot(pid):
    with open(f"/proc/{pid}/status") as f:
        rss = int(re.search(r"^VmRSS:\s+(\d+)", f.read(), re.M).group(1))
    return {"fds": len(os.listdir(f"/proc/{pid}/fd")),
            "threads": len(os.listdir(f"/proc/{pid}/task")), "rss_kib": rss}


def accept_cpu_seconds(pid):
    """CPU time of the server's accept loops (threads named smddp-accept)."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                if f.read().strip() != "smddp-accept":
                    continue
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
        except OSError:
            pass
    return total / os.sysconf("SC_CLK_TCK")


def quiet_snapshot(pid):
    """The server's level once it stopped changing (a stream that just ended
    may still be closing)."""
    last = snapshot(pid)
    end = time.monotonic() + 5.0
    while time.monotonic() < end:
        time.sleep(0.25)
        now = snapshot(pid)
        if now["fds"] == last["fds"] and now["threads"] == last["threads"]:
            return now
        last = now
    return last


def settled(pid, before, left_at):
    """Asserts the server is back to `before` within SETTLE_S of `left_at`."""
    while True:
        now = snapshot(pid)
        if (now["fds"] <= before["fds"] and now["threads"] <= before["threads"]
                and now["rss_kib"] <= before["rss_kib"] + RSS_SLACK_KIB):
            return now
        if time.monotonic() > left_at + SETTLE_S:
            raise AssertionError(f"the server did not settle within {SETTLE_S} s of the attacker "
                                 f"leaving: before {before}, now {now}")
        time.sleep(0.05)


# -- the live server and job -------------------------------------------------------

class Live:
    """The server, the 2-rank job, and the rounds that drive it."""

    def __init__(self, procs, out):
        self.procs, self.out, self.n = procs, out, 0
        self.log = os.path.join(out, "server.log")
        self.key = open(key_file(), "rb").read().strip()

        def limit_fds():
            resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))

        self.server, hosts = start_server(
            procs, ["--bind", "127.0.0.1", "--job", JOB, "--key-file", key_file()],
            # The attacker's sessions write unsealed frames (hostile_client.Session):
            # this server does not require the tags its job's workers still send.
            env=env(keyed=False, SMDDP_SERVER_INTEGRITY=0), stderr=open(self.log, "wb"),
            preexec_fn=limit_fds)
        self.port = int(hosts.rsplit(":", 1)[1])
        before = len(procs.procs)
        start_job(procs, 2, [PY, worker("security_worker.py"), out],
                  lambda r, port: env(RANK=r, WORLD_SIZE=2, MASTER_ADDR="127.0.0.1",
                                      MASTER_PORT=port, SMDDP_SERVER_HOSTS=hosts,
                                      SMDDP_SERVER_JOB=JOB, SMDDP_SERVER_REQUIRED=1,
                                      FI_TCP_IFACE="lo"),
                  lambda r: os.path.join(out, f"rank{r}.log"),
                  [os.path.join(out, f"crashed.{r}.json") for r in range(2)])
        self.ranks = procs.procs[before:]
        first = self.results(0)
        self.usual_s = max(r["fresh_s"] for r in first)
        self.n = 1

    def results(self, n):
        names = [f"round.{n}.{r}.json" for r in range(2)]
        end = time.monotonic() + ROUND_S
        while time.monotonic() < end:
            crashed = [c for c in os.listdir(self.out) if c.startswith("crashed.")]
            if crashed or all(os.path.exists(os.path.join(self.out, x)) for x in names):
                break
            time.sleep(0.1)
        return list(wait_results(self.out, names + [c for c in os.listdir(self.out)
                                                    if c.startswith("crashed.")], 1).values())

    def log_text(self):
        with open(self.log, "rb") as f:
            return f.read().decode("utf-8", "replace")

    def command(self, n, cmd):
        """Writes cmd.N whole: the workers poll for it, and one that saw the
        file created but not yet written read "" (no live calls in CI)."""
        write_atomic(os.path.join(self.out, f"cmd.{n}"), cmd)

    def round(self, attack, cmd="live"):
        """Runs `attack()` (which returns when the attacker left) during
        round n of the job; checks the server and the following group."""
        assert self.server.poll() is None, "the server died before the attack"
        before = quiet_snapshot(self.server.pid)
        n = self.n
        self.n += 1
        self.command(n, cmd)
        time.sleep(0.3)  # the live loop is under way
        detail = attack()
        left_at = time.monotonic()
        assert self.server.poll() is None, ("the attack killed the server:\n" +
                                            self.log_text()[-3000:])
        after = settled(self.server.pid, before, left_at)
        open(os.path.join(self.out, f"stop.{n}"), "w").close()
        self.last = self.results(n)
        for res in self.last:
            assert "crashed" not in res, res
            assert res["live_bad"] == 0, res
            assert cmd != "live" or res["live_calls"] > 0, res
            assert res["fresh_bad"] == [], res
            # Through the server, not around it (SMDDP_SERVER_REQUIRED=1 too).
            assert res["fresh_servers"] == 1 and res["fresh_server_steps"] > 0, res
            assert res["fresh_s"] < 5 * self.usual_s + 10, (res, self.usual_s)  # no hang
        assert self.server.poll() is None
        return before, after, detail

    def close(self):
        self.command(self.n, "quit")
