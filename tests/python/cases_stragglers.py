"""World-4 job for test_stragglers.py: the same allreduces on two groups,
rank 2 sleeping 20 ms before each call on the first ("slow") and nobody on
the second ("even"), recorded with SMDDP_TIMELINE."""

import time

import torch
import torch.distributed as dist
import torch_smddp

CALLS = 30


def _phase(rank, world, group, sleeper):
    bad = 0
    want = world * (world + 1) / 2
    for _ in range(CALLS):
        t = torch.ones(16384) * (rank + 1)
        torch.mul(t, 1.0)  # the same small work on every rank
        if rank == sleeper:
            time.sleep(0.020)
        dist.all_reduce(t, group=group)
        bad += int(not torch.all(t == want))
    return bad


def stragglers(rank, world):
    ranks = list(range(world))
    slow = dist.new_group(ranks, backend="smddp", group_desc="slow")
    even = dist.new_group(ranks, backend="smddp", group_desc="even")
    bad = _phase(rank, world, slow, sleeper=2)
    bad += _phase(rank, world, even, sleeper=-1)
    names = {"slow": dist.distributed_c10d._get_process_group_name(slow),
             "even": dist.distributed_c10d._get_process_group_name(even)}
    dist.barrier()
    torch_smddp._C.timeline_flush()
    return {"bad": bad, "names": names}
