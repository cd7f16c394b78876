"""With 2 or more GPUs (scripts/gpu_check.sh, stage multi): one rank per GPU.

* Every rank works on its own GPU only: after collectives of every kind, no
  rank's process appears on another GPU in nvidia-smi (the pipeline's
  threads bind to their device once; the device guard never makes a
  context on GPU 0 to restore it).
* SMDDP_INTRA=nccl: reduce-scatter over the host's GPUs with NCCL, the
  shard through the host, all-gather; allreduce of every size class and
  op against the closed form, and the route reported in stats().

    PYTHONPATH=tests/gpu:tests/python python3 tests/gpu/multi_gpu.py NGPU
"""
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))
from mp_harness import run_world  # noqa: E402


def own_gpu_only(rank, world):
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    dev = torch.device("cuda", rank)
    x = torch.full((1 << 22,), float(rank + 1), device=dev)
    dist.all_reduce(x)
    outs = [torch.empty(1000, device=dev) for _ in range(world)]
    dist.all_gather(outs, torch.full((1000,), float(rank), device=dev))
    dist.barrier()
    right, left = (rank + 1) % world, (rank - 1) % world
    buf = torch.zeros(1000, device=dev)
    reqs = [dist.irecv(buf, src=left), dist.isend(torch.full((1000,), float(rank), device=dev), dst=right)]
    for r in reqs:
        r.wait()
    torch.cuda.synchronize()
    ok = bool((x == world * (world + 1) / 2).all().item()) and bool((buf == left).all().item())
    uuid = subprocess.run(["nvidia-smi", "--query-gpu=uuid", "--format=csv,noheader", "-i", str(rank)],
                          capture_output=True, text=True).stdout.strip()
    apps = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,gpu_uuid", "--format=csv,noheader"],
                          capture_output=True, text=True).stdout.strip().splitlines()
    mine = [a.split(",")[1].strip() for a in apps if a.split(",")[0].strip() == str(os.getpid())]
    dist.barrier()  # every rank listed while all still hold their contexts
    return {"ok": ok, "own_uuid": uuid, "listed_on": mine, "apps_seen": len(apps)}


def intra_nccl(rank, world):
    import torch
    import torch.distributed as dist

    import torch_smddp

    torch.cuda.set_device(rank)
    dev = torch.device("cuda", rank)
    bad = []
    g = torch.Generator().manual_seed(5)
    for n in (1, 7, 4097, (1 << 22) + 3, 3 << 22):
        xs = [torch.randint(-8, 8, (n,), generator=g).float() for _ in range(world)]
        for op, fold in ((dist.ReduceOp.SUM, lambda s: s.sum(0)), (dist.ReduceOp.MAX, lambda s: s.amax(0)),
                         (dist.ReduceOp.AVG, lambda s: s.mean(0))):
            t = xs[rank].to(dev)
            dist.all_reduce(t, op=op)
            want = fold(torch.stack(xs))
            if not torch.allclose(t.cpu(), want, atol=1e-5):
                bad.append(f"n={n} {op}: {t[:3].tolist()} want {want[:3].tolist()}")
    return {"bad": bad, "route": torch_smddp.stats()["intra_route"]}


def main():
    world = int(sys.argv[1])
    failed = False
    res = run_world(world, "multi_gpu:own_gpu_only", backend="smddp", timeout=300)
    for rank, r in enumerate(res):
        others = [u for u in r["listed_on"] if u != r["own_uuid"]]
        if not r["ok"] or others:
            failed = True
        print(f"rank {rank}: results ok {r['ok']}, on its own GPU {r['own_uuid']}, "
              f"listed on {r['listed_on'] or 'nothing'} ({r['apps_seen']} processes listed)")
    if all(r["apps_seen"] == 0 for r in res):
        print("nvidia-smi lists no compute processes here (a container without the host's PID view): "
              "the per-GPU process check is inconclusive on this machine")
    res = run_world(world, "multi_gpu:intra_nccl", backend="smddp", timeout=300,
                    env={"SMDDP_INTRA": "nccl"})
    for rank, r in enumerate(res):
        print(f"rank {rank}: SMDDP_INTRA=nccl route {r['route']!r}, {len(r['bad'])} wrong results {r['bad'][:3]}")
        failed |= r["route"] != "nccl" or bool(r["bad"])
    print("multi-GPU checks:", "FAILED" if failed else "passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
