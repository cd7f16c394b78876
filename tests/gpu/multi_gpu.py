"""With 2 or more GPUs (scripts/gpu_check.sh, stage multi): one rank per GPU.

On each route inside the host (SMDDP_INTRA=shm: every GPU's data through
the host; SMDDP_INTRA=nccl: NCCL reduce-scatter over the host's GPUs, the
shard through the host, NCCL all-gather):
* allreduce of every size class and op against the closed form, and the
  route reported in stats();
* every rank works on its own GPU only: after collectives of every kind, no
  rank holds a CUDA context on another GPU (torch's _cuda_hasPrimaryContext;
  nvidia-smi lists no processes inside containers, so it is reported, not
  relied on).
On the NCCL route, a peer SIGKILLed in the middle of allreduces fails every
other rank's call within 5 s. Last, a DDP step on every GPU against Gloo and
against ProcessGroupNCCL alone: the same parameters after the same steps,
and the median step time of each.

    PYTHONPATH=tests/gpu:tests/python/harness python3 tests/gpu/multi_gpu.py NGPU
    PYTHONPATH=tests/gpu:tests/python/harness python3 tests/gpu/multi_gpu.py --sim 4

--sim runs the same checks on the stand-in (SMDDP_DEVICE_SIM=1, the CPU
build): 2 pretend hosts of 2 simulated GPUs, CPU tensors through the GPU
path; the harness checks the contexts there. The DDP step against
ProcessGroupNCCL needs real GPUs and is left out.
"""
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python", "harness"))
from mp_harness import ExitedRank, run_world  # noqa: E402

SIM_ENV = {"SMDDP_DEVICE_SIM": "1", "SMDDP_DEVICE_SIM_DELAY_US": "100",
           "SMDDP_DEVICE_CHUNK_BYTES": "16K", "SMDDP_DEVICE_MIN_PIECE_BYTES": "4K",
           "SMDDP_HOST_ID": lambda r: f"h{r // 2}"}
KILL_BOUND_S = 5.0


def _device(rank):
    import torch

    if os.environ.get("SMDDP_DEVICE_SIM") == "1":
        return torch.device("cpu")
    torch.cuda.set_device(rank)
    return torch.device("cuda", rank)


def _sync():
    import torch

    if os.environ.get("SMDDP_DEVICE_SIM") == "1":
        import torch_smddp.testing as sim
        sim.sim_synchronize()
    else:
        torch.cuda.synchronize()


def route_checks(rank, world):
    """Every collective kind, allreduce against the closed form, and which
    GPUs this process holds a context on."""
    import torch
    import torch.distributed as dist

    import torch_smddp

    dev = _device(rank)
    bad = []
    g = torch.Generator().manual_seed(5)
    for n in (1, 7, 4097, (1 << 20) + 3, 3 << 20):
        xs = [torch.randint(-8, 8, (n,), generator=g).float() for _ in range(world)]
        for op, fold in ((dist.ReduceOp.SUM, lambda s: s.sum(0)), (dist.ReduceOp.MAX, lambda s: s.amax(0)),
                         (dist.ReduceOp.AVG, lambda s: s.mean(0))):
            t = xs[rank].to(dev, copy=True)  # the stand-in's are CPU tensors: never reduce xs itself
            dist.all_reduce(t, op=op)
            _sync()
            want = fold(torch.stack(xs))
            if not torch.allclose(t.cpu(), want, atol=1e-5):
                bad.append(f"n={n} {op}: {t[:3].tolist()} want {want[:3].tolist()}")
    outs = [torch.empty(1000, device=dev) for _ in range(world)]
    dist.all_gather(outs, torch.full((1000,), float(rank), device=dev))
    dist.barrier()
    right, left = (rank + 1) % world, (rank - 1) % world
    buf = torch.zeros(1000, device=dev)
    reqs = [dist.irecv(buf, src=left), dist.isend(torch.full((1000,), float(rank), device=dev), dst=right)]
    for r in reqs:
        r.wait()
    _sync()
    if not all(bool((o.cpu() == i).all()) for i, o in enumerate(outs)):
        bad.append("all_gather")
    if not bool((buf.cpu() == left).all()):
        bad.append("isend/irecv ring")
    res = {"bad": bad, "route": torch_smddp.stats()["intra_route"]}
    if dev.type == "cuda":
        res["contexts_on_others"] = [i for i in range(torch.cuda.device_count())
                                     if i != rank and torch._C._cuda_hasPrimaryContext(i)]
        apps = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,gpu_uuid", "--format=csv,noheader"],
                              capture_output=True, text=True).stdout.strip().splitlines()
        res["nvidia_smi_listed"] = len(apps)
    dist.barrier()
    return res


