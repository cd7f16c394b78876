"""Child-side checks on the stand-in as a torch device ("privateuseone:N",
torch_smddp.testing.sim_torch_device): ops on its tensors are kernels on its
streams, and a device call's future carries its copies' events, as CUDA's
does. Copies back are slowed (SMDDP_DEVICE_SIM_OUT_DELAY_US), so a read that
is not ordered behind them through streams and events sees stale data.

``futures(rank, world)``: allreduce, all-gather, broadcast, reduce-scatter,
all-to-all and send/recv results read after ``work.wait()``, after
``future.wait()`` and through ``then()`` callbacks (``future.value()`` in
the callback), each against its closed form.
``ddp(rank, world, steps)``: cases_ddp's training on the device, against the
same training over Gloo on the CPU. ``fsdp(rank, world)``: cases_fsdp's
FSDP2 training on the device (all-gathers on a stream of FSDP's own, waited
for through events; storages freed and re-allocated with resize_), against
the same over Gloo.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

import cases_ddp

ROUNDS = 4
N = 4096


def _device(rank):
    import torch_smddp.testing as sim

    return torch.device(sim.SIM_TORCH_DEVICE, sim.sim_current_device())


def _filled(rank, k, device):
    return (torch.arange(N, dtype=torch.float32) % 97 + 1000 * rank + k).to(device)


def _sum(world, k):
    base = torch.arange(N, dtype=torch.float32) % 97 + k
    return base * world + 1000 * sum(range(world))


def _check(failures, what, got, want):
    got = got.cpu()
    if not torch.equal(got, want):
        bad = (got != want).nonzero()
        failures.append(f"{what}: {bad.numel()} elements differ, first at {bad[0].tolist()}: "
                        f"{got.reshape(-1)[bad[0][0]].item()} != {want.reshape(-1)[bad[0][0]].item()}")


def _reads(rank, world, device, k, failures):
    want = _sum(world, k)
    t = _filled(rank, k, device)
    dist.all_reduce(t, async_op=True).wait()
    _check(failures, f"round {k}: all_reduce after work.wait()", t, want)

    t = _filled(rank, k, device)
    fut = dist.all_reduce(t, async_op=True).get_future()
    fut.wait()
    _check(failures, f"round {k}: all_reduce after future.wait()", t, want)

    t = _filled(rank, k, device)
    doubled = dist.all_reduce(t, async_op=True).get_future().then(lambda f: f.value()[0] * 2)
    _check(failures, f"round {k}: all_reduce through then()", doubled.wait(), want * 2)

    parts = [torch.empty(N, device=device) for _ in range(world)]
    mine = _filled(rank, k, device)
    fut = dist.all_gather(parts, mine, async_op=True).get_future()
    fut.wait()
    for r in range(world):
        _check(failures, f"round {k}: all_gather part {r} after future.wait()", parts[r],
               _filled(r, k, "cpu"))

    b = _filled(rank, k, device)
    dist.broadcast(b, src=world - 1, async_op=True).wait()
    _check(failures, f"round {k}: broadcast after work.wait()", b, _filled(world - 1, k, "cpu"))
    _more_reads(rank, world, device, k, failures)


def _more_reads(rank, world, device, k, failures):
    """Reduce-scatter, all-to-all and send/recv, through their futures."""
    whole = torch.cat([_filled(rank, k + j, "cpu") for j in range(world)]).to(device)
    out = torch.empty(N, device=device)
    dist.reduce_scatter_tensor(out, whole, async_op=True).get_future().wait()
    _check(failures, f"round {k}: reduce_scatter_tensor after future.wait()", out,
           _sum(world, k + rank))

    # all-to-all: part j of rank r is r * 100 + j (times a ramp).
    ramp = torch.arange(N // world, dtype=torch.float32)
    send = torch.cat([ramp + rank * 100 + j for j in range(world)]).to(device)
    recv = torch.empty_like(send)
    fut = dist.all_to_all_single(recv, send, async_op=True).get_future()
    got = fut.then(lambda f: f.value()[0] + 0).wait()
    want = torch.cat([ramp + r * 100 + rank for r in range(world)])
    _check(failures, f"round {k}: all_to_all_single through then()", got, want)

    peer = rank ^ 1
    if peer < world:
        mine = _filled(rank, k, device)
        theirs = torch.empty(N, device=device)
        ops = [dist.P2POp(dist.isend, mine, peer), dist.P2POp(dist.irecv, theirs, peer)]
        for w in dist.batch_isend_irecv(ops if rank % 2 == 0 else ops[::-1]):
            w.wait()
        _check(failures, f"round {k}: recv after work.wait()", theirs, _filled(peer, k, "cpu"))


def futures(rank, world):
    torch.set_num_threads(1)
    device = _device(rank)
    failures = []
    for k in range(ROUNDS):
        _reads(rank, world, device, k, failures)
    import torch_smddp

    # CPU tensors beside the device's take the CPU path, as in a CUDA job.
    before = torch_smddp.stats()["device_calls"]
    t = _filled(rank, 0, "cpu")
    dist.all_reduce(t)
    _check(failures, "all_reduce of a CPU tensor", t, _sum(world, 0))
    if torch_smddp.stats()["device_calls"] != before:
        failures.append("an allreduce of a CPU tensor took the device path")

    stats = torch_smddp.stats()
    return {"failures": failures, "device": str(device), "device_calls": stats["device_calls"],
            "intra_route": stats["intra_route"]}


def ddp(rank, world, steps):
    import torch_smddp

    res = cases_ddp.ddp_vs_gloo(rank, world, steps, device=_device(rank))
    res["intra_route"] = torch_smddp.stats()["intra_route"]
    return res


def fsdp(rank, world):
    import cases_fsdp

    return cases_fsdp.run(rank, world, device=_device(rank))
