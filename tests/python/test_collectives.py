"""Collectives of the backend under test, checked against Gloo and closed forms.

Backend: $SMDDP_TEST_BACKEND (default "smddp"). To validate the harness
without the C++ backend:  SMDDP_TEST_BACKEND=gloo pytest tests/python
$SMDDP_TEST_STRICT_ORDER=1/0 forces the bitwise rank-order check on/off
(default: on for smddp, off otherwise, since Gloo's ring does not reduce in
rank order). $SMDDP_TEST_QUICK=1 trims the larger sizes.

Each world size is ONE multi-process job that runs every case; per-case
failures come back as a list, so a single run reports all of them.
"""

import os
import re
import time

import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mp_harness import backend_under_test, run_world  # noqa: E402

BACKEND = backend_under_test()
WORLD_SIZES = [1, 2, 3, 4]
JOB_TIMEOUT = float(os.environ.get("SMDDP_TEST_TIMEOUT", "240"))


def _strict_order():
    v = os.environ.get("SMDDP_TEST_STRICT_ORDER")
    return None if v is None else v not in ("0", "", "false", "no")


def _minimum_counts(world, quick):
    """Lower bounds on the number of cases per family: a family that silently
    stops running (e.g. a loop edited away) fails the test."""
    n_sizes = 6 if quick else 9
    return {
        "all_reduce": (4 * 5 + 4 * 7 + 7) * n_sizes,  # dtype x op x size, at least
        "broadcast": world * 9 * 5,
        "all_gather": 9 * 5,
        "all_gather_into_tensor": 9 * 5,
        "coalesced_all_reduce_coalesced": 16,
        "coalesced_coalescing_manager": 16,
        "barrier": world,
        "strided": 12,
        "async_pipeline": 1,
        "cross_rank": 1,
    }


@pytest.mark.parametrize("world", WORLD_SIZES)
def test_collectives_vs_gloo(world):
    quick = os.environ.get("SMDDP_TEST_QUICK", "") not in ("", "0")
    t0 = time.monotonic()
    results = run_world(world, "cases_collectives:collectives_vs_gloo", backend=BACKEND,
                        timeout=JOB_TIMEOUT, args=(BACKEND, _strict_order(), quick))
    elapsed = time.monotonic() - t0
    assert len(results) == world
    failures = [f for r in results for f in r["failures"]]
    assert not failures, f"{len(failures)} failing checks (world {world}):\n" + "\n".join(failures[:80])
    for r in results:
        assert r["cases"] == results[0]["cases"], "ranks ran different numbers of cases"
        for family, minimum in _minimum_counts(world, quick).items():
            assert r["counts"].get(family, 0) >= minimum, (family, r["counts"])
        assert r["async_checked"] >= 50, "too few async (future) checks ran"
    print(f"\nworld {world}: {results[0]['cases']} cases/rank in {elapsed:.1f}s; "
          f"strict_order={results[0]['strict_order']}; gloo refused: {results[0]['gloo_refused']}; "
          f"refused by both: {results[0]['both_refused']}; skipped: {results[0]['skipped']}")
    if "gloo" not in BACKEND:
        assert not results[0]["skipped"], results[0]["skipped"]


# Expected messages for rejected calls, per backend. For smddp they follow the
# core's wording (csrc/common/dtype.cc isSupported) and name the op or dtype.
_BAD_MESSAGES = {
    "smddp": {
        "all_reduce int32 AVG": r"AVG",
        "all_reduce bool AVG": r"AVG",
        "all_reduce float32 BAND": r"bitwise|BAND",
        "all_reduce float16 BXOR": r"bitwise|BXOR",
        "all_reduce bfloat16 BOR": r"bitwise|BOR",
        "all_reduce int16 SUM": r"int16|Short|dtype|type",
        "all_reduce int32 PREMUL_SUM": r"PREMUL_SUM.*floating",
        "broadcast root=world": r"root",
        "all_gather_into_tensor wrong output size": r"size|numel|shape",
        "all_gather wrong list length": r"length|size|world",
        "all_gather wrong slot size": r"size|numel|shape",
    },
    "gloo": {  # observed with torch 2.13
        "all_reduce int32 AVG": r"can't be cast",
        "all_reduce bool AVG": r"can't be cast",
        "all_reduce float32 BAND": r"BAND with non-integral",
        "all_reduce float16 BXOR": r"BXOR with non-integral",
        "all_reduce bfloat16 BOR": r"BOR with non-integral",
        "all_reduce int16 SUM": r"Invalid scalar type",
        "all_reduce int32 PREMUL_SUM": r"PREMUL_SUM",
        "broadcast root=world": r"invalid root rank",
        "all_gather_into_tensor wrong output size": r"invalid tensor size",
        "all_gather wrong list length": r"invalid output tensor list",
        "all_gather wrong slot size": r"invalid tensor size",
    },
}


