"""Child side of test_gpu.py: the smddp backend on CUDA tensors, every rank
on cuda:0 (two processes may share one GPU; smddp stages through the host).

``run_all(rank, world)`` runs every section in one job (spawning costs
seconds per rank) and returns {section: {"failures": [...], ...}}. A case
that raises is a failure of that case; the others still run.

Oracles:
* reductions: the same smddp collective on CPU copies of the inputs, bit for
  bit (smddp folds in rank order whatever the chunking, and the GPU path only
  stages bytes), and Gloo on the same inputs (on CUDA where Gloo takes CUDA
  tensors, else on CPU copies) within a dtype's rounding;
* data movement (broadcast, gathers, scatters, all_to_all, send/recv): the
  closed form, bit for bit: every input is a pure function of (case, rank);
* streams: a slow kernel on the caller's current stream writes the input;
  the result must reflect it, and the call must return long before the
  kernel ends (it never blocks at submit; work.wait() then blocks the host
  until the host part is done and makes the current stream wait);
* DDP and FSDP2: the same training over a Gloo group, from the same seeds.
"""

from __future__ import annotations

import collections
import time
import zlib

import torch
import torch.distributed as dist
import torch.nn as nn

R = dist.ReduceOp
DEV = torch.device("cuda", 0)

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.int32]
FLOAT_OPS = ["SUM", "AVG", "MIN", "MAX", "PRODUCT", "PREMUL_SUM"]
INT_OPS = ["SUM", "MIN", "MAX", "PRODUCT", "BAND", "BOR", "BXOR"]
# Empty, tiny, odd, and more than one 4 MiB staging slot of float32.
SIZES = [0, 1, 5, 1023, 65537, (1 << 20) + 3]
MOVE_SIZES = [0, 1, 1023, 65537]
# |smddp - gloo| allowed per dtype (rounding of a two-rank fold).
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}


def dname(dtype):
    return str(dtype).replace("torch.", "")


def make_input(key, r, dtype, n):
    """Rank r's input of case `key` on the CPU: a pure function of its arguments."""
    g = torch.Generator().manual_seed(zlib.crc32(f"{key}#{r}".encode()))
    if dtype.is_floating_point:
        return (torch.randn(n, generator=g) * 4).to(dtype)
    return torch.randint(-60, 60, (n,), generator=g, dtype=dtype)


def reduce_op(name, world):
    if name == "PREMUL_SUM":
        return dist._make_nccl_premul_sum(1.0 / (2 * world))
    return getattr(R, name)


def sync():
    if DEV.type == "cuda":
        torch.cuda.synchronize()


def bits(t):
    t = t.detach().cpu().contiguous()
    return t.view(torch.uint8) if t.numel() else t


class Checks:
    def __init__(self, rank, world, gloo):
        self.rank, self.world, self.gloo = rank, world, gloo
        self.failures = []
        self.counts = collections.Counter()
        self.gloo_on = collections.Counter()  # where Gloo's reference ran: cuda, cpu, refused

    def case(self, family, key, fn):
        try:
            fn()
            self.counts[family] += 1
        except Exception as e:  # noqa: BLE001 - one failing case must not hide the others
            self.failures.append(f"rank {self.rank} {family} {key}: {type(e).__name__}: {e}"[:600])

    def same(self, what, got, expect):
        if got.shape != expect.shape or got.dtype != expect.dtype or not torch.equal(bits(got), bits(expect)):
            self.failures.append(f"rank {self.rank} {what}: differs from the oracle "
                                 f"(got {got.flatten()[:4].tolist()}, expected {expect.flatten()[:4].tolist()}, "
                                 f"shapes {tuple(got.shape)} {tuple(expect.shape)})")

    def close(self, what, got, expect):
        got, expect = got.detach().cpu(), expect.detach().cpu()
        if got.dtype.is_floating_point:
            tol = TOL[got.dtype]
            ok = got.shape == expect.shape and torch.allclose(got.float(), expect.float(), rtol=tol, atol=tol)
        else:
            ok = torch.equal(got, expect)
        if not ok:
            self.failures.append(f"rank {self.rank} {what}: differs from Gloo "
                                 f"(got {got.flatten()[:4].tolist()}, gloo {expect.flatten()[:4].tolist()})")

    def with_gloo(self, run):
        """run(device) with group=self.gloo: on CUDA tensors where Gloo takes
        them, else on CPU copies; None when Gloo refuses the call itself."""
        for device in (DEV, torch.device("cpu")):
            try:
                out = run(device)
                self.gloo_on[device.type] += 1
                return out
            except (RuntimeError, ValueError):
                continue
        self.gloo_on["refused"] += 1
        return None


