"""Worker of test_cluster_gather.py, started by torchrun on each host of a
namespace cluster: ``cluster_gather_worker.py --out F``.

All-gather and reduce-scatter across hosts (the hierarchy of docs/design.md,
"All-gather and reduce-scatter across hosts"): every case of
cases_host_collectives at the cluster's sizes, then FSDP2 training
(cases_fsdp), each against its own oracles in the same job. Rank 0 writes
what every rank saw to F; the parent asserts."""

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
import cases_fsdp  # noqa: E402
import cases_host_collectives  # noqa: E402

import torch_smddp  # noqa: E402,F401  (registers the backend)

# Odd sizes on both sides of a piece (256 KiB), and an empty call.
SIZES = [0, 13, 4099, 65536 + 3]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("smddp", timeout=datetime.timedelta(seconds=120))
    rank, world = dist.get_rank(), dist.get_world_size()
    hosts = world // int(os.environ["LOCAL_WORLD_SIZE"])
    res = {"rank": rank, "host": os.environ.get("SMDDP_HOST_ID", "")}
    res["collectives"] = cases_host_collectives.run(rank, world, hosts, SIZES)
    res["fsdp"] = cases_fsdp.run(rank, world)
    write_everyones(res, args.out, dist.new_group(backend="gloo"))


if __name__ == "__main__":
    main()
