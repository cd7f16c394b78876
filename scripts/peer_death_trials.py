#!/usr/bin/env python3
"""Many randomized peer-death trials: a random rank dies (SIGKILL or
exit) after a random delay while the others are in a random collective
(all_reduce, broadcast, all_gather, barrier) at a random world size; every
survivor must raise an error naming the lost rank and the collective within
the group timeout, and so must every later call.

    .venv/bin/python scripts/peer_death_trials.py [--trials 50] [--seed N]

Each trial is one multi-process job with a hard deadline
(tests/python/harness/mp_harness.py). Prints one line per trial, then a summary;
exits 1 if any trial had a problem. `make test` runs three such trials
(tests/python/test_robust.py).
"""

import argparse
import os
import random
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests", "python", "harness"))

import mp_harness  # noqa: E402,F401  (puts the cases on sys.path)
import cases_robust as cr  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0, help="0: pick one and print it")
    ap.add_argument("--backend", default="smddp")
    ap.add_argument("--pretend-hosts", action="store_true",
                    help="one pretend host per rank (SMDDP_HOST_ID): tcp;ofi_rxm, no pid checks")
    a = ap.parse_args()
    env = {"SMDDP_HOST_ID": lambda rank: f"host{rank}"} if a.pretend_hosts else None
    # Across hosts a dead peer is noticed only by the group timeout (no
    # process id to check; tcp;ofi_rxm reports no error for it), so that
    # mode uses a short timeout and accepts a timeout error that names the
    # lost rank among those it waited for / never saw.
    pg_timeout = 5.0 if a.pretend_hosts else cr.TRIAL_PG_TIMEOUT
    seed = a.seed or random.SystemRandom().randrange(1, 2**31)
    rng = random.Random(seed)
    print(f"seed {seed}, {a.trials} trials, group timeout {pg_timeout:.0f} s"
          f"{', one pretend host per rank' if a.pretend_hosts else ''}")
    failures, worst = 0, 0.0
    t0 = time.monotonic()
    for i in range(a.trials):
        trial = cr.draw_trial(rng)
        try:
            out = cr.run_death_trial(trial, backend=a.backend, env=env, pg_timeout=pg_timeout,
                                     by_timeout_ok=a.pretend_hosts)
        except AssertionError as e:  # the harness: a hang or a crash of a survivor
            out = {"problems": [f"job failed: {e}"], "elapsed": {}}
        slowest = max(out["elapsed"].values(), default=0.0)
        worst = max(worst, slowest)
        status = "ok" if not out["problems"] else "FAIL"
        failures += bool(out["problems"])
        print(f"{i:3d} {status:4} world {trial['world']} victim {trial['victim']} "
              f"{trial['coll']:10} {trial['how']:7} delay {trial['delay']:.3f}s "
              f"survivors failed after {out['elapsed']}")
        for p in out["problems"]:
            print(f"      {p}")
        sys.stdout.flush()
    print(f"{a.trials - failures}/{a.trials} trials ok; slowest survivor {worst:.2f} s; "
          f"wall {time.monotonic() - t0:.0f} s; seed {seed}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
