"""`smdistributed.dataparallel.torch.distributed`: SageMaker's older API,
mapped onto torch.distributed with the smddp backend. As in SageMaker's
library, process groups other than `group.WORLD` are not offered, and
ReduceOp has AVERAGE, SUM, MIN and MAX. A name of SageMaker's API that has
no meaning here raises an error that says so.
"""
from __future__ import annotations

import os

import torch.distributed as _dist

import torch_smddp  # noqa: F401 - registers "smddp"

__all__ = ["is_available", "init_process_group", "is_initialized", "get_world_size", "get_rank",
           "get_local_rank", "get_local_size", "all_reduce", "broadcast", "all_gather",
           "all_to_all_single", "barrier", "ReduceOp", "group"]

class _Groups:
    """`group.WORLD`: the default group, the only one SageMaker's library offers."""

    @property
    def WORLD(self):  # noqa: N802 - SageMaker's name
        return _dist.group.WORLD


group = _Groups()


class ReduceOp:
    AVERAGE = _dist.ReduceOp.AVG
    SUM = _dist.ReduceOp.SUM
    MIN = _dist.ReduceOp.MIN
    MAX = _dist.ReduceOp.MAX


def _world_only(g, what):
    if g is not None and g is not group.WORLD and g is not _dist.group.WORLD:
        raise ValueError(f"smdistributed.dataparallel.torch.distributed.{what}: only group.WORLD is "
                         "supported (as in SageMaker's library); use torch.distributed with the smddp "
                         "backend for other process groups")
    return None


def is_available() -> bool:
    """True when started as a distributed job (a launcher set RANK and WORLD_SIZE)."""
    return bool(os.environ.get("RANK")) and bool(os.environ.get("WORLD_SIZE"))


def init_process_group(*args, **kwargs) -> None:
    """The smddp default group, from the launcher's environment (torchrun)."""
    if args or set(kwargs) - {"timeout"}:
        raise TypeError("smdistributed.dataparallel.torch.distributed.init_process_group takes no "
                        "arguments but timeout (SageMaker's takes none): got "
                        f"{list(args) + sorted(kwargs)}")
    if not is_available():
        raise RuntimeError("smdistributed.dataparallel.torch.distributed.init_process_group: not "
                           "started as a distributed job (RANK and WORLD_SIZE are unset); launch with "
                           "torchrun")
    _dist.init_process_group(backend="smddp", **kwargs)


def is_initialized() -> bool:
    return _dist.is_initialized()


def get_world_size(group=None) -> int:
    _world_only(group, "get_world_size")
    return _dist.get_world_size()


def get_rank(group=None) -> int:
    _world_only(group, "get_rank")
    return _dist.get_rank()


def get_local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0"))


def get_local_size() -> int:
    return int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1")))


def all_reduce(tensor, op=ReduceOp.SUM, group=None, async_op=False):
    _world_only(group, "all_reduce")
    return _dist.all_reduce(tensor, op=op, async_op=async_op)


def broadcast(tensor, src=0, group=None, async_op=False):
    _world_only(group, "broadcast")
    return _dist.broadcast(tensor, src=src, async_op=async_op)


def all_gather(tensor_list, tensor, group=None, async_op=False):
    _world_only(group, "all_gather")
    return _dist.all_gather(tensor_list, tensor, async_op=async_op)


def all_to_all_single(output_t, input_t, output_split_sizes=None, input_split_sizes=None,
                      group=None, async_op=False):
    _world_only(group, "all_to_all_single")
    return _dist.all_to_all_single(output_t, input_t, output_split_sizes, input_split_sizes,
                                   async_op=async_op)


def barrier(group=None, async_op=False):
    _world_only(group, "barrier")
    return _dist.barrier(async_op=async_op)


def __getattr__(name):
    raise AttributeError(f"smdistributed.dataparallel.torch.distributed.{name}: not part of SageMaker's "
                         "API as torch-smddp provides it (use torch.distributed with the smddp backend)")
