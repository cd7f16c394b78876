"""A stand-in for a real torchcomms (test_torchcomms.py): what torch 2.13's
c10d imports from it when TORCH_DISTRIBUTED_USE_TORCHCOMMS=1, with a
new_comm that, like torchcomms, knows no backend called smddp."""


def new_comm(backend, device, **kwargs):
    raise RuntimeError(f"torchcomms: no backend named {backend!r}")
