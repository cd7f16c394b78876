"""smddp inside torchft (docs/fault-tolerance.md, "Under torchft").

- torchft's own tests, shipped in its wheel, that are written for its Gloo
  wrapper, run with torch_smddp.torchft.ProcessGroupSmddp in its place
  (torchft_suite.py): the collectives of process_group_test.py (three
  ranks as threads of one process), the DDP, recovery and quorum tests of
  manager_integ_test.py, and the LocalSGD and DiLoCo tests of
  local_sgd_integ_test.py. Their oracles are torchft's: closed forms, and
  replicas ending with the same state. Two tests whose expected messages
  are Gloo's wording, and one with a race of its own, run as adapted
  copies (torchft_adapted.py says what changed). The tests left out, and why, are listed in tests/README.md.
- The wrapper's own contract: abort() stops a group still forming; the
  wrapper forms again afterwards; errored() before and after an abort.

All of it runs in child processes under hard deadlines.
"""

import importlib.util
import json
import os
import sys

import pytest

from mp_harness import REPO_ROOT, WORKERS, backend_under_test, run_with_deadline, run_world, worker

pytestmark = [
    pytest.mark.skipif("smddp" not in backend_under_test(), reason="smddp's torchft wrapper"),
    pytest.mark.skipif(importlib.util.find_spec("torchft") is None,
                       reason="torchft is not installed (pip install 'torch-smddp[ft]'; "
                              "make test installs it)"),
]

# MODULE:TEST_ID_REGEX for torchft_suite.py. The CPU variants; CUDA ones
# skip themselves without a GPU, torchcomms ones without torchcomms.
SELECTION = [
    r"process_group_test:ProcessGroupTest\.test_(gloo_apis_0_cpu|functional_collectives)$",
    r"process_group_test:NormalGlooMultiPgTest\.test_collective_\d",
    r"torchft_adapted",
    r"manager_integ_test:ManagerIntegTest\.test_(ddp_healthy$|ddp_recovery_\d"
    r"|ddp_recovery_multi_rank|quorum_timeout|manager_allreduce_1)",
    r"local_sgd_integ_test:LocalSGDIntegTest\.test_(local_sgd_recovery_0|diloco_healthy_0"
    r"|diloco_recovery_0|streaming_diloco_recovery_0|streaming_diloco_commit_failure_00"
    r"|streaming_diloco_upscale_00)$",
]
EXPECTED_TESTS = 8 + 10 + 6 + 6 + 2  # collectives, adapted, manager, LocalSGD/DiLoCo, ProcessGroupTest
SUITE_DEADLINE_S = 240


def test_torchfts_own_tests_pass_with_smddp_in_glooss_place(tmp_path):
    out = str(tmp_path / "results.json")
    env = dict(os.environ, SMDDP_TORCHFT_SUITE_DEADLINE=str(SUITE_DEADLINE_S),
               PYTHONPATH=os.pathsep.join([WORKERS, REPO_ROOT, os.environ.get("PYTHONPATH", "")]))
    code, timed_out, text = run_with_deadline(
        [sys.executable, worker("torchft_suite.py"), out, *SELECTION],
        SUITE_DEADLINE_S, env)
    try:
        with open(out) as f:
            results = json.load(f)
    except (OSError, ValueError):
        results = {}
    groups = results.pop("smddp_groups", 0)
    # A crash: what the runner printed around it (faulthandler's header and
    # the test that ran), else the end of its output.
    at = min([i for i in (text.find("Fatal Python error"), text.find("terminate called"))
              if i >= 0], default=-1)
    tail = text[max(0, at - 3000):at + 3000] if at >= 0 else text[-6000:]
    assert not timed_out, f"torchft's tests hung past {SUITE_DEADLINE_S} s:\n{tail}"
    assert code == 0, f"the suite runner exited {code}:\n{tail}"
    failed = {k: v for k, v in results.items() if v != "pass"}
    assert not failed, "\n\n".join(f"{k}: {v}" for k, v in failed.items())
    assert len(results) == EXPECTED_TESTS, sorted(results)
    # They ran on smddp: every test forms groups (the collectives' class
    # one, each resiliency run, every quorum of every replica).
    assert groups >= 40, groups


