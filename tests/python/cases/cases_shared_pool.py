"""Child side: all-gather and reduce-scatter on tensors from the backend's
allocate_tensor (the process's shared pool, hostpath/shared_pool.h), called
from cases_host_collectives.run in its jobs (one host and the namespace
cluster).

Oracles: every rank regenerates every rank's inputs (cases_host_collectives'
closed forms, so the bits must match), and stats()["pool_read_bytes"]
counts exactly the bytes a one-host call read from its peers' pools, and
nothing for private tensors."""

import os

import torch
import torch.distributed as dist

import torch_smddp
from cases_host_collectives import Checker, closed_form_block, make

CPU = torch.device("cpu")
# Every peer's part is read from its pool, the last (4 MiB parts) too,
# which a rank of world 3 and up would otherwise receive through the rings;
# from world 3 it receives 8 MiB and more, written with streaming stores.
SHAPES = [(torch.float32, 1), (torch.float32, 4099), (torch.bfloat16, 65539),
          (torch.int32, 300007), (torch.float32, 1 << 18), (torch.float32, (1 << 20) + 5)]


def pooled_bytes():
    return torch_smddp.stats()["pool_read_bytes"]


def pooled(ck, rank, world, hosts):
    backend = dist.group.WORLD._get_backend(CPU)
    ck.check("smddp supports tensor allocation on the CPU", backend.supports_tensor_alloc(CPU))
    local = world // hosts
    for dtype, n in SHAPES:
        es = torch.empty(0, dtype=dtype).element_size()
        whole = torch.cat([make(f"pool{n}", r, dtype, n) for r in range(world)])
        # In place, as FSDP2 calls it: the output from the pool, the input
        # this rank's part of it.
        out = backend.allocate_tensor(n * world, dtype=dtype, device=CPU)
        ck.check(f"allocate_tensor gives {dtype} x {n * world}",
                 out.dtype == dtype and out.shape == (n * world,) and out.device == CPU, str(out.shape))
        out[rank * n:(rank + 1) * n].copy_(whole[rank * n:(rank + 1) * n])
        before = pooled_bytes()
        dist.all_gather_into_tensor(out, out[rank * n:(rank + 1) * n])
        read = pooled_bytes() - before
        ck.equal(f"pooled all_gather in place ({dtype}, {n})", out, whole)
        if hosts == 1:
            ck.check(f"pooled all_gather read its peers' pools ({dtype}, {n})",
                     read == (local - 1) * n * es, f"{read} bytes, want {(local - 1) * n * es}")
        else:
            ck.check(f"pooled all_gather read its peers' pools ({dtype}, {n})", read > 0, str(read))
        # Out of place: a pooled input, a private output.
        private = torch.empty(n * world, dtype=dtype)
        part = backend.allocate_tensor(n, dtype=dtype, device=CPU)
        part.copy_(whole[rank * n:(rank + 1) * n])
        dist.all_gather_into_tensor(private, part)
        ck.equal(f"pooled input, private output ({dtype}, {n})", private, whole)
        # Reduce-scatter: the input from the pool, as FSDP2 allocates it.
        rs_in = backend.allocate_tensor(n * world, dtype=dtype, device=CPU)
        rs_in.copy_(make(f"poolrs{n}", rank, dtype, n * world))
        rs_out = backend.allocate_tensor(n, dtype=dtype, device=CPU)
        before = pooled_bytes()
        dist.reduce_scatter_tensor(rs_out, rs_in)
        read = pooled_bytes() - before
        if hosts == 1:
            ck.check(f"pooled reduce_scatter read its peers' pools ({dtype}, {n})",
                     read == (local - 1) * n * es, f"{read} bytes, want {(local - 1) * n * es}")
        ck.equal(f"pooled reduce_scatter ({dtype}, {n})", rs_out,
                 closed_form_block(f"poolrs{n}", dtype, n, world, hosts, rank))
    # A private all-gather: each part is staged in its rank's pool
    # (stagePart) and read there.
    x = torch.full((4099,), float(rank))
    out = torch.empty(4099 * world)
    before = pooled_bytes()
    dist.all_gather_into_tensor(out, x)
    read = pooled_bytes() - before
    if hosts == 1:
        ck.check("a private all_gather's parts are staged in the pools", read == (local - 1) * 4099 * 4,
                 f"{read} bytes, want {(local - 1) * 4099 * 4}")
    else:
        ck.check("a private all_gather's parts are staged in the pools", read > 0, str(read))
    ck.equal("private all_gather after pooled ones", out,
             torch.cat([torch.full((4099,), float(q)) for q in range(world)]))
    # A private reduce-scatter: the blocks the peers read are staged in the
    # poster's pool first (stageForPeers), and read there: every peer's
    # block for this rank's owners on every host.
    rs_private = make("privrs", rank, torch.float32, 4099 * world)
    got = torch.empty(4099)
    before = pooled_bytes()
    dist.reduce_scatter_tensor(got, rs_private)
    read, want = pooled_bytes() - before, hosts * (local - 1) * 4099 * 4
    ck.check("a private reduce_scatter's blocks are staged in the pool", read == want,
             f"{read} bytes, want {want}")
    ck.equal("private reduce_scatter, staged", got,
             closed_form_block("privrs", torch.float32, 4099, world, hosts, rank))
    advised_huge(ck, hosts)
    # Freed pool memory is handed out again (the pool does not grow without end).
    a = backend.allocate_tensor(1 << 20, dtype=torch.uint8, device=CPU)
    where = a.data_ptr()
    del a
    b = backend.allocate_tensor(1 << 20, dtype=torch.uint8, device=CPU)
    ck.check("a released pool range is reused", b.data_ptr() == where)


