"""Worker of test_cluster.py, started by torchrun on each host of a
scripts/cluster.sh cluster: ``cluster_worker.py LOOP_S``.

Each rank joins the group, checks a warm-up all_reduce against its closed
form, writes ``ready.<rank>`` (host, pid, provider, liveness peers) and then
runs 4 MiB all_reduces back to back until one raises (the parent kills a
rank, a host or a link meanwhile) or LOOP_S pass. It writes what raised and
when (wall clock, which the parent shares) to ``result.<rank>``, tries one
more call (it must fail at once) and destroys the group (which must not
hang). The parent asserts; the worker only observes.
"""

import datetime
import json
import os
import sys
import time
import traceback


def _write(name: str, obj) -> None:
    out = os.environ["SMDDP_CLUSTER_OUT"]
    tmp = os.path.join(out, name + ".tmp")
    with open(tmp, "w") as f:
        json.dump(obj, f)
    os.replace(tmp, os.path.join(out, name))


def main() -> None:
    loop_s = float(sys.argv[1])
    rank = int(os.environ["RANK"])
    try:
        import torch
        import torch.distributed as dist

        import torch_smddp

        torch.set_num_threads(1)
        dist.init_process_group("smddp", timeout=datetime.timedelta(seconds=120))
        world = dist.get_world_size()
        backend = torch_smddp._backend_of()
        t = torch.arange(1000, dtype=torch.float64) * (rank + 1)
        dist.all_reduce(t)
        expect = torch.arange(1000, dtype=torch.float64) * (world * (world + 1) // 2)
        info = {"rank": rank, "world": world, "host": os.environ.get("SMDDP_HOST_ID"),
                "pid": os.getpid(), "provider": backend.provider,
                "allreduce_path": torch_smddp.stats()["allreduce_path"],
                "allreduce_schedule": torch_smddp.stats()["allreduce_schedule"],
                "liveness_peers": list(backend.liveness_peers),
                "closed_form_ok": bool(torch.equal(t, expect))}
        _write(f"ready.{rank}", info)
        big = torch.ones(1 << 20)
        calls = 0
        res = {"raised": False}
        end = time.monotonic() + loop_s
        try:
            while time.monotonic() < end:
                big.fill_(1.0)
                dist.all_reduce(big)
                calls += 1
        except Exception as e:  # noqa: BLE001 - reported to the parent
            res = {"raised": True, "t": time.time(), "type": type(e).__name__, "msg": str(e)}
        res["calls"] = calls
        try:  # calls that ran (or began) in pairwise rounds: 3 hosts of one rank
            res["rounds_calls"] = torch_smddp.stats()["rounds_calls"]
        except Exception as e:  # noqa: BLE001
            res["rounds_calls"] = f"stats() raised: {e}"
        t0 = time.time()
        try:
            dist.all_reduce(torch.ones(4))
            res["later"] = {"raised": False}
        except Exception as e:  # noqa: BLE001
            res["later"] = {"raised": True, "elapsed": time.time() - t0, "msg": str(e)}
        t0 = time.time()
        try:
            dist.destroy_process_group()
        except Exception as e:  # noqa: BLE001
            res["destroy_error"] = str(e)
        res["destroy_s"] = time.time() - t0
        _write(f"result.{rank}", {**info, **res})
    except BaseException as e:  # noqa: BLE001
        _write(f"result.{rank}", {"rank": rank, "crashed": f"{type(e).__name__}: {e}",
                                  "traceback": traceback.format_exc()[-4000:]})
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
