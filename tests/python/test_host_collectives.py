"""All-gather and reduce-scatter through the host segment (all-gather
through each rank's ring once a rank receives 4 MiB at world 3 and up,
the rest reading the peers' buffers): one job per world size, against Gloo, the
network path and this path's own out-of-place results (cases_host_collectives).
Private inputs are staged in the poster's shared pool; the job without a
pool (SMDDP_SHARED_POOL_BYTES=0) reads them where they lie, and its inputs
that overlap an output are read from private snapshots instead of staged
copies. The job with SMDDP_STAGE_BYTES=1M runs the calls that would stage
more in pieces (cases_pieces), every case of the other jobs included."""

import pytest

from mp_harness import run_world


@pytest.mark.parametrize("world,env", [(2, None), (3, None), (4, None),
                                       (3, {"SMDDP_SHARED_POOL_BYTES": "0"}),
                                       (3, {"SMDDP_STAGE_BYTES": "1048576"})],
                         ids=["2", "3", "4", "3-no-pool", "3-pieces"])
def test_host_collectives(world, env):
    results = run_world(world, "cases_host_collectives:run", timeout=300, env=env)
    for rank, res in enumerate(results):
        assert res["failures"] == [], (rank, len(res["failures"]), res["failures"][:8])
        assert res["cases"] > 400, (rank, res["cases"])


@pytest.mark.parametrize("which", ["first", "warm"])
def test_a_rank_ending_its_process_right_after_a_small_all_gather(which):
    """cases_eager.exit_right_after: rank 2 calls os._exit as soon as an
    all-gather returns on it (a group's first, or one that left early);
    the others' results are still whole (against the closed form)."""
    results = run_world(3, "cases_eager:exit_right_after", timeout=90, pg_timeout=8.0,
                        expect_failure=True, allow_exit={2}, args=(2, which))
    for r in results[:2]:
        assert r["ok"] and r["warm_ok"], results
        # The survivors' own last call left early once warm, and waited
        # as the group's first.
        assert r["left_early"] == (1 if which == "warm" else 0), results