def smaps():
    """This process's mappings (/proc/self/smaps), each as (lo, hi, perms,
    the header line, {field: first value}, VmFlags as a set)."""
    maps = []
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if "-" in head[0] and not head[0].endswith(":"):
                lo, hi = (int(x, 16) for x in head[0].split("-"))
                maps.append((lo, hi, head[1], line, {}, set()))
            elif head[0] == "VmFlags:":
                maps[-1][5].update(head[1:])
            elif len(head) > 1:
                maps[-1][4][head[0].rstrip(":")] = head[1]
    return maps


def pool_mappings():
    """Every mapping of a pool in this process, its own and its peers'
    (the memfd's name): [(perms, VmFlags, ShmemPmdMapped kB)]."""
    return [(perms, flags, int(fields.get("ShmemPmdMapped", 0)))
            for _, _, perms, line, fields, flags in smaps() if "memfd:smddp-pool" in line]


def thp_mode(name):
    """The selected mode of /sys/kernel/mm/transparent_hugepage/`name`
    ("" where the kernel has none)."""
    try:
        with open(f"/sys/kernel/mm/transparent_hugepage/{name}") as f:
            text = f.read()
    except OSError:
        return ""
    return text[text.index("[") + 1:text.index("]")] if "[" in text else ""


def shmem_huge_on_request():
    """Whether the kernel gives shared memory huge pages when asked
    (shmem_enabled "advise", or one that gives them anyway)."""
    return thp_mode("shmem_enabled") in ("always", "within_size", "advise", "force")


def advised_huge(ck, hosts):
    """The pool asks for huge pages, in this process's mapping and in its
    mappings of its peers' pools (VmFlags "hg"); where the kernel gives
    shared memory huge pages on request, the touched pool has them."""
    maps = pool_mappings()
    own = [m for m in maps if "w" in m[0]]
    ck.check("the pool is mapped once for writing", len(own) == 1, str(maps))
    if hosts == 1:
        ck.check("the peers' pools are mapped here", len(maps) > len(own), str(maps))
    ck.check("every pool mapping asks for huge pages (VmFlags hg)",
             all("hg" in m[1] for m in maps), str(maps))
    if shmem_huge_on_request() and own:
        ck.check("the pool lies on huge pages", own[0][2] > 0, str(maps))


def pool_ranges():
    """Where this process's pool is mapped (/proc/self/smaps, the memfd's
    name), independent of the library's own bookkeeping."""
    return [(lo, hi) for lo, hi, _, line, _, _ in smaps() if "memfd:smddp-pool" in line]


