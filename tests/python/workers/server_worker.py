"""Worker of test_servers.py: ``server_worker.py MODE OUT_DIR [LOOP_S]``.

Started once per rank (by the test, or by torchrun on a cluster host) with
the standalone reduction servers in SMDDP_SERVER_HOSTS (or the store).
It only observes and writes ``<mode>.<rank>.json``; the test asserts.

* ``check``: allreduce of several sizes and dtypes. Oracles: the closed
  form (integer-valued inputs, exact in every dtype), and for random floats
  the sum in rank order within a host, then in host order, computed here
  from every rank's seeded inputs (f16/bf16: in f32, rounded once). Writes
  each result's sha256 (the test compares them across ranks) and stats().
* ``loop``: 4 MiB all_reduces back to back until one raises or LOOP_S pass
  (the test kills the server meanwhile); writes what raised and when.
* ``init``: only joins the group; writes the error it raised, if any.
* ``badscale``: one allreduce on a group crossing hosts in bf16 (the test's
  server answers with a bad scale); writes what it raised, or what it got.
* ``steady``: 256 KiB all_reduces back to back for LOOP_S seconds, each
  checked against its closed form (no servers needed: the peer-monitor
  flood of test_server_security.py); writes the calls and the wrong ones.
* ``reconfigure``: ``loop`` until an allreduce raises (the test kills a
  server), then, as torchft does, a new group on a new store prefix: how
  long it took to form, how many servers it uses, a closed-form allreduce.
* ``big``: three 64 MiB all_reduces (closed form, exact), run with large
  shared-memory steps so that the steps in flight to a server hold far
  more than its sockets do; writes what each returned and stats().
* ``narrow``: f32 allreduces on groups crossing hosts in bf16 and in fp16
  (cross_host_dtype). Oracles: the closed form (small integers, exact in
  either), and for random floats, bf16: each host's partial rounded to
  bf16, summed in f32 in host order, rounded once more (computed here);
  fp16: the per-element bound of reduce/narrow_wire.h against an f64 sum.
  Writes each result's sha256 and the two groups' standalone-server stats.
With SERVER_TEST_HOST_PER_RANK=1 each rank is its own pretend host
(SMDDP_HOST_ID), as under torchrun on this one machine.

* ``failover`` (under ``torchrun --max-restarts 1``, each rank its own
  pretend host): the first attempt writes ``ready.<rank>.json``, runs
  ``loop`` until an allreduce raises (the test kills a server), writes
  ``attempt0.<rank>.json`` and exits 1, so torchrun restarts the job; the
  restarted attempt runs ``check`` over the servers still alive and writes
  ``failover.<rank>.json`` with how long joining the group took.
"""

import datetime
import hashlib
import json
import os
import sys
import time
import traceback


def _write(out_dir, name, obj):
    tmp = os.path.join(out_dir, name + ".tmp")
    with open(tmp, "w") as f:
        json.dump(obj, f)
    os.replace(tmp, os.path.join(out_dir, name))


def _inputs(torch, rank, n, dtype):
    g = torch.Generator().manual_seed(1000 + rank)
    return torch.randn(n, generator=g, dtype=torch.float32).to(dtype)


