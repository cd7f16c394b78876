"""Worker of test_cluster_idle.py, started by torchrun on each host of a
namespace cluster whose hosts cap their TCP socket buffers at 4 KiB:
``idle_progress_worker.py --reps R --out F``.

Rounds of cases_host_collectives' all-gathers and reduce-scatters at sizes
that cross hosts in one message each (the world group's hierarchy and a
network-only group), interleaved with Gloo's calls on the same data, its
oracle. A rank that leaves a call while its provider still owes a peer
bytes of it (a rendezvous acknowledgement queued behind a full socket) and
then waits in another group leaves that peer waiting, unless its idle
engine thread keeps progressing (Communicator::parkIdle). Each group's
timeout (60 s) turns such a wait into a failure. Rank 0 writes what every
rank saw to F."""

import argparse
import datetime
import os
import sys

import torch
import torch.distributed as dist

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "harness"))
from mp_helpers import put_support_on_path, write_everyones  # noqa: E402

put_support_on_path()
import cases_host_collectives as chc  # noqa: E402

import torch_smddp  # noqa: E402,F401  (registers the backend)

SIZES = [13, 4099, 65536 + 3]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.set_num_threads(1)
    timeout = datetime.timedelta(seconds=60)
    dist.init_process_group("smddp", timeout=timeout)
    rank, world = dist.get_rank(), dist.get_world_size()
    hosts = world // int(os.environ["LOCAL_WORLD_SIZE"])
    ck = chc.Checker(rank, world)
    gloo = dist.new_group(backend="gloo", timeout=timeout)
    os.environ["SMDDP_SHM_COLLECTIVES"] = "0"
    net = dist.new_group(backend="smddp", timeout=timeout)
    del os.environ["SMDDP_SHM_COLLECTIVES"]
    for _ in range(args.reps):
        for dtype in (torch.float32, torch.int32):
            for n in SIZES:
                chc.all_gathers(ck, rank, world, net, gloo, dtype, n)
                chc.reduce_scatters(ck, rank, world, net, gloo, dtype, n, hosts)
    write_everyones({"rank": rank, "cases": ck.cases, "failures": ck.failures}, args.out, gloo)


if __name__ == "__main__":
    main()