@pytest.mark.parametrize("world", [2, 3])
def test_bad_inputs_are_rejected(world):
    results = run_world(world, "cases_collectives:bad_inputs", backend=BACKEND, timeout=90,
                        expect_failure=True)
    key = "smddp" if "smddp" in BACKEND else BACKEND
    patterns = _BAD_MESSAGES.get(key, {})
    for rank, res in enumerate(results):
        assert set(res) == set(_BAD_MESSAGES["gloo"]), sorted(res)
        for name, info in res.items():
            msg = info["message"]
            assert msg.strip(), (rank, name)
            if name in patterns:
                assert re.search(patterns[name], msg, re.I), \
                    f"rank {rank}: '{name}' raised {msg!r}, expected /{patterns[name]}/"
            # smddp validates before touching data (gloo's int AVG sums first,
            # then fails to divide, leaving the sum behind).
            if key != "gloo":
                assert info["input_unchanged"], f"rank {rank}: '{name}' modified its input before failing"


# ---------------------------------------------------------------------------
# the harness itself (always on gloo: these test the launcher, not a backend)
# ---------------------------------------------------------------------------

def test_harness_returns_per_rank_results():
    res = run_world(3, "cases_collectives:selftest_echo", backend="gloo", timeout=60, args=("tok",),
                    env={"SMDDP_HARNESS_TEST_VAR": "42"})
    assert [r["rank"] for r in res] == [0, 1, 2]
    assert all(r["world"] == 3 and r["token"] == "tok" and r["sum"] == 3.0 for r in res)
    assert all(r["env"] == "42" and r["local_rank"] == str(i) for i, r in enumerate(res)), res
    assert res[0]["backend"] == "gloo"


def test_harness_reports_child_exception_fast():
    t0 = time.monotonic()
    with pytest.raises(AssertionError) as ei:
        run_world(2, "cases_collectives:selftest_raise", backend="gloo", timeout=60, args=(1,),
                  keep_logs=False)
    elapsed = time.monotonic() - t0
    text = str(ei.value)
    assert "boom from rank 1" in text and "ValueError" in text, text
    assert "rank 0:" in text and "rank 1:" in text, text
    # rank 0 sat in a barrier; the harness must not wait for the deadline
    assert elapsed < 30, f"took {elapsed:.1f}s: the failing rank did not end the job"
    # keep_logs=False: the job's directory, which the report names, is gone
    logs = re.findall(r"stderr tail \((\S+)\)", text)
    assert logs and not any(os.path.exists(os.path.dirname(p)) for p in logs), logs


def test_harness_kills_hung_job_and_its_children(tmp_path):
    t0 = time.monotonic()
    with pytest.raises(AssertionError) as ei:
        run_world(2, "cases_collectives:selftest_hang", backend="gloo", timeout=10,
                  args=(str(tmp_path),), keep_logs=False)
    elapsed = time.monotonic() - t0
    text = str(ei.value)
    assert "hard timeout" in text, text
    assert elapsed < 10 + 12, elapsed
    # faulthandler dumped the stuck stacks into the stderr tail
    assert "selftest_hang" in text, text
    pids = []
    for rank in range(2):
        pids += [int(p) for p in (tmp_path / f"pids.{rank}").read_text().split()]
    time.sleep(0.2)
    for pid in pids:
        assert not _alive(pid), f"pid {pid} survived the harness kill"


def _alive(pid):
    """Running (a zombie waiting for a reaper counts as dead)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")
