"""One rank of test_leave.py's exit-order test, launched as the harness
launches ranks without torchrun: rank 0 hosts the TCPStore
(MASTER_ADDR/MASTER_PORT), so the store goes when rank 0's process exits.
Every rank runs a few calls and a barrier; the others then take
`argv[1]` seconds before destroy_process_group, as a rank still writing a
checkpoint would, while rank 0 destroys its group and exits at once. Each
rank prints when its destroy_process_group started and ended, on
CLOCK_MONOTONIC, which every process on the machine shares."""

import sys
import time

import torch
import torch.distributed as dist

import torch_smddp  # noqa: F401  (registers the backend)

late = float(sys.argv[1])
dist.init_process_group("smddp")
rank, world = dist.get_rank(), dist.get_world_size()
t = torch.full((1024,), float(rank + 1))
dist.all_reduce(t)
assert t[0].item() == world * (world + 1) / 2
dist.barrier()
if rank != 0:
    time.sleep(late)
t0 = time.monotonic()
dist.destroy_process_group()
print(f"destroy_start {t0:.6f} destroy_end {time.monotonic():.6f}", flush=True)
