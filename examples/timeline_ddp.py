"""A few DDP steps recorded for `python -m torch_smddp.trace plot`: an MLP whose
gradients fall into several buckets, SMDDP_TIMELINE on, and torch.profiler
over the last steps (its trace, profile.rank<R>.json, lands beside the
timeline so the plot can draw backward compute too).

    SMDDP_TIMELINE=/tmp/tl/timeline.json torchrun --standalone --nproc-per-node 2 \\
        examples/timeline_ddp.py --out /tmp/tl
    python -m torch_smddp.trace plot /tmp/tl --out step.png
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.profiler import ProfilerActivity, profile

import torch_smddp  # noqa: F401  (registers "smddp")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True, help="directory for profile.rank<R>.json")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--profiled", type=int, default=3, help="last steps under torch.profiler")
    ap.add_argument("--widths", type=int, nargs="+", default=[512, 1024, 768, 1024, 640, 768, 512],
                    help="layer widths (different sizes: buckets of different sizes)")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--bucket-mb", type=float, default=2.0)
    args = ap.parse_args()
    dist.init_process_group("smddp")
    rank = dist.get_rank()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    layers = []
    for a, b in zip(args.widths, args.widths[1:]):
        layers += [nn.Linear(a, b), nn.GELU()]
    model = DDP(nn.Sequential(*layers), bucket_cap_mb=args.bucket_mb)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(args.batch, args.widths[0], generator=torch.Generator().manual_seed(rank))

    def step():
        opt.zero_grad(set_to_none=True)
        model(x).square().mean().backward()
        opt.step()

    for _ in range(args.steps - args.profiled):
        step()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(args.profiled):
            step()
    os.makedirs(args.out, exist_ok=True)
    prof.export_chrome_trace(os.path.join(args.out, f"profile.rank{rank}.json"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
