"""SMDDP_WIRE_ENCRYPT=1 on the peer wire between hosts, at world 4 as 2
pretend hosts x 2 ranks (SMDDP_HOST_ID, tcp;ofi_rxm on loopback): one job
runs every case of cases_wire_encrypt (each spawned rank costs a torch
import). Oracles: Gloo's all_reduce and closed forms of the same inputs;
for what was sealed, the bytes each rank sent its peer on the other host."""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mp_harness import backend_under_test, run_world  # noqa: E402

pytestmark = pytest.mark.skipif("smddp" not in backend_under_test(),
                                reason="SMDDP_WIRE_ENCRYPT on the peer wire is an smddp feature")

P2P_BYTES = 200_003 * 4  # cases_wire_encrypt._point_to_point's n, f32


def test_encrypted_peer_wire_matches_oracles_and_seals_only_what_crosses_hosts():
    results = run_world(4, "cases_wire_encrypt:encrypted_world", timeout=240,
                        env={"SMDDP_HOST_ID": lambda r: f"sealhost{r // 2}",
                             "SMDDP_WIRE_ENCRYPT": "1", "FI_TCP_IFACE": "lo"})
    for rank, res in enumerate(results):
        assert res["provider"] == "tcp;ofi_rxm", (rank, res["provider"])
        assert res["path"] == "shared-memory", (rank, res["path"])
        assert res["bad"] == [], (rank, res["bad"])
        # Exactly the payload sent to and received from the other host was
        # sealed and opened; the exchange within the host added nothing.
        assert res["counters"]["across"] == [P2P_BYTES, P2P_BYTES], (rank, res["counters"])
        assert res["counters"]["beside"] == [P2P_BYTES, P2P_BYTES], (rank, res["counters"])
        # Every rank refuses the group whose rank 3 disagrees, by name.
        why = res["disagreeing"]
        assert "SMDDP_WIRE_ENCRYPT differs" in why and "rank 3 has 0" in why, (rank, why)
