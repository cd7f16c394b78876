"""The GPU path on a machine with a CUDA device: every collective on CUDA
tensors (against Gloo and the same smddp collective on CPU tensors), the
caller's stream semantics, DDP and FSDP2 against Gloo. World 2 with both
ranks on cuda:0. The child side is cases_gpu.py; all sections run in one
job (spawning costs seconds per rank) and each test checks one section.

Run with `make test-gpu` (the CUDA build of torch_smddp and .venv-cuda).
"""

import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python", "harness"))
from mp_harness import backend_under_test, run_world  # noqa: E402

import torch  # noqa: E402

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="no CUDA device here (torch.cuda.is_available() is False): the GPU path's tests need one")

BACKEND = backend_under_test()
WORLD = 2
# SMDDP_GPU_TEST_TIMEOUT bounds every job here (a device lent for minutes).
JOB_TIMEOUT = float(os.environ.get("SMDDP_GPU_TEST_TIMEOUT", "600"))


@pytest.fixture(scope="module")
def results():
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [HERE, os.environ.get("PYTHONPATH")]))}
    return run_world(WORLD, "cases_gpu:run_all", backend=BACKEND, timeout=JOB_TIMEOUT, env=env)


def _section(results, name):
    failures = [f for r in results for f in r[name]["failures"]]
    assert not failures, f"{len(failures)} failing checks in {name}:\n" + "\n".join(failures[:60])
    for r in results:
        assert r[name]["counts"] == results[0][name]["counts"], "ranks ran different cases"
    print(f"\n{name}: {results[0][name]['counts']} in {results[0][name]['seconds']} s")
    return [r[name] for r in results]


def test_collectives_on_cuda_tensors(results):
    sections = _section(results, "collectives")
    counts = sections[0]["counts"]
    # Every family ran every case (a case that raised is a failure above).
    floats, ints = 3, 1
    assert counts.get("all_reduce") == (floats * 6 + ints * 7) * 6, counts
    assert counts.get("reduce_scatter") == (floats * 6 + ints * 7) * 4, counts
    for family in ("broadcast", "all_gather", "all_to_all", "rooted", "send_recv"):
        assert counts.get(family) == 4 * 4, (family, counts)
    assert counts.get("coalesced") == 4 and counts.get("barrier") == 1, counts
    # The Gloo oracle did run (on CUDA tensors or CPU copies), not only smddp's CPU path.
    gloo_on = sections[0]["gloo_on"]
    assert gloo_on.get("cuda", 0) + gloo_on.get("cpu", 0) > 0, gloo_on
    print(f"gloo reference ran on: {gloo_on}")


def test_caller_stream_semantics(results):
    sections = _section(results, "streams")
    assert sections[0]["counts"] == {"default_stream": 1, "side_stream": 1, "future_then": 1,
                                     "many_in_flight": 1}
    print("timings:", [s["timings"] for s in sections])


def test_the_gpu_paths_defects_stay_fixed(results):
    """A coalesced 256 MiB block read at once after wait(), a CUDA tensor
    PREMUL_SUM factor, capture refused by name, a group destroyed before
    its tensors are freed, a barrier that orders device work."""
    sections = _section(results, "defects")
    assert sections[0]["counts"] == {"coalesced_256m": 1, "tensor_factor": 1, "capture": 1,
                                     "destroy_then_free": 1, "barrier_orders": 1}


@pytest.mark.parametrize("env", [{"CUDA_DEVICE_MAX_CONNECTIONS": "1"}, {"CUDA_LAUNCH_BLOCKING": "1"}],
                         ids=["one_connection", "launch_blocking"])
def test_isend_irecv_rings_in_any_order(env):
    env = dict(env, PYTHONPATH=os.pathsep.join(filter(None, [HERE, os.environ.get("PYTHONPATH")])))
    results = run_world(WORLD, "cases_gpu_defects:p2p_rings", backend=BACKEND, timeout=min(300, JOB_TIMEOUT), env=env)
    failures = [f for r in results for f in r["failures"]]
    assert not failures, failures


def test_a_killed_peer_fails_the_synchronous_call():
    from mp_harness import ExitedRank
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [HERE, os.environ.get("PYTHONPATH")]))}
    results = run_world(WORLD, "cases_gpu_defects:killed_peer", backend=BACKEND, timeout=min(120, JOB_TIMEOUT), pg_timeout=60.0,
                        expect_failure=True, allow_exit={1}, args=(1,), env=env)
    assert isinstance(results[1], ExitedRank)
    assert results[0]["raised"], results[0]
    assert "rank 1" in results[0]["msg"], results[0]
    assert results[0]["kept_input"], results[0]


def test_ddp_on_cuda_matches_gloo(results):
    _section(results, "ddp")


def test_fsdp2_on_cuda_matches_gloo(results):
    sections = _section(results, "fsdp")
    print("fsdp reference:", sections[0]["reference"])