def _host_order_sum(torch, world, nproc, n, dtype):
    wide = dtype in (torch.float16, torch.bfloat16)
    acc = torch.float32 if wide else dtype
    total = None
    for h in range(world // nproc):
        part = None
        for r in range(h * nproc, (h + 1) * nproc):
            x = _inputs(torch, r, n, dtype).to(acc)
            part = x.clone() if part is None else part + x
        if not wide and nproc > 1:
            part = part.to(dtype).to(acc)  # a host partial is stored in the dtype
        total = part if total is None else total + part
    return total.to(dtype)


def check(torch, dist, torch_smddp, rank, world, nproc):
    out = {"cases": [], "bad": []}
    sizes = [1, 1000, (1 << 16) + 3, (1 << 20) + 5]
    dtypes = [torch.float32, torch.float64, torch.int32, torch.bfloat16, torch.float16]
    ops = [("sum", dist.ReduceOp.SUM), ("avg", dist.ReduceOp.AVG)]
    for n in sizes:
        for dt in dtypes:
            for opname, op in ops:
                if opname == "avg" and not dt.is_floating_point:
                    continue
                # Closed form: rank r holds (r + 1) * (i % 7 + 1).
                base = (torch.arange(n, dtype=torch.int64) % 7 + 1)
                t = (base * (rank + 1)).to(dt)
                dist.all_reduce(t, op=op)
                s = world * (world + 1) // 2
                expect = (base * s).to(torch.float64)
                if opname == "avg":
                    expect = expect / world
                ok = bool(torch.equal(t.to(torch.float64), expect))
                case = f"closed {opname} {dt} n={n}"
                out["cases"].append([case, hashlib.sha256(t.contiguous().view(torch.uint8).numpy()
                                                          .tobytes()).hexdigest()])
                if not ok:
                    out["bad"].append(case)
        for dt in (torch.float32, torch.bfloat16):
            t = _inputs(torch, rank, n, dt)
            dist.all_reduce(t)
            expect = _host_order_sum(torch, world, nproc, n, dt)
            case = f"random sum {dt} n={n}"
            out["cases"].append([case, hashlib.sha256(t.view(torch.uint8).numpy().tobytes())
                                 .hexdigest()])
            if not torch.equal(t.view(torch.uint8), expect.view(torch.uint8)):
                diff = (t.double() - expect.double()).abs().max().item()
                out["bad"].append(f"{case} (max diff {diff})")
    out["stats"] = {k: v for k, v in torch_smddp.stats().items() if isinstance(v, (int, str))}
    return out


def narrow(torch, dist, torch_smddp, rank, world, nproc):
    out = {"cases": [], "bad": []}
    sizes = [1, 1000, (1 << 16) + 3, (1 << 20) + 5]
    hosts = world // nproc

    def partials(n):  # each host's f32 partial, its ranks summed in rank order
        res = []
        for h in range(hosts):
            part = None
            for r in range(h * nproc, (h + 1) * nproc):
                x = _inputs(torch, r, n, torch.float32)
                part = x.clone() if part is None else part + x
            res.append(part)
        return res

    for wire in ("bf16", "fp16"):
        pg = dist.new_group(backend="smddp", pg_options=torch_smddp.Options(cross_host_dtype=wire))
        for n in sizes:
            base = (torch.arange(n, dtype=torch.int64) % 7 + 1)
            for opname, op in (("sum", dist.ReduceOp.SUM), ("avg", dist.ReduceOp.AVG)):
                t = (base * (rank + 1)).to(torch.float32)
                dist.all_reduce(t, op=op, group=pg)
                expect = (base * (world * (world + 1) // 2)).to(torch.float64)
                if opname == "avg":
                    expect = expect / world
                case = f"{wire} closed {opname} n={n}"
                out["cases"].append([case, hashlib.sha256(t.numpy().tobytes()).hexdigest()])
                if not torch.equal(t.to(torch.float64), expect):
                    out["bad"].append(case)
            t = _inputs(torch, rank, n, torch.float32)
            dist.all_reduce(t, group=pg)
            case = f"{wire} random sum n={n}"
            out["cases"].append([case, hashlib.sha256(t.numpy().tobytes()).hexdigest()])
            parts = partials(n)
            if wire == "bf16":
                total = None
                for p in parts:
                    p = p.to(torch.bfloat16).to(torch.float32)
                    total = p if total is None else total + p
                expect = total.to(torch.bfloat16).to(torch.float32)
                if not torch.equal(t, expect):
                    diff = (t.double() - expect.double()).abs().max().item()
                    out["bad"].append(f"{case} (max diff {diff})")
            else:
                # |read - x| <= 2^-11 |x| + 2^-39 m per rounding (m: the
                # largest |x| of a piece, at most of the whole buffer):
                # every partial once, the sum once, plus f32's own sums.
                exact = sum(p.double() for p in parts)
                m = max(max(p.abs().max().item() for p in parts), exact.abs().max().item())
                bound = (2.0 ** -11 * (sum(p.double().abs() for p in parts) + exact.abs()) * 1.001
                         + (hosts + 1) * 2.0 ** -39 * m + 1e-30)
                over = ((t.double() - exact).abs() - bound).max().item()
                if over > 0:
                    out["bad"].append(f"{case} (past the bound by {over})")
        st = torch_smddp.stats(pg)
        out.setdefault("stats", {})
        for k in ("standalone_server_steps", "standalone_server_bytes"):
            out["stats"][k] = out["stats"].get(k, 0) + st[k]
    return out


def _loop_until_raised(torch, dist, out_dir, rank, loop_s, res):
    big = torch.ones(1 << 20)
    dist.all_reduce(big)
    _write(out_dir, f"ready.{rank}.json", {"rank": rank, "pid": os.getpid()})
    calls, end = 0, time.monotonic() + loop_s
    res["raised"] = False
    try:
        while time.monotonic() < end:
            big.fill_(1.0)
            dist.all_reduce(big)
            calls += 1
    except Exception as e:  # noqa: BLE001
        res.update(raised=True, t=time.time(), msg=str(e))
    res["calls"] = calls


def main():
    mode, out_dir = sys.argv[1], sys.argv[2]
    loop_s = float(sys.argv[3]) if len(sys.argv) > 3 else 30.0
    rank = int(os.environ["RANK"])
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    one_rank_hosts = mode == "failover" or os.environ.get("SERVER_TEST_HOST_PER_RANK") == "1"
    if one_rank_hosts:
        os.environ["SMDDP_HOST_ID"] = f"h{rank}"  # torchrun runs every rank on this host
    if mode == "failover" and attempt == 0:
        mode = "attempt0"
    try:
        import torch
        import torch.distributed as dist

        import torch_smddp

        torch.set_num_threads(1)
        timeout = float(os.environ.get("SERVER_TEST_TIMEOUT_S", "60"))
        t_init = time.monotonic()
        try:
            dist.init_process_group("smddp", timeout=datetime.timedelta(seconds=timeout))
        except Exception as e:  # noqa: BLE001 - reported to the parent
            _write(out_dir, f"{mode}.{rank}.json", {"rank": rank, "init_error": str(e)})
            if rank == 0:
                time.sleep(5)  # rank 0 hosts the store: the others may still read it
            return
        world = dist.get_world_size()
        nproc = 1 if one_rank_hosts else int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        res = {"rank": rank, "world": world, "pid": os.getpid(), "attempt": attempt,
               "init_s": time.monotonic() - t_init,
               "path": torch_smddp.stats()["allreduce_path"],
               "standalone_servers": torch_smddp.stats()["standalone_servers"],
               # torch_smddp hands servers found in a store to the engine
               # directly: the variable stays as the launcher set it.
               "env_server_hosts": os.environ.get("SMDDP_SERVER_HOSTS")}
        if mode == "check":
            res.update(check(torch, dist, torch_smddp, rank, world, nproc))
        elif mode == "narrow":
            res.update(narrow(torch, dist, torch_smddp, rank, world, nproc))
        elif mode == "failover":
            res.update(check(torch, dist, torch_smddp, rank, world, nproc))
        elif mode == "attempt0":
            _loop_until_raised(torch, dist, out_dir, rank, loop_s, res)
            _write(out_dir, f"{mode}.{rank}.json", res)
            dist.destroy_process_group()
            sys.exit(1)  # torchrun restarts the job
        elif mode == "big":
            n = 16 << 20
            base = torch.arange(n, dtype=torch.int64) % 7 + 1
            s = world * (world + 1) // 2
            res["bad"], res["seconds"] = [], []
            for i in range(3):
                t = (base * (rank + 1)).to(torch.float32)
                t0 = time.monotonic()
                dist.all_reduce(t)
                res["seconds"].append(time.monotonic() - t0)
                if not torch.equal(t, (base * s).to(torch.float32)):
                    res["bad"].append(i)
            res["stats"] = {k: v for k, v in torch_smddp.stats().items()
                            if isinstance(v, (int, str))}
        elif mode == "loop":
            _loop_until_raised(torch, dist, out_dir, rank, loop_s, res)
        elif mode == "badscale":
            pg = dist.new_group(backend="smddp",
                                pg_options=torch_smddp.Options(cross_host_dtype="bf16"))
            t = torch.ones(1 << 16)
            res["raised"] = False
            try:
                dist.all_reduce(t, group=pg)
                res["result_head"] = t[:4].tolist()
            except Exception as e:  # noqa: BLE001
                res.update(raised=True, msg=str(e))
        elif mode == "steady":
            base = torch.arange(1 << 16, dtype=torch.int64) % 7 + 1
            want = (base * (world * (world + 1) // 2)).float()
            res["calls"], res["bad"], end = 0, 0, time.monotonic() + loop_s
            done = torch.zeros(1)
            while not done.item():  # every rank stops at the same call
                t = (base * (rank + 1)).float()
                dist.all_reduce(t)
                res["calls"] += 1
                res["bad"] += int(not torch.equal(t, want))
                done.fill_(float(time.monotonic() >= end))
                dist.all_reduce(done, op=dist.ReduceOp.MAX)
        elif mode == "reconfigure":
            # As torchft after a failure: the group that lost a server is
            # aborted, and a new one is made on a new store prefix.
            _loop_until_raised(torch, dist, out_dir, rank, loop_s, res)
            store = dist.distributed_c10d._get_default_store()
            t0 = time.monotonic()
            pg = torch_smddp._C.ProcessGroupSmddp(dist.PrefixStore("quorum2", store), rank, world,
                                                  datetime.timedelta(seconds=timeout), "quorum2")
            res["reform_s"] = time.monotonic() - t0
            st = pg.stats()
            res["reformed_servers"] = st["standalone_servers"]
            t = torch.arange(1 << 18, dtype=torch.float32) * (rank + 1)
            pg.allreduce([t], dist.AllreduceOptions()).wait()
            s = world * (world + 1) // 2
            res["reformed_ok"] = bool(torch.equal(t, torch.arange(1 << 18, dtype=torch.float32) * s))
            res["reformed_path"] = pg.stats()["allreduce_path"]
            res["reformed_server_steps"] = pg.stats()["standalone_server_steps"]
            pg.abort()
        t0 = time.time()
        dist.destroy_process_group()
        res["destroy_s"] = time.time() - t0
        _write(out_dir, f"{mode}.{rank}.json", res)
    except SystemExit:
        raise
    except BaseException as e:  # noqa: BLE001
        _write(out_dir, f"{mode}.{rank}.json",
               {"rank": rank, "crashed": f"{type(e).__name__}: {e}",
                "traceback": traceback.format_exc()[-4000:]})


if __name__ == "__main__":
    main()
