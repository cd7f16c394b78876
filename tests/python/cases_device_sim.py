"""Rank functions of test_device_sim.py (run by mp_harness.run_world)."""


def routed(rank, world):
    import torch
    import torch.distributed as dist

    import torch_smddp

    calls, ok = 0, True
    # 3 MiB of float32 in 16 KiB chunks: 192 chunks through a few slots.
    for n in (1, 1000, 3 << 18):
        t = torch.arange(n, dtype=torch.float32) + rank
        dist.all_reduce(t)
        want = torch.arange(n, dtype=torch.float32) * world + world * (world - 1) / 2
        ok &= bool(torch.equal(t, want))
        calls += 1
    works = [dist.all_reduce(torch.full((5000,), float(rank + i)), async_op=True)
             for i in range(8)]
    for w in works:
        w.wait()
    calls += len(works)
    ok &= all(bool(torch.equal(w.result()[0], torch.full((5000,), float(sum(range(world)) + world * i))))
              for i, w in enumerate(works))
    return {"ok": ok, "calls": calls, "device_calls": torch_smddp.stats()["device_calls"]}


def device_errors(rank, world):
    """Calls on devices the backend cannot serve fail at once, naming the
    collective and the device; the group still works afterwards."""
    import torch
    import torch.distributed as dist

    import torch_smddp

    out = {"built_with_cuda": torch_smddp._C.built_with_cuda()}
    cases = {
        "mixed all_gather": lambda: dist.all_gather(
            [torch.zeros(4, device="meta") for _ in range(world)], torch.ones(4)),
    }
    for name, fn in cases.items():
        try:
            fn()
            out[name] = None
        except Exception as e:  # noqa: BLE001
            out[name] = f"{type(e).__name__}: {e}"
    t = torch.ones(8)
    dist.all_reduce(t)
    out["after_ok"] = bool(torch.equal(t, torch.full((8,), float(world))))
    return out
