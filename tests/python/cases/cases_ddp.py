"""Child-side DDP checks, run by mp_harness.run_world in every rank.

``ddp_vs_gloo(rank, world, steps)`` trains the same small model (Linear +
BatchNorm1d layers, so it has buffers that DDP broadcasts every step) twice
in one job from identical per-rank initial weights and data: once with DDP
over the default process group (the backend under test) and once with DDP
over a Gloo group. Initial weights differ between ranks on purpose, so the
runs only agree if DDP's initial broadcast works. Checks:

* final parameters and buffers allclose to the Gloo run (same rank);
* final parameters bitwise identical across ranks (gathered through Gloo),
  for both runs (the Gloo run checks the oracle itself);
* the training did something: the loss fell and parameters moved.

Each check is done for several DDP configurations (one bucket; many tiny
buckets with gradient_as_bucket_view and no_sync gradient accumulation).
``device`` puts the tested run's model and data on that device
(cases_sim_torch_device: the stand-in's "privateuseone"); the Gloo run stays
on the CPU.

Returns {"checks": n, "failures": [...], "losses": {...}}.
"""

from __future__ import annotations

import zlib

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

IN, OUT, BATCH = 12, 3, 16

VARIANTS = {
    "one_bucket": dict(ddp=dict(), accumulate=1),
    "tiny_buckets_accum": dict(ddp=dict(bucket_cap_mb=0.0005, gradient_as_bucket_view=True), accumulate=2),
}


def make_model(rank: int) -> nn.Module:
    torch.manual_seed(1000 + rank)  # different per rank: DDP must broadcast rank 0's
    return nn.Sequential(
        nn.Linear(IN, 32), nn.BatchNorm1d(32), nn.ReLU(),
        nn.Linear(32, 16), nn.BatchNorm1d(16), nn.Tanh(),
        nn.Linear(16, OUT),
    )


def _teacher() -> torch.Tensor:
    g = torch.Generator().manual_seed(7)
    return torch.randn(IN, OUT, generator=g)


def batch(rank: int, step: int, teacher: torch.Tensor):
    g = torch.Generator().manual_seed(zlib.crc32(f"ddp#{rank}#{step}".encode()))
    x = torch.randn(BATCH, IN, generator=g) * (1 + rank)  # ranks see different distributions
    y = torch.tanh(x @ teacher) + 0.05 * torch.randn(BATCH, OUT, generator=g)
    return x, y


def train(rank, world, steps, group, variant, device="cpu"):
    cfg = VARIANTS[variant]
    model = make_model(rank).to(device)
    ddp = DDP(model, process_group=group, **cfg["ddp"])
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    teacher = _teacher()
    losses = []
    initial = [p.detach().clone() for p in model.parameters()]
    acc = cfg["accumulate"]
    for step in range(steps):
        micro = []
        for k in range(acc):
            x, y = (t.to(device) for t in batch(rank, step * acc + k, teacher))
            last = k == acc - 1
            if last:
                loss = nn.functional.mse_loss(ddp(x), y) / acc
                loss.backward()
            else:
                with ddp.no_sync():  # accumulate locally, reduce on the last micro-batch
                    loss = nn.functional.mse_loss(ddp(x), y) / acc
                    loss.backward()
            micro.append(loss.item() * acc)
        opt.step()
        opt.zero_grad(set_to_none=not cfg["ddp"].get("gradient_as_bucket_view", False))
        losses.append(sum(micro) / len(micro))
    state = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
    moved = max((p.detach() - q).abs().max().item() for p, q in zip(model.parameters(), initial))
    return state, losses, moved


def _flat_params(state):
    return torch.cat([v.reshape(-1).float() for k, v in state.items()
                      if "running" not in k and "num_batches" not in k])


def ddp_vs_gloo(rank, world, steps=20, rtol=1e-5, atol=1e-6, device="cpu"):
    torch.set_num_threads(1)
    gloo = dist.new_group(backend="gloo")
    failures, checks = [], 0
    losses_out = {}

    def fail(msg):
        failures.append(f"[rank {rank}] {msg}")

    for variant in VARIANTS:
        tested_state, tested_losses, moved = train(rank, world, steps, None, variant, device)
        gloo_state, gloo_losses, _ = train(rank, world, steps, gloo, variant)
        losses_out[variant] = {"tested": tested_losses, "gloo": gloo_losses}

        # 1. against the Gloo run on the same rank
        for k, v in tested_state.items():
            checks += 1
            ref = gloo_state[k]
            if v.dtype.is_floating_point:
                if not torch.allclose(v, ref, rtol=rtol, atol=atol):
                    d = (v - ref).abs().max().item()
                    fail(f"{variant}: {k} differs from the gloo run (max abs diff {d:.3g})")
            elif not torch.equal(v, ref):
                fail(f"{variant}: {k} = {v.tolist()} but {ref.tolist()} in the gloo run")

        # 2. parameters bitwise identical on every rank, for both runs
        for label, state in (("tested", tested_state), ("gloo", gloo_state)):
            checks += 1
            mine = _flat_params(state)
            every = [torch.empty_like(mine) for _ in range(world)]
            dist.all_gather(every, mine, group=gloo)
            for r, other in enumerate(every):
                if not torch.equal(other.view(torch.int32), mine.view(torch.int32)):
                    what = "ORACLE PROBLEM: gloo run" if label == "gloo" else "tested run"
                    fail(f"{variant}: {what}: parameters differ bitwise between rank {rank} and rank {r}")
                    break

        # 3. the run did train
        checks += 1
        head = sum(tested_losses[:3]) / 3
        tail = sum(tested_losses[-3:]) / 3
        if not tail < 0.8 * head:
            fail(f"{variant}: loss did not fall ({head:.4f} -> {tail:.4f})")
        if not moved > 1e-3:
            fail(f"{variant}: parameters barely moved ({moved:.3g})")
        # loss traces of the two runs should agree too (same data, same weights)
        checks += 1
        if not torch.allclose(torch.tensor(tested_losses), torch.tensor(gloo_losses), rtol=1e-4, atol=1e-6):
            fail(f"{variant}: loss trace differs from gloo: {tested_losses[-1]} vs {gloo_losses[-1]}")

    dist.barrier(group=gloo)
    return {"checks": checks, "failures": failures, "losses": losses_out}