def test_abort_stops_a_forming_group_and_the_wrapper_forms_again():
    (res,) = run_world(1, "cases_torchft:abort_while_forming", timeout=120)
    assert "aborted" in res["forming_raised"], res
    assert res["abort_to_raise_s"] < 10, res  # its timeout is 60 s
    # A group with a cancel handle but without keep_spare wants no spare.
    assert res["plain_sums"] == [[3.0] * 4, [3.0] * 4], res
    assert res["spares_after_plain"] == {"ready": 0, "opening": 0, "waiting": 0, "taken": 0}, res
    assert "aborted" in res["errored_after_abort"], res
    assert res["sums"] == [[3.0] * 8, [3.0] * 8], res
    assert res["errored_healthy"] == ["None", "None"], res
    assert res["backend_name"] == "torchft-smddp", res
    # The next formation took the two spare endpoints the first left, and
    # its all_reduce on them matches the closed form.
    assert res["spares_before_reform"]["ready"] == 2, res
    assert res["spares_after_reform"]["ready"] == 0, res
    assert res["spares_after_reform"]["taken"] - res["spares_before_reform"]["taken"] == 2, res
    assert res["sums_on_spares"] == [True, True], res
    # The group that timed out: released once, in the background, its
    # error kept; the abort after it has nothing left to do.
    assert all("timed out" in e or "Timeout" in e or "timeout" in e
               for e in res["failed_errors"]), res
    assert res["releases"] == [["smddp-release-failed", False],
                               ["smddp-release-failed", True]], res
    assert res["error_after_release"] == res["failed_errors"][0], res
    assert res["abort_after_release_s"] < 0.5, res
    assert all("aborted" in e for e in res["errored_aborted"]), res


def test_an_abort_racing_configure_from_another_thread_is_never_lost():
    """cases_torchft.abort_races_configure: 20 rounds of abort() landing
    around the end of a configure() on another thread; after each, the
    wrapper holds no group and errored() reports the abort."""
    (res,) = run_world(1, "cases_torchft:abort_races_configure", timeout=240)
    assert res["stuck"] == 0, res
    assert res["lost"] == [], res
    # Both orders happened: aborts that cancelled the formation, and
    # aborts of a group already installed.
    assert res["configure_returned"] + res["configure_raised"] == 20, res
    assert res["configure_returned"] >= 1 and res["configure_raised"] >= 1, res


def test_torchft_groups_are_described_in_torch_flight_recorder_dumps(tmp_path):
    """A torchft group's entry in torch's flight-recorder dump carries its
    name as description and the global ranks torchft gave configure(),
    not "undefined" and the group's own 0..n-1."""
    (res,) = run_world(1, "cases_torchft:torchft_flight_dump", timeout=120,
                       env={"TORCH_FR_DUMP_TEMP_FILE": str(tmp_path / "fr_")})
    assert res["error"] and "timed out" in res["error"], res
    mine = [g for g in res["groups"].values() if g["name"].startswith("torchft_quorum_3")]
    assert len(mine) == 1, res["groups"]
    assert mine[0]["desc"] == "torchft_quorum_3", mine
    assert mine[0]["ranks"] == "[4, 7]", mine


def test_servers_found_through_the_quorum_store_are_refused_naming_the_fix():
    """Under torchft the quorum's store dies with its primary replica, and
    the servers' registrations and key with it: SMDDP_SERVER_COUNT without
    SMDDP_SERVER_RENDEZVOUS is an error that says what to set."""
    # The harness's own world group is Gloo's: an smddp one would look for
    # the servers first.
    (res,) = run_world(1, "cases_torchft:servers_in_quorum_store", timeout=120, backend="gloo",
                       env={"SMDDP_SERVER_COUNT": "1", "SMDDP_SERVER_JOB": "ftjob",
                            "SMDDP_SERVER_HOSTS": None,
                            "SMDDP_SERVER_RENDEZVOUS": None})
    assert res["said"].startswith("ValueError"), res
    assert "SMDDP_SERVER_RENDEZVOUS" in res["said"] and "SMDDP_SERVER_HOSTS" in res["said"], res
    assert res["seconds"] < 10, res  # not the 30 s wait for servers that never come
