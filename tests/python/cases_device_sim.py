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
