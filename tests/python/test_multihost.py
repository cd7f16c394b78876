"""Ranks on one machine split into pretend hosts (SMDDP_HOST_ID): they must
pick tcp;ofi_rxm, as separate hosts would, and still match Gloo."""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mp_harness import backend_under_test, run_world  # noqa: E402

pytestmark = pytest.mark.skipif("smddp" not in backend_under_test(),
                                reason="SMDDP_HOST_ID is an smddp feature")


# What smddp sets for rxm over tcp unless the user did (transport/fabric.cc).
RXM_DEFAULTS = {"FI_OFI_RXM_EAGER_LIMIT": "262144", "FI_OFI_RXM_ENABLE_DIRECT_SEND": "1",
                "FI_OFI_RXM_MSG_RX_SIZE": "16"}
NO_RXM_ENV = dict.fromkeys(RXM_DEFAULTS)  # run_world drops None-valued variables


def _network_path_matches_gloo(world, host_of, env=None, rxm_env=RXM_DEFAULTS, ring_depth=2):
    results = run_world(world, "cases_multihost:provider_and_collectives", timeout=240,
                        env={"SMDDP_HOST_ID": host_of, **NO_RXM_ENV, **(env or {})})
    for rank, res in enumerate(results):
        assert res["rxm_env"] == rxm_env, (rank, res["rxm_env"])
        # The network path's receive ring: 2 per peer across hosts unless set.
        assert res["ring_depth"] == ring_depth, (rank, res["ring_depth"])
        assert res["provider"] == "tcp;ofi_rxm", (rank, res["provider"])
        assert res["allreduce_path"] == "tcp;ofi_rxm", (rank, res["allreduce_path"])
        assert res["closed_form_ok"], rank
        assert res["failures"] == [], (rank, res["failures"][:10])
        assert res["cases"] > 300, (rank, res["cases"])
        # Overlapping async calls in call order; f16/bf16 rounded once.
        assert res["call_order_bad"] == [], (rank, res["call_order_bad"])
        assert res["half"]["bad"] == [], (rank, res["half"])


def test_pretend_hosts_use_tcp_and_match_gloo():
    # hosts of 2 and 1 ranks: uneven, so allreduce takes the network path;
    # an rxm setting the user made is kept, the other gets smddp's default
    _network_path_matches_gloo(3, lambda rank: f"host{rank % 2}",
                               env={"FI_OFI_RXM_EAGER_LIMIT": "65536"},
                               rxm_env={**RXM_DEFAULTS, "FI_OFI_RXM_EAGER_LIMIT": "65536"})


def test_one_rank_per_host_takes_the_network_path_and_matches_gloo():
    # 2 hosts x 1 rank: a host segment of one rank would only copy; the
    # network-only path (fusing too) carries the same bytes across.
    _network_path_matches_gloo(2, lambda rank: f"solo{rank}")


def test_a_ring_depth_the_user_set_is_kept_across_hosts():
    _network_path_matches_gloo(2, lambda rank: f"solo{rank}", env={"SMDDP_RING_DEPTH": "5"},
                               ring_depth=5)


def test_two_pretend_hosts_reduce_hierarchically_and_match_gloo():
    # 2 hosts x 2 ranks: each host reduces through its shared segment, then
    # the hosts' reduction servers combine the partials over tcp;ofi_rxm.
    results = run_world(4, "cases_multihost:provider_and_collectives", timeout=240,
                        env={"SMDDP_HOST_ID": lambda rank: f"host{rank // 2}", **NO_RXM_ENV})
    for rank, res in enumerate(results):
        assert res["provider"] == "tcp;ofi_rxm", (rank, res["provider"])
        assert res["rxm_env"] == RXM_DEFAULTS, (rank, res["rxm_env"])
        assert res["allreduce_path"] == "shared-memory", (rank, res["allreduce_path"])
        assert res["closed_form_ok"], rank
        assert res["failures"] == [], (rank, res["failures"][:10])
        # Overlapping async calls, fused across hosts, keep call order.
        assert res["call_order_bad"] == [], (rank, res["call_order_bad"])
        # Host partials stay f32: one rounding, which these inputs tell
        # apart from rounding each host's partial.
        assert res["half"]["bad"] == [], (rank, res["half"])
        assert all(d > 0 for d in res["half"]["double_rounding_differs"].values()), res["half"]


