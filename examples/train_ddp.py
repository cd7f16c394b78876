"""DistributedDataParallel training over the smddp backend: a character-level
language model learning to write Python, trained on the source of Python's
own standard library (real text that ships with every Python install).

    torchrun --standalone --nproc-per-node 2 examples/train_ddp.py
    torchrun --standalone --nproc-per-node 2 examples/train_ddp.py --backend gloo

Each rank reads the same corpus, then trains on a disjoint shard of it
(DistributedSampler); gradients are averaged by DDP through the chosen
backend. Rank 0 prints progress (step, loss averaged over ranks, global
samples/s) and a summary; the other ranks are quiet. Everything is seeded,
so a run is reproducible for a given world size and backend.
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import random
import sys
import sysconfig
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler

# Printable ASCII plus newline; anything else (tabs, non-ASCII) maps to '?'.
VOCAB = ["\n"] + [chr(c) for c in range(32, 127)]
UNKNOWN = VOCAB.index("?")
STOI = {ch: i for i, ch in enumerate(VOCAB)}
SKIP_DIRS = {"test", "tests", "idlelib", "turtledemo", "lib2to3", "site-packages",
             "dist-packages", "__pycache__", "ensurepip", "pydoc_data"}


def parser(description=__doc__) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", default="smddp", help="process-group backend (default: smddp)")
    p.add_argument("--steps", type=int, default=int(os.environ.get("TRAIN_STEPS", 500)),
                   help="optimizer steps (default 500, about a minute at 2 ranks on 2 cores)")
    p.add_argument("--batch-size", type=int, default=24, help="sequences per rank per step")
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--corpus-mb", type=float, default=2.0, help="characters of stdlib source to read, in MB")
    p.add_argument("--log-every", type=int, default=int(os.environ.get("TRAIN_LOG_EVERY", 25)))
    p.add_argument("--eval-batches", type=int, default=8, help="held-out batches per rank at the end")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--timeout", type=float, default=300, help="process-group timeout, seconds")
    p.add_argument("--no-sample", action="store_true", help="skip the generated text at the end")
    return p


def parse_args(argv=None):
    return parser().parse_args(argv)


# --------------------------------------------------------------------------
# data: the Python standard library's own source code
# --------------------------------------------------------------------------

def stdlib_files():
    root = sysconfig.get_paths()["stdlib"]
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS and not d.startswith("."))
        for name in sorted(filenames):
            if name.endswith(".py"):
                yield os.path.join(dirpath, name)


def load_corpus(max_chars: int) -> tuple[str, int]:
    """Deterministic: files in sorted order, until max_chars are collected."""
    parts, total, nfiles = [], 0, 0
    for path in stdlib_files():
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except (OSError, UnicodeDecodeError):
            continue
        parts.append(text.replace("\t", "    "))
        total += len(parts[-1])
        nfiles += 1
        if total >= max_chars:
            break
    if total < 100_000:
        raise SystemExit(f"found only {total} characters of stdlib source under "
                         f"{sysconfig.get_paths()['stdlib']}")
    return "".join(parts)[:max_chars], nfiles


def encode(text: str) -> torch.Tensor:
    return torch.tensor([STOI.get(ch, UNKNOWN) for ch in text], dtype=torch.long)


class Windows(Dataset):
    """Non-overlapping (seq_len + 1)-character windows: input and next-char targets."""

    def __init__(self, data: torch.Tensor, seq_len: int):
        self.data, self.seq_len = data, seq_len
        self.n = (len(data) - 1) // seq_len

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        chunk = self.data[i * self.seq_len: i * self.seq_len + self.seq_len + 1]
        return chunk[:-1], chunk[1:]


# --------------------------------------------------------------------------
# model: a small causal transformer
# --------------------------------------------------------------------------

class CharTransformer(nn.Module):
    def __init__(self, vocab: int, seq_len: int, d_model: int, layers: int, heads: int):
        super().__init__()
        self.tok = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(seq_len, d_model)
        layer = nn.TransformerEncoderLayer(d_model, heads, dim_feedforward=4 * d_model, dropout=0.0,
                                           activation="gelu", batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab)
        mask = torch.triu(torch.full((seq_len, seq_len), float("-inf")), diagonal=1)
        self.register_buffer("causal_mask", mask, persistent=False)

    def forward(self, idx):
        t = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        x = self.blocks(x, mask=self.causal_mask[:t, :t], is_causal=True)
        return self.head(self.norm(x))


@torch.no_grad()
def sample(model, prompt: str, length: int, seq_len: int, temperature=0.7, seed=0) -> str:
    g = torch.Generator().manual_seed(seed)
    idx = encode(prompt).unsqueeze(0)
    for _ in range(length):
        logits = model(idx[:, -seq_len:])[0, -1] / temperature
        nxt = torch.multinomial(F.softmax(logits, -1), 1, generator=g)
        idx = torch.cat([idx, nxt.view(1, 1)], 1)
    return "".join(VOCAB[i] for i in idx[0].tolist())


# --------------------------------------------------------------------------
# training
# --------------------------------------------------------------------------

def main(argv=None):
    return run(parse_args(argv))


def run(args, shard=None, parallel="ddp"):
    """Trains and reports. `shard`: None wraps the model in DDP; else a
    function that shards it in place for every rank's forward and backward
    (train_fsdp.py's FSDP2), named `parallel` in the output."""
    torch.set_num_threads(1)  # ranks share the machine's cores
    random.seed(args.seed)
    torch.manual_seed(args.seed)

    if "smddp" in args.backend:
        import torch_smddp  # registers the "smddp" backend

        if "smddp" not in dist.Backend.backend_list:
            raise SystemExit(f"torch_smddp (from {list(getattr(torch_smddp, '__path__', []))}) did not "
                             "register the 'smddp' backend; is the extension built?")
    dist.init_process_group(backend=args.backend, timeout=datetime.timedelta(seconds=args.timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    main_rank = rank == 0

    def log(*a):
        if main_rank:
            print(*a, flush=True)

    t_start = time.perf_counter()
    text, nfiles = load_corpus(int(args.corpus_mb * 1e6))
    data = encode(text)
    split = int(len(data) * 0.95)
    train_set, val_set = Windows(data[:split], args.seq_len), Windows(data[split:], args.seq_len)
    sampler = DistributedSampler(train_set, num_replicas=world, rank=rank, shuffle=True,
                                 seed=args.seed, drop_last=True)
    loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler, drop_last=True)
    val_loader = DataLoader(val_set, batch_size=args.batch_size,
                            sampler=DistributedSampler(val_set, num_replicas=world, rank=rank,
                                                       shuffle=False, drop_last=True))

    model = CharTransformer(len(VOCAB), args.seq_len, args.d_model, args.layers, args.heads)
    nparams = sum(p.numel() for p in model.parameters())
    # The default process group, the --backend one, carries the gradients.
    # Under FSDP2 `model` itself is sharded: every rank runs its forward.
    ddp = DDP(model) if shard is None else shard(model)
    opt = torch.optim.AdamW(ddp.parameters(), lr=args.lr, weight_decay=0.01)
    warmup = max(1, min(20, args.steps // 10))

    def lr_at(step):  # linear warm-up, cosine decay to 10%
        if step < warmup:
            return args.lr * (step + 1) / warmup
        frac = (step - warmup) / max(1, args.steps - warmup)
        return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))

    log(f"{parallel}: backend={args.backend} world_size={world} params={nparams:,} corpus={len(text):,} chars "
        f"from {nfiles} stdlib files (train {len(train_set):,} windows, {len(train_set) // world:,} per rank)")
    log(f"steps={args.steps} batch={args.batch_size}/rank x {world} ranks, seq_len={args.seq_len}, "
        f"setup {time.perf_counter() - t_start:.1f}s")

    loss_sum = torch.zeros(2)  # [sum of losses, count] since the last log line
    first_loss = None
    last_interval_loss = None
    history = []
    epoch, it = 0, None
    step = 0
    dist.barrier()
    t_train = t_last = time.perf_counter()
    while step < args.steps:
        if it is None:
            sampler.set_epoch(epoch)
            it = iter(loader)
        try:
            x, y = next(it)
        except StopIteration:
            epoch, it = epoch + 1, None
            continue
        for group in opt.param_groups:
            group["lr"] = lr_at(step)
        logits = ddp(x)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(ddp.parameters(), 1.0)
        opt.step()
        step += 1
        loss_sum += torch.tensor([loss.item(), 1.0])
        if step == 1 or step % args.log_every == 0 or step == args.steps:
            stats = loss_sum.clone()
            dist.all_reduce(stats)  # average over ranks and steps in the interval
            mean_loss = (stats[0] / stats[1]).item()
            now = time.perf_counter()
            n_steps = stats[1].item() / world
            sps = n_steps * args.batch_size * world / (now - t_last)
            if first_loss is None:
                first_loss = mean_loss
            last_interval_loss = mean_loss
            history.append((step, mean_loss))
            log(f"step {step:5d}/{args.steps}  loss {mean_loss:.4f}  lr {lr_at(step - 1):.2e}  "
                f"samples/s {sps:8.1f}  ({sps * args.seq_len:,.0f} chars/s)")
            loss_sum.zero_()
            t_last = now
    train_time = time.perf_counter() - t_train

    # held-out loss, averaged over every rank's disjoint validation shard
    model.eval()
    val = torch.zeros(2)
    with torch.no_grad():
        for i, (x, y) in enumerate(val_loader):
            if i >= args.eval_batches:
                break
            logits = model(x)
            val += torch.tensor([F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1)).item(), 1.0])
    dist.all_reduce(val)
    val_loss = (val[0] / val[1]).item() if val[1] > 0 else float("nan")

    total_sps = args.steps * args.batch_size * world / train_time
    log("-" * 72)
    if not args.no_sample and (main_rank or shard is not None):
        text = sample(model, "def ", 160, args.seq_len, seed=args.seed)
        log("sample (prompt 'def '):")
        log(text)
        log("-" * 72)
    log(f"loss {first_loss:.4f} (first step) -> {last_interval_loss:.4f} (last {args.log_every} steps), "
        f"held-out {val_loss:.4f}; uniform guess would be {math.log(len(VOCAB)):.4f}")
    log(f"{args.steps} steps in {train_time:.1f}s: {total_sps:.1f} samples/s global "
        f"({total_sps * args.seq_len:,.0f} chars/s), backend={args.backend}, world_size={world}")
    if "smddp" in args.backend:  # what carried the step, by smddp's own count
        st = torch_smddp.stats()
        counts = " ".join(f"{k}={v}" for k, v in sorted(st["collective_counts"].items()) if v)
        log(f"smddp: {counts}; allreduce: {st['allreduce_path']}; all-gather and reduce-scatter: "
            f"{st['gather_scatter_path']}")
    log(f"SUMMARY parallel={parallel} backend={args.backend} world_size={world} steps={args.steps} first_loss={first_loss:.4f} "
        f"final_loss={last_interval_loss:.4f} val_loss={val_loss:.4f} samples_per_s={total_sps:.1f} "
        f"train_s={train_time:.1f} total_s={time.perf_counter() - t_start:.1f}")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
