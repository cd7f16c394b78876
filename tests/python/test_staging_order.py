"""Call order for staged inputs: every collective whose input is a
non-contiguous view (or a PREMUL_SUM-scaled copy) of memory an earlier
queued call writes reads that call's result (cases_staging_order.py), on
the shared-memory and the network-only allreduce paths."""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mp_harness import backend_under_test, run_world  # noqa: E402


@pytest.mark.parametrize("world,path", [(2, "shm"), (3, "shm"), (2, "network")])
def test_staged_inputs_keep_call_order(world, path):
    env = {"SMDDP_SHM_ALLREDUCE": "0" if path == "network" else "1"}
    results = run_world(world, "cases_staging_order:run", backend=backend_under_test(),
                        timeout=240, env=env)
    for rank, res in enumerate(results):
        assert res["failures"] == [], (rank, res["failures"])
        assert res["cases"] >= 17, (rank, res["cases"])