def limits(rank, world, pool_bytes):
    """Run with SMDDP_SHARED_POOL_BYTES=`pool_bytes`: a pool that is full,
    or none, hands out private tensors, and the collectives stay right."""
    ck = Checker(rank, world)
    check = ck.check
    cpu = torch.device("cpu")
    backend = dist.group.WORLD._get_backend(cpu)

    def pooled(t):
        return any(lo <= t.data_ptr() < hi for lo, hi in pool_ranges())

    check("supports_tensor_alloc follows the pool", backend.supports_tensor_alloc(cpu) == (pool_bytes > 0))
    n_small, n_big = (256 << 10) // 4, (2 << 20) // 4  # 256 KiB fits a 1 MiB pool, 2 MiB does not
    small = backend.allocate_tensor(n_small * world, dtype=torch.float32, device=cpu)
    big = backend.allocate_tensor(n_big * world, dtype=torch.float32, device=cpu)
    check("a tensor that fits is in the pool", pooled(small) == (pool_bytes > 0))
    check("a tensor past the pool's size is private", not pooled(big))
    for name, out, n in (("small", small, n_small), ("big", big, n_big)):
        out[rank * n:(rank + 1) * n].fill_(float(rank + 1))
        before = torch_smddp.stats()["pool_read_bytes"]
        dist.all_gather_into_tensor(out, out[rank * n:(rank + 1) * n])
        read = torch_smddp.stats()["pool_read_bytes"] - before
        want = torch.arange(1, world + 1, dtype=torch.float32).repeat_interleave(n)
        check(f"{name} all_gather", torch.equal(out, want))
        expect = (world - 1) * n * 4 if pooled(out) else 0
        check(f"{name} pool_read_bytes", read == expect, f"{read}, want {expect}")
    where = small.data_ptr()
    del small
    again = backend.allocate_tensor(n_small, dtype=torch.float32, device=cpu)
    if pool_bytes:  # (malloc may or may not hand back the same address)
        check("a released range is handed out again", again.data_ptr() == where and pooled(again))
    return {"cases": ck.cases, "failures": ck.failures}


def thp_possible():
    """Whether the kernel may give anonymous memory huge pages."""
    return thp_mode("enabled") not in ("", "never")


def anon_huge_kib(t):
    """AnonHugePages of the mapping that holds `t` (/proc/self/smaps)."""
    p = t.data_ptr()
    return next((int(fields.get("AnonHugePages", 0)) for lo, hi, _, _, fields, _ in smaps()
                 if lo <= p < hi), 0)


def huge_pages(rank, world, sizes):
    """Run with THP_MEM_ALLOC_ENABLE=1 (torch's allocator on huge pages):
    at two ranks a private all-gather part (or piece, past
    SMDDP_STAGE_BYTES) of 4 MiB and up that torch allocated is read where
    it lies (nothing of it read from a pool, so not staged); a smaller one,
    one torch did not allocate and every part at three ranks are staged
    (read from the poster's pool). "mixed": only rank 0's part is torch's,
    so each rank chooses for itself. `sizes`: float32 elements per part.
    Results against the closed form; the premise, that torch's tensors lie
    on huge pages, against /proc/self/smaps."""
    ck = Checker(rank, world)
    limit = int(os.environ.get("SMDDP_STAGE_BYTES", 64 << 20))
    for n in sizes:
        piece = min(n * 4, limit) if limit else n * 4
        want = torch.cat([make(f"huge{n}", r, torch.float32, n) for r in range(world)])
        for form in ("out of place", "in place", "not torch's", "mixed"):
            torchs = [form in ("out of place", "in place") or (form == "mixed" and r == 0)
                      for r in range(world)]
            reads_in_place = [world == 2 and thp_possible() and torchs[r] and piece >= 4 << 20
                              for r in range(world)]
            out = torch.empty(n * world)
            if form == "in place":
                inp = out[rank * n:(rank + 1) * n]
            elif torchs[rank]:
                inp = torch.empty(n)
            else:  # a storage torch did not allocate
                inp = torch.frombuffer(bytearray(n * 4), dtype=torch.float32)
            inp.copy_(make(f"huge{n}", rank, torch.float32, n))
            if reads_in_place[rank]:
                ck.check(f"{n * 4} B part ({form}) lies on huge pages", anon_huge_kib(inp) > 0)
            before = pooled_bytes()
            dist.all_gather_into_tensor(out, inp)
            read = pooled_bytes() - before
            ck.check(f"{n * 4} B part ({form}): all_gather_into_tensor", torch.equal(out, want))
            expect = sum(0 if reads_in_place[p] else n * 4 for p in range(world) if p != rank)
            ck.check(f"{n * 4} B part ({form}): read from pools", read == expect,
                     f"pool_read_bytes {read}, want {expect} (read in place: {reads_in_place})")
    return {"cases": ck.cases, "failures": ck.failures}
