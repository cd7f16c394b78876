"""Inputs and oracles for the collective checks (see cases_collectives.py):
every rank's input as a pure function of (case key, rank), the closed-form
fold of all ranks' inputs, the exact rank-order (and, with HOST_GROUPS,
host-hierarchical) fold smddp promises, and byte-level comparisons."""

from __future__ import annotations

import collections
import os
import hashlib
import time
import warnings
import zlib

import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import _coalescing_manager

from mp_harness import expect_raises

R = dist.ReduceOp

FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
INTS = [torch.int8, torch.uint8, torch.int32, torch.int64]
ALL_DTYPES = FLOATS + INTS + [torch.bool]

OPS = {"SUM": R.SUM, "AVG": R.AVG, "MIN": R.MIN, "MAX": R.MAX, "PRODUCT": R.PRODUCT,
       "BAND": R.BAND, "BOR": R.BOR, "BXOR": R.BXOR}
FLOAT_OPS = ["SUM", "AVG", "MIN", "MAX", "PRODUCT"]
INT_OPS = ["SUM", "MIN", "MAX", "PRODUCT", "BAND", "BOR", "BXOR"]

# Element counts: empty, tiny (fewer elements than ranks), odd, around powers
# of two (typical chunk/shard boundaries) and a few larger ones.
SIZES = [0, 1, 2, 3, 5, 17, 1023, 4097, 65537]
MOVE_SIZES = [0, 1, 3, 1023, 65537]
GUARD = 13  # guard elements either side of an offset view

warnings.filterwarnings("ignore", category=FutureWarning)  # all_reduce_coalesced
warnings.filterwarnings("ignore", category=UserWarning)


