"""SMDDP_WIRE_ENCRYPT=1 on the peer wire between hosts, at world 4 as 2
pretend hosts x 2 ranks (SMDDP_HOST_ID, tcp;ofi_rxm on loopback): one job
runs every case of cases_wire_encrypt (each spawned rank costs a torch
import). Oracles: Gloo's all_reduce and closed forms of the same inputs;
for what was sealed, the bytes each rank sent its peer on the other host."""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mp_harness import backend_under_test, build_tool, run_world  # noqa: E402

pytestmark = pytest.mark.skipif("smddp" not in backend_under_test(),
                                reason="SMDDP_WIRE_ENCRYPT on the peer wire is an smddp feature")

P2P_BYTES = 200_003 * 4  # cases_wire_encrypt._point_to_point's n, f32


INTRUDER = build_tool("smddp_wire_intruder")


def test_encrypted_peer_wire_matches_oracles_and_seals_what_crosses_hosts_and_all_p2p():
    if not os.path.exists(INTRUDER):
        pytest.fail(f"{INTRUDER} is missing: build with `make build`")
    results = run_world(4, "cases_wire_encrypt:encrypted_world", args=(INTRUDER,), timeout=240,
                        env={"SMDDP_HOST_ID": lambda r: f"sealhost{r // 2}",
                             "SMDDP_WIRE_ENCRYPT": "1", "FI_TCP_IFACE": "lo"})
    for rank, res in enumerate(results):
        assert res["provider"] == "tcp;ofi_rxm", (rank, res["provider"])
        assert res["path"] == "shared-memory", (rank, res["path"])
        assert res["bad"] == [], (rank, res["bad"])
        # Exactly the payload sent to and received from the other host was
        # sealed and opened, then as much again within the host: a receive
        # from any rank must be able to prove its sender, so point-to-point
        # seals with every peer.
        assert res["counters"]["across"] == [P2P_BYTES, P2P_BYTES], (rank, res["counters"])
        assert res["counters"]["beside"] == [2 * P2P_BYTES, 2 * P2P_BYTES], (rank, res["counters"])
        # Every rank refuses the group whose rank 3 disagrees, by name.
        why = res["disagreeing"]
        assert "SMDDP_WIRE_ENCRYPT differs" in why and "rank 3 has 0" in why, (rank, why)
    # A forged frame that names rank 1 (rank 0's own host) is refused by a
    # receive from any rank, plain or in the sealed layout, naming rank 1:
    # before point-to-point sealed with every peer, the plain one was taken
    # as rank 1's message.
    forged = results[0]["forged"]
    for layout in ("plain", "sealed"):
        assert "accepted" not in forged[layout], (layout, forged)
        assert "rank 1" in forged[layout] and "SMDDP_WIRE_ENCRYPT" in forged[layout], (layout, forged)


TAMPER = build_tool("libsmddp_wire_tamper.so")


def test_a_frame_rewritten_on_the_wire_fails_its_call_when_sealed_and_not_otherwise(tmp_path):
    """Two live ranks on 2 pretend hosts, each one's sends through a
    one-byte rewrite on the way to the kernel (tests/cpp/wire_tamper_preload.cc,
    after the rank sealed them: an attacker on the path), in both
    directions. Oracle: the closed form of the inputs. Without
    SMDDP_WIRE_ENCRYPT the received tensor differs from what was sent in
    exactly one element: the rewrite reached the payload, unseen (the
    documented limit). With it, the receive fails naming the sender and the
    setting, and an allreduce fails on every rank: no rank returns a sum."""
    if not os.path.exists(TAMPER):
        pytest.fail(f"{TAMPER} is missing: build with `make build`")
    results = run_world(2, "cases_wire_encrypt:tampered_wire", args=(str(tmp_path),), timeout=180,
                        env={"SMDDP_HOST_ID": lambda r: f"tamperhost{r}",
                             "SMDDP_WIRE_ENCRYPT": "1", "FI_TCP_IFACE": "lo",
                             "SMDDP_TAMPER_ARM": lambda r: str(tmp_path / f"arm{r}")},
                        wrap={r: ["env", f"LD_PRELOAD={TAMPER}"] for r in range(2)})
    for sender in (0, 1):
        receiver = 1 - sender
        plain = f"p2p from {sender}, encrypt=0"
        sealed = f"p2p from {sender}, encrypt=1"
        for case in (plain, sealed, f"allreduce armed on {sender}"):
            assert results[sender][case][1] is True, (case, "the rewrite never went out", results)
        assert results[receiver][plain][0] == 1, (plain, results[receiver][plain])
        got = results[receiver][sealed][0]
        assert isinstance(got, str) and "integrity check" in got, (sealed, got)
        assert f"rank {sender}" in got and "SMDDP_WIRE_ENCRYPT" in got, (sealed, got)
        for rank in (0, 1):
            got = results[rank][f"allreduce armed on {sender}"][0]
            assert isinstance(got, str) and "Error" in got, (sender, rank, got)
        print(f"\nrewrite from rank {sender}: {results[receiver][sealed][0][:160]}")
