"""FSDP2 training over the smddp backend: train_ddp.py's character-level
language model, sharded with torch.distributed.fsdp.fully_shard (each
encoder layer, then the root), so every step gathers its parameters with
smddp's all-gathers and sends its gradients out through its
reduce-scatters.

    torchrun --standalone --nproc-per-node 2 examples/train_fsdp.py
    torchrun --standalone --nproc-per-node 2 examples/train_fsdp.py --backend gloo

FSDP2 takes its communication buffers from the process group once asked
to (set_allocate_memory_from_process_group_for_comm), and this script asks:
smddp hands out buffers in its shared pool, which the host's other ranks
read in place instead of copying them into shared memory first
(docs/design.md, "Buffers from the backend: the shared pool"). Gloo has no
such buffers, and FSDP2 then allocates its own. --no-pool leaves FSDP2's
own buffers under smddp too. Data, model, schedule and output are
train_ddp.py's; every rank runs the held-out pass and the sample, as a
sharded model needs.
"""

from __future__ import annotations

import sys
import warnings

import torch.distributed as dist

import train_ddp  # this directory's, which torchrun puts first on sys.path


def shard(model, pool: bool):
    """FSDP2 on a mesh over the default group: one unit per encoder layer
    (its all-gather can overlap the layer before), one for the rest."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule, fully_shard

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for layer in model.blocks.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    if pool:
        for m in model.modules():
            if isinstance(m, FSDPModule):
                m.set_allocate_memory_from_process_group_for_comm(True)
    return model


def main(argv=None) -> int:
    p = train_ddp.parser(__doc__)
    p.add_argument("--no-pool", action="store_true",
                   help="FSDP2's own communication buffers, not the process group's")
    args = p.parse_args(argv)
    # FSDP2 warns that the root returns a view (the output layer's 3-D
    # matmul): an in-place op on it would skip backward's all-gather. The
    # loss reads the logits out of place, so the warning is noise here.
    warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view tensor")
    return train_ddp.run(args, shard=lambda m: shard(m, not args.no_pool), parallel="fsdp")


if __name__ == "__main__":
    sys.exit(main())
