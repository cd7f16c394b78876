"""`smdistributed.dataparallel.torch.distributed`: SageMaker's older API,
mapped onto torch.distributed with the smddp backend. As in SageMaker's
library, process groups other than `group.WORLD` are not offered, and
ReduceOp has AVERAGE, SUM, MIN and MAX. A name of SageMaker's API that has
no meaning here raises an error that says so.
"""
from __future__ import annotations

import inspect
import os
import warnings

import torch.distributed as _dist

import torch_smddp  # noqa: F401 - registers "smddp"
from smdistributed.dataparallel.torch._environment import apply_mpi_environment, launcher_value

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
    """True when started as a distributed job: a launcher set RANK and
    WORLD_SIZE (torchrun), or Open MPI's mpirun its OMPI_COMM_WORLD_* ones."""
    return launcher_value("RANK") is not None and launcher_value("WORLD_SIZE") is not None


def _torch_parameters():
    """torch.distributed.init_process_group's public parameters, in order."""
    sig = inspect.signature(_dist.init_process_group)
    return sig.replace(parameters=[p for p in sig.parameters.values() if not p.name.startswith("_")])


_TORCH_INIT = _torch_parameters()


def init_process_group(*args, **kwargs) -> None:
    """The smddp default group. Takes what torch.distributed.init_process_group
    takes (SageMaker's takes *args, **kwargs for parity with it) and passes it
    on, with the backend always "smddp". With env:// (the default) the
    launcher's environment says who is who: torchrun's, or Open MPI's mpirun's
    mapped onto it (see _environment.mpi_environment)."""
    try:
        bound = _TORCH_INIT.bind(*args, **kwargs)
    except TypeError as e:
        raise TypeError("smdistributed.dataparallel.torch.distributed.init_process_group takes the "
                        f"arguments of torch.distributed.init_process_group {_TORCH_INIT}: {e}") from None
    arguments = dict(bound.arguments)
    backend = arguments.pop("backend", None)
    if backend is not None and str(backend) != "smddp":
        # SageMaker's library ignores the backend; so does this one, but says so.
        warnings.warn(f"smdistributed.dataparallel.torch.distributed.init_process_group: backend "
                      f"{backend!r} ignored; this API's group is always \"smddp\"", RuntimeWarning,
                      stacklevel=2)
    env_rendezvous = arguments.get("store") is None and arguments.get("init_method") in (None, "env://")
    # Under mpirun: strict where torch's env:// will need MASTER_ADDR.
    apply_mpi_environment(strict=env_rendezvous)
    if env_rendezvous:
        missing = [name for name, arg in (("RANK", "rank"), ("WORLD_SIZE", "world_size"))
                   if not os.environ.get(name, "").strip() and arguments.get(arg, -1) == -1]
        if missing:
            raise RuntimeError("smdistributed.dataparallel.torch.distributed.init_process_group: not "
                               f"started as a distributed job ({' and '.join(missing)} unset); launch "
                               "with torchrun, or with Open MPI's mpirun")
    _dist.init_process_group(backend="smddp", **arguments)


def is_initialized() -> bool:
    return _dist.is_initialized()


def _before_init(name, what):
    """Before init_process_group, the launcher's value (torchrun's or mpirun's);
    torch's error where there is none."""
    value = launcher_value(name)
    if value is None:
        return getattr(_dist, what)()  # raises: not initialized
    return value


def get_world_size(group=None) -> int:
    _world_only(group, "get_world_size")
    return _dist.get_world_size() if _dist.is_initialized() else _before_init("WORLD_SIZE", "get_world_size")


def get_rank(group=None) -> int:
    _world_only(group, "get_rank")
    return _dist.get_rank() if _dist.is_initialized() else _before_init("RANK", "get_rank")


def get_local_rank() -> int:
    """LOCAL_RANK (torchrun), else OMPI_COMM_WORLD_LOCAL_RANK (mpirun), else 0."""
    value = launcher_value("LOCAL_RANK")
    return 0 if value is None else value


def get_local_size() -> int:
    """LOCAL_WORLD_SIZE (torchrun), else OMPI_COMM_WORLD_LOCAL_SIZE (mpirun),
    else the world size (one host), else 1."""
    for name in ("LOCAL_WORLD_SIZE", "WORLD_SIZE"):
        value = launcher_value(name)
        if value is not None:
            return value
    return 1


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
