"""Child-side collective checks, run by mp_harness.run_world in every rank.

``collectives_vs_gloo(rank, world)`` runs every collective x dtype x op x size
case through the default process group (the backend under test) and through
a Gloo group created beside it, and checks each result against

  1. a closed-form oracle computed locally: every rank's input is a pure
     function of (case key, rank), so each rank regenerates all inputs and
     folds them with torch ops (float64 for floating point, wrap-around
     arithmetic in the dtype itself for integers);
  2. Gloo's answer on the same inputs (when Gloo accepts the combination;
     the refusals are reported back);
  3. optionally (``strict_order``, on by default for smddp) the exact
     rank-order fold smddp promises: inputs combined left to right in rank
     order, float16/bfloat16 accumulated in float32, AVG divided once at the
     end in the accumulation precision, so results are bitwise reproducible;
  4. bitwise agreement across ranks (digests gathered through Gloo).

Float tolerances are derived, not guessed: a sum of w terms evaluated in any
order with round-to-nearest in precision eps is within (w+1)*eps*sum|x_i| of
the exact sum (w-1 additions and a final rounding, each off by at most
eps*sum|x_i|); products likewise within (w+1)*eps*|prod|. The bound used is
twice that (the float64 oracle has its own rounding, which matters for
float64 inputs), plus a few subnormal spacings for results near zero. Cases
built from "grid" values (multiples of 1/8, or +-2^k for products) have exact
results in every dtype and order, and are compared bit for bit. MIN/MAX and
all data movement (broadcast, all_gather*) are compared bit for bit, with
NaN, -0.0 and infinities in the moved data.

Outputs are alternately plain tensors and views at an offset inside a larger
buffer whose guard elements must survive; every third call is async and its
work.get_future().wait() value must hold the outputs.

Every mismatch is recorded and the run continues, so one job reports
everything. Returns {"cases", "counts" (per family), "failures",
"gloo_refused", "both_refused", "skipped", "async_checked", "strict_order"}.

Known Gloo defects (torch 2.13) are tolerated only when Gloo itself is the
backend under test: bool SUM leaves non-canonical bytes (the count of Trues),
and non-dense strided tensors are silently corrupted.
"""
from __future__ import annotations

import collections
import hashlib
import time
import warnings
import zlib

import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import _coalescing_manager

from mp_harness import expect_raises
from collective_checker import Checker  # noqa: F401
from collective_oracle import *  # noqa: F401,F403 - cases and helpers
import collective_oracle  # noqa: F401 - collective_oracle.HOST_GROUPS

# --------------------------------------------------------------------------
# entry points (run in each rank by mp_harness)
# --------------------------------------------------------------------------

def collectives_vs_gloo(rank, world, backend="smddp", strict_order=None, quick=False):
    """Every collective x dtype x op x size, against Gloo and a closed form."""
    if strict_order is None:
        strict_order = "smddp" in backend
    # Known defects of Gloo, tolerated only when Gloo itself is under test
    # (SMDDP_TEST_BACKEND=gloo): bool SUM leaves bytes > 1 (the count of
    # Trues); non-dense strided tensors are silently mishandled.
    quirks = {"noncanonical_bool", "gloo_nondense"} if dist.get_backend() == "gloo" else set()
    gloo = dist.new_group(backend="gloo")
    ck = Checker(rank, world, gloo, backend, strict_order, quirks)
    sizes = SIZES[:5] + SIZES[6:7] if quick else SIZES

    # all_reduce: every dtype x meaningful op x size
    for dtype in ALL_DTYPES:
        for op_name in ops_for(dtype):
            for n in sizes:
                ck.all_reduce_case(dtype, op_name, n)
            if dtype.is_floating_point:
                for n in (17, 4097):
                    ck.all_reduce_case(dtype, op_name, n, exact=True)
            ck.all_reduce_case(dtype, op_name, 1023, shape=(3, 11, 31))
    if not quick:
        big = [(torch.float32, "SUM", 1 << 20), (torch.float32, "AVG", 1 << 20),
               (torch.float32, "MAX", (1 << 20) + 1), (torch.float16, "SUM", (1 << 20) + 1),
               (torch.bfloat16, "SUM", 1 << 19), (torch.float64, "SUM", (1 << 18) + 3),
               (torch.int32, "SUM", (1 << 18) + 3), (torch.int64, "BXOR", 1 << 18),
               (torch.uint8, "MAX", (1 << 20) + 7), (torch.bool, "BOR", (1 << 20) + 7)]
        for dtype, op_name, n in big:
            ck.all_reduce_case(dtype, op_name, n)
        for dtype, op_name in [(torch.float32, "SUM"), (torch.float16, "SUM"), (torch.bfloat16, "AVG"),
                               (torch.float64, "PRODUCT")]:
            ck.all_reduce_repeat_case(dtype, op_name, 65537)
    ck.async_pipeline_case()

    # coalesced all_reduce, through both public spellings
    for api in ("all_reduce_coalesced", "coalescing_manager"):
        for dtype, op_name in [(torch.float32, "SUM"), (torch.float64, "AVG"), (torch.float16, "SUM"),
                               (torch.bfloat16, "MAX"), (torch.int32, "SUM"), (torch.int8, "BXOR"),
                               (torch.uint8, "MIN"), (torch.bool, "BOR")]:
            for async_op in (False, True):
                ck.coalesced_case(dtype, op_name, api, async_op)

    # broadcast from every root
    for root in range(world):
        for dtype in ALL_DTYPES:
            for n in MOVE_SIZES:
                ck.broadcast_case(dtype, n, root)
    if not quick:
        ck.broadcast_case(torch.float32, 1 << 20, world - 1)

    # all_gather (list) and all_gather_into_tensor
    for dtype in ALL_DTYPES:
        for n in MOVE_SIZES:
            ck.all_gather_case(dtype, n)
            ck.all_gather_into_tensor_case(dtype, n, "flat")
        ck.all_gather_case(dtype, 35, shape=(5, 7))
        ck.all_gather_into_tensor_case(dtype, 35, "cat")
        ck.all_gather_into_tensor_case(dtype, 35, "stack")
    if not quick:
        ck.all_gather_into_tensor_case(torch.float32, (1 << 18) + 1, "flat")
        ck.all_gather_case(torch.bfloat16, (1 << 18) + 1)

    # non-contiguous tensors
    for coll in ("all_reduce", "broadcast"):
        for dtype in (torch.float32, torch.int32, torch.float16):
            for layout in ("every_other", "transposed"):
                ck.strided_case(coll, dtype, 1023, layout)

    # barrier: every rank takes a turn at being late (sync and async)
    for late in range(world):
        ck.barrier_case(late, async_op=bool(late % 2))

    ck.cross_rank_digests()
    dist.barrier(group=gloo)
    return {"cases": ck.cases, "counts": dict(ck.counts), "failures": ck.failures,
            "gloo_refused": sorted(ck.gloo_refused), "both_refused": sorted(ck.both_refused),
            "skipped": sorted(ck.skipped),
            "async_checked": ck.async_seen,
            "strict_order": strict_order}


