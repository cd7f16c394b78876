"""Keep training through a rank's death, no process restarted:
dist.shrink_group on the smddp backend.

    python examples/shrink_on_failure.py --nproc 4 --kill-rank 3 --kill-step 5 --check

It starts its own ranks: torchrun's agent stops every worker when one
dies, which is the restart this example does without. (Under a launcher
that leaves survivors running, set RANK, WORLD_SIZE, MASTER_ADDR and
MASTER_PORT and it runs as one rank.)

DDP trains a small regression model; every step's global batch is cut
into one shard per rank of the job. At --kill-step, --kill-rank SIGKILLs
itself in the middle of the step. The survivors' backward fails with an
error naming it; they ask smddp which ranks are gone
(torch_smddp.lost_ranks), shrink the default group without them
(dist.shrink_group with SHRINK_ABORT), wrap the model in DDP again on the
new group, and redo the failed step (its optimizer step never ran, so
the parameters are those of the last completed step). From then on each
step averages the survivors' shards.

--check replays the same steps in one process, each step's loss the mean
of the shards of the ranks alive at that step (what DDP's average of
equal-sized shards computes), and compares the parameters: the oracle of
tests/python/test_shrink.py. Rank 0 prints the time from the kill to the
first completed step after it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.distributed_c10d import SHRINK_ABORT
from torch.nn.parallel import DistributedDataParallel as DDP

import torch_smddp

SHARD = 32     # samples per rank and step
FEATURES = 16
LR = 0.05


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(FEATURES, 32), nn.Tanh(), nn.Linear(32, 1)).double()


def shard(step: int, job_rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The samples of one rank of the job (its rank at launch) at `step`."""
    g = torch.Generator().manual_seed(1000 * step + job_rank)
    x = torch.randn(SHARD, FEATURES, generator=g, dtype=torch.float64)
    y = x[:, :1].sin() + 0.1 * x[:, 1:2]
    return x, y


def shard_loss(model: nn.Module, step: int, job_rank: int) -> torch.Tensor:
    x, y = shard(step, job_rank)
    return nn.functional.mse_loss(model(x), y)


def oracle(steps: int, members_at: list[list[int]]) -> list[torch.Tensor]:
    """One process: each step's loss is the mean over the ranks alive then."""
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for step in range(steps):
        opt.zero_grad()
        loss = sum(shard_loss(model, step, r) for r in members_at[step]) / len(members_at[step])
        loss.backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def train(args) -> dict:
    job_rank = int(os.environ["RANK"])
    dist.init_process_group("smddp", timeout=datetime.timedelta(seconds=args.timeout))
    members = list(range(dist.get_world_size()))  # job ranks of the current group, in order
    module = make_model()
    model = DDP(module)
    opt = torch.optim.SGD(module.parameters(), lr=LR)
    members_at: list[list[int]] = []
    killed_at = recovered_s = None
    step = 0
    while step < args.steps:
        opt.zero_grad()
        loss = shard_loss(model, step, job_rank)
        if step == args.kill_step and job_rank == args.kill_rank:
            dist.distributed_c10d._get_default_store().set("killed_at", repr(time.time()))
            os.kill(os.getpid(), signal.SIGKILL)
        failure = None
        try:
            loss.backward()  # DDP's allreduce of the gradients
        except Exception as e:  # noqa: BLE001 - a lost rank, named in the error
            failure = str(e).splitlines()[0][:160]
        if failure is not None:
            lost = torch_smddp.lost_ranks()
            if not lost:
                raise RuntimeError(f"step {step} failed with no rank lost: {failure}")
            if job_rank == 0:
                print(f"step {step}: {failure}", flush=True)
            del loss, model  # the old DDP's reducer and its hooks go with it
            dist.shrink_group(lost, shrink_flags=SHRINK_ABORT)
            members = [m for i, m in enumerate(members) if i not in lost]
            killed_at = float(dist.distributed_c10d._get_default_store().get("killed_at"))
            model = DDP(module)  # on the new default group
            continue  # the step again, without the lost rank's shard
        opt.step()
        members_at.append(list(members))
        if killed_at is not None and recovered_s is None:
            recovered_s = time.time() - killed_at
        step += 1
    result = {"members_at": members_at, "recovered_s": recovered_s,
              "params": [p.detach().tolist() for p in module.parameters()]}
    dist.destroy_process_group()
    return result


def launch(args) -> int:
    """Starts --nproc ranks of this script and waits for them (a rank that
    dies is left dead); returns rank 0's exit code."""
    import socket
    import subprocess

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for r in range(args.nproc):
        env = dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(args.nproc),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        procs.append(subprocess.Popen([sys.executable, __file__] + sys.argv[1:], env=env))
    deadline = time.monotonic() + args.timeout * 4
    try:
        for p in procs:
            p.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        print("shrink_on_failure: a rank did not finish in time", file=sys.stderr)
        return 1
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    codes = [p.returncode for p in procs]
    expected_dead = args.kill_rank if 0 <= args.kill_rank < args.nproc else None
    bad = [r for r, c in enumerate(codes) if c != 0 and r != expected_dead]
    if bad:
        print(f"shrink_on_failure: rank(s) {bad} failed: exit codes {codes}", file=sys.stderr)
        return 1
    return codes[0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nproc", type=int, default=4, help="ranks to start (without RANK set)")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--kill-rank", type=int, default=3)
    ap.add_argument("--kill-step", type=int, default=5)
    ap.add_argument("--timeout", type=float, default=60.0)
    ap.add_argument("--check", action="store_true",
                    help="compare with the one-process replay; print a JSON verdict")
    args = ap.parse_args()
    if "RANK" not in os.environ:
        return launch(args)
    res = train(args)
    if int(os.environ["RANK"]) != 0:
        return 0
    print(f"trained {args.steps} steps; members per step: "
          f"{sorted({tuple(m) for m in res['members_at']})}; "
          f"kill to the first step after it: "
          f"{res['recovered_s'] if res['recovered_s'] is None else round(res['recovered_s'], 3)} s")
    if args.check:
        want = oracle(args.steps, res["members_at"])
        got = [torch.tensor(p, dtype=torch.float64) for p in res["params"]]
        err = max((a - b).abs().max().item() for a, b in zip(got, want))
        print(json.dumps({"max_abs_error": err, "ok": err < 1e-9,
                          "members_at": res["members_at"], "recovered_s": res["recovered_s"]}))
        return 0 if err < 1e-9 else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
