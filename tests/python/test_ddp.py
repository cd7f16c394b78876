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


def run_example(script, steps, log_every, extra=()):
    """`script` under the real torchrun at world 2 on the backend under
    test: its output, its SUMMARY line as a dict, and its progress lines'
    (step, loss), after checking that it ended on time, that only rank 0
    printed, and that its loss fell. Closed-form reference: an untrained
    model is close to a uniform guess over the 96-symbol vocabulary; a
    learning one gets well below it."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           script, "--backend", BACKEND, "--steps", str(steps), "--log-every", str(log_every),
           "--corpus-mb", "0.5", "--no-sample", "--timeout", "60", *extra]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    if "smddp" in BACKEND:  # in-tree build of torch_smddp, after any installed one
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [env.get("PYTHONPATH"), REPO_ROOT]))
    t0 = time.monotonic()
    code, timed_out, text = run_with_deadline(cmd, timeout=150, env=env)
    elapsed = time.monotonic() - t0
    tail = "\n".join(text.splitlines()[-40:])
    assert not timed_out, f"{script} hung (killed after {elapsed:.0f}s):\n{tail}"
    assert code == 0, f"{script} exited {code}:\n{tail}"

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
    uniform = math.log(96)
    assert abs(first - uniform) < 0.5, f"first loss {first} is not near ln(96) = {uniform:.3f}"
    assert final < first - 1.0, f"loss did not fall enough: {first} -> {final}\n{tail}"
    assert val < first - 1.0, f"held-out loss {val} did not fall (first {first})"
    losses = [l for _, l in steps_seen]
    assert losses[-1] < losses[1] < losses[0], losses
    assert float(summary["samples_per_s"]) > 0
    print(f"\n{os.path.basename(script)}: {steps} steps, loss {first} -> {final} (held-out {val}), "
          f"{summary['samples_per_s']} samples/s, wall {elapsed:.1f}s")
    return text, summary, steps_seen


def smddp_counts(text):
    """The example's count of smddp's calls by collective ({} off smddp)."""
    m = re.search(r"^smddp: (.*?); allreduce: .*?; all-gather and reduce-scatter: (.*)$", text, re.M)
    if not m:
        return {}, ""
    return {k: int(v) for k, v in (kv.split("=") for kv in m.group(1).split())}, m.group(2)


def test_demo_under_torchrun_loss_falls():
    text, summary, _ = run_example(DEMO, 60, 10)
    assert summary["parallel"] == "ddp", summary
    counts, _ = smddp_counts(text)
    if "smddp" in BACKEND:
        assert counts.get("allreduce", 0) >= 60, counts  # DDP's buckets, every step


def test_fsdp_demo_under_torchrun_loss_falls():
    """examples/train_fsdp.py: FSDP2 over the backend, its buffers from the
    process group. Its loss falls as the DDP demo's does (the closed form
    above), and under smddp its parameters and gradients went through
    smddp's all-gathers and reduce-scatters on one host's shared memory:
    at least one of each per step, each unit's once per forward."""
    steps = 30
    text, summary, _ = run_example(os.path.join(REPO_ROOT, "examples", "train_fsdp.py"), steps, 10)
    assert summary["parallel"] == "fsdp", summary
    if "smddp" in BACKEND:
        counts, path = smddp_counts(text)
        assert counts.get("allgather", 0) >= 3 * steps, counts  # 3 units, forward
        assert counts.get("reduce_scatter", 0) >= 3 * steps, counts  # 3 units, backward
        assert path.startswith("shared memory"), path
