"""``python -m torch_smddp.info``: what this build is and what it would use."""

from __future__ import annotations

import os
import socket
import sys


def main() -> int:
    import torch

    import torch_smddp
    from torch_smddp import _C

    print(f"torch-smddp        {torch_smddp.__version__}")
    print(f"built against torch {_C.built_with_torch} (running {torch.__version__})")
    print(f"python             {sys.version.split()[0]}")
    print(f"libfabric          {_C.libfabric_version()}")
    print(f"providers          {', '.join(_C.available_providers()) or '(none)'}")
    host = os.environ.get("SMDDP_HOST_ID") or socket.gethostname()
    try:
        one, why_one = _C.choose_provider(True)
        many, why_many = _C.choose_provider(False)
    except Exception as exc:  # a bad SMDDP_* value names itself here
        print(f"provider choice    error: {exc}")
        return 1
    print(f"host identity      {host}")
    print(f"provider (1 host)  {one}  [{why_one}]")
    print(f"provider (>1 host) {many}  [{why_many}]")
    # Across hosts, tcp (and smddp's liveness connections, which follow the
    # tcp endpoint's address) take this interface; FI_TCP_IFACE picks another.
    try:
        iface, addr = _C.provider_address("tcp;ofi_rxm")
        chosen = "FI_TCP_IFACE" if os.environ.get("FI_TCP_IFACE") else "first usable"
        print(f"tcp interface      {iface or '?'} {addr or '?'}  [{chosen}; set FI_TCP_IFACE to "
              "choose another]")
    except Exception as exc:  # no tcp provider in this libfabric
        print(f"tcp interface      unavailable: {exc}")
    print(f"reduce kernels     {_C.reduce_kernel_isa()}")
    print()
    print("SMDDP_* settings (effective value, default, meaning):")
    for env, typ, default, doc in sorted(_C.params()):
        value = os.environ.get(env)
        shown = value if value not in (None, "") else f"{default} (default)"
        print(f"  {env:<26} {typ:<7} {shown:<22} {doc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
