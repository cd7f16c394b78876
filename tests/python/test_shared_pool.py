"""allocate_tensor's pool at its limits (cases_shared_pool.limits): a 1 MiB
pool hands out a 2 MiB tensor privately, SMDDP_SHARED_POOL_BYTES=0 gives no
pool at all; where each tensor lies is read from /proc/self/maps, and the
all-gathers on both kinds are checked against the closed form. The pool in
use, at every world size and across hosts, is in cases_shared_pool.pooled
(test_host_collectives, test_cluster_gather)."""

import pytest

from mp_harness import run_world


@pytest.mark.parametrize("pool_bytes", [1 << 20, 0])
def test_pool_limits(pool_bytes):
    results = run_world(2, "cases_shared_pool:limits", args=(pool_bytes,),
                        env={"SMDDP_SHARED_POOL_BYTES": str(pool_bytes)}, timeout=120)
    for res in results:
        assert res["failures"] == [], res["failures"]
        assert res["cases"] >= 7, res["cases"]
