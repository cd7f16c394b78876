"""Ranks on one machine split into pretend hosts (SMDDP_HOST_ID): they must
pick tcp;ofi_rxm, as separate hosts would, and still match Gloo."""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mp_harness import backend_under_test, run_world  # noqa: E402

pytestmark = pytest.mark.skipif("smddp" not in backend_under_test(),
                                reason="SMDDP_HOST_ID is an smddp feature")


def test_pretend_hosts_use_tcp_and_match_gloo():
    results = run_world(3, "cases_multihost:provider_and_collectives", timeout=240,
                        env={"SMDDP_HOST_ID": lambda rank: f"host{rank % 2}"})
    for rank, res in enumerate(results):
        assert res["provider"] == "tcp;ofi_rxm", (rank, res["provider"])
        assert res["closed_form_ok"], rank
        assert res["failures"] == [], (rank, res["failures"][:10])
        assert res["cases"] > 300, (rank, res["cases"])


def test_same_host_uses_shm():
    results = run_world(2, "cases_multihost:provider_and_collectives", timeout=240)
    assert [r["provider"] for r in results] == ["shm", "shm"]
    assert all(r["closed_form_ok"] and r["failures"] == [] for r in results)
