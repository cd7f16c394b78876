"""The collectives torch_smddp.bench times (--op), each with its buffers,
its closed form and its nccl-tests accounting.

Sizes are the nccl-tests ones: the buffer for all_reduce, the whole output
for all_gather, the whole input for reduce_scatter (so S / n per rank goes
in, or comes out). busbw = algbw x 2(n-1)/n for all_reduce and x (n-1)/n
for the other two: what each rank must move through the slowest link.

Rank r contributes r + 1 in every element. all_reduce and reduce_scatter
must leave n(n+1)/2 everywhere; all_gather must leave j + 1 in rank j's
part. Before every call, untimed, the input is refilled and a separate
output is poisoned (-1), so a call that writes nothing fails the check.

`copy` is not a collective: it is the floor a rank's own memory traffic
sets, run on every rank at once, so they share the memory bandwidth as
the collective's ranks do. all_gather must write its S-byte output
(copy: S bytes from a buffer that already holds the answer); reduce_scatter
must read S bytes and write S / n (a local sum of n pieces of S / n, each
(n+1)/2, so the sum is the closed form); all_reduce must read and write S.

`in_place` (all_gather only) is the form FSDP2 calls: the input is this
rank's part of the output (`all_gather_single(out, out[r*S/n:...])`),
so the rank's own part never moves and its floor copies the other n - 1
parts: (n-1)/n of S.
"""

from __future__ import annotations

OPS = ("all_reduce", "all_gather", "reduce_scatter")
# all_gather and reduce_scatter are timed through the entries FSDP2 calls:
# all_gather_single and reduce_scatter_single on torch 2.13, which
# deprecates all_gather_into_tensor and reduce_scatter_tensor (fsdp_entry).


def fsdp_entry(dist, name: str, before: str):
    """The entry FSDP2 calls on this torch: `name` (all_gather_single,
    reduce_scatter_single) where torch has it, else its older name, which
    such a torch deprecates with a warning on every call."""
    return getattr(dist, name, None) or getattr(dist, before)


def bus_factor(op: str, n: int) -> float:
    """busbw / algbw over n ranks (nccl-tests)."""
    if n <= 1:
        return 1.0
    return 2 * (n - 1) / n if op == "all_reduce" else (n - 1) / n


def link_share(op: str, hosts: int) -> float:
    """The share of S each host must send (and receive) through its link:
    2(H-1)/H for all_reduce; (H-1)/H for all_gather (the other hosts' parts
    come in) and reduce_scatter (host-reduced parts of the other hosts go
    out)."""
    if hosts < 2:
        return 0.0
    return 2 * (hosts - 1) / hosts if op == "all_reduce" else (hosts - 1) / hosts


def closed_form_sum(world: int) -> float:
    """What SUM over ranks leaves in every element when rank r holds r + 1."""
    return world * (world + 1) / 2


def first_mismatch(out, expected, i: int) -> str:
    """"" when `out` equals `expected` (a tensor, or a number for every
    element), else which element of iteration `i` is wrong and how."""
    import torch

    if isinstance(expected, float):
        # One read pass when the result is right (min and max both the
        # closed form; a NaN fails it); the element-wise search only when
        # it is not. At 4 x 2 eight ranks check on two vCPUs, and a rank
        # still checking takes CPU from ranks already in their next call.
        lo, hi = out.aminmax()
        if lo.item() == expected and hi.item() == expected:
            return ""
        bad = (out != expected).nonzero()
        want = lambda j: expected  # noqa: E731
    else:
        if torch.equal(out, expected):
            return ""
        bad = (out != expected).nonzero()
        want = lambda j: expected.view(-1)[j].item()  # noqa: E731
    if not bad.numel():
        return ""
    j = int(bad[0, 0]) if bad.dim() > 1 else int(bad[0])
    return (f"iteration {i}: element {j} of {out.numel()} is {out.view(-1)[j].item()!r}, "
            f"expected {want(j)!r} ({bad.shape[0]} elements differ)")