# --------------------------------------------------------------------------
# collectives
# --------------------------------------------------------------------------

def _all_reduce(c, dtype, op_name, n):
    key = f"all_reduce/{dname(dtype)}/{op_name}/{n}"
    x = make_input(key, c.rank, dtype, n)
    got = x.to(DEV, copy=True)
    dist.all_reduce(got, op=reduce_op(op_name, c.world))
    ref = x.clone()
    dist.all_reduce(ref, op=reduce_op(op_name, c.world))
    c.same(key + " vs smddp on CPU", got, ref)
    if op_name == "PREMUL_SUM":
        return  # Gloo has none
    gloo_op = R.SUM if op_name == "AVG" else getattr(R, op_name)

    def run(device):
        t = x.to(device, copy=True)
        dist.all_reduce(t, op=gloo_op, group=c.gloo)
        return (t.double() / c.world).to(dtype) if op_name == "AVG" else t

    g = c.with_gloo(run)
    if g is not None:
        c.close(key, got, g)


def _coalesced(c, dtype):
    key = f"coalesced/{dname(dtype)}"
    xs = [make_input(f"{key}/{i}", c.rank, dtype, n) for i, n in enumerate([3, 1023, 0, 4099])]
    refs = [x.clone() for x in xs]
    for x in refs:
        dist.all_reduce(x)
    # all_reduce_coalesced (deprecated, still what some callers use)
    got = [x.to(DEV, copy=True) for x in xs]
    dist.all_reduce_coalesced(got)
    for i, (a, b) in enumerate(zip(got, refs)):
        c.same(f"{key}/all_reduce_coalesced/{i}", a, b)
    # the coalescing manager (what DDP's and FSDP's grouped calls use)
    from torch.distributed.distributed_c10d import _coalescing_manager

    got = [x.to(DEV, copy=True) for x in xs]
    with _coalescing_manager(device=DEV, async_ops=True) as cm:
        for t in got:
            dist.all_reduce(t)
    cm.wait()
    for i, (a, b) in enumerate(zip(got, refs)):
        c.same(f"{key}/coalescing_manager/{i}", a, b)


def _broadcast(c, dtype, n):
    for src in range(c.world):
        key = f"broadcast/{dname(dtype)}/{n}/src{src}"
        t = make_input(key, c.rank, dtype, n).to(DEV, copy=True)
        dist.broadcast(t, src=src)
        c.same(key, t, make_input(key, src, dtype, n))


def _all_gather(c, dtype, n):
    key = f"all_gather/{dname(dtype)}/{n}"
    x = make_input(key, c.rank, dtype, n).to(DEV, copy=True)
    outs = [torch.empty(n, dtype=dtype, device=DEV) for _ in range(c.world)]
    dist.all_gather(outs, x)
    for r in range(c.world):
        c.same(f"{key}/from{r}", outs[r], make_input(key, r, dtype, n))
    key = f"all_gather_into_tensor/{dname(dtype)}/{n}"
    x = make_input(key, c.rank, dtype, n).to(DEV, copy=True)
    out = torch.empty(c.world * n, dtype=dtype, device=DEV)
    dist.all_gather_into_tensor(out, x)
    c.same(key, out, torch.cat([make_input(key, r, dtype, n) for r in range(c.world)]))


