"""FSDP2 (`torch.distributed.fsdp.fully_shard`) over the backend under test
($SMDDP_TEST_BACKEND, default "smddp"), checked against the same training run
over Gloo in the same job: 20 steps of a small transformer at world 2 and 3,
three variants (AVG reduce-scatter, PREMUL_SUM reduce-scatter, bf16 mixed
precision). Under smddp, the AVG run again with FSDP2's buffers from the
backend's allocate_tensor (the shared pool): bit for bit the same.
See cases_fsdp.py."""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mp_harness import backend_under_test, run_world  # noqa: E402


@pytest.mark.parametrize("world", [2, 3])  # 3: uneven shards on every rank
def test_fsdp2_matches_gloo(world):
    results = run_world(world, "cases_fsdp:run", backend=backend_under_test(), timeout=240)
    failures = [f for r in results for f in r["failures"]]
    assert not failures, "\n".join(failures)
    for r in results:
        assert r["checks"] > 3 * 20, r["checks"]
        for variant, losses in r["losses"].items():
            assert len(losses) == 20, variant
