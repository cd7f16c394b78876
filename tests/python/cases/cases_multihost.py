"""Child-side cases for ranks split into pretend hosts with SMDDP_HOST_ID."""

import torch
import torch.distributed as dist

import os

import collective_oracle
import torch_smddp
from cases_call_order import half_sums, overlapping_calls
from cases_collectives import collectives_vs_gloo


def _process_env(*names):
    """The C library's view of the environment (os.environ is a copy taken
    at startup: it does not see what the backend set since)."""
    import ctypes
    libc = ctypes.CDLL(None)
    libc.getenv.restype = ctypes.c_char_p
    return {n: (v.decode() if (v := libc.getenv(n.encode())) is not None else None)
            for n in names}


def provider_and_collectives(rank, world):
    backend = torch_smddp._backend_of()
    # Closed form first: sum of (rank + 1) * i over ranks.
    t = torch.arange(1000, dtype=torch.float64) * (rank + 1)
    dist.all_reduce(t)
    expect = torch.arange(1000, dtype=torch.float64) * (world * (world + 1) // 2)
    closed_form_ok = torch.equal(t, expect)
    hosts = [None] * world
    dist.all_gather_object(hosts, os.environ.get("SMDDP_HOST_ID", "local"))
    groups = {}
    for r, h in enumerate(hosts):
        groups.setdefault(h, []).append(r)
    if torch_smddp.stats()["allreduce_path"] == "shared-memory":
        collective_oracle.HOST_GROUPS = list(groups.values())
    res = collectives_vs_gloo(rank, world, quick=True)
    return {"provider": backend.provider, "closed_form_ok": closed_form_ok,
            "rxm_env": _process_env("FI_OFI_RXM_EAGER_LIMIT", "FI_OFI_RXM_ENABLE_DIRECT_SEND",
                                    "FI_OFI_RXM_MSG_RX_SIZE"),
            "allreduce_path": torch_smddp.stats()["allreduce_path"],
            "ring_depth": torch_smddp.stats()["ring_depth"],
            "call_order_bad": overlapping_calls(rank, world),
            "half": half_sums(rank, world, list(groups.values())), **res}


def pipelined_steps(rank, world):
    """Run with tiny slots and a shallow ring (SMDDP_SHM_SLOT_BYTES,
    SMDDP_SHM_DEPTH): large allreduces take hundreds of pipeline steps, so
    the network step between hosts keeps several steps in flight and reuses
    each result slot many times over. Each result must be the exact
    host-hierarchical rank-order fold (collective_oracle), sync and fused
    async alike."""
    import collective_oracle as co

    hosts = [None] * world
    dist.all_gather_object(hosts, os.environ.get("SMDDP_HOST_ID", "local"))
    groups = {}
    for r, h in enumerate(hosts):
        groups.setdefault(h, []).append(r)
    co.HOST_GROUPS = list(groups.values())
    bad = []
    cases = [(dt, op, n) for dt in (torch.float32, torch.float64, torch.bfloat16)
             for op in ("SUM", "AVG") for n in (1, 4097, 65537, (1 << 18) + 3)]
    for dt, op, n in cases:
        key = f"pipe-{co.dname(dt)}-{op}-{n}"
        xs = [co.make_input(key, r, dt, n, "normal") for r in range(world)]
        t = xs[rank].clone()
        dist.all_reduce(t, op=co.OPS[op])
        if not co.bitwise_equal(t, co.rank_order_fold(op, dt, xs, world)):
            bad.append(key)
    # Several async calls fused into one batch of many steps.
    key = "pipe-async"
    xs = [[co.make_input(f"{key}{i}", r, torch.float32, 30011 * (i + 1), "normal")
           for r in range(world)] for i in range(5)]
    ts = [x[rank].clone() for x in xs]
    works = [dist.all_reduce(t, async_op=True) for t in ts]
    for w in works:
        w.wait()
    for i, t in enumerate(ts):
        if not co.bitwise_equal(t, co.rank_order_fold("SUM", torch.float32, xs[i], world)):
            bad.append(f"{key}{i}")
    st = torch_smddp.stats()
    return {"bad": bad, "cases": len(cases) + len(ts), "path": st["allreduce_path"]}


def compressed_group(rank, world):
    """2 pretend hosts x 2 ranks, or 3 x 1 (the network-only path). A group made with
    ``pg_options=torch_smddp.Options(cross_host_dtype="bf16")`` sends its f32
    partials across hosts in bf16; the world group (fp32) is untouched.
    Oracles: Gloo's sum of the same inputs (f64 for the bound), the bf16
    rounding of torch itself, and the other ranks' bytes."""
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    out = {}
    gloo = dist.new_group(backend="gloo")
    narrow = dist.new_group(backend="smddp",
                            pg_options=torch_smddp.Options(cross_host_dtype="bf16"))
    out["narrow_path"] = torch_smddp.stats(narrow)["allreduce_path"]
    gen = torch.Generator().manual_seed(1234 + rank)
    # Magnitudes from 2^-40 to 2^40, and values that cancel between hosts.
    x = torch.randn(200_003, generator=gen) * torch.pow(2.0, torch.randint(-40, 41, (200_003,),
                                                                           generator=gen))
    x[::7] = 1e6 * (1 if rank < 2 else -1) + torch.randn(x[::7].shape, generator=gen)
    exact = x.double().clone()
    dist.all_reduce(exact, group=gloo)  # f64: exact enough to bound an f32/bf16 sum
    plain, small = x.clone(), x.clone()
    dist.all_reduce(plain)
    dist.all_reduce(small, group=narrow)
    # The world group is untouched: the f32 result, within f32's rounding.
    absum = x.double().abs()
    dist.all_reduce(absum, group=gloo)
    err32 = (plain.double() - exact).abs()
    out["fp32_within_f32_bound"] = bool((err32 <= 4 * 2.0 ** -24 * absum).all())
    # bf16 across: every element is a bf16 value (the result crossed in bf16).
    out["bf16_representable"] = bool(torch.equal(small.to(torch.bfloat16).float(), small))
    out["fp32_not_representable"] = not torch.equal(plain.to(torch.bfloat16).float(), plain)
    # The bound of docs/design.md, "Compression between hosts", with the
    # host partials' magnitudes over-estimated by the inputs' (sum |x|).
    bound = 2.0 ** -8 * 1.01 * (absum + exact.abs()) + 6 * 2.0 ** -24 * absum
    err = (small.double() - exact).abs()
    out["bf16_within_bound"] = bool((err <= bound).all())
    out["bf16_error_seen"] = float((err / bound.clamp_min(1e-300)).max())
    # Every rank holds the same bytes.
    mine = small.view(torch.int32).to(torch.int64).sum().item()
    all_sums = [None] * world
    dist.all_gather_object(all_sums, mine, group=gloo)
    out["same_bytes_everywhere"] = len(set(all_sums)) == 1
    # DDP on the compressed group trains as on Gloo (same seed, same data).
    def train(group):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 1))
        ddp = DDP(model, process_group=group)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
        g = torch.Generator().manual_seed(99 + rank)
        w = torch.linspace(-1, 1, 32)
        losses = []
        for _ in range(40):
            inp = torch.randn(64, 32, generator=g)
            loss = ((ddp(inp).squeeze(1) - 0.3 * (inp @ w)) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses
    out["loss_gloo"] = train(gloo)
    out["loss_bf16"] = train(narrow)
    # A value that names no dtype, and options of another backend.
    try:
        dist.new_group(backend="smddp", pg_options=torch_smddp.Options(cross_host_dtype="fp8"))
        out["bad_value"] = "no error"
    except (ValueError, RuntimeError) as e:
        out["bad_value"] = str(e)
    try:
        dist.new_group(backend="smddp", pg_options=object())
        out["bad_type"] = "no error"
    except TypeError as e:
        out["bad_type"] = str(e)
    dist.barrier(group=gloo)
    return out
