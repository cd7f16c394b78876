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

F32 = 4


def pool_read():
    return torch_smddp.stats()["pool_read_bytes"]


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