class OpBuffers:
    """One size of one op on one rank: its input, its output (the same
    tensor for all_reduce, which runs in place), and what the output must
    hold. `nbytes` is the op's size as nccl-tests counts it."""

    def __init__(self, op: str, nbytes: int, rank: int, world: int, in_place: bool = False,
                 empty=None):
        """`empty(numel, dtype)` makes the input and output (torch.empty by
        default; a backend's allocate_tensor for pooled buffers)."""
        import torch

        if empty is None:
            def empty(numel, dtype):
                return torch.empty(numel, dtype=dtype)

        if op not in OPS:
            raise ValueError(f"unknown op {op!r}; one of {', '.join(OPS)}")
        if in_place and op != "all_gather":
            raise ValueError(f"in_place is all_gather's form (FSDP2's), not {op}'s")
        self.op, self.rank, self.world, self.in_place = op, rank, world, in_place
        f32 = torch.float32
        if op == "all_reduce":
            numel = max(1, nbytes // 4)
            self.inp = self.out = empty(numel, f32)
            self.expected = closed_form_sum(world)
            self.nbytes = numel * 4
            return
        per = max(1, nbytes // 4 // world)
        self.nbytes = per * world * 4
        if op == "all_gather":
            self.out = empty(per * world, f32)
            self.inp = self.out.narrow(0, rank * per, per) if in_place else empty(per, f32)
            self.expected = torch.arange(1, world + 1, dtype=f32).repeat_interleave(per)
        else:
            self.inp = empty(per * world, f32)
            self.out = empty(per, f32)
            self.expected = closed_form_sum(world)

    def refill(self) -> None:
        if self.out is not self.inp:
            self.out.fill_(-1.0)
        self.inp.fill_(self.rank + 1.0)

    def problem(self, i: int) -> str:
        return first_mismatch(self.out, self.expected, i)

    def call(self, dist, group):
        """The collective itself, on `group`."""
        if self.op == "all_reduce":
            return lambda: dist.all_reduce(self.out, group=group)
        if self.op == "all_gather":
            gather = fsdp_entry(dist, "all_gather_single", "all_gather_into_tensor")
            return lambda: gather(self.out, self.inp, group=group)
        scatter = fsdp_entry(dist, "reduce_scatter_single", "reduce_scatter_tensor")
        return lambda: scatter(self.out, self.inp, group=group)

    def copy_floor(self):
        """The `copy` floor (module docstring): local memory traffic only,
        leaving exactly the closed form in the output."""
        import torch

        if self.op == "reduce_scatter":
            n, per = self.world, self.out.numel()
            src = torch.full((n, per), (n + 1) / 2, dtype=torch.float32)
            return lambda: torch.sum(src, 0, out=self.out)
        src = (self.expected.clone() if self.op == "all_gather"
               else torch.full_like(self.out, self.expected))
        if self.in_place:
            # The other parts only: before this rank's and after it.
            per = self.inp.numel()
            lo, hi = self.rank * per, (self.rank + 1) * per
            pieces = [(self.out[:lo], src[:lo]), (self.out[hi:], src[hi:])]
            return lambda: [o.copy_(s) for o, s in pieces if o.numel()]
        return lambda: self.out.copy_(src)


def timed_checked(call, bufs, iters: int, untimed: list | None = None) -> tuple[float, str]:
    """Runs ``call()`` ``iters`` times and returns (mean seconds per call,
    "" or the first mismatch). Only the call itself is inside the timed
    region: ``bufs.refill()`` before each call and ``bufs.problem(i)``
    after it run between calls. ``untimed``, if given, gets the mean
    seconds per iteration spent outside the calls: on a tbf-shaped link the
    bucket refills meanwhile (tools/smddp_model/ counts it)."""
    import time

    total = 0.0
    problem = ""
    start = time.perf_counter()
    for i in range(iters):
        bufs.refill()
        t0 = time.perf_counter()
        call()
        total += time.perf_counter() - t0
        if not problem:
            problem = bufs.problem(i)
    if untimed is not None:
        untimed.append((time.perf_counter() - start - total) / max(iters, 1))
    return total / max(iters, 1), problem


class InPlace:
    """An in-place allreduce's buffer `t` as OpBuffers: refilled with
    rank + 1, checked against one number."""

    def __init__(self, t, rank: int, expected: float):
        self.out, self.rank, self.expected = t, rank, expected

    def refill(self) -> None:
        self.out.fill_(self.rank + 1.0)

    def problem(self, i: int) -> str:
        return first_mismatch(self.out, self.expected, i)
def link_bound_seconds(nbytes: int, hosts: int, rate_bps: float, op: str = "all_reduce") -> float:
    """The least time `op` of `nbytes` can take across `hosts` hosts whose
    links carry `rate_bps` each way: for an allreduce every host must send
    (and receive) 2(H-1)/H of the buffer, which is the buffer itself for
    H = 2; for all_gather and reduce_scatter (H-1)/H (link_share)."""
    return link_share(op, hosts) * nbytes * 8 / rate_bps


