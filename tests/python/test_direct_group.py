"""A ProcessGroupSmddp made directly: create, use and delete it with calls
still queued, make another (the same name again, then a new one), and leave
a last one alive at interpreter exit. Every rank must exit 0 within the
hard deadline (mp_harness kills hung ranks and fails the test)."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mp_harness import run_world  # noqa: E402


def test_delete_and_recreate_a_directly_made_group(tmp_path):
    store = str(tmp_path / "store")
    # The world group is gloo: only the directly made groups are smddp.
    results = run_world(2, "cases_direct_group:create_use_delete", backend="gloo",
                        timeout=120, args=(store,))
    for rank, res in enumerate(results):
        assert res["errors"] == [], (rank, res["errors"])
        assert len(res["del_seconds"]) == 3, (rank, res)
