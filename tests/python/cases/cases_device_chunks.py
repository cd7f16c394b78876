"""Rank functions of test_device_sim.py (run by mp_harness.run_world) on
how the GPU path cuts calls: that calls take it at all, allreduce in many
chunks, and all-gather and reduce-scatter (both forms) in pieces of
SMDDP_DEVICE_MIN_PIECE_BYTES. Results are read after sim_synchronize(), as
in cases_device_sim.py.
"""
import os

from cases_device_sim import _settle
from mp_helpers import env_set


def routed(rank, world):
    import torch
    import torch.distributed as dist

    import torch_smddp

    calls, ok = 0, True
    # 3 MiB of float32 in 16 KiB chunks: 192 chunks through a few slots.
    for n in (1, 1000, 3 << 18):
        t = torch.arange(n, dtype=torch.float32) + rank
        dist.all_reduce(t)
        _settle()
        want = torch.arange(n, dtype=torch.float32) * world + world * (world - 1) / 2
        ok &= bool(torch.equal(t, want))
        calls += 1
    works = [dist.all_reduce(torch.full((5000,), float(rank + i)), async_op=True)
             for i in range(8)]
    for w in works:
        w.wait()
    _settle()
    calls += len(works)
    ok &= all(bool(torch.equal(w.result()[0], torch.full((5000,), float(sum(range(world)) + world * i))))
              for i, w in enumerate(works))
    st = torch_smddp.stats()
    out = {"ok": ok, "calls": calls, "device_calls": st["device_calls"],
           "device_host_group": st["device_host_group"]}
    if os.environ.get("SMDDP_DEVICE_SIM") == "1":
        out.update(min_piece(rank, world))
    return out


def min_piece(rank, world):
    """A group made under SMDDP_DEVICE_MIN_PIECE_BYTES=1M stages all-gather
    and reduce-scatter in pieces of 1 MiB per rank, whatever its 16 KiB
    chunk: its slots grow to world + 1 pieces. A 3 MiB part then takes 3
    pieces, one copy each from the all-gather's input and world from the
    reduce-scatter's (16 KiB / (world + 1) would make 576). The list forms
    (all_gather, reduce_scatter) take the same pieces, where they were
    staged whole (one copy from each tensor) before."""
    import torch
    import torch.distributed as dist

    import torch_smddp.testing as sim

    with env_set(SMDDP_DEVICE_MIN_PIECE_BYTES="1M"):
        g = dist.new_group(backend="smddp")
        n = 3 << 18  # 3 MiB of float32 per rank
        inp = torch.arange(n, dtype=torch.float32) + rank * n
        big = torch.arange(world * n, dtype=torch.float32) + rank
        out, part = torch.empty(world * n), torch.empty(n)
        # The list forms take the same pieces: the input of this rank's
        # part of the gather is one of the outputs (in place), and the
        # reduce-scatter reads world separate tensors.
        outs = [torch.empty(n) for _ in range(world)]
        outs[rank].copy_(inp)
        parts = [torch.arange(n, dtype=torch.float32) + r * n + rank for r in range(world)]
        part2 = torch.empty(n)
        _settle()
        # The sim counts copies ever made from a range: count the new ones.
        base_in, base_big = sim.sim_copies_from(inp), sim.sim_copies_from(big)
        base_own, base_parts = sim.sim_copies_from(outs[rank]), [sim.sim_copies_from(p) for p in parts]
        dist.all_gather_into_tensor(out, inp, group=g)
        dist.reduce_scatter_tensor(part, big, group=g)
        dist.all_gather(outs, outs[rank], group=g)
        dist.reduce_scatter(part2, parts, group=g)
        _settle()
    want_part = (torch.arange(n, dtype=torch.float32) + rank * n) * world + world * (world - 1) / 2
    want_out = torch.arange(world * n, dtype=torch.float32)
    return {"pieces_ok": bool(torch.equal(out, want_out) and torch.equal(part, want_part)),
            "lists_ok": bool(torch.equal(torch.cat(outs), want_out)
                             and torch.equal(part2, want_part)),
            "gather_copies": sim.sim_copies_from(inp) - base_in,
            "scatter_copies": sim.sim_copies_from(big) - base_big,
            "list_gather_copies": sim.sim_copies_from(outs[rank]) - base_own,
            "list_scatter_copies": [sim.sim_copies_from(p) - b for p, b in zip(parts, base_parts)]}