# Bad inputs: each call must raise on every rank, and the group must still
# work afterwards. Run with run_world(..., expect_failure=True).
def _bad_calls(world):
    f32 = lambda n=5: torch.ones(n)  # noqa: E731
    return [
        ("all_reduce int32 AVG", lambda: torch.full((5,), 3, dtype=torch.int32),
         lambda t: dist.all_reduce(t, op=R.AVG)),
        ("all_reduce bool AVG", lambda: torch.ones(5, dtype=torch.bool),
         lambda t: dist.all_reduce(t, op=R.AVG)),
        ("all_reduce float32 BAND", f32, lambda t: dist.all_reduce(t, op=R.BAND)),
        ("all_reduce float16 BXOR", lambda: torch.ones(5, dtype=torch.float16),
         lambda t: dist.all_reduce(t, op=R.BXOR)),
        ("all_reduce bfloat16 BOR", lambda: torch.ones(5, dtype=torch.bfloat16),
         lambda t: dist.all_reduce(t, op=R.BOR)),
        ("all_reduce int16 SUM", lambda: torch.ones(5, dtype=torch.int16),
         lambda t: dist.all_reduce(t)),
        ("all_reduce int32 PREMUL_SUM", lambda: torch.full((5,), 3, dtype=torch.int32),
         lambda t: dist.all_reduce(t, op=dist._make_nccl_premul_sum(2.0))),
        ("broadcast root=world", f32, lambda t: dist.broadcast(t, src=world)),
        ("all_gather_into_tensor wrong output size", f32,
         lambda t: dist.all_gather_into_tensor(torch.empty(world * 5 + 1), t)),
        ("all_gather wrong list length", f32,
         lambda t: dist.all_gather([torch.empty(5) for _ in range(world + 1)], t)),
        ("all_gather wrong slot size", f32,
         lambda t: dist.all_gather([torch.empty(4) for _ in range(world)], t)),
    ]


def bad_inputs(rank, world):
    out = {}
    for name, make, call in _bad_calls(world):
        t = make()
        before = t.clone()
        msg = expect_raises(lambda: call(t), Exception, what=name)
        # the group must still be usable after a rejected call
        probe = torch.full((3,), float(rank + 1))
        dist.all_reduce(probe)
        settle()
        want = world * (world + 1) / 2
        if not torch.equal(probe, torch.full((3,), want)):
            raise AssertionError(f"after rejecting '{name}' all_reduce gave {probe.tolist()}, want {want}")
        out[name] = {"message": msg, "input_unchanged": bitwise_equal(t, before)}
    return out


# --------------------------------------------------------------------------
# harness self-test targets (backend-agnostic)
# --------------------------------------------------------------------------

def selftest_echo(rank, world, token):
    t = torch.tensor([float(rank)])
    dist.all_reduce(t)
    import os
    return {"rank": rank, "world": world, "token": token, "sum": t.item(),
            "backend": dist.get_backend(), "env": os.environ.get("SMDDP_HARNESS_TEST_VAR"),
            "local_rank": os.environ.get("LOCAL_RANK")}


def selftest_raise(rank, world, bad_rank):
    if rank == bad_rank:
        raise ValueError(f"boom from rank {rank}")
    dist.barrier()  # blocks until the harness kills us
    return "unreachable"


def selftest_hang(rank, world, pid_dir):
    import os
    import subprocess
    child = subprocess.Popen(["sleep", "600"])  # same process group as the rank
    escaped = subprocess.Popen(["sleep", "600"], start_new_session=True)  # a group of its own
    with open(os.path.join(pid_dir, f"pids.{rank}"), "w") as f:
        f.write(f"{os.getpid()} {child.pid} {escaped.pid}\n")
    time.sleep(600)
