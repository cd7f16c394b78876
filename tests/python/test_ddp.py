"""DDP over the backend under test ($SMDDP_TEST_BACKEND, default "smddp"),
checked against DDP over Gloo in the same job, and the demo launched through
the real torchrun.

    SMDDP_TEST_BACKEND=gloo pytest tests/python/test_ddp.py
"""

import math
import os
import re
import sys
import time

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mp_harness import REPO_ROOT, backend_under_test, run_with_deadline, run_world  # noqa: E402

BACKEND = backend_under_test()
DEMO = os.path.join(REPO_ROOT, "examples", "train_ddp.py")


@pytest.mark.parametrize("world", [2, 3])
def test_ddp_matches_gloo(world):
    results = run_world(world, "cases_ddp:ddp_vs_gloo", backend=BACKEND, timeout=180, args=(20,))
    failures = [f for r in results for f in r["failures"]]
    assert not failures, "\n".join(failures)
    for r in results:
        assert r["checks"] >= 2 * (8 + 2 + 2), r["checks"]  # variants x (state entries + gathers + loss)
        for variant, tr in r["losses"].items():
            assert len(tr["tested"]) == 20, variant


def test_demo_under_torchrun_loss_falls():
    steps, log_every = 60, 10
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           DEMO, "--backend", BACKEND, "--steps", str(steps), "--log-every", str(log_every),
           "--corpus-mb", "0.5", "--no-sample", "--timeout", "60"]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    if "smddp" in BACKEND:  # in-tree build of torch_smddp, after any installed one
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [env.get("PYTHONPATH"), REPO_ROOT]))
    t0 = time.monotonic()
    code, timed_out, text = run_with_deadline(cmd, timeout=150, env=env)
    elapsed = time.monotonic() - t0
    tail = "\n".join(text.splitlines()[-40:])
    assert not timed_out, f"demo hung (killed after {elapsed:.0f}s):\n{tail}"
    assert code == 0, f"demo exited {code}:\n{tail}"

    steps_seen = [(int(m.group(1)), float(m.group(2)))
                  for m in re.finditer(r"^step\s+(\d+)/\d+\s+loss\s+([\d.]+)", text, re.M)]
    assert [s for s, _ in steps_seen] == [1] + list(range(log_every, steps + 1, log_every)), \
        f"unexpected progress lines (only rank 0 may print):\n{tail}"
    m = re.search(r"^SUMMARY (.*)$", text, re.M)
    assert m, tail
    summary = dict(kv.split("=", 1) for kv in m.group(1).split())
    assert summary["backend"] == BACKEND and summary["world_size"] == "2", summary
    assert text.count("SUMMARY ") == 1, "more than one rank printed a summary"
    first, final, val = (float(summary[k]) for k in ("first_loss", "final_loss", "val_loss"))
    # Closed-form reference: an untrained model is close to a uniform guess
    # over the 96-symbol vocabulary; a learning one gets well below it.
    uniform = math.log(96)
    assert abs(first - uniform) < 0.5, f"first loss {first} is not near ln(96) = {uniform:.3f}"
    assert final < first - 1.0, f"loss did not fall enough: {first} -> {final}\n{tail}"
    assert val < first - 1.0, f"held-out loss {val} did not fall (first {first})"
    losses = [l for _, l in steps_seen]
    assert losses[-1] < losses[1] < losses[0], losses
    assert float(summary["samples_per_s"]) > 0
    print(f"\ndemo: {steps} steps, loss {first} -> {final} (held-out {val}), "
          f"{summary['samples_per_s']} samples/s, wall {elapsed:.1f}s")
