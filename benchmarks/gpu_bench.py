"""The GPU path's benchmark (scripts/gpu_check.sh, stage bench): on CUDA
tensors, in one run on the same machine,

1. the copy bound: page-locked device-to-host and host-to-device bandwidth
   of one rank, measured first. The GPU path stages every byte through the
   host, copy in and copy back overlapping chunk by chunk, so an allreduce
   of S bytes takes at least max(S/d2h, S/h2d) x (ranks sharing the GPU);
2. allreduce of 64 MiB float32: smddp against Gloo (on CUDA tensors), time,
   algbw and busbw the nccl-tests way (busbw = algbw x 2(n-1)/n), and
   smddp's time over the copy bound;
3. allreduce from 256 KiB to 256 MiB on CUDA tensors and on CPU tensors,
   smddp and Gloo: the CPU rows are the host part alone (item 2 is this
   sweep's 64 MiB row on CUDA tensors);
4. a DDP step of a ~20M-parameter MLP: smddp against Gloo in the same
   processes, taking turns (ABBA), median step time.

    python3 benchmarks/gpu_bench.py [--world N] [--report FILE]

World: one rank per GPU, or 2 ranks sharing cuda:0 on a one-GPU machine.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

SIZE = 64 << 20


def copy_bound(torch, nbytes: int, iters: int = 10) -> dict:
    dev = torch.device("cuda", 0)
    host = torch.empty(nbytes, dtype=torch.uint8).pin_memory()
    devbuf = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    out = {}
    for name, dst, src in (("d2h", host, devbuf), ("h2d", devbuf, host)):
        for _ in range(2):
            dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(iters):
            dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize()
        out[name] = nbytes * iters / (time.perf_counter() - t0)
    return out


def timed(torch, dist, call, iters: int, warmup: int = 3) -> float:
    for _ in range(warmup):
        call()
    torch.cuda.synchronize()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        call()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / iters


def ddp_steps(torch, dist, gloo, dev, steps: int = 12) -> dict:
    from torch.nn.parallel import DistributedDataParallel as DDP

    nn = torch.nn

    def model():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(1024, 4096), nn.GELU(), nn.Linear(4096, 4096), nn.GELU(),
                             nn.Linear(4096, 1024)).to(dev)

    copies = {"smddp": DDP(model(), device_ids=[dev.index]),
              "gloo": DDP(model(), device_ids=[dev.index], process_group=gloo)}
    opts = {k: torch.optim.SGD(m.parameters(), lr=1e-3) for k, m in copies.items()}
    x = torch.randn(64, 1024, device=dev)
    times = {k: [] for k in copies}
    order = list(copies)
    for step in range(steps + 2):
        for name in (order if step % 2 == 0 else order[::-1]):
            m, opt = copies[name], opts[name]
            torch.cuda.synchronize()
            dist.barrier()
            t0 = time.perf_counter()
            m(x).square().mean().backward()
            opt.step()
            opt.zero_grad()
            torch.cuda.synchronize()
            if step >= 2:
                times[name].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


SWEEP = (256 << 10, 4 << 20, 16 << 20, 64 << 20, 256 << 20)


def sweep(torch, dist, gloo, dev, iters: int) -> dict:
    """Each size on CUDA tensors and on CPU tensors, smddp and Gloo, in the
    same processes: the CPU rows are the host part alone, so the gap between
    a CUDA row and its CPU row is what staging through the host costs.
    `iters` timed calls per size, more (up to 50) for the small ones."""
    out = {}
    for size in SWEEP:
        n = max(iters, min(50, (64 << 20) // size))
        row = {}
        for where in ("cuda", "cpu"):
            x = torch.ones(size // 4, device=dev if where == "cuda" else "cpu")
            row[f"smddp_{where}"] = timed(torch, dist, lambda: dist.all_reduce(x), n)
            try:
                row[f"gloo_{where}"] = timed(torch, dist, lambda: dist.all_reduce(x, group=gloo), n)
            except RuntimeError as e:  # a Gloo without CUDA allreduce
                row[f"gloo_{where}"] = None
                row[f"gloo_{where}_error"] = str(e)[:200]
        out[str(size)] = row
    return out


def worker(args) -> None:
    import torch
    import torch.distributed as dist

    import torch_smddp  # noqa: F401 - registers smddp

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    ngpu = torch.cuda.device_count()
    dev = torch.device("cuda", rank % ngpu)
    torch.cuda.set_device(dev)
    dist.init_process_group("smddp")
    gloo = dist.new_group(backend="gloo")
    res = {"sweep": sweep(torch, dist, gloo, dev, args.iters)}
    res["ddp"] = ddp_steps(torch, dist, gloo, dev)
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump(res, f)
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world", type=int)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--report")
    ap.add_argument("--worker", action="store_true")
    ap.add_argument("--out")
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return 0
    import torch

    ngpu = torch.cuda.device_count()
    if ngpu == 0:
        print("no CUDA device here")
        return 1
    world = args.world or (ngpu if ngpu >= 2 else 2)
    sharing = max(1, world // ngpu)
    bw = copy_bound(torch, SIZE)
    bound = max(SIZE / bw["d2h"], SIZE / bw["h2d"]) * sharing
    out = tempfile.mktemp(suffix=".json")
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE=str(world))
    procs = [subprocess.Popen([sys.executable, __file__, "--worker", "--out", out, "--iters", str(args.iters)],
                              env=dict(env, RANK=str(r), LOCAL_RANK=str(r))) for r in range(world)]
    try:
        codes = [p.wait(timeout=480) for p in procs]
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        print("benchmark timed out")
        return 1
    if any(codes):
        print(f"benchmark ranks exited {codes}")
        return 1
    with open(out) as f:
        res = json.load(f)
    os.unlink(out)
    gpu = torch.cuda.get_device_name(0)
    lines = [f"GPU: {gpu} x {ngpu}; world {world} ({sharing} rank(s) per GPU); torch {torch.__version__}", "",
             f"Copy bound: d2h {bw['d2h'] / 1e9:.1f} GB/s, h2d {bw['h2d'] / 1e9:.1f} GB/s: an allreduce of "
             f"64 MiB takes at least {bound * 1e3:.1f} ms through the host", "",
             "| 64 MiB float32 allreduce | time (ms) | algbw (GB/s) | busbw (GB/s) | time / copy bound |",
             "|---|---|---|---|---|"]
    head = res["sweep"][str(SIZE)]   # the sweep's 64 MiB row, on CUDA tensors
    for name in ("smddp", "gloo"):
        t = head[f"{name}_cuda"]
        if t is None:
            lines.append(f"| {name} | refused: {head.get(name + '_cuda_error', '')} | | | |")
            continue
        alg = SIZE / t / 1e9
        lines.append(f"| {name} | {t * 1e3:.1f} | {alg:.2f} | {alg * 2 * (world - 1) / world:.2f} | "
                     f"{t / bound:.2f} |")
    busbw = 2 * (world - 1) / world
    lines += ["", "| allreduce float32 | smddp CUDA (ms) | smddp CPU tensors (ms) | Gloo CUDA (ms) | "
              "Gloo CPU tensors (ms) | smddp CUDA busbw (GB/s) | Gloo CUDA busbw (GB/s) |",
              "|---|---|---|---|---|---|---|"]

    def ms(t):
        return "refused" if t is None else f"{t * 1e3:.2f}"

    def bus(size, t):
        return "" if t is None else f"{size / t / 1e9 * busbw:.2f}"

    for size in SWEEP:
        r = res["sweep"][str(size)]
        label = f"{size >> 20} MiB" if size >= 1 << 20 else f"{size >> 10} KiB"
        lines.append(f"| {label} | {ms(r['smddp_cuda'])} | {ms(r['smddp_cpu'])} | {ms(r['gloo_cuda'])} | "
                     f"{ms(r['gloo_cpu'])} | {bus(size, r['smddp_cuda'])} | {bus(size, r['gloo_cuda'])} |")
    d = res["ddp"]
    lines += ["", "| DDP step (MLP, 21M params, batch 64) | median step (ms) |", "|---|---|",
              f"| smddp | {d['smddp'] * 1e3:.1f} |", f"| gloo | {d['gloo'] * 1e3:.1f} |",
              f"| smddp / gloo | {d['smddp'] / d['gloo']:.2f} |"]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.report:
        with open(args.report, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
