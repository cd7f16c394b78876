"""Rank functions of test_parallelism.py: the parallelism APIs users build on
c10d, on the backend under test. A 2x2 DeviceMesh (dp x tp), DTensor
redistribution, tensor parallel inside FSDP2, and distributed checkpoints
(DCP: save, async_save, load, and a world-4 checkpoint loaded at world 2).
The parent compares every loss and weight with the same job on Gloo."""


def _model(torch):
    nn = torch.nn
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 16))


def _parallelize(torch, model, mesh):
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    parallelize_module(model, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
    fully_shard(model, mesh=mesh["dp"])
    return model


def _full_state(model):
    from torch.distributed.tensor import DTensor

    return {k: (v.full_tensor() if isinstance(v, DTensor) else v).detach().clone()
            for k, v in model.state_dict().items()}


def _same(a, b):
    """Bit for bit: dtypes, shapes and every byte."""
    import torch

    return set(a) == set(b) and all(
        a[k].dtype == b[k].dtype and a[k].shape == b[k].shape
        and torch.equal(a[k].contiguous().view(torch.uint8), b[k].contiguous().view(torch.uint8)) for k in a)


def tp_fsdp(rank, world, ckpt_dir):
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    res = {}
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    torch.manual_seed(0)
    full = torch.randn(8, 6)
    d = distribute_tensor(full, mesh["tp"], [Shard(0)])
    res["redistribute"] = bool(torch.equal(d.redistribute(mesh["tp"], [Replicate()]).to_local(), full))
    d2 = distribute_tensor(full, mesh, [Shard(0), Shard(1)])
    res["redistribute_2d"] = bool(torch.equal(d2.full_tensor(), full))

    model = _parallelize(torch, _model(torch), mesh)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    dp = mesh["dp"].get_local_rank()
    for step in range(6):
        g = torch.Generator().manual_seed(100 + 10 * step + dp)
        x, y = torch.randn(4, 16, generator=g), torch.randn(4, 16, generator=g)
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    res["losses"] = losses
    state = _full_state(model)
    res["weights"] = {k: v.reshape(-1).tolist() for k, v in state.items()}

    # Distributed checkpoints round-trip bit for bit, sync and async.
    for how in ("sync", "async"):
        path = f"{ckpt_dir}/{how}"
        sd = {"model": model.state_dict()}
        if how == "sync":
            dcp.save(sd, checkpoint_id=path)
        else:
            dcp.async_save(sd, checkpoint_id=path).result()
        fresh = _parallelize(torch, _model(torch), mesh)
        for p in fresh.parameters():
            p.data.zero_()
        target = {"model": fresh.state_dict()}
        dcp.load(target, checkpoint_id=path)
        fresh.load_state_dict(target["model"])
        res[f"dcp_{how}"] = _same(_full_state(fresh), state)
    dist.barrier()
    return res


def load_at_world_2(rank, world, ckpt_dir, weights):
    """The world-4 checkpoint, loaded by a world-2 job on a (1, 2) mesh."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (1, 2), mesh_dim_names=("dp", "tp"))
    model = _parallelize(torch, _model(torch), mesh)
    target = {"model": model.state_dict()}
    dcp.load(target, checkpoint_id=f"{ckpt_dir}/sync")
    model.load_state_dict(target["model"])
    got = {k: v.reshape(-1).tolist() for k, v in _full_state(model).items()}
    return {"same": got == weights}


def backend_override(rank, world):
    """init_device_mesh(..., backend_override=...): the tp dimension on Gloo,
    dp on the default backend; both answer."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"), backend_override={"tp": "gloo"})
    out = {}
    for dim in ("dp", "tp"):
        g = mesh.get_group(dim)
        t = torch.full((5,), float(rank + 1))
        dist.all_reduce(t, group=g)
        ranks = dist.get_process_group_ranks(g)
        out[dim] = {"backend": str(dist.get_backend(g)), "ok": bool((t == sum(r + 1 for r in ranks)).all())}
    return out
