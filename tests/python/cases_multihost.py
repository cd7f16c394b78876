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
