"""Worker of test_cluster_paths.py, started by torchrun on each host of a
namespace cluster of one rank per host: ``cluster_paths_worker.py --out F``.

It records which allreduce path the world group took, reduces the same
inputs through smddp and Gloo, and through an smddp group whose partials
cross hosts in bf16; rank 0 writes what every rank saw to F. The parent
asserts; the worker only observes."""

import argparse
import datetime
import os
import sys

import torch
import torch.distributed as dist

import torch_smddp

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "harness"))
from mp_helpers import write_everyones  # noqa: E402


def inputs(key, rank, n):
    return torch.randn(n, generator=torch.Generator().manual_seed(key * 1000 + rank))


def gather_scatter_in_rounds(rank, world, gloo):
    """All-gather and reduce-scatter, direct (one rank per host): 7.2 MB
    and up run in pairwise rounds, 1.2 MB not; against Gloo, and the f32
    reduce-scatter against its closed form (rank order, in f32)."""
    before = torch_smddp.stats()["rounds_calls"]
    out = {}
    for n, tag in ((600_001, "big"), (100_003, "small")):
        x = inputs(11, rank, n)
        got, want = torch.empty(n * world), torch.empty(n * world)
        dist.all_gather_into_tensor(got, x)
        dist.all_gather_into_tensor(want, x, group=gloo)
        out[f"all_gather_{tag}_equal_gloo"] = bool(torch.equal(got, want))
        flat = inputs(12, rank, n * world)
        rs = torch.empty(n)
        dist.reduce_scatter_tensor(rs, flat.clone())
        acc = inputs(12, 0, n * world).narrow(0, n * rank, n).clone()
        for r in range(1, world):
            acc = acc + inputs(12, r, n * world).narrow(0, n * rank, n)
        out[f"reduce_scatter_{tag}_closed_form"] = bool(torch.equal(rs, acc))
        ints = (flat * 1000).to(torch.int64)
        a, b = torch.empty(n, dtype=torch.int64), torch.empty(n, dtype=torch.int64)
        dist.reduce_scatter_tensor(a, ints.clone())
        dist.reduce_scatter_tensor(b, ints.clone(), group=gloo)
        out[f"reduce_scatter_{tag}_int64_equal_gloo"] = bool(torch.equal(a, b))
    out["gather_scatter_rounds_calls"] = torch_smddp.stats()["rounds_calls"] - before
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("smddp", timeout=datetime.timedelta(seconds=120))
    rank, world = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    narrow = dist.new_group(backend="smddp",
                            pg_options=torch_smddp.Options(cross_host_dtype="bf16"))
    res = {"rank": rank, "world_path": torch_smddp.stats()["allreduce_path"],
           "narrow_path": torch_smddp.stats(narrow)["allreduce_path"]}
    g = torch.Generator().manual_seed(7 + rank)
    # 4.8 MB and 8 MB: both run in pairwise rounds (SMDDP_ROUNDS_MIN_BYTES).
    ints = torch.randint(-2**40, 2**40, (600_001,), generator=g)
    floats = torch.randn(1_000_003, generator=g, dtype=torch.float64)
    a, b = ints.clone(), ints.clone()
    dist.all_reduce(a)
    dist.all_reduce(b, group=gloo)
    res["int64_equal_gloo"] = bool(torch.equal(a, b))
    a, b = floats.clone(), floats.clone()
    dist.all_reduce(a)
    dist.all_reduce(b, group=gloo)
    # The two sum in different orders: each within f64's rounding of the
    # other, (n - 1) 2^-53 sum |x| apiece.
    mag = floats.abs()
    dist.all_reduce(mag, group=gloo)
    res["f64_within_rounding_of_gloo"] = bool(((a - b).abs() <= 2 * world * 2.0 ** -53 * mag).all())
    res["rounds_calls"] = torch_smddp.stats()["rounds_calls"]
    res.update(gather_scatter_in_rounds(rank, world, gloo))
    # bf16 crossing: within the bound of docs/design.md against Gloo's f64 sum.
    x = torch.randn(1_000_003, generator=g) * 100
    exact, absum = x.double(), x.double().abs()
    dist.all_reduce(exact, group=gloo)
    dist.all_reduce(absum, group=gloo)
    y = x.clone()
    dist.all_reduce(y, group=narrow)
    bound = 2.0 ** -8 * 1.01 * (absum + exact.abs()) + (world + 3) * 2.0 ** -24 * absum
    err = (y.double() - exact).abs()
    res["bf16_within_bound"] = bool((err <= bound).all())
    res["bf16_worst_of_bound"] = float((err / bound).max())
    res["bf16_representable"] = bool(torch.equal(y.to(torch.bfloat16).float(), y))
    res["bf16_bytes"] = int(y.view(torch.int32).to(torch.int64).sum())
    write_everyones(res, args.out, gloo)


if __name__ == "__main__":
    main()
