"""What ``torch.cuda`` offers a test, on smddp's simulated device.

With ``SMDDP_DEVICE_SIM=1`` collectives on CPU tensors take the GPU path
through a stand-in device that follows CUDA's rules (docs/gpu.md): each
thread has a current device and a current stream, a collective records a
readiness event on that stream, ``work.wait()`` makes the stream wait for the
copies back without blocking the host, and a host read of a result is
correct only after :func:`sim_synchronize`, as after
``torch.cuda.synchronize()``. These helpers drive the stand-in from tests.

:func:`sim_torch_device` also makes the stand-in a torch device,
``privateuseone``, whose ops are kernels on its streams and whose futures
carry its events, as CUDA's do.
"""
from __future__ import annotations

import contextlib

import torch

from . import _C

__all__ = ["sim_set_device", "sim_current_device", "sim_synchronize", "sim_fill_", "sim_record",
           "sim_capture", "sim_contexts", "sim_violations", "sim_clear_violations",
           "sim_copies_from", "sim_torch_device"]

SIM_TORCH_DEVICE = "privateuseone"
_renamed: list = []


def sim_torch_device() -> str:
    """Registers the stand-in as torch's PrivateUse1 device and returns its
    name: tensors on ``privateuseone:N`` live on simulated device N; every
    op on them first waits, on the host, for what the current stream of
    their device has queued (as a kernel on that stream would), and
    collectives on them take smddp's device path, whose futures carry the
    stand-in's events. Needs ``SMDDP_DEVICE_SIM=1``; refuses when another
    extension owns PrivateUse1."""
    import os

    import torch.distributed as dist

    if os.environ.get("SMDDP_DEVICE_SIM") != "1":
        raise RuntimeError("sim_torch_device() needs SMDDP_DEVICE_SIM=1")
    _C.sim_enable_torch_device()
    # torch takes PrivateUse1 for the accelerator once it has a name.
    if not _renamed:
        torch.utils.rename_privateuse1_backend(SIM_TORCH_DEVICE)
        _renamed.append(True)
    # c10d sends the device's tensors to smddp (a group made after this).
    devices = dist.Backend.backend_capability.setdefault("smddp", ["cpu"])
    if SIM_TORCH_DEVICE not in devices:
        devices.append(SIM_TORCH_DEVICE)
    if not hasattr(torch, SIM_TORCH_DEVICE):
        torch._register_device_module(SIM_TORCH_DEVICE, _SimDeviceModule)
    return SIM_TORCH_DEVICE


class _SimDeviceModule:
    """``torch.privateuseone``: what torch's generic code asks of a device module."""

    @staticmethod
    def is_available() -> bool:
        return True

    @staticmethod
    def device_count() -> int:
        return 8

    @staticmethod
    def current_device() -> int:
        return _C.sim_current_device()

    @staticmethod
    def set_device(index) -> None:
        _C.sim_set_device(int(torch.device(SIM_TORCH_DEVICE, index).index
                              if not isinstance(index, int) else index))

    @staticmethod
    def synchronize(device=None) -> None:
        _C.sim_synchronize(60.0)

    @staticmethod
    def _is_in_bad_fork() -> bool:
        return False

    @staticmethod
    def is_initialized() -> bool:
        return True

    @staticmethod
    def _lazy_init() -> None:
        pass

    @staticmethod
    def manual_seed_all(seed: int) -> None:
        pass  # its random numbers come from the CPU generator

    # Streams and events (what FSDP2 asks of a device module): torch's
    # generic ones, over the stand-in's device guard.
    @staticmethod
    def Stream(device=None, priority: int = 0, **kwargs):  # noqa: N802 - torch.cuda's name
        index = _C.sim_current_device() if device is None else torch.device(device).index
        return torch.Stream(torch.device(SIM_TORCH_DEVICE, index), priority=priority, **kwargs)

    @staticmethod
    def Event(enable_timing: bool = False, **kwargs):  # noqa: N802 - torch.cuda's name
        return torch.Event(torch.device(SIM_TORCH_DEVICE, _C.sim_current_device()),
                           enable_timing=enable_timing, **kwargs)

    @staticmethod
    def current_stream(device=None):
        index = _C.sim_current_device() if device is None else torch.device(device).index
        return torch.accelerator.current_stream(torch.device(SIM_TORCH_DEVICE, index))

    @staticmethod
    @contextlib.contextmanager
    def stream(stream):
        if stream is None:
            yield
            return
        previous = torch.accelerator.current_stream(stream.device)
        torch.accelerator.set_stream(stream)
        try:
            yield
        finally:
            torch.accelerator.set_stream(previous)


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
