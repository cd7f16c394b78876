"""Child-side cases for ranks split into pretend hosts with SMDDP_HOST_ID."""

import torch
import torch.distributed as dist

import os

import collective_oracle
import torch_smddp
from cases_call_order import half_sums, overlapping_calls
from cases_collectives import collectives_vs_gloo


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
            "allreduce_path": torch_smddp.stats()["allreduce_path"],
            "call_order_bad": overlapping_calls(rank, world),
            "half": half_sums(rank, world, list(groups.values())), **res}
