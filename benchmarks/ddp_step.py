"""DDP step benchmark: a ~20M-parameter transformer on synthetic tokens,
smddp against Gloo, world 2 by default, in one run on the same machine.

    .venv/bin/python benchmarks/ddp_step.py [--world 2] [--steps 12] [--warmup 3]

Each backend runs in its own torchrun-style job (one process per rank);
step time is the mean over the timed steps (max over ranks) after a
barrier. The backends alternate for --rounds rounds and the median round
is reported, so both see the same machine noise.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time


def build_model(torch, vocab=8192, d=384, layers=8, heads=6, seq=128):
    nn = torch.nn

    class LM(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(vocab, d)
            self.pos = nn.Parameter(torch.zeros(seq, d))
            layer = nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.0, batch_first=True)
            self.body = nn.TransformerEncoder(layer, layers)
            self.head = nn.Linear(d, vocab)

        def forward(self, x):
            h = self.emb(x) + self.pos[: x.shape[1]]
            return self.head(self.body(h))

    return LM()


def worker(args) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    if "smddp" in args.backend:
        import torch_smddp  # noqa: F401
    torch.set_num_threads(max(1, args.threads))
    dist.init_process_group(args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = build_model(torch, seq=args.seq)
    nparams = sum(p.numel() for p in model.parameters())
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(rank)
    x = torch.randint(0, 8192, (args.batch, args.seq), generator=g)
    y = torch.randint(0, 8192, (args.batch, args.seq), generator=g)
    loss_fn = torch.nn.CrossEntropyLoss()

    def step():
        opt.zero_grad(set_to_none=True)
        out = ddp(x)
        loss = loss_fn(out.reshape(-1, out.shape[-1]), y.reshape(-1))
        loss.backward()
        opt.step()
        return loss.item()

    for _ in range(args.warmup):
        step()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        step()
    dt = (time.perf_counter() - t0) / args.steps
    t = torch.tensor([dt], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump({"step_s": t.item(), "params": nparams, "world": world,
                       "samples_per_s": args.batch * world / t.item()}, f)
    dist.destroy_process_group()


def launch(backend: str, args) -> dict:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tempfile.mktemp(suffix=".json")
    cmd = [sys.executable, __file__, "--worker", "--backend", backend, "--out", out,
           "--steps", str(args.steps), "--warmup", str(args.warmup), "--batch", str(args.batch),
           "--seq", str(args.seq), "--threads", str(args.threads)]
    procs = [subprocess.Popen(cmd, env=dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                                             RANK=str(r), WORLD_SIZE=str(args.world), LOCAL_RANK=str(r)),
                              start_new_session=True) for r in range(args.world)]
    try:
        for p in procs:
            p.wait(timeout=args.timeout)
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        raise SystemExit(f"{backend} run exceeded {args.timeout} s")
    if any(p.returncode for p in procs):
        raise SystemExit(f"{backend} run failed: {[p.returncode for p in procs]}")
    with open(out) as f:
        res = json.load(f)
    os.unlink(out)
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--backends", nargs="+", default=["smddp", "gloo"])
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds per backend (median)")
    ap.add_argument("--worker", action="store_true")
    ap.add_argument("--backend")
    ap.add_argument("--out")
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return 0
    runs = {b: [] for b in args.backends}
    for _ in range(args.rounds):
        for b in args.backends:
            runs[b].append(launch(b, args))
    results = {b: sorted(rs, key=lambda r: r["step_s"])[len(rs) // 2] for b, rs in runs.items()}
    first = next(iter(results.values()))
    print(f"\n# DDP step, transformer {first['params'] / 1e6:.1f}M params, world {args.world}, "
          f"batch {args.batch}x{args.seq} tokens per rank, {args.steps} timed steps, "
          f"median of {args.rounds} alternating rounds")
    print(f"{'backend':>8} {'step ms':>10} {'samples/s':>10}   all rounds (ms)")
    for b, r in results.items():
        rounds = " ".join(f"{x['step_s'] * 1e3:.1f}" for x in runs[b])
        print(f"{b:>8} {r['step_s'] * 1e3:>10.1f} {r['samples_per_s']:>10.2f}   {rounds}")
    if len(results) == 2:
        a, b = list(results)
        print(f"step time {a}/{b}: {results[a]['step_s'] / results[b]['step_s']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