def test_calls_fuse_across_pretend_hosts_without_deadlock():
    # 2 hosts x 2 ranks: rank 0 cuts every fusion buffer for both hosts, and
    # only from calls every rank has issued. Skewed async calls must fuse on
    # every rank and match closed forms; ranks that wait on each call while
    # rank 0 queues them all must finish (timeout 30 s, far above the ~1 s
    # the job takes).
    results = run_world(4, "cases_engine:engine_across_hosts", timeout=120, pg_timeout=30,
                        env={"SMDDP_HOST_ID": lambda rank: f"host{rank // 2}"})
    for rank, res in enumerate(results):
        skew = res["skew"]
        assert skew["bad"] == [], (rank, skew["bad"][:10])
        st = skew["stats"]
        assert st["allreduce_path"] == "shared-memory", st
        assert st["fused_calls"] > st["fusion_buffers_flushed"], (rank, st)
        sa = res["sync_async"]
        assert sa["bad"] == [], (rank, sa["bad"][:10])
        assert sa["seconds"] < 20, (rank, sa["seconds"])


def test_same_host_uses_shm():
    results = run_world(2, "cases_multihost:provider_and_collectives", timeout=240,
                        env=NO_RXM_ENV)
    assert [r["provider"] for r in results] == ["shm", "shm"]
    # Set before the first fi_getinfo whatever the provider: rxm reads
    # FI_OFI_RXM_MSG_RX_SIZE when libfabric loads it (transport/fabric.cc).
    assert all(r["rxm_env"] == RXM_DEFAULTS for r in results), results
    assert [r["allreduce_path"] for r in results] == ["shared-memory"] * 2
    assert [r["ring_depth"] for r in results] == [4, 4]  # one host: the cache-resident ring
    assert all(r["closed_form_ok"] and r["failures"] == [] for r in results)
    for rank, res in enumerate(results):
        # Overlapping async calls fused on one host keep call order.
        assert res["call_order_bad"] == [], (rank, res["call_order_bad"])
        assert res["half"]["bad"] == [], (rank, res["half"])


def test_hosts_keep_many_network_steps_in_flight():
    # 2 hosts x 2 ranks, 4 KiB slots and a ring of 2: a 1 MiB allreduce
    # takes 128 steps per server, several in flight between the hosts at
    # once, every result slot reused again and again. Exact host-order
    # folds, bitwise, for every dtype, op, size and fused batch.
    results = run_world(4, "cases_multihost:pipelined_steps", timeout=240,
                        env={"SMDDP_HOST_ID": lambda rank: f"host{rank // 2}",
                             "SMDDP_SHM_SLOT_BYTES": "4096", "SMDDP_SHM_DEPTH": "2"})
    for rank, res in enumerate(results):
        assert res["path"] == "shared-memory", (rank, res["path"])
        assert res["bad"] == [], (rank, res["bad"])
        assert res["cases"] == 29, (rank, res["cases"])


@pytest.mark.parametrize("hosts,per_host", [(2, 2), (3, 1)], ids=["2x2", "3x1"])
def test_a_group_can_cross_hosts_in_bf16_and_stays_within_the_bound(hosts, per_host):
    # docs/design.md, "Compression between hosts": only the group made with
    # torch_smddp.Options(cross_host_dtype="bf16") narrows; the bound and the
    # bytes are checked against Gloo's f64 sum of the same inputs. 2 x 2
    # narrows in the hierarchy, 3 x 1 on the network-only path.
    results = run_world(hosts * per_host, "cases_multihost:compressed_group", timeout=240,
                        env={"SMDDP_HOST_ID": lambda rank: f"host{rank // per_host}"})
    for rank, res in enumerate(results):
        assert (res["narrow_path"] == "shared-memory") == (per_host > 1), (rank, res["narrow_path"])
        assert res["fp32_within_f32_bound"] and res["fp32_not_representable"], rank
        assert res["bf16_representable"], rank
        assert res["bf16_within_bound"], rank
        assert res["bf16_error_seen"] > 0.05, (rank, res["bf16_error_seen"])
        assert res["same_bytes_everywhere"], rank
        for a, b in zip(res["loss_gloo"], res["loss_bf16"]):
            assert abs(a - b) <= 0.02 * abs(a) + 1e-4, (rank, res["loss_gloo"], res["loss_bf16"])
        assert res["loss_bf16"][-1] < 0.7 * res["loss_bf16"][0], (rank, res["loss_bf16"])
        assert "cross_host_dtype='fp8' is not a cross-host dtype" in res["bad_value"], res
        assert "torch_smddp.Options" in res["bad_type"], res