def killed_peer(rank, world, victim):
    """The victim SIGKILLs itself 1 s after a barrier while the others run
    allreduces: each survivor's call must raise within KILL_BOUND_S."""
    import torch
    import torch.distributed as dist

    dev = _device(rank)
    t = torch.ones(1 << 20, device=dev)
    dist.all_reduce(t)
    _sync()
    dist.barrier()
    t0 = time.monotonic()
    if rank == victim:
        time.sleep(1.0)
        os.kill(os.getpid(), 9)
    try:
        while time.monotonic() - t0 < 1.0 + 4 * KILL_BOUND_S:
            dist.all_reduce(t)
            _sync()
        return {"raised": False, "after_s": None, "msg": ""}
    except Exception as e:  # noqa: BLE001
        return {"raised": True, "after_s": time.monotonic() - t0 - 1.0, "msg": str(e)[:300]}


def ddp_against_gloo_and_nccl(rank, world):
    """The same MLP, data and steps under DDP on smddp, Gloo and NCCL."""
    import statistics

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    dev = _device(rank)
    nn = torch.nn
    groups = {"smddp": None, "gloo": dist.new_group(backend="gloo"), "nccl": dist.new_group(backend="nccl")}
    models, times = {}, {}
    for name, group in groups.items():
        torch.manual_seed(0)
        m = DDP(nn.Sequential(nn.Linear(1024, 4096), nn.GELU(), nn.Linear(4096, 1024)).to(dev),
                device_ids=[rank], process_group=group)
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        steps = []
        for step in range(8):
            g = torch.Generator().manual_seed(100 * step + rank)
            x = torch.randn(64, 1024, generator=g).to(dev)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            m(x).square().mean().backward()
            opt.step()
            opt.zero_grad()
            torch.cuda.synchronize()
            steps.append(time.perf_counter() - t0)
        models[name] = [p.detach().cpu() for p in m.parameters()]
        times[name] = statistics.median(steps[2:])
    diff = {other: max(float((a - b).abs().max()) for a, b in zip(models["smddp"], models[other]))
            for other in ("gloo", "nccl")}
    return {"max_param_diff": diff, "median_step_s": times}


def main():
    args = sys.argv[1:]
    sim = "--sim" in args
    world = int([a for a in args if a != "--sim"][0])
    base = dict(SIM_ENV) if sim else {}
    failed = False
    for route in ("shm", "nccl"):
        res = run_world(world, "multi_gpu:route_checks", backend="smddp", timeout=120,
                        env=dict(base, SMDDP_INTRA=route))
        for rank, r in enumerate(res):
            others = r.get("contexts_on_others", [])
            ok = r["route"] == route and not r["bad"] and not others
            failed |= not ok
            print(f"SMDDP_INTRA={route} rank {rank}: route {r['route']!r}, {len(r['bad'])} wrong {r['bad'][:3]}, "
                  f"contexts on other GPUs {others or 'none'}"
                  + (f" (nvidia-smi lists {r['nvidia_smi_listed']} processes)" if "nvidia_smi_listed" in r else "")
                  + ("" if ok else "  <- FAILED"))
    victim = world - 1
    t0 = time.monotonic()
    res = run_world(world, "multi_gpu:killed_peer", backend="smddp", timeout=120, args=(victim,),
                    env=dict(base, SMDDP_INTRA="nccl"), allow_exit={victim}, pg_timeout=60.0)
    for rank, r in enumerate(res):
        if rank == victim:
            dead = isinstance(r, ExitedRank)
            failed |= not dead
            print(f"SMDDP_INTRA=nccl rank {rank}: killed itself: {dead}")
            continue
        ok = r["raised"] and r["after_s"] is not None and r["after_s"] <= KILL_BOUND_S
        failed |= not ok
        after = "never" if r["after_s"] is None else f"{r['after_s']:.2f} s"
        print(f"SMDDP_INTRA=nccl rank {rank}: raised {after} after rank {victim} died "
              f"(bound {KILL_BOUND_S} s): {r['msg'][:160]!r}" + ("" if ok else "  <- FAILED"))
    print(f"(the killed-peer job took {time.monotonic() - t0:.1f} s)")
    if not sim:
        res = run_world(world, "multi_gpu:ddp_against_gloo_and_nccl", backend="smddp", timeout=180)
        for rank, r in enumerate(res):
            ok = all(d <= 1e-4 for d in r["max_param_diff"].values())
            failed |= not ok
            t = r["median_step_s"]
            print(f"DDP rank {rank}: max |param - smddp's| {r['max_param_diff']}; median step ms "
                  f"smddp {t['smddp'] * 1e3:.1f}, gloo {t['gloo'] * 1e3:.1f}, nccl {t['nccl'] * 1e3:.1f}"
                  + ("" if ok else "  <- FAILED"))
    print("multi-GPU checks:", "FAILED" if failed else "passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
