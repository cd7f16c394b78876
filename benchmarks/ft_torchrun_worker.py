"""The baseline of benchmarks/ft_recovery.py: the same demo model and data
as ft_replica.py, trained with plain DDP over smddp under ``torchrun
--max-restarts``, one rank per host. Rank 0 writes a checkpoint every
--ckpt-every steps; a (re)started worker resumes from it. A dead host fails
every survivor's call, torchrun restarts the workers, and the job goes on
from the checkpoint: the steps since then are done again.

Every completed step appends a JSON line to ``steps.<rank>.jsonl`` in
$SMDDP_CLUSTER_OUT (wall time, step, loss, torchrun's restart count).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--ckpt-every", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--corpus-mb", type=float, default=0.3)
    p.add_argument("--timeout", type=float, default=30.0)
    args = p.parse_args(argv)
    out = os.environ["SMDDP_CLUSTER_OUT"]
    rank = int(os.environ["RANK"])
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))

    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    import torch_smddp  # noqa: F401  (registers "smddp")

    sys.path.insert(0, os.path.join(REPO, "examples"))
    from train_ddp import VOCAB, CharTransformer, Windows, encode, load_corpus

    torch.set_num_threads(1)
    dist.init_process_group("smddp", timeout=datetime.timedelta(seconds=args.timeout))
    text, _ = load_corpus(int(args.corpus_mb * 1e6))
    windows = Windows(encode(text), args.seq_len)
    torch.manual_seed(1234)
    model = CharTransformer(len(VOCAB), args.seq_len, 128, 2, 4)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    ckpt = os.path.join(out, "ckpt.pt")
    step = 0
    if os.path.exists(ckpt):
        sd = torch.load(ckpt, weights_only=False)
        model.load_state_dict(sd["model"])
        opt.load_state_dict(sd["optim"])
        step = sd["step"]
    ddp = DDP(model)
    log = open(os.path.join(out, f"steps.{rank}.jsonl"), "a", buffering=1)
    log.write(json.dumps({"event": "start", "t": time.time(), "attempt": attempt,
                          "resume": step, "pid": os.getpid()}) + "\n")
    while step < args.steps:
        g = torch.Generator().manual_seed(100_003 * step + rank)
        idx = torch.randint(len(windows), (args.batch_size,), generator=g).tolist()
        xs, ys = zip(*(windows[i] for i in idx))
        x, y = torch.stack(xs), torch.stack(ys)
        opt.zero_grad(set_to_none=True)
        logits = ddp(x)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        loss.backward()
        opt.step()
        step += 1
        log.write(json.dumps({"t": time.time(), "step": step - 1, "after": step, "committed": True,
                              "loss": loss.item(), "attempt": attempt}) + "\n")
        if rank == 0 and step % args.ckpt_every == 0:
            torch.save({"model": model.state_dict(), "optim": opt.state_dict(), "step": step},
                       ckpt + ".tmp")
            os.replace(ckpt + ".tmp", ckpt)
    log.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
