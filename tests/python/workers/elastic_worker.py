"""A torchrun worker for test_ecosystem's elastic restart: in the first
attempt rank 1 exits after one allreduce while rank 0 waits in the next one;
torchrun then restarts both, and the second attempt must come up on the
same store and compute correct sums (closed form)."""

import datetime
import os

import torch
import torch.distributed as dist

import torch_smddp  # noqa: F401  (registers the backend)

attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
dist.init_process_group(os.environ.get("SMDDP_TEST_BACKEND") or "smddp",
                        timeout=datetime.timedelta(seconds=30))
rank, world = dist.get_rank(), dist.get_world_size()
t = torch.full((1000,), float(rank + 1))
dist.all_reduce(t)
assert t[0].item() == world * (world + 1) / 2, t[0].item()
if attempt == 0:
    if rank == 1:
        os._exit(3)
    dist.all_reduce(t)  # waits on the dead rank until torchrun stops this attempt
for i in range(5):
    t = torch.full((100000,), float(rank + 1 + i))
    dist.all_reduce(t)
    want = sum(r + 1 + i for r in range(world))
    assert torch.all(t == want), (i, t[0].item(), want)
print(f"OK attempt={attempt} rank={rank}", flush=True)
dist.destroy_process_group()