def dname(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def ops_for(dtype):
    return FLOAT_OPS if dtype.is_floating_point else INT_OPS


# --------------------------------------------------------------------------
# deterministic inputs
# --------------------------------------------------------------------------

def _gen(key: str, r: int) -> torch.Generator:
    return torch.Generator().manual_seed(zlib.crc32(f"{key}#{r}".encode()))


def make_input(key: str, r: int, dtype: torch.dtype, n: int, flavour: str) -> torch.Tensor:
    """Input of rank ``r`` for case ``key``: a pure function of its arguments.

    flavour: "normal" (random), "grid" (exactly summable/multipliable values),
    "prod" (magnitudes in [0.5, 2], safe for products), "minmax" (random
    plus infinities / integer extremes), "bits" (full-range integers),
    "small" (small integers, safe for integer products), "special" (floats
    with NaN, -0.0 and infinities, for data-movement collectives only).
    """
    g = _gen(key, r)
    if dtype == torch.bool:
        return torch.randint(0, 2, (n,), generator=g).bool()
    if dtype.is_floating_point:
        if flavour == "grid":
            x = torch.randint(-64, 65, (n,), generator=g).double() / 8
        elif flavour == "gridprod":
            x = torch.pow(2.0, torch.randint(-1, 2, (n,), generator=g).double())
            x = x * (torch.randint(0, 2, (n,), generator=g).double() * 2 - 1)
        elif flavour == "prod":
            x = (0.5 + 1.5 * torch.rand(n, generator=g, dtype=torch.float64))
            x = x * (torch.randint(0, 2, (n,), generator=g).double() * 2 - 1)
        else:
            x = torch.randn(n, generator=g, dtype=torch.float64)
            if flavour == "minmax" and n >= 2:
                x[r % n] = float("inf") if r % 2 == 0 else float("-inf")
                x[(r + 1) % n] = -3.0e4 if r % 2 else 3.0e4
            if flavour == "special" and n >= 4:
                x[0], x[1], x[2], x[3] = float("nan"), -0.0, float("inf"), float("-inf")
        return x.to(dtype)
    info = torch.iinfo(dtype)
    if flavour == "small":
        lo, hi = (-9, 10) if info.min < 0 else (0, 10)
    else:
        lo, hi = info.min, info.max + 1 if info.max < 2**63 - 1 else info.max
    if dtype == torch.int64 and flavour != "small":
        # torch.randint's bounds are int64 themselves; assemble 64 random bits.
        a = torch.randint(-2**31, 2**31, (n,), generator=g, dtype=torch.int64)
        b = torch.randint(0, 2**32, (n,), generator=g, dtype=torch.int64)
        x = (a << 32) | b
    else:
        x = torch.randint(lo, hi, (n,), generator=g, dtype=torch.int64).to(dtype)
    if flavour == "minmax" and n >= 2:
        x[r % n] = info.min if r % 2 == 0 else info.max
        x[(r + 1) % n] = info.max if r % 2 == 0 else info.min
    return x


def flavour_for(dtype, op_name, exact: bool) -> str:
    if dtype == torch.bool:
        return "bool"
    if dtype.is_floating_point:
        if op_name == "PRODUCT":
            return "gridprod" if exact else "prod"
        if op_name in ("MIN", "MAX"):
            return "grid" if exact else "minmax"
        return "grid" if exact else "normal"
    if op_name == "PRODUCT" and dtype in (torch.int32, torch.int64):
        return "small" if exact else "bits"  # "bits": wrap-around products
    if op_name in ("MIN", "MAX"):
        return "minmax"
    return "bits"


# --------------------------------------------------------------------------
# oracles
# --------------------------------------------------------------------------

_BOOL_FOLD = {"SUM": torch.logical_or, "PRODUCT": torch.logical_and,
              "MIN": torch.logical_and, "MAX": torch.logical_or,
              "BAND": torch.logical_and, "BOR": torch.logical_or, "BXOR": torch.logical_xor}
_INT_FOLD = {"SUM": torch.add, "PRODUCT": torch.mul, "MIN": torch.minimum,
             "MAX": torch.maximum, "BAND": torch.bitwise_and, "BOR": torch.bitwise_or,
             "BXOR": torch.bitwise_xor}
_FLOAT_FOLD = {"SUM": torch.add, "AVG": torch.add, "PRODUCT": torch.mul,
               "MIN": torch.minimum, "MAX": torch.maximum}


def oracle(op_name, dtype, xs, world):
    """Closed-form result. Floats: (float64 value, float64 error bound).
    Integers/bool: (exact tensor in dtype, None)."""
    if dtype == torch.bool:
        acc = xs[0].clone()
        for x in xs[1:]:
            acc = _BOOL_FOLD[op_name](acc, x)
        return acc, None
    if not dtype.is_floating_point:
        acc = xs[0].clone()
        for x in xs[1:]:
            acc = _INT_FOLD[op_name](acc, x)  # wraps in the dtype, like C++ would
        return acc.to(dtype), None
    x64 = torch.stack([x.double() for x in xs])
    eps = torch.finfo(dtype).eps
    # smallest subnormal spacing of the dtype, for results near zero
    tiny = torch.finfo(dtype).tiny * eps
    c = 2 * (world + 1)  # tested result and float64 oracle each within (w+1) eps
    if op_name in ("SUM", "AVG"):
        val = x64.sum(0)
        bound = c * eps * x64.abs().sum(0) + c * tiny
        if op_name == "AVG":
            val = val / world
            bound = bound / world + eps * val.abs() + tiny
        return val, bound
    if op_name == "PRODUCT":
        val = x64.prod(0)
        return val, c * eps * val.abs() + c * tiny
    val = x64.amin(0) if op_name == "MIN" else x64.amax(0)
    return val, torch.zeros_like(val)


# Ranks grouped by host, when the job spans several (pretend) hosts with the
# same number of ranks each: smddp then folds each host's ranks in rank order
# through the host's segment, rounds to the dtype, and folds the host
# partials in host order. None: one host (a plain rank-order fold).
HOST_GROUPS = None


def _ordered_fold(op_name, dtype, xs):
    acc_t = torch.float64 if dtype == torch.float64 else torch.float32
    acc = xs[0].to(acc_t)
    for x in xs[1:]:
        acc = _FLOAT_FOLD[op_name](acc, x.to(acc_t))
    return acc


def rank_order_fold(op_name, dtype, xs, world):
    """smddp's documented semantics: left-to-right in rank order; f16/bf16
    (and f32) accumulate in float32, f64 in float64; AVG divides once."""
    if not dtype.is_floating_point:
        return oracle(op_name, dtype, xs, world)[0]
    if HOST_GROUPS and len(HOST_GROUPS) > 1:
        # Each host's partial stays in the accumulation type (f16/bf16 too)
        # and the hosts' partials are folded in host order: one rounding.
        local_op = "SUM" if op_name == "AVG" else op_name
        partials = [_ordered_fold(local_op, dtype, [xs[r] for r in g]) for g in HOST_GROUPS]
        acc = _ordered_fold(local_op, dtype, partials)
    else:
        acc = _ordered_fold(op_name, dtype, xs)
    if op_name == "AVG":
        acc = acc / world
    return acc.to(dtype)


def _bytes(t: torch.Tensor) -> bytes:
    t = t.detach().contiguous()
    if t.numel() == 0:
        return b""
    return t.view(torch.uint8).numpy().tobytes() if t.dtype != torch.bool else t.numpy().tobytes()


def digest(t: torch.Tensor) -> str:
    return hashlib.sha1(_bytes(t)).hexdigest()[:16]


_SIM = os.environ.get("SMDDP_DEVICE_SIM") == "1"


def settle():
    """On the simulated device, as on a GPU, a host read of a collective's
    result is correct only once the device has drained: what
    torch.cuda.synchronize() is to a CUDA test, sim_synchronize() is here."""
    if _SIM:
        import torch_smddp.testing
        torch_smddp.testing.sim_synchronize()


def bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    settle()
    return a.dtype == b.dtype and a.shape == b.shape and _bytes(a) == _bytes(b)


def canonical_bool(t: torch.Tensor) -> bool:
    """True when every byte of a bool tensor is 0 or 1."""
    return t.numel() == 0 or bool((t.contiguous().view(torch.uint8) <= 1).all())
