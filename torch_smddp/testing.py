"""What ``torch.cuda`` offers a test, on smddp's simulated device.

With ``SMDDP_DEVICE_SIM=1`` collectives on CPU tensors take the GPU path
through a stand-in device that follows CUDA's rules (docs/gpu.md): each
thread has a current device and a current stream, a collective records a
readiness event on that stream, ``work.wait()`` makes the stream wait for the
copies back without blocking the host, and a host read of a result is
correct only after :func:`sim_synchronize`, as after
``torch.cuda.synchronize()``. These helpers drive the stand-in from tests.
"""
from __future__ import annotations

import contextlib

import torch

from . import _C

__all__ = ["sim_set_device", "sim_current_device", "sim_synchronize", "sim_fill_", "sim_record",
           "sim_capture", "sim_contexts", "sim_violations", "sim_clear_violations",
           "sim_copies_from"]


def sim_set_device(index: int) -> None:
    """``torch.cuda.set_device``: the calling thread's current simulated device
    (this makes a context on it)."""
    _C.sim_set_device(int(index))


def sim_current_device() -> int:
    return _C.sim_current_device()


def sim_synchronize(timeout: float = 60.0) -> None:
    """``torch.cuda.synchronize()``: the host waits until every operation
    queued on the current simulated device has run."""
    _C.sim_synchronize(float(timeout))


def sim_fill_(tensor: torch.Tensor, value) -> torch.Tensor:
    """A kernel on the current stream that fills ``tensor`` with ``value``
    later (the stand-in's delays apply), not now."""
    pattern = torch.tensor([value], dtype=tensor.dtype).view(torch.uint8).tolist()
    _C.sim_fill_(tensor, pattern)
    return tensor


def sim_record():
    """An event on the current stream (``torch.cuda.Event().record()``);
    ``.query()`` says whether the work queued before it has run."""
    return _C.sim_record()


@contextlib.contextmanager
def sim_capture():
    """``torch.cuda.graph``'s capture (global mode) on a new stream made
    current: meanwhile an event query or a host wait from a thread not in
    relaxed mode breaks the stand-in's rules."""
    _C.sim_begin_capture()
    try:
        yield
    finally:
        _C.sim_end_capture()


def sim_contexts() -> list[int]:
    """The simulated devices this process has a context on (what
    ``nvidia-smi`` lists per GPU)."""
    return list(_C.sim_contexts())


def sim_violations() -> list[str]:
    """Every rule of CUDA's the process broke on the stand-in so far."""
    return list(_C.sim_violations())


def sim_clear_violations() -> None:
    _C.sim_clear_violations()


def sim_copies_from(tensor: torch.Tensor) -> int:
    """How many device copies read from ``tensor``'s memory, of the last
    few thousand on every simulated device."""
    return int(_C.sim_copies_from(tensor))
