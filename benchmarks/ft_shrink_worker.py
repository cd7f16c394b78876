"""The shrink mode of benchmarks/ft_recovery.py: the same demo model and
data as ft_replica.py and ft_torchrun_worker.py, trained with plain DDP over
smddp, one rank per host, started by the driver itself (no torchrun: its
agents stop every worker when one dies). When a host dies mid-step, the
survivors' backward fails naming the lost rank; they shrink the default
group without it (``dist.shrink_group`` with ``SHRINK_ABORT``), wrap the
model in DDP again on the new group, and redo the step. Nothing restarts.

The group's store is the cluster's, in the hub (--store HOST:PORT, under a
prefix of --job), so it outlives any training host.

Every completed step appends a JSON line to ``steps.<rank>.jsonl`` in --out
(wall time, step, loss, the group's size; with FT_REPLICA_DIGESTS=1 a digest
of the state); a failed
step appends ``{"event": "failed"}`` and the shrink ``{"event": "shrunk"}``
with its duration. At the end ``final.<rank>.json`` holds the step and the
digest of the model's and optimizer's state.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world", type=int, required=True)
    p.add_argument("--store", required=True, help="HOST:PORT of a TCPStore that is running")
    p.add_argument("--job", required=True, help="the store prefix of this job")
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--corpus-mb", type=float, default=0.3)
    p.add_argument("--timeout", type=float, default=30.0)
    args = p.parse_args(argv)

    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed import PrefixStore, TCPStore
    from torch.distributed.distributed_c10d import SHRINK_ABORT
    from torch.nn.parallel import DistributedDataParallel as DDP

    import torch_smddp

    sys.path.insert(0, HERE)
    sys.path.insert(0, os.path.join(REPO, "examples"))
    from ft_replica import state_digest
    from train_ddp import VOCAB, CharTransformer, Windows, encode, load_corpus

    torch.set_num_threads(1)
    timeout = datetime.timedelta(seconds=args.timeout)
    host, port = args.store.rsplit(":", 1)
    store = PrefixStore(args.job, TCPStore(host, int(port), is_master=False, timeout=timeout))
    dist.init_process_group("smddp", store=store, rank=args.rank, world_size=args.world,
                            timeout=timeout)
    text, _ = load_corpus(int(args.corpus_mb * 1e6))
    windows = Windows(encode(text), args.seq_len)
    torch.manual_seed(1234)  # the same initial weights on every rank
    model = CharTransformer(len(VOCAB), args.seq_len, 128, 2, 4)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    ddp = DDP(model)
    log = open(os.path.join(args.out, f"steps.{args.rank}.jsonl"), "a", buffering=1)
    log.write(json.dumps({"event": "start", "t": time.time(), "pid": os.getpid()}) + "\n")
    step = 0
    while step < args.steps:
        # Each rank its own batch of every step (its rank at launch).
        g = torch.Generator().manual_seed(100_003 * step + args.rank)
        idx = torch.randint(len(windows), (args.batch_size,), generator=g).tolist()
        xs, ys = zip(*(windows[i] for i in idx))
        x, y = torch.stack(xs), torch.stack(ys)
        opt.zero_grad(set_to_none=True)
        logits = ddp(x)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        try:
            loss.backward()  # DDP's allreduce of the gradients
        except Exception as e:  # noqa: BLE001 - a lost rank, named in the error
            lost = torch_smddp.lost_ranks()
            log.write(json.dumps({"event": "failed", "t": time.time(), "step": step,
                                  "lost": lost, "error": str(e).splitlines()[0][:200]}) + "\n")
            if not lost:
                raise
            del logits, loss, ddp  # the old reducer and its hooks
            t0 = time.time()
            dist.shrink_group(lost, shrink_flags=SHRINK_ABORT)
            ddp = DDP(model)  # on the new default group
            log.write(json.dumps({"event": "shrunk", "t": time.time(), "s": time.time() - t0,
                                  "lost": lost, "world": dist.get_world_size()}) + "\n")
            continue  # the step again, with the survivors' gradients
        opt.step()
        step += 1
        row = {"t": time.time(), "step": step - 1, "after": step, "committed": True,
               "loss": loss.item(), "participants": dist.get_world_size()}
        if os.environ.get("FT_REPLICA_DIGESTS"):
            row["digest"] = state_digest(model, opt)[:12]
        log.write(json.dumps(row) + "\n")
    log.close()
    with open(os.path.join(args.out, f"final.{args.rank}.json.tmp"), "w") as f:
        json.dump({"step": step, "digest": state_digest(model, opt)}, f)
    os.replace(os.path.join(args.out, f"final.{args.rank}.json.tmp"),
               os.path.join(args.out, f"final.{args.rank}.json"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