def _reduce_scatter(c, dtype, op_name, n):
    op = reduce_op(op_name, c.world)
    gloo_op = R.SUM if op_name == "AVG" else (getattr(R, op_name) if op_name != "PREMUL_SUM" else None)

    def gloo_check(key, got, run):
        if gloo_op is None:
            return
        g = c.with_gloo(run)
        if g is not None:
            c.close(key, got, (g.double() / c.world).to(dtype) if op_name == "AVG" else g)

    key = f"reduce_scatter/{dname(dtype)}/{op_name}/{n}"
    xs = [make_input(f"{key}/{j}", c.rank, dtype, n) for j in range(c.world)]
    got = torch.empty(n, dtype=dtype, device=DEV)
    dist.reduce_scatter(got, [x.to(DEV, copy=True) for x in xs], op=op)
    ref = torch.empty(n, dtype=dtype)
    dist.reduce_scatter(ref, [x.clone() for x in xs], op=op)
    c.same(key + " vs smddp on CPU", got, ref)

    def run_list(device):
        out = torch.empty(n, dtype=dtype, device=device)
        dist.reduce_scatter(out, [x.to(device, copy=True) for x in xs], op=gloo_op, group=c.gloo)
        return out

    gloo_check(key, got, run_list)

    key = f"reduce_scatter_tensor/{dname(dtype)}/{op_name}/{n}"
    x = make_input(key, c.rank, dtype, c.world * n)
    got = torch.empty(n, dtype=dtype, device=DEV)
    dist.reduce_scatter_tensor(got, x.to(DEV, copy=True), op=op)
    ref = torch.empty(n, dtype=dtype)
    dist.reduce_scatter_tensor(ref, x.clone(), op=op)
    c.same(key + " vs smddp on CPU", got, ref)

    def run_tensor(device):
        out = torch.empty(n, dtype=dtype, device=device)
        dist.reduce_scatter_tensor(out, x.to(device, copy=True), op=gloo_op, group=c.gloo)
        return out

    gloo_check(key, got, run_tensor)


def _all_to_all(c, dtype, n):
    key = f"all_to_all_single/{dname(dtype)}/{n}"
    x = make_input(key, c.rank, dtype, c.world * n).to(DEV, copy=True)
    out = torch.empty(c.world * n, dtype=dtype, device=DEV)
    dist.all_to_all_single(out, x)
    expect = torch.cat([make_input(key, r, dtype, c.world * n)[c.rank * n:(c.rank + 1) * n]
                        for r in range(c.world)])
    c.same(key, out, expect)
    # uneven splits: rank r sends (r + j + 1) * n elements to rank j
    key = f"all_to_all_single_uneven/{dname(dtype)}/{n}"

    def splits(r):
        return [(r + j + 1) * n for j in range(c.world)]

    x = make_input(key, c.rank, dtype, sum(splits(c.rank))).to(DEV, copy=True)
    recv = [splits(r)[c.rank] for r in range(c.world)]
    out = torch.empty(sum(recv), dtype=dtype, device=DEV)
    dist.all_to_all_single(out, x, output_split_sizes=recv, input_split_sizes=splits(c.rank))
    parts = []
    for r in range(c.world):
        start = sum(splits(r)[:c.rank])
        parts.append(make_input(key, r, dtype, sum(splits(r)))[start:start + splits(r)[c.rank]])
    c.same(key, out, torch.cat(parts))


