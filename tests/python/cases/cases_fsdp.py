"""Child side of test_fsdp.py: FSDP2 (`fully_shard`) training of a small
transformer, once over the backend under test and once over a Gloo group
created beside it in the same job, from identical initial weights on
identical data. The oracle is Gloo: after 20 optimizer steps the full
(unsharded) parameters of the two runs must agree.

Variants exercise the backend paths FSDP2 uses:
  avg      fp32 gradients: all_gather_into_tensor (async), reduce_scatter_tensor
           with ReduceOp.AVG;
  premul   set_gradient_divide_factor(2 * world): reduce_scatter_tensor with
           PREMUL_SUM(1 / (2 * world)) on smddp. Gloo cannot run PREMUL_SUM, so
           its run forces SUM and FSDP divides afterwards (same maths);
  bf16     MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32) with
           reshard_after_forward=False: bf16 all-gathers, fp32 AVG reduce-scatter.

``device`` puts the tested run on that device (cases_sim_torch_device: the
stand-in's "privateuseone"); the Gloo run stays on the CPU.
"""

import math

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

VOCAB, DIM, HEADS, FF, LAYERS, SEQ, BATCH = 61, 32, 4, 72, 2, 12, 4
STEPS = 20


class TinyTransformer(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.pos = nn.Parameter(torch.randn(SEQ, DIM) * 0.02)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(DIM, HEADS, FF, dropout=0.0, batch_first=True)
            for _ in range(LAYERS))
        self.norm = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, VOCAB)  # 61 rows: uneven shards at world 2 (padding)

    def forward(self, tokens):
        x = self.embed(tokens) + self.pos
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x))


def batch(rank, step):
    g = torch.Generator().manual_seed(1000 * step + rank)
    tokens = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
    return tokens, torch.roll(tokens, 1, dims=1)  # learnable target


def train(group, rank, world, variant, force_sum, device=None, pool=False):
    torch.manual_seed(0)  # identical initial weights on every rank and in both runs
    model = TinyTransformer()
    if device is not None:
        model.to(device)
    mesh = DeviceMesh.from_group(group, device_type="cpu" if device is None else device.type)
    kw = {"mesh": mesh}
    if variant == "bf16":
        kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                               reduce_dtype=torch.float32)
        kw["reshard_after_forward"] = False
    for layer in model.layers:
        fully_shard(layer, **kw)
    fully_shard(model, **kw)
    if pool:  # the all-gather and reduce-scatter buffers from the backend's allocate_tensor
        for m in model.modules():
            if isinstance(m, FSDPModule):
                m.set_allocate_memory_from_process_group_for_comm(True)
    if variant == "premul":
        for m in model.modules():
            if isinstance(m, FSDPModule):
                m.set_gradient_divide_factor(2.0 * world)
                if force_sum:  # Gloo has no PREMUL_SUM: SUM, then divide
                    m.set_force_sum_reduction_for_comms(True)
    # SGD, not Adam: Adam's update is almost invariant to the gradient's
    # scale, so it would hide a wrong divide factor.
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    losses = []
    for step in range(STEPS):
        tokens, target = (t.to(device or "cpu") for t in batch(rank, step))
        loss = nn.functional.cross_entropy(model(tokens).float().reshape(-1, VOCAB),
                                           target.reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    full = {name: p.full_tensor().detach().cpu().clone() for name, p in model.named_parameters()}
    return full, losses


def pooled_buffers(rank, world, avg, avg_losses, failures):
    """FSDP2 with its communication buffers from smddp's allocate_tensor
    (the shared pool: peers read them with memcpy): the same run as "avg"
    on the same path, so the same bits, and the pool was read."""
    import torch_smddp
    before = torch_smddp.stats()["pool_read_bytes"]
    got, losses = train(dist.group.WORLD, rank, world, "avg", force_sum=False, pool=True)
    read = torch_smddp.stats()["pool_read_bytes"] - before
    if read == 0:
        failures.append(f"rank {rank} pool: no byte was read from a peer's pool")
    for name, want in avg.items():
        if not torch.equal(got[name], want):
            failures.append(f"rank {rank} pool {name}: differs from the private-buffer run, "
                            f"max {(got[name] - want).abs().max().item()}")
    if losses != avg_losses:
        failures.append(f"rank {rank} pool: losses {losses} vs {avg_losses}")
    return 2 + len(avg)


def run(rank, world, device=None):
    gloo = dist.new_group(backend="gloo")
    failures, checks = [], 0
    torch.manual_seed(0)
    init = {n: p.detach().clone() for n, p in TinyTransformer().named_parameters()}
    out, fulls = {}, {}
    for variant in ("avg", "premul", "bf16"):
        got, got_losses = train(dist.group.WORLD, rank, world, variant,
                                force_sum=dist.get_backend() == "gloo", device=device)
        fulls[variant] = got
        ref, ref_losses = train(gloo, rank, world, variant, force_sum=True)
        # bf16 params amplify rounding differences of the fp32 reductions
        tol = 2e-3 if variant == "bf16" else 2e-5
        moved = 0
        for name in ref:
            checks += 1
            a, b = got[name], ref[name]
            if a.shape != b.shape or not torch.allclose(a, b, rtol=tol, atol=tol):
                diff = (a - b).abs().max().item() if a.shape == b.shape else "shape"
                failures.append(f"rank {rank} {variant} {name}: max |smddp - gloo| = {diff}")
            if not torch.allclose(b, init[name]):
                moved += 1
        # The oracle must have trained: most parameters changed from init.
        checks += 1
        if moved < len(ref) - 2:
            failures.append(f"rank {rank} {variant}: only {moved}/{len(ref)} parameters moved")
        checks += 1
        if not all(math.isfinite(x) for x in got_losses):
            failures.append(f"rank {rank} {variant}: non-finite loss {got_losses}")
        checks += 1
        if not all(abs(x - y) <= 1e-3 * max(1.0, abs(y)) for x, y in zip(got_losses, ref_losses)):
            failures.append(f"rank {rank} {variant}: losses differ {got_losses} vs {ref_losses}")
        out[variant] = got_losses
    if dist.get_backend() == "smddp" and device is None:
        checks += pooled_buffers(rank, world, fulls["avg"], out["avg"], failures)
    # Every rank must end with the same full parameters (all-gathered again
    # over Gloo, independent of the backend under test).
    digest = torch.stack([p.double().sum() for p in got.values()])
    everyone = [torch.empty_like(digest) for _ in range(world)]
    dist.all_gather(everyone, digest, group=gloo)
    checks += 1
    if not all(torch.equal(everyone[0], d) for d in everyone):
        failures.append(f"rank {rank}: full parameters differ across ranks")
    return {"failures": failures, "checks": checks, "losses": out}
