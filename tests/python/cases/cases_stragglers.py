"""World-4 job for test_stragglers.py: the same allreduces on two groups,
rank 2 sleeping 20 ms before each call on the first ("slow") and nobody on
the second ("even"), recorded with SMDDP_TIMELINE, and what torch_smddp.stats() says live."""

import time

import torch
import torch.distributed as dist
import torch_smddp
from mp_harness import captured_stderr

CALLS = 30
WINDOW = 256  # hostpath/arrivals.h kStragglerWindow


def _phase(rank, world, group, sleeper, calls=CALLS, sleep_s=0.020, numel=16384):
    """`calls` allreduces, `sleeper` sleeping `sleep_s` before each; returns
    how many gave a wrong sum."""
    bad = 0
    want = world * (world + 1) / 2
    for _ in range(calls):
        t = torch.ones(numel) * (rank + 1)
        torch.mul(t, 1.0)  # the same small work on every rank
        if rank == sleeper:
            time.sleep(sleep_s)
        dist.all_reduce(t, group=group)
        bad += int(not torch.all(t == want))
    return bad


def _window_phase(rank, world, group, sleeper):
    """One window of allreduces, `sleeper` sleeping 2 ms before each; returns
    the SMDDP_STRAGGLER_REPORT lines this process logged meanwhile."""
    lines = []
    with captured_stderr(lines):
        bad = _phase(rank, world, group, sleeper, calls=WINDOW, sleep_s=0.002, numel=1024)
    return bad, [ln for ln in lines if "SMDDP_STRAGGLER_REPORT" in ln]


def stragglers(rank, world):
    ranks = list(range(world))
    slow = dist.new_group(ranks, backend="smddp", group_desc="slow")
    even = dist.new_group(ranks, backend="smddp", group_desc="even")
    bad = _phase(rank, world, slow, sleeper=2)
    bad += _phase(rank, world, even, sleeper=-1)
    names = {"slow": dist.distributed_c10d._get_process_group_name(slow),
             "even": dist.distributed_c10d._get_process_group_name(even)}
    # The live counts, as every rank of the host reads them.
    live = {"slow": torch_smddp.stats(slow)["stragglers"],
            "even": torch_smddp.stats(even)["stragglers"]}
    # SMDDP_STRAGGLER_REPORT (set by the test): one window (WINDOW calls)
    # with rank 1 sleeping, then one without.
    window = dist.new_group(ranks, backend="smddp", group_desc="window")
    b, report_slow = _window_phase(rank, world, window, 1)
    bad += b
    b, report_even = _window_phase(rank, world, window, -1)
    bad += b
    dist.barrier()
    torch_smddp._C.timeline_flush()
    return {"bad": bad, "names": names, "live": live,
            "report": {"slow": report_slow, "even": report_even}}