def _rooted(c, dtype, n):
    for root in range(c.world):
        key = f"gather/{dname(dtype)}/{n}/dst{root}"
        x = make_input(key, c.rank, dtype, n).to(DEV, copy=True)
        outs = [torch.empty(n, dtype=dtype, device=DEV) for _ in range(c.world)] if c.rank == root else None
        dist.gather(x, gather_list=outs, dst=root)
        if c.rank == root:
            for r in range(c.world):
                c.same(f"{key}/from{r}", outs[r], make_input(key, r, dtype, n))

        key = f"scatter/{dname(dtype)}/{n}/src{root}"
        out = torch.empty(n, dtype=dtype, device=DEV)
        ins = None
        if c.rank == root:
            ins = [make_input(f"{key}/{j}", root, dtype, n).to(DEV, copy=True) for j in range(c.world)]
        dist.scatter(out, scatter_list=ins, src=root)
        c.same(key, out, make_input(f"{key}/{c.rank}", root, dtype, n))

        ops = ["SUM", "MAX"] if dtype.is_floating_point else ["SUM", "BXOR"]
        for op_name in ops:
            key = f"reduce/{dname(dtype)}/{op_name}/{n}/dst{root}"
            x = make_input(key, c.rank, dtype, n)
            got = x.to(DEV, copy=True)
            dist.reduce(got, dst=root, op=getattr(R, op_name))
            ref = x.clone()
            dist.reduce(ref, dst=root, op=getattr(R, op_name))
            if c.rank == root:  # elsewhere the contents are unspecified
                c.same(key + " vs smddp on CPU", got, ref)


