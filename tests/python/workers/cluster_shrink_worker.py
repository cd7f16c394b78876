"""Worker of test_shrink_cluster.py, started on its host by the parent
itself (not torchrun, whose agents would stop the survivors):
``cluster_shrink_worker.py STORE_HOST:PORT JOB EXCLUDED VICTIMS``.

RANK and WORLD_SIZE come from the environment, the group's store is the
cluster's in the hub under the prefix JOB, so it outlives any training host.
The rank runs cases_shrink.py's two cases: a sub-group shrunk without rank
EXCLUDED (alive), then the default group shrunk without VICTIMS (a comma
list: every rank of the host the parent kills). A survivor tells the parent
it is inside the all_reduce the victims never join by writing
``inside.<rank>``; the parent writes ``killed_at`` (wall clock) when it has
killed the host. Each survivor writes its results to ``result.<rank>``.
"""

import datetime
import json
import os
import sys
import time
import traceback

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "harness"))
from mp_helpers import put_support_on_path  # noqa: E402

put_support_on_path()  # cases/ (cases_shrink) and harness/, which they import

OUT = os.environ["SMDDP_CLUSTER_OUT"]


def _write(name: str, obj) -> None:
    tmp = os.path.join(OUT, name + ".tmp")
    with open(tmp, "w") as f:
        json.dump(obj, f)
    os.replace(tmp, os.path.join(OUT, name))


class FileKiller:
    """cases_shrink's killer: the parent watches the files."""

    def inside(self, rank: int) -> None:
        _write(f"inside.{rank}", {"t": time.time()})

    def killed_at(self, timeout: float = 30.0) -> float:
        path = os.path.join(OUT, "killed_at")
        deadline = time.monotonic() + timeout
        while not os.path.exists(path):
            if time.monotonic() > deadline:
                raise TimeoutError("the parent never wrote killed_at")
            time.sleep(0.02)
        with open(path) as f:
            return float(json.load(f))


def main() -> None:
    store_addr, job, excluded, victims = sys.argv[1:5]
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    try:
        import torch
        import torch.distributed as dist
        from torch.distributed import PrefixStore, TCPStore

        import cases_shrink
        import torch_smddp  # noqa: F401  (registers "smddp")

        torch.set_num_threads(1)
        host, port = store_addr.rsplit(":", 1)
        timeout = datetime.timedelta(seconds=30)
        store = PrefixStore(job, TCPStore(host, int(port), is_master=False, timeout=timeout))
        dist.init_process_group("smddp", store=store, rank=rank, world_size=world,
                                timeout=timeout)
        out = {"host": os.environ.get("SMDDP_HOST_ID"),
               "subgroup": cases_shrink._subgroup_case(rank, world, excluded=int(excluded))}
        victims_t = tuple(int(v) for v in victims.split(","))
        out["default"] = cases_shrink._default_case(rank, world, victims_t, FileKiller())
        _write(f"result.{rank}", out)
        dist.destroy_process_group()
    except BaseException:  # noqa: BLE001 - reported to the parent
        _write(f"result.{rank}", {"crashed": traceback.format_exc()})
        raise


if __name__ == "__main__":
    main()
