"""All-gather and reduce-scatter through the host segment (all-gather
through each rank's ring once a rank receives 4 MiB at world 3 and up,
the rest reading the peers' buffers): one job per world size, against Gloo, the
network path and this path's own out-of-place results (cases_host_collectives)."""

import pytest

from mp_harness import run_world


@pytest.mark.parametrize("world", [2, 3, 4])
def test_host_collectives(world):
    results = run_world(world, "cases_host_collectives:run", timeout=300)
    for rank, res in enumerate(results):
        assert res["failures"] == [], (rank, len(res["failures"]), res["failures"][:8])
        assert res["cases"] > 400, (rank, res["cases"])
