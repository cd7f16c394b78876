"""Sub-groups (new_group, new_subgroups, new_subgroups_by_enumeration) with
interleaved async collectives on overlapping groups, separate sequence
spaces, the "cpu:smddp" device spec, PREMUL_SUM, coalescing blocks and
batch_isend_irecv: one job at world 4, closed-form oracles. See
cases_surface.py.

    SMDDP_TEST_BACKEND=gloo pytest tests/python/test_surface.py   # groups part on gloo
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mp_harness import backend_under_test, run_world  # noqa: E402

BACKEND = backend_under_test()


def test_surface_world4():
    backend = "cpu:smddp" if BACKEND == "smddp" else BACKEND
    results = run_world(4, "cases_surface:run", backend=backend, timeout=240)
    for rank, res in enumerate(results):
        assert res["failures"] == [], (rank, len(res["failures"]), res["failures"][:8])
        assert res["cases"] > (100 if "smddp" in backend else 25), (rank, res["cases"])
