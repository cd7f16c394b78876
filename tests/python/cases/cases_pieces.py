"""Child side: one-host all-gathers and reduce-scatters that would stage
more than SMDDP_STAGE_BYTES (set small for the job) run in pieces, each
staged in the poster's pool and read there. run() in
cases_host_collectives calls pieces() when the job sets it; its other
cases, at that size, cover every dtype, the in-place and overlapping
forms and queued calls in pieces.

Oracles: every rank's inputs regenerated here (make, closed_form_block);
how many bytes each rank read from its peers' pools (stats'
pool_read_bytes), which is every byte it receives when each piece was
staged, and none when a call too large to stage whole is read where it
lies (as before pieces); how much of the pool is in use (the staging
range, at most the limit); a mismatch whose first pieces agree fails every
rank, naming the call.
"""

import os

import torch
import torch.distributed as dist

import torch_smddp
from cases_host_collectives import closed_form_block, make
from mp_helpers import env_set

F32 = 4


def pool_read():
    return torch_smddp.stats()["pool_read_bytes"]


def fsdp_in_pieces(ck, rank, world, gloo):
    """FSDP2 training whose all-gathers and reduce-scatters run in pieces:
    two 1024 x 1024 layers (4 MiB of weights each) sharded over the job's
    ranks, 8 SGD steps (each rank on a batch of its own) on this job's
    group (pieces past the job's 1 MiB limit), on a group made with
    SMDDP_STAGE_BYTES=64M (each call staged whole) and on Gloo. Pieces
    keep every sum's order, so the first two match bit for bit; Gloo's
    within rounding. The peers' pieces were read from their pools, which
    held no more than the limit."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    def make_model():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.Tanh(),
                                   torch.nn.Linear(1024, 1024))

    def train(group):
        model = make_model()
        mesh = DeviceMesh.from_group(group, device_type="cpu")
        for layer in (model[0], model[2]):
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        losses, before = [], pool_read()
        x = torch.randn(16, 1024, generator=torch.Generator().manual_seed(100 + rank))
        for _ in range(8):
            loss = (model(x) - x.roll(1, dims=1)).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(loss.item())
        read = pool_read() - before  # the steps' own calls (full_tensor's small ones are staged)
        full = {n: p.full_tensor().detach().clone() for n, p in model.named_parameters()}
        return full, losses, read

    got, got_losses, read = train(dist.group.WORLD)
    # Each layer's calls are past the limit: a peer's bytes come from its
    # pool only when they were staged, which means in pieces.
    ck.check("FSDP2 in pieces: the peers' pieces were read from their pools", read > 0, str(read))
    in_use = torch_smddp.stats()["pool_bytes_in_use"]
    ck.check("FSDP2 in pieces: the pool held at most the limit",
             in_use <= int(os.environ["SMDDP_STAGE_BYTES"]), f"{in_use} bytes")
    with env_set(SMDDP_STAGE_BYTES=str(64 << 20)):
        whole_group = dist.new_group(backend="smddp")
    whole, whole_losses, _ = train(whole_group)
    ref, _, _ = train(gloo)
    for name in ref:
        ck.equal(f"FSDP2 in pieces, {name}: the same bits as staged whole", got[name], whole[name])
        ck.check(f"FSDP2 in pieces, {name}: Gloo's within rounding",
                 torch.allclose(got[name], ref[name], rtol=2e-5, atol=2e-5),
                 f"max diff {(got[name] - ref[name]).abs().max().item()}")
    ck.check("FSDP2 in pieces: the same losses as staged whole", got_losses == whole_losses,
             f"{got_losses} vs {whole_losses}")
    # Every rank keeps its batch: the mean loss over the ranks must fall.
    ends = torch.tensor([got_losses[0], got_losses[-1]])
    dist.all_reduce(ends, group=gloo)
    ck.check("FSDP2 in pieces: it trained (the ranks' mean loss fell)", ends[1] < ends[0],
             str((ends / world).tolist()))
    moved = [n for n, p in make_model().named_parameters() if not torch.equal(p.detach(), got[n])]
    ck.check("FSDP2 in pieces: every parameter moved", len(moved) == 4, str(moved))
    dist.destroy_process_group(whole_group)


def pieces(ck, rank, world):
    stage = int(os.environ["SMDDP_STAGE_BYTES"])
    # An all-gather part of 2.5 pieces and 3 elements: three pieces, the
    # last one short.
    n = (5 * stage // 2) // F32 + 3
    x = make("pieces-ag", rank, torch.float32, n)
    want = torch.cat([make("pieces-ag", r, torch.float32, n) for r in range(world)])
    out = torch.empty(n * world)
    before = pool_read()
    dist.all_gather_into_tensor(out, x)
    read = pool_read() - before
    ck.equal(f"all_gather in pieces (n={n})", out, want)
    ck.check("all_gather in pieces: every peer's part read from its pool",
             read == (world - 1) * n * F32, f"{read} bytes, want {(world - 1) * n * F32}")
    # Reduce-scatter: each rank stages the blocks of its world - 1 peers,
    # so its pieces hold stage / (world - 1) bytes of each block.
    m = (3 * stage // (world - 1)) // F32 + 5
    flat = make("pieces-rs", rank, torch.float32, m * world)
    got = torch.empty(m)
    before = pool_read()
    dist.reduce_scatter_tensor(got, flat)
    read = pool_read() - before
    ck.equal(f"reduce_scatter in pieces (m={m}) vs the closed form (bitwise)", got,
             closed_form_block("pieces-rs", torch.float32, m, world, 1, rank))
    ck.check("reduce_scatter in pieces: every peer's block read from its pool",
             read == (world - 1) * m * F32, f"{read} bytes, want {(world - 1) * m * F32}")
    # Nothing in this job allocates from the pool but staging: the range
    # kept for it stays at the limit, though the calls staged 2.5 and 3
    # times as much.
    in_use = torch_smddp.stats()["pool_bytes_in_use"]
    ck.check("staging in pieces keeps at most SMDDP_STAGE_BYTES of the pool",
             0 < in_use <= stage, f"{in_use} bytes in use, limit {stage}")
    # Whole pieces on both sides, two on rank 0 and three elsewhere: the
    # pieces agree until rank 0 would leave, so only the call's own
    # signature on every piece finds the mismatch.
    k = stage // F32
    mine = 2 * k if rank == 0 else 3 * k
    try:
        dist.all_gather_into_tensor(torch.empty(mine * world), torch.ones(mine))
        ck.check("a mismatch in pieces raises", False, "no error")
    except Exception as e:  # noqa: BLE001
        text = str(e)
        ck.check("a mismatch in pieces names the other call",
                 "mismatch" in text and f"{2 * k} elements" in text and f"{3 * k} elements" in text,
                 text[:400])
    x = make("pieces-after", rank, torch.float32, 2 * k + 1)
    out = torch.empty((2 * k + 1) * world)
    dist.all_gather_into_tensor(out, x)
    ck.equal("all_gather in pieces after a mismatch", out,
             torch.cat([make("pieces-after", r, torch.float32, 2 * k + 1) for r in range(world)]))
