"""Child side of test_observe.py: stats() latency histograms, torch.profiler's
record_param_comms events and the SMDDP_TIMELINE file, in one world-2 job."""

import os
import time

import torch
import torch.distributed as dist

import torch_smddp

# Phase C of observe() starts with a broadcast of this many int8 elements,
# which the parent finds in the timeline to know where the workload starts.
MARKER_NUMEL = 777


def _stats_phase(rank, world):
    out = {}
    torch_smddp.reset_stats()
    st = torch_smddp.stats()
    out["after_reset"] = {"counts": st["collective_counts"], "latency": st["latency"],
                          "collectives": st["collectives"]}
    # 25 synchronous 4 KiB all_reduces, each timed from Python: the engine's
    # queued-to-completed latency of a call is part of the call's wall time.
    wall_us = []
    t = torch.ones(1024)
    for _ in range(25):
        t0 = time.perf_counter()
        dist.all_reduce(t)
        wall_us.append((time.perf_counter() - t0) * 1e6)
    b = torch.zeros(10)
    for _ in range(10):
        dist.broadcast(b, src=0)
    for _ in range(3):
        dist.barrier()
    works = [dist.all_reduce(torch.ones(16), async_op=True) for _ in range(7)]
    for w in works:
        w.wait()
    out["wall_us"] = wall_us
    out["stats"] = torch_smddp.stats(reset=True)
    st = torch_smddp.stats()
    out["after_stats_reset"] = {"counts": st["collective_counts"], "latency": st["latency"],
                                "collectives": st["collectives"]}
    return out


def _profiler_phase(rank, world, profile_dir):
    from torch.profiler import ProfilerActivity, profile

    t = torch.ones(4096)
    b = torch.zeros(100, dtype=torch.float64)
    outs = [torch.empty(8) for _ in range(world)]
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        dist.all_reduce(t)
        dist.broadcast(b, src=0)
        dist.all_gather(outs, torch.full((8,), float(rank)))
        dist.all_reduce(t, async_op=True).wait()
    path = os.path.join(profile_dir, f"profile.rank{rank}.json")
    prof.export_chrome_trace(path)
    names = [e.name for e in prof.events() if e.name == "record_param_comms"]
    return {"record_param_comms": len(names), "profile": path}


def _timeline_phase(rank, world):
    torch_smddp.reset_stats()
    dist.broadcast(torch.zeros(MARKER_NUMEL, dtype=torch.int8), src=0)
    sizes = [1000, 70000, 3, 1000, 250000, 64]
    issued = []
    works = []
    for i in range(36):
        n = sizes[i % len(sizes)]
        t = torch.ones(n) * (rank + 1)
        works.append((dist.all_reduce(t, async_op=True), t))
        issued.append(n * 4)
        if rank == 1 and i % 9 == 8:
            time.sleep(0.003)  # rank 0 queues ahead: its calls fuse
    bad = 0
    for w, t in works:
        w.wait()
        bad += int(not torch.all(t == world * (world + 1) / 2))
    for _ in range(4):  # synchronous: these may run on the caller's thread
        t = torch.ones(256)
        dist.all_reduce(t)
        issued.append(1024)
    st = torch_smddp.stats()
    torch_smddp._C.timeline_flush()
    return {"issued_bytes": issued, "bad": bad, "stats": {
        k: st[k] for k in ("fusion_buffers_flushed", "fused_calls", "collective_counts")},
        "timeline_path": torch_smddp._C.timeline_path()}


def observe(rank, world, profile_dir):
    return {"stats_phase": _stats_phase(rank, world),
            "profiler_phase": _profiler_phase(rank, world, profile_dir),
            "timeline_phase": _timeline_phase(rank, world)}
