"""The stand-in as a torch device: with SMDDP_TEST_SIM_TORCH_DEVICE=1 every
rank's tensors live on "privateuseone:<rank>" (torch_smddp.testing.
sim_torch_device), whose ops are kernels on the simulated streams and whose
futures carry the simulated events. The device path then completes a call
through the same code as for CUDA (csrc/backend/device_future.h), and c10's
own future code (Future::markCompleted's events, wait()'s stream wait,
then()'s callback streams) runs on the stand-in. Copies back are slowed, so
a result read without that ordering is stale.

Oracles: closed forms, and the same training over Gloo on the CPU.
"""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mp_harness import run_world  # noqa: E402
from test_device_sim import SIM, TWO_BY_TWO  # noqa: E402

TORCH_DEVICE = dict(SIM, SMDDP_TEST_SIM_TORCH_DEVICE="1", SMDDP_DEVICE_SIM_OUT_DELAY_US="3000")


@pytest.mark.parametrize("world,intra", [(2, "shm"), (4, "nccl")])
def test_results_read_through_work_and_future_are_ordered_behind_the_copies_back(world, intra):
    """World 2 on one host's staging route; world 4 as 2 hosts x 2 GPUs on
    the intra-host NCCL route (the stand-in's NCCL)."""
    env = dict(TORCH_DEVICE, SMDDP_INTRA=intra)
    if world == 4:
        env.update(TWO_BY_TWO)
    results = run_world(world, "cases_sim_torch_device:futures", backend="smddp", timeout=180,
                        env=env)
    for rank, r in enumerate(results):
        assert r["failures"] == [], (rank, r["failures"][:8])
        assert r["device"] == f"privateuseone:{rank}", r
        assert r["device_calls"] > 0, r
        assert r["intra_route"] == intra, r


@pytest.mark.parametrize("world,intra", [(2, "shm"), (4, "nccl")])
def test_ddp_on_the_torch_device_matches_gloo_without_host_ordering(world, intra):
    # No SMDDP_DEVICE_SIM_HOST_ORDER: DDP's reads are ordered by streams
    # and the future's events alone. World 4: 2 hosts x 2 GPUs on the
    # intra-host NCCL route.
    env = dict(TORCH_DEVICE, SMDDP_INTRA=intra)
    if world == 4:
        env.update(TWO_BY_TWO)
    results = run_world(world, "cases_sim_torch_device:ddp", backend="smddp", timeout=300,
                        args=(6,), env=env)
    failures = [f for r in results for f in r["failures"]]
    assert not failures, "\n".join(failures)
    assert [r["intra_route"] for r in results] == [intra] * world, results


def test_fsdp2_on_the_torch_device_matches_gloo():
    """FSDP2 all-gathers on a stream of its own and waits for it with
    events, and reduce-scatters on another: the device path's readiness
    events and copies back must follow those streams."""
    results = run_world(2, "cases_sim_torch_device:fsdp", backend="smddp", timeout=300,
                        env=TORCH_DEVICE)
    failures = [f for r in results for f in r["failures"]]
    assert not failures, "\n".join(failures)
    for r in results:
        assert r["checks"] > 3 * 20, r["checks"]