def _send_recv(c, dtype, n):
    for src in range(c.world):
        dst = (src + 1) % c.world
        if src == dst:
            continue
        key = f"send_recv/{dname(dtype)}/{n}/{src}to{dst}"
        if c.rank == src:
            dist.send(make_input(key, src, dtype, n).to(DEV, copy=True), dst=dst)
        elif c.rank == dst:
            t = torch.empty(n, dtype=dtype, device=DEV)
            dist.recv(t, src=src)
            c.same(key, t, make_input(key, src, dtype, n))
    # both directions at once through batch_isend_irecv
    key = f"batch_isend_irecv/{dname(dtype)}/{n}"
    nxt, prv = (c.rank + 1) % c.world, (c.rank - 1) % c.world
    t = torch.empty(n, dtype=dtype, device=DEV)
    ops = [dist.P2POp(dist.isend, make_input(key, c.rank, dtype, n).to(DEV, copy=True), nxt),
           dist.P2POp(dist.irecv, t, prv)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    c.same(key, t, make_input(key, prv, dtype, n))


def collectives(rank, world, gloo):
    c = Checks(rank, world, gloo)
    for dtype in DTYPES:
        for op_name in (FLOAT_OPS if dtype.is_floating_point else INT_OPS):
            for n in SIZES:
                c.case("all_reduce", (dname(dtype), op_name, n), lambda: _all_reduce(c, dtype, op_name, n))
            for n in MOVE_SIZES:
                c.case("reduce_scatter", (dname(dtype), op_name, n), lambda: _reduce_scatter(c, dtype, op_name, n))
        c.case("coalesced", dname(dtype), lambda: _coalesced(c, dtype))
        for n in MOVE_SIZES:
            c.case("broadcast", (dname(dtype), n), lambda: _broadcast(c, dtype, n))
            c.case("all_gather", (dname(dtype), n), lambda: _all_gather(c, dtype, n))
            c.case("all_to_all", (dname(dtype), n), lambda: _all_to_all(c, dtype, n))
            c.case("rooted", (dname(dtype), n), lambda: _rooted(c, dtype, n))
            c.case("send_recv", (dname(dtype), n), lambda: _send_recv(c, dtype, n))
    c.case("barrier", "", dist.barrier)
    sync()
    return {"failures": c.failures, "counts": dict(c.counts), "gloo_on": dict(c.gloo_on)}


# --------------------------------------------------------------------------
# streams
# --------------------------------------------------------------------------

def _cycles_per_ms():
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(1000)  # the first launch pays for loading the kernel
    start.record()
    torch.cuda._sleep(20_000_000)
    end.record()
    end.synchronize()
    return 20_000_000 / max(start.elapsed_time(end), 1e-3)


def streams(rank, world, gloo):
    c = Checks(rank, world, gloo)
    n = (1 << 20) + 7
    expected = float(sum(r + 1 for r in range(world)))
    cycles_per_ms = _cycles_per_ms()
    sleep_ms = 2000.0
    timings = {}

    def slow_then_reduce(stream_name, make_stream):
        x = torch.zeros(n, device=DEV)
        dist.all_reduce(x)  # warm: the staging path and its buffers exist
        torch.cuda.synchronize()
        dist.barrier(group=gloo)  # both ranks' slow kernels overlap
        slept = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(make_stream()):
            slept[0].record()
            torch.cuda._sleep(int(cycles_per_ms * sleep_ms))
            slept[1].record()
            x.fill_(rank + 1.0)  # queued behind the sleep: the input is written late
            t0 = time.perf_counter()
            work = dist.all_reduce(x, async_op=True)
            host_ms = (time.perf_counter() - t0) * 1000  # the submit alone
            work.wait()
            y = x * 2  # on the same current stream: must see the reduced values
        torch.cuda.synchronize()
        kernel_ms = slept[0].elapsed_time(slept[1])
        timings[stream_name] = {"host_ms": round(host_ms, 1), "kernel_ms": round(kernel_ms, 1)}
        if not torch.equal(y.cpu(), torch.full((n,), 2 * expected)):
            c.failures.append(f"rank {rank} {stream_name}: result misses the input written on the current "
                              f"stream (got {y[:3].tolist()}, expected {2 * expected})")
        # Behavioural, with a wide margin: the call never blocks at submit;
        # blocking until the kernel ended would take sleep_ms.
        if kernel_ms < sleep_ms / 4:
            c.failures.append(f"rank {rank} {stream_name}: the slow kernel took only {kernel_ms:.0f} ms "
                              f"(asked for {sleep_ms:.0f}): the check below would prove nothing")
        elif host_ms > kernel_ms / 2:
            c.failures.append(f"rank {rank} {stream_name}: dist.all_reduce(async_op=True) blocked the "
                              f"host {host_ms:.0f} ms behind a {kernel_ms:.0f} ms kernel")

    c.case("default_stream", "", lambda: slow_then_reduce("default_stream", torch.cuda.current_stream))
    side = torch.cuda.Stream(device=DEV)
    c.case("side_stream", "", lambda: slow_then_reduce("side_stream", lambda: side))

    def future_then():
        x = torch.zeros(n, device=DEV)
        torch.cuda._sleep(int(cycles_per_ms * 200))
        x.fill_(rank + 1.0)
        fut = dist.all_reduce(x, async_op=True).get_future()
        doubled = fut.then(lambda f: f.value()[0] * 2)
        out = doubled.wait()
        if not torch.equal(out.cpu(), torch.full((n,), 2 * expected)):
            c.failures.append(f"rank {rank} future.then: got {out[:3].tolist()}, expected {2 * expected}")

    c.case("future_then", "", future_then)

    def many_in_flight():
        # Several calls queued before any is waited for: each result lands
        # in its own tensor, in order.
        xs = [torch.full((4099,), float(rank * 10 + i), device=DEV) for i in range(8)]
        works = [dist.all_reduce(x, async_op=True) for x in xs]
        for w in works:
            w.wait()
        for i, x in enumerate(xs):
            want = float(sum(r * 10 + i for r in range(world)))
            if not torch.equal(x.cpu(), torch.full((4099,), want)):
                c.failures.append(f"rank {rank} in flight #{i}: got {x[:3].tolist()}, expected {want}")

    c.case("many_in_flight", "", many_in_flight)
    torch.cuda.synchronize()
    return {"failures": c.failures, "counts": dict(c.counts), "timings": timings,
            "cycles_per_ms": cycles_per_ms}


# --------------------------------------------------------------------------
# DDP and FSDP2
# --------------------------------------------------------------------------

STEPS = 12


def _mlp():
    return nn.Sequential(nn.Linear(24, 64), nn.ReLU(), nn.Linear(64, 37), nn.Tanh(), nn.Linear(37, 5))


def _batch(rank, step, device):
    g = torch.Generator().manual_seed(zlib.crc32(f"train#{rank}#{step}".encode()))
    x = torch.randn(16, 24, generator=g) * (1 + rank)
    y = torch.randn(16, 5, generator=g)
    return x.to(device, copy=True), y.to(device, copy=True)


def _compare_training(c, what, got, ref, init, tol):
    (params, losses), (ref_params, ref_losses) = got, ref
    moved = 0
    for name, b in ref_params.items():
        a = params[name]
        if a.shape != b.shape or not torch.allclose(a, b, rtol=tol, atol=tol):
            diff = (a - b).abs().max().item() if a.shape == b.shape else "shape"
            c.failures.append(f"rank {c.rank} {what} {name}: max |smddp - gloo| = {diff}")
        moved += not torch.allclose(b, init[name])
    if moved < len(ref_params):  # the oracle must have trained
        c.failures.append(f"rank {c.rank} {what}: only {moved}/{len(ref_params)} parameters moved")
    if not all(abs(x - y) <= 10 * tol * max(1.0, abs(y)) for x, y in zip(losses, ref_losses)):
        c.failures.append(f"rank {c.rank} {what}: losses differ {losses} vs {ref_losses}")


def _sgd_steps(model, rank, device):
    """STEPS steps of SGD with momentum on this rank's batches; the losses."""
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    losses = []
    for step in range(STEPS):
        x, y = _batch(rank, step, device)
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


def ddp(rank, world, gloo):
    from torch.nn.parallel import DistributedDataParallel as DDP

    c = Checks(rank, world, gloo)

    def train(group):
        torch.manual_seed(1000 + rank)  # different per rank: DDP must broadcast rank 0's
        model = _mlp().to(DEV)
        model = DDP(model, device_ids=[DEV.index] if DEV.type == "cuda" else None, process_group=group,
                    bucket_cap_mb=0.01)
        losses = _sgd_steps(model, rank, DEV)
        return {n: p.detach().cpu() for n, p in model.module.named_parameters()}, losses

    def run():
        torch.manual_seed(1000)
        init = {n: p.detach().clone() for n, p in _mlp().named_parameters()}  # rank 0's
        _compare_training(c, "ddp", train(dist.group.WORLD), train(gloo), init, 1e-5)

    c.case("ddp", "", run)
    return {"failures": c.failures, "counts": dict(c.counts)}


def fsdp(rank, world, gloo):
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    c = Checks(rank, world, gloo)

    def train(group, device):
        torch.manual_seed(0)
        model = _mlp().to(device)
        mesh = DeviceMesh.from_group(group, device_type=device.type)
        for layer in model:
            if isinstance(layer, nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        losses = _sgd_steps(model, rank, device)
        return {n: p.full_tensor().detach().cpu() for n, p in model.named_parameters()}, losses

    reference = {}

    def run():
        torch.manual_seed(0)
        init = {n: p.detach().clone() for n, p in _mlp().named_parameters()}
        got = train(dist.group.WORLD, DEV)
        try:
            ref, reference["on"], tol = train(gloo, DEV), f"gloo on {DEV.type}", 2e-5
        except (RuntimeError, ValueError) as e:
            # Gloo without CUDA all_gather_into_tensor/reduce_scatter_tensor:
            # the same training on the CPU (matmuls round differently there).
            ref, reference["on"], tol = train(gloo, torch.device("cpu")), f"gloo on cpu ({e})"[:200], 1e-4
        _compare_training(c, "fsdp2", got, ref, init, tol)

    c.case("fsdp2", "", run)
    return {"failures": c.failures, "counts": dict(c.counts), "reference": reference.get("on")}


def run_all(rank, world):
    from cases_gpu_defects import defects

    torch.cuda.set_device(DEV)
    gloo = dist.new_group(backend="gloo")
    out = {}
    for name, section in (("collectives", collectives), ("streams", streams), ("defects", defects),
                          ("ddp", ddp), ("fsdp", fsdp)):
        t0 = time.monotonic()
        out[name] = section(rank, world, gloo)
        out[name]["seconds"] = round(time.monotonic() - t0, 1)
        dist.barrier(group=gloo)
    return out
