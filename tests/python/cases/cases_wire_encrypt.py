"""Child-side cases for SMDDP_WIRE_ENCRYPT=1 on 2 pretend hosts x 2 ranks
(test_wire_encrypt.py): the collectives (on the shared-memory path and
on the network-only one) and point-to-point match Gloo or a closed form
of the same inputs, the counters say exactly the bytes that
crossed hosts, and every point-to-point message, were sealed and opened,
a group whose ranks disagree on the setting fails to form naming it, and
a forged frame claiming a rank of the receiver's own host is refused by a
receive from any rank."""

import os
import zlib

import torch
import torch.distributed as dist

import torch_smddp


def _input(key, r, n, dtype=torch.float32):
    # Small integers: every sum below is exact in f32 and bf16 (|sum| <= 64),
    # so any order of reduction gives the closed form's bytes.
    g = torch.Generator().manual_seed(zlib.crc32(f"{key}/{r}".encode()))
    return torch.randint(-16, 17, (n,), generator=g).to(dtype)


def _collectives(rank, world, gloo):
    bad = []
    for dtype, n in ((torch.float32, 1), (torch.float32, 100_003), (torch.float32, 1 << 20),
                     (torch.bfloat16, 100_003), (torch.bfloat16, 1 << 19)):
        key = f"ar-{dtype}-{n}"
        xs = [_input(key, r, n, dtype) for r in range(world)]
        t = xs[rank].clone()
        dist.all_reduce(t)
        if not torch.equal(t, torch.stack([x.double() for x in xs]).sum(0).to(dtype)):
            bad.append(key)
        if dtype == torch.float32 and n > 1:
            ref = xs[rank].clone()
            dist.all_reduce(ref, group=gloo)
            if not torch.equal(t, ref):
                bad.append(key + " vs gloo")
    for root in (1, 2):
        key = f"bcast-{root}"
        t = _input(key, rank, 300_007)
        dist.broadcast(t, src=root)
        if not torch.equal(t, _input(key, root, 300_007)):
            bad.append(key)
    outs = [torch.empty(50_001) for _ in range(world)]
    dist.all_gather(outs, _input("ag", rank, 50_001))
    if any(not torch.equal(o, _input("ag", r, 50_001)) for r, o in enumerate(outs)):
        bad.append("all_gather")
    return bad


def _network_only(rank, world):
    """A group made with SMDDP_SHM_ALLREDUCE=0: allreduce in rings of
    reduction servers over libfabric, reduce_scatter and all_to_all, every
    step between hosts sealed."""
    os.environ["SMDDP_SHM_ALLREDUCE"] = "0"
    try:
        g = dist.new_group(backend="smddp")
    finally:
        del os.environ["SMDDP_SHM_ALLREDUCE"]
    bad = []
    if torch_smddp.stats(g)["allreduce_path"] == "shared-memory":
        bad.append("network-only group took the shared-memory path")
    n = 1 << 20
    xs = [_input("net-ar", r, n) for r in range(world)]
    t = xs[rank].clone()
    dist.all_reduce(t, group=g)
    if not torch.equal(t, torch.stack(xs).sum(0)):
        bad.append("network-only all_reduce")
    xs = [_input("net-rs", r, 4 * 30_011) for r in range(world)]
    out = torch.empty(30_011)
    dist.reduce_scatter_tensor(out, xs[rank], group=g)
    if not torch.equal(out, torch.stack(xs).sum(0)[rank * 30_011:(rank + 1) * 30_011]):
        bad.append("network-only reduce_scatter")
    ins = [_input(f"a2a-{rank}-{d}", 0, 7_001 + d) for d in range(world)]
    outs = [torch.empty(7_001 + rank) for _ in range(world)]
    dist.all_to_all(outs, ins, group=g)
    if any(not torch.equal(o, _input(f"a2a-{s}-{rank}", 0, 7_001 + rank))
           for s, o in enumerate(outs)):
        bad.append("network-only all_to_all")
    sealed = torch_smddp.stats(g)["bytes_sealed"]
    if sealed == 0:
        bad.append("the network-only group sealed nothing")
    return bad


