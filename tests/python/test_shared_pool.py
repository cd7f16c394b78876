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


@pytest.mark.parametrize("world,stage_bytes,sizes", [
    (2, None, (2 << 20, 1 << 20, 1 << 19)),  # 8 and 4 MiB parts read in place, 2 MiB staged
    (3, None, (1 << 20,)),                   # three ranks: staged
    (2, 4 << 20, (2 << 20,)),                # 8 MiB parts in two 4 MiB pieces, each read in place
], ids=["2", "3", "2-pieces"])
def test_huge_page_parts_are_read_in_place(world, stage_bytes, sizes):
    """cases_shared_pool.huge_pages: with torch's allocator on huge pages
    (THP_MEM_ALLOC_ENABLE=1), world 2 reads its large private all-gather
    parts where they lie instead of staging them, each rank by its own
    part's pages; world 3 stages them."""
    env = {"THP_MEM_ALLOC_ENABLE": "1"}
    if stage_bytes:
        env["SMDDP_STAGE_BYTES"] = str(stage_bytes)
    results = run_world(world, "cases_shared_pool:huge_pages", args=(sizes,), env=env, timeout=120)
    for res in results:
        assert res["failures"] == [], res["failures"]
        assert res["cases"] >= 8 * len(sizes), res["cases"]
