"""Child side of test_gpu.py, the defects the GPU path was fixed for, on
real CUDA (scripts/gpu_check.sh): a coalesced 256 MiB call read at once
after wait(), irecv-first rings under CUDA_DEVICE_MAX_CONNECTIONS=1, a
killed peer, and the rest of ``defects``. Helpers and oracles are
cases_gpu.py's; ``cases_gpu.run_all`` runs ``defects`` with its other
sections."""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from cases_gpu import DEV, Checks  # noqa: F401


# --------------------------------------------------------------------------
# the defects the GPU path was fixed for, on real CUDA (gpu_check.sh)
# --------------------------------------------------------------------------

def defects(rank, world, gloo):
    from torch.distributed.distributed_c10d import _coalescing_manager

    c = Checks(rank, world, gloo)
    total = float(sum(r + 1 for r in range(world)))

    def coalesced_256m():
        # A 256 MiB coalesced block, read at once after wait(): the block's
        # Work orders the current stream after every call's copies back.
        a = torch.full((64 << 20,), float(rank + 1), device=DEV)
        b = torch.full((1000,), float(rank + 1), device=DEV)
        with _coalescing_manager(device=DEV, async_ops=True) as cm:
            dist.all_reduce(a)
            dist.all_reduce(b)
        cm.wait()
        ok = bool((a == total).all().item()) and bool((b == total).all().item())
        if not ok:
            c.failures.append(f"rank {rank} coalesced 256 MiB read after wait(): {a[:2].tolist()} {b[:2].tolist()}")

    def tensor_factor():
        factor = torch.full((1,), 0.5, device=DEV)
        t = torch.full((1 << 20,), float(rank + 1), device=DEV)
        dist.all_reduce(t, op=dist._make_nccl_premul_sum(factor))
        if not torch.allclose(t, torch.full_like(t, 0.5 * total)):
            c.failures.append(f"rank {rank} PREMUL_SUM with a CUDA factor: {t[:2].tolist()}")

    def capture():
        s = torch.cuda.Stream()
        g = torch.cuda.CUDAGraph()
        x = torch.ones(8, device=DEV)
        try:
            with torch.cuda.graph(g, stream=s):
                dist.all_reduce(x)
            c.failures.append(f"rank {rank} all_reduce under capture did not raise")
        except RuntimeError as e:
            if "all_reduce" not in str(e) or "captur" not in str(e):
                c.failures.append(f"rank {rank} capture error does not name the call: {str(e)[:200]}")
        y = torch.ones(8, device=DEV)
        dist.all_reduce(y)
        if not bool((y == world).all().item()):
            c.failures.append(f"rank {rank} group broken after the refused capture: {y.tolist()}")

    def destroy_then_free():
        g = dist.new_group(backend="smddp")
        kept = [torch.full((1 << 18,), float(rank + i), device=DEV) for i in range(4)]
        works = [dist.all_reduce(t, group=g, async_op=True) for t in kept]
        dist.destroy_process_group(g)
        for w in works:
            try:
                w.wait()
            except RuntimeError:
                pass
        del kept, works
        torch.cuda.synchronize()
        torch.cuda.empty_cache()  # frees blocks recorded on the pool streams

    def barrier_orders():
        t = torch.full((16 << 20,), float(rank + 1), device=DEV)
        dist.all_reduce(t, async_op=True)
        dist.barrier()
        host = t.cpu()  # a host read right after barrier() must see the result
        if not bool((host == total).all()):
            c.failures.append(f"rank {rank} read after barrier: {host[:2].tolist()}")

    for name, fn in (("coalesced_256m", coalesced_256m), ("tensor_factor", tensor_factor),
                     ("capture", capture), ("destroy_then_free", destroy_then_free),
                     ("barrier_orders", barrier_orders)):
        c.case(name, "", fn)
    torch.cuda.synchronize()
    return {"failures": c.failures, "counts": dict(c.counts)}


def p2p_rings(rank, world):
    """isend/irecv rings in every order (run under CUDA_DEVICE_MAX_CONNECTIONS=1
    and under CUDA_LAUNCH_BLOCKING=1 by gpu_check.sh)."""
    torch.cuda.set_device(DEV)
    right, left = (rank + 1) % world, (rank - 1) % world
    failures = []
    for order in ("recv_first", "send_first"):
        out = torch.full((1 << 20,), float(rank), device=DEV)
        inp = torch.zeros(1 << 20, device=DEV)
        if order == "recv_first":
            r, s = dist.irecv(inp, src=left), dist.isend(out, dst=right)
        else:
            s, r = dist.isend(out, dst=right), dist.irecv(inp, src=left)
        r.wait()
        s.wait()
        if not bool((inp == left).all().item()):
            failures.append(f"rank {rank} {order}: {inp[:2].tolist()}")
    x = torch.ones(1 << 20, device=DEV)
    dist.all_reduce(x)
    if not bool((x == world).all().item()):
        failures.append(f"rank {rank} all_reduce after the rings: {x[:2].tolist()}")
    return {"failures": failures}


def killed_peer(rank, world, victim):
    """The victim is SIGKILLed while the others are in a synchronous
    all_reduce on CUDA tensors: that call raises, and the tensor keeps its
    input."""
    import os

    torch.cuda.set_device(DEV)
    warm = torch.ones(4, device=DEV)
    dist.all_reduce(warm)
    torch.cuda.synchronize()
    if rank == victim:
        time.sleep(1.0)
        os.kill(os.getpid(), 9)
    t = torch.full((1 << 20,), float(rank + 1), device=DEV)
    try:
        dist.all_reduce(t)
        raised, msg = False, ""
    except Exception as e:  # noqa: BLE001
        raised, msg = True, str(e)
    kept = bool((t.cpu() == rank + 1).all())
    return {"raised": raised, "msg": msg[:300], "kept_input": kept}