def _exchange_with(peer, rank, key, n):
    recv = torch.empty(n)
    ops = [dist.P2POp(dist.isend, _input(key, rank, n), peer),
           dist.P2POp(dist.irecv, recv, peer)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    return torch.equal(recv, _input(key, peer, n))


def _point_to_point(rank, world):
    """Returns (bad, counters): across hosts, then within the host (sealed
    too: point-to-point seals with every peer once the group seals), then
    any-source receives from both on rank 0."""
    bad, n = [], 200_003
    across, beside = (rank + 2) % world, rank ^ 1
    torch_smddp.reset_stats()
    if not _exchange_with(across, rank, "p2p-across", n):
        bad.append("p2p across hosts")
    st = torch_smddp.stats()
    counters = {"across": [st["bytes_sealed"], st["bytes_opened"]]}
    if not _exchange_with(beside, rank, "p2p-beside", n):
        bad.append("p2p within the host")
    st = torch_smddp.stats()
    counters["beside"] = [st["bytes_sealed"], st["bytes_opened"]]
    # Rank 0 receives from any rank: a frame from the other host (rank 2)
    # and one from its own (rank 1), both sealed.
    if rank in (1, 2):
        dist.send(_input("any", rank, 1001), dst=0, tag=10 + rank)
    elif rank == 0:
        for src in (2, 1):
            t = torch.empty(1001)
            got = dist.recv(t, tag=10 + src)
            if got != src or not torch.equal(t, _input("any", src, 1001)):
                bad.append(f"any-source from {src} (got {got})")
    dist.barrier()
    return bad, counters


def _disagreeing_group(rank):
    """A group formed while rank 3 has SMDDP_WIRE_ENCRYPT=0: every rank's
    formation fails, naming the setting."""
    os.environ["SMDDP_WIRE_ENCRYPT"] = "0" if rank == 3 else "1"
    try:
        g = dist.new_group(backend="smddp")
        t = torch.ones(4)
        dist.all_reduce(t, group=g)
        return f"formed, all_reduce gave {t.tolist()}"
    except Exception as e:  # noqa: BLE001 - the message is the result
        return f"{type(e).__name__}: {e}"
    finally:
        os.environ["SMDDP_WIRE_ENCRYPT"] = "1"


def _forged_any_source(intruder_bin):
    """Rank 0's receives from any rank, each offered one frame by a foreign
    libfabric process (tests/cpp/wire_intruder.cc) that holds the group's
    secret (anyone who reads the store does) and claims to be rank 1, on
    rank 0's host: once plain, as a frame within the host travelled before
    point-to-point sealed with every peer, and once in the sealed layout
    with a tag of zeros. Returns, per layout, what the receive did."""
    import subprocess

    import torch.distributed.distributed_c10d as c10d

    store = c10d._get_default_store()
    prefix = torch_smddp._backend_of().store_prefix
    name = store.get(f"cpu//{prefix}addr/0")
    secret = store.get(f"cpu//{prefix}secret").decode()
    out = {}
    for layout, tag in (("plain", 31), ("sealed", 32)):
        proc = subprocess.Popen([intruder_bin, "p2p", torch_smddp._backend_of().provider,
                                 name.hex(), secret, "1", str(tag), "1001",
                                 "1" if layout == "sealed" else "0"],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        try:
            t = torch.zeros(1001)
            try:
                got = dist.recv(t, tag=tag)
                out[layout] = f"accepted from rank {got}: {t[:3].tolist()}"
            except Exception as e:  # noqa: BLE001 - the message is the result
                out[layout] = f"{type(e).__name__}: {e}"
        finally:
            proc.stdin.close()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    return out


def encrypted_world(rank, world, intruder_bin=None):
    gloo = dist.new_group(backend="gloo")
    bad = _collectives(rank, world, gloo) + _network_only(rank, world)
    p2p_bad, counters = _point_to_point(rank, world)
    st = torch_smddp.stats()
    res = {"bad": bad + p2p_bad, "counters": counters,
           "provider": torch_smddp._backend_of().provider, "path": st["allreduce_path"],
           "disagreeing": _disagreeing_group(rank)}
    # Last: a refused point-to-point frame may leave the default group
    # unusable, and no rank calls into it after this. The others wait in
    # Gloo meanwhile: a rank that left would fail rank 0's receive first.
    if rank == 0 and intruder_bin:
        res["forged"] = _forged_any_source(intruder_bin)
    dist.barrier(group=gloo)
    return res


def _tamper_group(encrypt):
    os.environ["SMDDP_WIRE_ENCRYPT"] = "1" if encrypt else "0"
    try:
        return dist.new_group(backend="smddp")
    finally:
        os.environ["SMDDP_WIRE_ENCRYPT"] = "1"


def _tampered_call(rank, sender, arm, fn):
    """Runs fn() on every rank, `sender` having armed its one-byte rewrite
    (tests/cpp/wire_tamper_preload.cc) just before; returns what fn gave
    or raised, and whether the rewrite went out (the arm was taken)."""
    if rank == sender:
        open(arm, "w").close()
    try:
        out = fn()
    except Exception as e:  # noqa: BLE001 - the message is the result
        out = f"{type(e).__name__}: {e}"
    taken = not os.path.exists(arm) if rank == sender else None
    if rank == sender and not taken:
        os.unlink(arm)
    return out, taken


def tampered_wire(rank, world, arm_dir):
    """World 2 on 2 pretend hosts, each rank's sends passing through a
    one-byte rewrite it arms at will (an on-path attacker). Each case in a
    group of its own, since a failed call leaves its group unusable; the
    sender takes turns, so both directions are tried. Returns per case and
    rank what the call gave: the count of elements that differ from the
    closed form, or the error's text."""
    gloo = dist.new_group(backend="gloo")
    arm = os.path.join(arm_dir, f"arm{rank}")
    n = 1 << 20
    out = {}
    for sender in (0, 1):
        peer = 1 - sender
        sent = _input(f"tamper-{sender}", sender, n)
        # p2p, encryption off: the control, which shows the rewrite lands
        # in the payload (and goes unseen: the peer wire's data frames
        # carry no MAC without SMDDP_WIRE_ENCRYPT).
        for encrypt in (False, True):
            g = _tamper_group(encrypt)

            def p2p():
                if rank == sender:
                    dist.send(sent.clone(), dst=peer, group=g)
                    return "sent"
                t = torch.empty(n)
                dist.recv(t, src=sender, group=g)
                return int((t != sent).sum())

            out[f"p2p from {sender}, encrypt={int(encrypt)}"] = _tampered_call(rank, sender, arm, p2p)
            dist.barrier(group=gloo)
        # allreduce, encryption on: every rank's call fails.
        g = _tamper_group(True)
        xs = [_input(f"tamper-ar-{sender}", r, n) for r in range(world)]

        def allreduce():
            t = xs[rank].clone()
            dist.all_reduce(t, group=g)
            return int((t != torch.stack(xs).sum(0)).sum())

        out[f"allreduce armed on {sender}"] = _tampered_call(rank, sender, arm, allreduce)
        dist.barrier(group=gloo)
    return out
