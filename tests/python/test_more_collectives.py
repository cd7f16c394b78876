"""reduce_scatter, reduce, gather, scatter, all-to-all and coalesced variants
at world sizes 1-4: one job per world size, against Gloo and closed forms."""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mp_harness import backend_under_test, run_world  # noqa: E402


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_more_collectives(world):
    results = run_world(world, "cases_more_collectives:run", backend=backend_under_test(),
                        timeout=300)
    for rank, res in enumerate(results):
        assert res["failures"] == [], (rank, len(res["failures"]), res["failures"][:8])
        assert res["cases"] > 500, (rank, res["cases"])
