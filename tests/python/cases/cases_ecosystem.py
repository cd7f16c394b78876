"""Child-side checks: the torch features users combine with a backend, each
run under the backend under test and under Gloo in the same job, from the
same seeds, and compared.

``ecosystem(rank, world)`` runs every check and returns
{"checks": [names], "failures": [...], "refused_by_torch_as_under_gloo":
[names]}; the last lists features that torch itself refuses on CPU with
the same error under Gloo (bf16_compress_hook wants CUDA). The oracle is always Gloo's result on
the same inputs (or a closed form, for object collectives):

* DDP communication hooks: fp16_compress_hook, bf16_compress_hook, PowerSGD
  (rank 1, compressing from step 2: its hook issues allreduces from inside
  future callbacks and waits for them);
* DDP with static_graph, find_unused_parameters (a branch used only on some
  steps), gradient_as_bucket_view, no_sync accumulation;
* Join with uneven inputs (rank r runs 4 + 2r steps);
* object collectives;
* functional collectives;
* DDP under torch.compile (the aot_eager backend: DDPOptimizer splits the
  graph at bucket boundaries; no C++ code generation, so it stays cheap).
"""

from __future__ import annotations

import time
import zlib

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

IN, OUT, BATCH = 16, 4, 8


class Branchy(nn.Module):
    """A model whose `extra` branch is used only on even steps."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(IN, 32)
        self.b = nn.Linear(32, OUT)
        self.extra = nn.Linear(32, 32)

    def forward(self, x, use_extra=True):
        h = torch.relu(self.a(x))
        if use_extra:
            h = h + torch.tanh(self.extra(h))
        return self.b(h)


def _model():
    torch.manual_seed(1234)  # the same on every rank and for both backends
    return Branchy()


def _batch(rank, step):
    g = torch.Generator().manual_seed(zlib.crc32(f"eco#{rank}#{step}".encode()))
    x = torch.randn(BATCH, IN, generator=g) * (1 + rank)
    y = torch.randn(BATCH, OUT, generator=g)
    return x, y


def _train(rank, group, steps, ddp_kwargs=None, hook=None, accumulate=1, branch=False,
           compile_model=False):
    model = _model()
    ddp = DDP(model, process_group=group, **(ddp_kwargs or {}))
    if hook is not None:
        state, fn = hook(group)
        ddp.register_comm_hook(state, fn)
    run = torch.compile(ddp, backend="aot_eager") if compile_model else ddp
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    losses = []
    for step in range(steps):
        for k in range(accumulate):
            x, y = _batch(rank, step * accumulate + k)
            kw = {"use_extra": step % 2 == 0} if branch else {}
            if k < accumulate - 1:
                with ddp.no_sync():
                    nn.functional.mse_loss(run(x, **kw), y).backward()
            else:
                loss = nn.functional.mse_loss(run(x, **kw), y)
                loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=not (ddp_kwargs or {}).get("gradient_as_bucket_view", False))
        losses.append(loss.item())
    return [p.detach().clone() for p in model.parameters()], losses


def _hooks():
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks as dh
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as ps

    return {
        "fp16_compress_hook": lambda g: (g, dh.fp16_compress_hook),
        "bf16_compress_hook": lambda g: (g, dh.bf16_compress_hook),
        "powerSGD_hook": lambda g: (
            ps.PowerSGDState(process_group=g, matrix_approximation_rank=1, start_powerSGD_iter=2,
                             random_seed=7),
            ps.powerSGD_hook),
    }


def _compare(name, mine, ref, failures, rtol=1e-4, atol=1e-5):
    (pm, lm), (pr, lr) = mine, ref
    for i, (a, b) in enumerate(zip(pm, pr)):
        if not torch.allclose(a, b, rtol=rtol, atol=atol):
            failures.append(f"{name}: parameter {i} differs from gloo "
                            f"(max abs diff {(a - b).abs().max().item():.3g})")
            return
    if not torch.allclose(torch.tensor(lm), torch.tensor(lr), rtol=rtol, atol=atol):
        failures.append(f"{name}: losses {lm} differ from gloo's {lr}")


def ecosystem(rank, world):
    torch.set_num_threads(1)
    gloo = dist.new_group(backend="gloo")
    failures, checks, refused = [], [], []

    def both(name, deadline_s=60.0, **kw):
        checks.append(name)
        t0 = time.monotonic()
        try:
            mine = _train(rank, None, **kw)
        except Exception as e:  # noqa: BLE001 - compared with what Gloo does
            # Some features are refused by torch itself on CPU (the bf16
            # hook wants CUDA): that is fine if Gloo gets the same refusal.
            try:
                _train(rank, gloo, **kw)
            except Exception as g:  # noqa: BLE001
                if type(g) is type(e) and str(g) == str(e):
                    refused.append(name)
                    return
            failures.append(f"{name}: raised {type(e).__name__}: {e} (gloo did not)")
            return
        took = time.monotonic() - t0
        ref = _train(rank, gloo, **kw)
        _compare(name, mine, ref, failures)
        if took > deadline_s:
            failures.append(f"{name}: took {took:.1f} s")

    # Communication hooks.
    for name, hook in _hooks().items():
        both(name, steps=5, hook=hook)
    # DDP options.
    both("static_graph", steps=4, ddp_kwargs=dict(static_graph=True))
    both("find_unused_parameters", steps=4, branch=True,
         ddp_kwargs=dict(find_unused_parameters=True))
    both("gradient_as_bucket_view+no_sync", steps=3, accumulate=2,
         ddp_kwargs=dict(gradient_as_bucket_view=True, bucket_cap_mb=0.001))
    # DDP under torch.compile.
    both("torch.compile(aot_eager)", steps=3, compile_model=True)

    # Join with uneven inputs: rank r has 4 + 2r batches. The ranks that run
    # out shadow the others' allreduces, so every rank ends with the same
    # parameters as under Gloo.
    from torch.distributed.algorithms.join import Join

    def joined(group):
        model = _model()
        ddp = DDP(model, process_group=group)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
        with Join([ddp]):
            for step in range(4 + 2 * rank):
                x, y = _batch(rank, step)
                nn.functional.mse_loss(ddp(x), y).backward()
                opt.step()
                opt.zero_grad()
        return [p.detach().clone() for p in model.parameters()], [0.0]

    checks.append("Join(uneven inputs)")
    try:
        _compare("Join(uneven inputs)", joined(None), joined(gloo), failures)
    except Exception as e:  # noqa: BLE001
        failures.append(f"Join(uneven inputs): raised {type(e).__name__}: {e}")

    # Object collectives, against closed forms.
    checks.append("object collectives")
    try:
        objs = [None] * world
        dist.all_gather_object(objs, {"rank": rank, "sq": [rank] * rank})
        if objs != [{"rank": r, "sq": [r] * r} for r in range(world)]:
            failures.append(f"all_gather_object: {objs}")
        lst = [f"from-{rank}", rank * 10] if rank == 0 else [None, None]
        dist.broadcast_object_list(lst, src=0)
        if lst != ["from-0", 0]:
            failures.append(f"broadcast_object_list: {lst}")
        out = [None]
        dist.scatter_object_list(out, [("item", r) for r in range(world)] if rank == 0 else None,
                                 src=0)
        if out != [("item", rank)]:
            failures.append(f"scatter_object_list: {out}")
        gathered = [None] * world if rank == 0 else None
        dist.gather_object({"r": rank}, gathered, dst=0)
        if rank == 0 and gathered != [{"r": r} for r in range(world)]:
            failures.append(f"gather_object: {gathered}")
    except Exception as e:  # noqa: BLE001
        failures.append(f"object collectives: raised {type(e).__name__}: {e}")

    # Functional collectives (the traceable API FSDP2 and compiled code use).
    checks.append("functional collectives")
    try:
        import torch.distributed._functional_collectives as funcol

        group = dist.group.WORLD
        x = torch.arange(6, dtype=torch.float32) + rank
        s = funcol.all_reduce(x, "sum", group)
        s = funcol.wait_tensor(s) if hasattr(funcol, "wait_tensor") else s
        want = torch.arange(6, dtype=torch.float32) * world + sum(range(world))
        if not torch.equal(s, want):
            failures.append(f"funcol.all_reduce: {s.tolist()} != {want.tolist()}")
        g = funcol.all_gather_tensor(torch.full((2,), float(rank)), 0, group)
        g = funcol.wait_tensor(g) if hasattr(funcol, "wait_tensor") else g
        want = torch.cat([torch.full((2,), float(r)) for r in range(world)])
        if not torch.equal(g, want):
            failures.append(f"funcol.all_gather_tensor: {g.tolist()} != {want.tolist()}")
        rs = funcol.reduce_scatter_tensor(torch.arange(2 * world, dtype=torch.float32), "sum", 0,
                                          group)
        rs = funcol.wait_tensor(rs) if hasattr(funcol, "wait_tensor") else rs
        want = torch.arange(2 * world, dtype=torch.float32)[2 * rank:2 * rank + 2] * world
        if not torch.equal(rs, want):
            failures.append(f"funcol.reduce_scatter_tensor: {rs.tolist()} != {want.tolist()}")
    except Exception as e:  # noqa: BLE001
        failures.append(f"functional collectives: raised {type(e).__name__}: {e}")

    dist.barrier(group=gloo)
    return {"checks": checks, "failures": failures, "refused_by_torch_as_under_gloo": refused}
