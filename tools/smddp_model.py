"""An alpha-beta model of smddp's allreduce paths and of a ring, fitted to
cluster measurements and projected past this machine. From the repository
root (development tooling, not part of the installed package):

    python -m tools.smddp_model fit F.json [F.json ...] [--out params.json]
    python -m tools.smddp_model project --params params.json [--plot out.png]
                                        [--backward-ms 300] [--bucket-mb 25]
                                        [--mem-gbs G] [--pcie-gbs G] [--p P]
    python -m tools.smddp_model predict --params P --hosts H --ranks R --like F.json --out O.json
    python -m tools.smddp_model check O.json F.json
    python -m tools.smddp_model step --params P STEP.json [...]   (ddp_step.py --paired --save)

F.json is what ``python -m torch_smddp.bench --hosts H --ranks R --rate RATE
--save F.json`` writes ({"world", "rows": [{"bytes", "smddp", "gloo"}],
"hosts", "ranks_per_host", "rate_bps"}); a local run's list of such dicts
(no "hosts") is read as one host of ``world`` ranks. S is the buffer in
bytes, H hosts of R ranks (N = H*R), L the host link rate in bytes/s.

smddp, hierarchical (docs/design.md, "The allreduce path"):
    host(S, R) = a_host + S*(R+1)/B_mem   shared memory: every rank writes its
                  parts into the servers' slots, the servers combine R parts,
                  every rank copies the result out; the memory traffic of the
                  host grows with R, B_mem is the host's effective bandwidth
    net(S, H)  = 2(H-1)*a_net + max(X/(eta*L), X/B_net), X = 2(H-1)/H * S
                  the servers of one index on every host: reduce-scatter +
                  all-gather, H-1 messages each way per server, X on the
                  link; B_net is what the CPU can push through the network
                  stack (kernel TCP copies) when that, not the link, limits
    t          = max(host, net) + p*min(host, net)   steps pipeline through
                  the segment; p (0..1) is the part that does not overlap
    H = 1: t = host.
    Model v2 (fit --a-step) adds a fixed latency per call: the network
    latency is 2(a_step + (H-1) a_net), not 2(H-1) a_net.
    Compression between hosts (SMDDP_CROSS_HOST_DTYPE=bf16|fp16): wire = 0.5
    of the bytes cross, so X becomes wire*X in the link and B_net terms, and
    the host part gains the pack of the host's partial and the unpack of
    the result, read S and write wire*S and back: 2(1+wire)S bytes over
    B_mem. No new parameter: the bf16 points are never fitted.
    A tbf-shaped link (the namespace cluster) lets a burst through above its
    rate after it idled: the bench records the time each call's ranks spent
    between calls (filling and checking the tensor), during which the bucket
    refills, up to its size (bench --save's burst_bytes). With I = min(that
    time, burst/L), a link term X/(eta*L) becomes max(0, X/(eta*L) - I): over
    a run of calls the link still carries no more than L per second. I = 0
    for real links and in the projection.
    On the namespace cluster all N ranks share this machine's C cores
    (fit --cores), so every term that is CPU work (host(), a_net, X/B_net)
    is multiplied by share = max(1, N/C): a message waits for a core as a
    copy does. The projection gives each rank a core (share = 1) and no
    X/B_net (EFA's provider bypasses the kernel: B_net = inf).
smddp network-only (SMDDP_SHM_ALLREDUCE=0: every rank a server over the
network): net = 2(N-1)*a_net + 2R(H-1)/H * S/(eta*L) (the R ranks of a host
share its link), host() as above (the same bytes cross the host's memory).
smddp + k server hosts (BytePS-style push/pull of the host partial): a
worker link carries S each way, a server link H*S/k each way:
    net = 2*a_net + max(S, H*S/k)/(eta*L), combined with host() as above.
Ring (Gloo, NCCL ring): 2(N-1) steps of S/N, ranks ordered by host so each
host link carries 2(N-1)/N*S each way:
    cpu  = 2(N-1) * (share*(a_ring + (S/N)/B_ring) + a_wait)
            a_ring and B_ring (a step's local copy+reduce+syscall bandwidth)
            are CPU work, times share as above; a_wait is the part of a
            step's latency that waits in the kernel (Gloo blocks in recv)
            and needs no core: on the cluster Gloo's small calls take
            1.1-1.4 ms per step at 2 x 1 and 4 x 2 alike (0 in the projection)
    link = 2(N-1) * (S/N)/(eta_ring*L)        (only when H > 1)
    t    = max(cpu, link) + p_ring*min(cpu, link): p_ring = 1 is a ring that
           never overlaps a step's latency with the link (the projection's);
           below 1, other ranks' steps go on while one waits.
    N = 2, one host, B_ring = B: t = 2*(a_ring + S/2/B).

The fit minimises a robust (soft-L1, scale 10%) loss of the log ratio
model/measured over all points (relative error, every size weighs the same;
an outlier weighs like |r| instead of r^2), parameters positive (fitted
as logs; p as a logistic), by Levenberg-Marquardt with a numeric Jacobian.
smddp's six parameters come from the "smddp" columns, the ring's five
from the "gloo" columns. `fit` prints a table per shape and the verdict
(every point of 1 MiB and up within --tol, 20%) and exits 1 when it fails;
a multi-host sweep's "smddp-bf16" column is priced there too (bf16
crossing, never fitted), and counts in the verdict.

`project` keeps the fitted host part (a_host, p or --p, B_mem or --mem-gbs) and
puts EFA in place of the measured links (EFA_SOURCES: 100 and 400 Gbit/s,
efficiency 0.61, a per-message latency of 20 us that is an assumption),
8 GPUs per host, up to 32 hosts; busbw = algbw * 2(n-1)/n. "DDP step
overhead" is the allreduce time left after the backward pass when 25 MB
buckets of a 1.3 B-parameter fp16 model become ready evenly through it.
It also prints, for f32 gradients, the step with the allreduce behind
backward for smddp f32, bf16 crossing, a ring and a ring under DDP's bf16
hook (a ring of S/2 bytes), and with --pcie-gbs the GPU path's staging
(S/pcie per GPU in the host part). Every figure it prints is a projection.

The DDP step (`step`, ddp_step_time): DDP's buckets (the first 1 MiB, then
25 MB) become ready as backward makes their bytes (backward = 2/3 of the
compute), each allreduced one at a time as the model prices it; where each
rank has cores to spare, step = compute + the tail after backward. Where
compute keeps every core busy (this VM), the allreduce's CPU comes out of
the same cores: step = max(that, (CPU s of compute + CPU s of the
allreduce alone) / cores), the CPU seconds being the run's measured ones.

This module needs numpy (matplotlib for --plot), not torch.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

import numpy as np

from tools.smddp_cluster import parse_rate

MIB = 1 << 20
# The columns of a bench --save sweep that the model prices (VARIANTS below).
COLUMNS = ("smddp", "gloo", "smddp-bf16")

# EFA figures for the projection (public sources, also printed):
EFA_SOURCES = {
    "p4d 400 Gbit/s EFA":
        "https://aws.amazon.com/blogs/compute/amazon-ec2-p4d-instances-deep-dive/",
    "p3dn/c5n 100 Gbit/s EFA": "https://pcluster-cmaq.readthedocs.io/en/latest/user_guide_pcluster/"
                               "help/ena-cmaq-cluster.html",
    "2 x p4d nccl-tests 1 GiB allreduce: algbw 30.5 GB/s (link carries S each way: "
    "30.5/50 = 0.61 of 400 Gbit/s); 1 x p4d (NVLink only): busbw 230.8 GB/s":
        "https://github.com/NVIDIA/nccl/issues/527",
}
EFA_LINKS_GBIT = (100, 400)
EFA_ETA = 0.61            # achieved / nominal, nccl#527 above (2 hosts, 1 GiB)
NVLINK_BUSBW = 230.8e9    # a ring step inside a p4d host (nccl#527, 1 host, 1 GiB)
EFA_ALPHA = 20e-6         # per network message: an ASSUMPTION (order of EFA's
                          # published MPI small-message latencies), not a cited figure


# ---------------------------------------------------------------- the model
def _combine(host, net, p):
    return np.maximum(host, net) + p * np.minimum(host, net)


def smddp_host(S, R, a_host, B_mem, share=1.0, wire=1.0):
    """The host part; with a narrow wire (wire < 1: bf16/fp16 crossing is
    0.5) also the pack of the host's partial and the unpack of the result,
    read S and write wire*S, then the reverse: 2(1+wire)S more bytes."""
    pack = np.where(np.asarray(wire) < 1.0, 2 * (1 + np.asarray(wire)) * S, 0.0)
    return share * (a_host + (S * (R + 1) + pack) / B_mem)


def link_time(X, eta, L, idle=0.0):
    """X bytes through a link of L B/s at efficiency eta, less what a tbf
    bucket refilled during `idle` seconds lets through (see above)."""
    return np.maximum(0.0, X / (eta * L) - idle)


def net_bytes_time(X, eta, L, B_net, share, idle=0.0):
    """X bytes across a host's link: the link's time, or the CPU's (X/B_net,
    times share) where it pushes them through the network stack slower."""
    return np.maximum(link_time(X, eta, L, idle), share * X / B_net)


def smddp_time(S, H, R, L, a_host, B_mem, a_net, eta, p, B_net=math.inf, share=1.0, idle=0.0,
               a_step=0.0, wire=1.0):
    """Hierarchical smddp allreduce of S bytes on H hosts x R ranks, links of L B/s.
    wire: bytes crossing hosts per byte of S (0.5 with bf16/fp16 crossing).
    a_step: a fixed network latency per call, on top of a_net per message."""
    S, H, R, L = (np.asarray(v, dtype=float) for v in (S, H, R, L))
    wire = np.where(H > 1, wire, 1.0)    # one host: nothing crosses, nothing narrows
    host = smddp_host(S, R, a_host, B_mem, share, wire)
    Ls = np.where(H > 1, L, 1.0)
    X = 2 * (H - 1) / H * S * wire
    net = np.where(H > 1, share * 2 * (a_step + (H - 1) * a_net)
                   + net_bytes_time(X, eta, Ls, B_net, share, idle), 0.0)
    return _combine(host, net, p)


def smddp_netonly_time(S, H, R, L, a_host, B_mem, a_net, eta, p, B_net=math.inf, share=1.0):
    """Every rank a reduction server over the network; R ranks share a host link."""
    N = H * R
    host = smddp_host(S, R, a_host, B_mem, share)
    X = 2 * R * (H - 1) / H * S
    net = 2 * (N - 1) * a_net * share + net_bytes_time(X, eta, L, B_net, share) if N > 1 else 0.0
    return _combine(host, net, p)


def server_share(H, k):
    """The standalone servers' share of each step when links are of one
    speed (server_wire.h, serverShareMillionths with SMDDP_SERVER_SHARE
    unset): the balance of a worker's and a server's bytes, capped at 1
    (0 on one host: nothing crosses)."""
    if H < 2 or k < 1:
        return 0.0
    return min(1.0, 2 * k * (H - 1) / (H * H + (H - 2) * k))


def smddp_servers_time(S, H, R, L, k, a_host, B_mem, a_net, eta, p, B_net=math.inf, share=1.0,
                       f=None, wire=1.0):
    """smddp with k standalone server hosts taking the share f of each step
    (default server_share(H, k)), the hosts' own servers the rest: host
    pieces of a = (1-f)S/H and server pieces of b = fS/k. A worker host's
    link carries S + (H-2)a each way, a server's Hb (the busier one
    bounds); wire < 1 for bf16/fp16 crossing, the servers' pieces too."""
    f = server_share(H, k) if f is None else f
    host = smddp_host(S, R, a_host, B_mem, share, wire if H > 1 else 1.0)
    X = max(S * (1 + (H - 2) * (1 - f) / H), H * f * S / k) * wire
    net = 2 * a_net * share + net_bytes_time(X, eta, L, B_net, share) if H > 1 else 0.0
    return _combine(host, net, p)


def ring_time(S, N, H, L, a_ring, eta_ring, B_ring=math.inf, p_ring=1.0, share=1.0, idle=0.0,
              a_wait=0.0):
    """Ring allreduce over N ranks on H hosts: 2(N-1) steps of S/N bytes."""
    S, N, H, L = (np.asarray(v, dtype=float) for v in (S, N, H, L))
    chunk = S / N
    Ls = np.where(H > 1, L, 1.0)
    link = np.where(H > 1, link_time(2 * (N - 1) * chunk, eta_ring, Ls, idle), 0.0)
    lat = 2 * (N - 1) * (share * (a_ring + chunk / B_ring) + a_wait)
    return _combine(lat, link, p_ring)


def busbw(S, N, t):
    """nccl-tests bus bandwidth of an allreduce: algbw * 2(n-1)/n, bytes/s."""
    return S / t * 2 * (N - 1) / N


# ---------------------------------------------------------------- the data
def load(paths, cores=math.inf):
    """Points from bench JSON files: dicts with S, H, R, N, L, share, smddp, gloo
    (share = max(1, N/cores): the N ranks of a namespace cluster share the
    machine's cores) and idle_smddp, idle_gloo (the tbf refill, seconds;
    0 where the file has no burst_bytes or no time between calls)."""
    pts = []
    for path in paths:
        with open(path) as f:
            data = json.load(f)
        for d in data if isinstance(data, list) else [data]:
            H = int(d.get("hosts", 1))
            R = int(d.get("ranks_per_host", d["world"] // H))
            L = float(d.get("rate_bps") or 0) / 8
            burst_s = float(d.get("burst_bytes") or 0) / L if L > 0 else 0.0
            for row in d["rows"]:
                pts.append(dict(S=row["bytes"], H=H, R=R, N=H * R, L=L,
                                share=max(1.0, H * R / cores),
                                tbf=bool(d.get("burst_bytes")),
                                **{c: row.get(c) for c in COLUMNS},
                                **{f"idle_{c}": min(burst_s, float(row.get(f"{c}_between") or 0))
                                   for c in COLUMNS}))
    return pts


# ---------------------------------------------------------------- the fit
def levenberg_marquardt(resid, x0, iters=300):
    x = np.array(x0, dtype=float)
    r = resid(x)
    cost, lam = r @ r, 1e-3
    for _ in range(iters):
        J = np.empty((r.size, x.size))
        for j in range(x.size):
            dx = np.zeros_like(x)
            dx[j] = 1e-6
            J[:, j] = (resid(x + dx) - r) / 1e-6
        A, g = J.T @ J, J.T @ r
        while True:
            step = np.linalg.solve(A + lam * (np.diag(np.diag(A)) + 1e-9 * np.eye(x.size)), -g)
            rn = resid(x + step)
            cn = rn @ rn
            if np.isfinite(cn) and cn < cost:
                improved = cost - cn
                x, r, cost, lam = x + step, rn, cn, max(lam / 3, 1e-12)
                break
            lam *= 4
            if lam > 1e12:
                return x, cost
        if improved < 1e-12 * max(cost, 1e-30):
            break
    return x, cost


ROBUST = 0.10   # residuals (log ratio) past ~10% weigh like |r|, not r^2


def _robust(r):
    """Soft-L1 residuals: sum of squares = sum 2c^2(sqrt(1+(r/c)^2)-1), so a
    measurement caught in an episode (docs/notes/2026-11-one-host-allreduce.md) cannot drag the fit."""
    c = ROBUST
    return np.sign(r) * c * np.sqrt(2 * (np.sqrt(1 + (r / c) ** 2) - 1))


def _exp(z):
    return float(np.exp(np.clip(z, -60, 60)))


def _smddp_params(x):
    d = dict(a_host=_exp(x[0]), B_mem=_exp(x[1]), a_net=_exp(x[2]),
             eta=_exp(x[3]), p=1 / (1 + _exp(-x[4])), B_net=_exp(x[5]))
    if len(x) > 6:
        d["a_step"] = _exp(x[6])
    return d


def _ring_params(x):
    return dict(a_ring=_exp(x[0]), eta_ring=_exp(x[1]), B_ring=_exp(x[2]),
                p_ring=1 / (1 + _exp(-x[3])), a_wait=_exp(x[4]))


def _arrays(pts, col):
    use = [q for q in pts if q.get(col)]
    a = {k: np.array([q[k] for q in use], dtype=float)
         for k in ("S", "H", "R", "N", "L", "share")}
    a["idle"] = np.array([q.get(f"idle_{col}", 0.0) for q in use], dtype=float)
    return a, np.array([q[col] for q in use], dtype=float)


def fit_smddp(pts, a_step=False):
    """smddp's parameters; with a_step, the network latency per call is
    2(a_step + (H-1) a_net) rather than 2(H-1) a_net (model v2)."""
    a, y = _arrays(pts, "smddp")

    def resid(x):
        return _robust(np.log(smddp_time(a["S"], a["H"], a["R"], a["L"], **_smddp_params(x),
                                         share=a["share"], idle=a["idle"]) / y))

    starts = [[math.log(v) for v in (a0, bm, an, e)] + [pz, math.log(bn)]
              + ([math.log(st)] if a_step else [])
              for a0 in (1e-5, 1e-3) for bm in (1e9, 1e10) for an in (1e-4, 1e-3)
              for e in (0.5, 1.0) for pz in (-2.0, 1.0) for bn in (1e8, 1e10)
              for st in ((1e-4, 1e-3) if a_step else (None,))]
    best = min((levenberg_marquardt(resid, s) for s in starts), key=lambda t: t[1])
    return _smddp_params(best[0])


def fit_ring(pts):
    a, y = _arrays(pts, "gloo")

    def resid(x):
        return _robust(np.log(ring_time(a["S"], a["N"], a["H"], a["L"], **_ring_params(x),
                                        share=a["share"], idle=a["idle"]) / y))

    starts = [[math.log(v) for v in (ar, e, br)] + [pz, math.log(aw)]
              for ar in (1e-5, 1e-3) for e in (0.3, 1.0) for br in (1e8, 1e10)
              for pz in (-2.0, 1.0) for aw in (1e-6, 1e-3)]
    best = min((levenberg_marquardt(resid, s) for s in starts), key=lambda t: t[1])
    return _ring_params(best[0])


# Every variant the model prices, by the names bench (columns), ddp_step.py
# (DDP variants) and the projection give them: its path, and the bytes of
# the f32 buffer that its wire carries (0.5: bf16 crossing hosts for smddp;
# for a ring under DDP's bf16 hook, every step of the ring).
VARIANTS = {
    "smddp": ("smddp", 1.0), "smddp-bf16": ("smddp", 0.5), "smddp bf16": ("smddp", 0.5),
    "gloo": ("ring", 1.0), "ring": ("ring", 1.0),
    "gloo bf16 hook": ("ring", 0.5), "ring bf16 hook": ("ring", 0.5),
}


def variant_time(name, S, H, R, L, smddp, ring, share=1.0, idle=0.0):
    """Seconds for an allreduce of S f32 bytes by variant `name` (VARIANTS)."""
    path, wire = VARIANTS[name]
    if path == "smddp":
        return float(smddp_time(S, H, R, L, **smddp, share=share, idle=idle, wire=wire))
    return float(ring_time(S * wire, H * R, H, L, **ring, share=share, idle=idle))


def model_for(col, q, params):
    return variant_time(col, q["S"], q["H"], q["R"], q["L"], params["smddp"], params["ring"],
                        share=q["share"], idle=q.get(f"idle_{col}", 0.0))


def fmt_bytes(n):
    for unit, m in (("G", 1 << 30), ("M", MIB), ("K", 1 << 10)):
        if n >= m:
            return f"{n / m:g}{unit}"
    return str(int(n))


def report(pts, params, out=sys.stdout, tol=0.20):
    """The per-shape table (measured vs modelled) and the verdict; True if every
    point of 1 MiB and up agrees within `tol`."""
    ok, worst, bad = True, 0.0, []
    shapes = sorted({(q["H"], q["R"], q["L"]) for q in pts})
    for H, R, L in shapes:
        rate = f"{L * 8 / 1e9:g} Gbit/s" if H > 1 else "shared memory only"
        at = f"{H}x{R}" + (f" {L * 8 / 1e9:g}gbit" if H > 1 else "")   # names a miss
        print(f"\n# {H} host(s) x {R} rank(s), {rate}", file=out)
        these = [q for q in pts if (q["H"], q["R"], q["L"]) == (H, R, L)]
        # bf16 crossing only where something crosses hosts
        cols = [c for c in COLUMNS if c != "smddp-bf16" or (H > 1 and any(q.get(c) for q in these))]
        print(f"{'size':>6} " + " ".join(f"{c + ' ms':>9} {'model':>9} {'err':>7}" for c in cols),
              file=out)
        for q in sorted(these, key=lambda q: q["S"]):
            cells = []
            for col in cols:
                if not q.get(col):
                    cells.append(f"{'-':>9} {'-':>9} {'-':>7}")
                    continue
                m = model_for(col, q, params)
                err = (m - q[col]) / q[col]
                if q["S"] >= MIB:
                    worst = max(worst, abs(err))
                    ok &= abs(err) <= tol
                    if abs(err) > tol:
                        bad.append(f"{col} {at} {fmt_bytes(q['S'])} {err:+.0%}")
                cells.append(f"{q[col] * 1e3:9.3f} {m * 1e3:9.3f} {err * 100:+6.1f}%")
            print(f"{fmt_bytes(q['S']):>6} " + " ".join(cells), file=out)
    verdict = "AGREES" if ok else "DOES NOT AGREE"
    print(f"\nverdict: the model {verdict} with every measurement >= 1 MiB within "
          f"{tol:.0%} (worst {worst:.1%})", file=out)
    if bad:
        print("outside: " + ", ".join(bad), file=out)
    return ok


def print_params(params, out=sys.stdout, pts=()):
    s, r = params["smddp"], params["ring"]
    if pts and not any(q["H"] > 1 for q in pts):
        print("note: no multi-host measurements: a_net, eta, p and eta_ring are not "
              "constrained (their start values)", file=out)
    def gbs(b):   # a bandwidth the fit pushed past anything measurable: no cost left to it
        return "unbounded" if b > 1e15 else f"{b / 1e9:.2f} GB/s"

    print(f"smddp: a_host {s['a_host'] * 1e6:.1f} us, B_mem {gbs(s['B_mem'])}, a_net "
          f"{s['a_net'] * 1e6:.1f} us, a_step {s.get('a_step', 0.0) * 1e6:.1f} us, "
          f"eta {s['eta']:.3f}, p {s['p']:.3f}, B_net {gbs(s.get('B_net', math.inf))}", file=out)
    print(f"ring:  a_ring {r['a_ring'] * 1e6:.1f} us, a_wait {r.get('a_wait', 0.0) * 1e6:.1f} us, "
          f"eta_ring {r['eta_ring']:.3f}, B_ring {gbs(r['B_ring'])}, "
          f"p_ring {r.get('p_ring', 1.0):.3f}", file=out)


# ---------------------------------------------------------------- projection
def exposed_time(t_bucket, n_buckets, backward):
    """DDP: buckets ready evenly through the backward pass, allreduced one at a
    time in order; returns the time the last one ends after the backward."""
    return exposed_tail([t_bucket] * n_buckets, [1.0] * n_buckets, backward)


def exposed_tail(t_buckets, sizes, backward):
    """Buckets in DDP's order, each ready once backward has produced its
    share of the gradient bytes (sizes), allreduced one at a time: the time
    the last one ends after the end of the backward (>= 0)."""
    total, done, end = float(sum(sizes)), 0.0, 0.0
    for t, n in zip(t_buckets, sizes):
        done += n
        end = max(backward * done / total, end) + t
    return max(0.0, end - backward)


def ddp_buckets(grad_bytes, bucket_bytes, first_bytes=1 << 20):
    """DDP's bucket sizes in the order they become ready: the first capped
    at 1 MiB (torch's default first bucket), then bucket_bytes each."""
    sizes, left, cap = [], grad_bytes, first_bytes
    while left > 0:
        sizes.append(min(cap, left))
        left -= sizes[-1]
        cap = bucket_bytes
    return sizes


BACKWARD_SHARE = 2 / 3   # backward's part of forward + backward (2 of the 3 matrix passes)


def ddp_step_time(compute, t_buckets, sizes, backward_share=BACKWARD_SHARE, cpu_compute=None,
                  cpu_allreduce=None, cores=None):
    """The DDP step with the allreduce behind backward.

    compute: forward + backward + optimizer alone; t_buckets: each bucket's
    allreduce time (the model's, per bucket). Where each rank has cores to
    spare (a GPU computes, the reduction runs on the host's CPUs):
        step = compute + the allreduce's tail after backward.
    Where compute keeps every core busy (this VM's namespace cluster: all
    ranks share 2 vCPUs and compute on them), the allreduce's CPU work
    (cpu_allreduce, CPU seconds over all ranks) can only come out of
    compute's cores too (cpu_compute CPU seconds over `cores`):
        step = max(compute + tail, (cpu_compute + cpu_allreduce) / cores)."""
    pipeline = compute + exposed_tail(t_buckets, sizes, compute * backward_share)
    if cpu_compute is None:
        return pipeline
    return max(pipeline, (cpu_compute + cpu_allreduce) / cores)


def project(params, plot=None, backward=0.3, bucket=25e6, grad_bytes=1.3e9 * 2, R=8,
            server_hosts=None, mem_bw=None, pcie_bw=None, overlap=None, out=sys.stdout):
    host = {k: params["smddp"][k] for k in ("a_host", "B_mem", "p")}
    if overlap is not None:
        host["p"] = overlap
    if mem_bw:
        host["B_mem"] = mem_bw
    if pcie_bw:
        # The GPU path stages every byte through the host: copy-in and
        # copy-out overlap each other, chunk by chunk, and the host's
        # memory carries them too, so they count as bytes over B_mem.
        host["B_mem"] = 1 / (1 / host["B_mem"] + 1 / ((R + 1) * pcie_bw))
    net = dict(a_net=EFA_ALPHA, eta=EFA_ETA)
    ring = dict(a_ring=EFA_ALPHA, eta_ring=EFA_ETA, B_ring=NVLINK_BUSBW)
    print("EFA figures used (per host link, each way):", file=out)
    for what, url in EFA_SOURCES.items():
        print(f"  {what}: {url}", file=out)
    print(f"  link efficiency {EFA_ETA} (nccl#527); a_net = a_ring = {EFA_ALPHA * 1e6:g} us per "
          "message (assumed, not cited)", file=out)
    print(f"  smddp host part: a_host {host['a_host'] * 1e6:.1f} us, "
          f"p {host['p']:.2f} ({'fit' if overlap is None else '--p'}), "
          f"B_mem {host['B_mem'] / 1e9:.2f} GB/s ({'--mem-gbs' if mem_bw else 'fit'}"
          f"{f', with PCIe staging at {pcie_bw / 1e9:g} GB/s per GPU (--pcie-gbs)' if pcie_bw else ''}); "
          f"{R} GPUs per host; ring steps inside a host at {NVLINK_BUSBW / 1e9:g} GB/s "
          "(nccl#527)", file=out)
    print("  a_net is charged per message, 2(H-1) of them in a row: conservative for smddp "
          "at many hosts (its messages overlap); ring is a flat ring over all N ranks "
          "(2(N-1) latencies: NCCL would switch to trees at small sizes)", file=out)

    def paths(S, H, Lb):
        L = Lb / 8
        k = server_hosts or H
        sm = dict(host, **net)
        return {"smddp": variant_time("smddp", S, H, R, L, sm, ring),
                "smddp bf16": variant_time("smddp bf16", S, H, R, L, sm, ring),
                "smddp net-only": smddp_netonly_time(S, H, R, L, **sm),
                f"smddp+{'k' if server_hosts is None else k} servers":
                    smddp_servers_time(S, H, R, L, k, **sm),
                "ring": variant_time("ring", S, H, R, L, sm, ring),
                "ring bf16 hook": variant_time("ring bf16 hook", S, H, R, L, sm, ring)}

    print("\nPROJECTION: every figure below is the model's, with the EFA figures above in "
          "place of the measured links; none was measured. busbw is counted in the f32 "
          "buffer's bytes for every column, so a bf16 column's gain is the compression's.",
          file=out)
    sizes = [1 << e for e in range(16, 31, 2)]
    hosts = [1, 2, 4, 8, 16, 32]
    curves = {}
    for Lg in EFA_LINKS_GBIT:
        Lb = Lg * 1e9
        print(f"\n# busbw GB/s, {Lg} Gbit/s EFA, 32 hosts x {R} GPUs, against size"
              f" (server hosts k = {server_hosts or 'H'})", file=out)
        names = list(paths(MIB, 32, Lb))
        print(f"{'size':>6} " + " ".join(f"{n:>18}" for n in names), file=out)
        for S in sizes:
            t = paths(S, 32, Lb)
            bw = [busbw(S, 32 * R, t[n]) / 1e9 for n in names]
            curves.setdefault(("size", Lg), []).append((S, bw))
            print(f"{fmt_bytes(S):>6} " + " ".join(f"{b:18.2f}" for b in bw), file=out)
        print(f"\n# busbw GB/s, {Lg} Gbit/s EFA, 256 MiB, against GPUs", file=out)
        print(f"{'GPUs':>6} " + " ".join(f"{n:>18}" for n in names), file=out)
        for H in hosts:
            t = paths(256 * MIB, H, Lb)
            bw = [busbw(256 * MIB, H * R, t[n]) / 1e9 for n in names]
            curves.setdefault(("gpus", Lg), []).append((H * R, bw))
            print(f"{H * R:>6} " + " ".join(f"{b:18.2f}" for b in bw), file=out)

    nb = math.ceil(grad_bytes / bucket)
    print(f"\n# DDP step overhead: {grad_bytes / 1e9:g} GB of gradients (1.3 B parameters, "
          f"fp16/bf16) in {nb} buckets of {bucket / 1e6:g} MB, ready evenly through a "
          f"{backward * 1e3:g} ms backward, allreduced one at a time in order; exposed = "
          "end of the last allreduce - end of the backward", file=out)
    print(f"{'link':>8} {'GPUs':>5} " + " ".join(f"{n:>18}" for n in names), file=out)
    for Lg in EFA_LINKS_GBIT:
        for H in (1, 2, 8, 32):
            t = paths(bucket, H, Lg * 1e9)
            ex = [exposed_time(t[n], nb, backward) * 1e3 for n in names]
            print(f"{Lg:>4}Gbit {H * R:>5} " + " ".join(f"{e:15.1f} ms" for e in ex), file=out)
    # The step with the allreduce behind backward, gradients in f32 (where
    # crossing hosts in bf16 has something to save), each rank with cores
    # to spare (the GPU computes): step = compute + the tail after backward.
    f32_bytes = grad_bytes * 2
    compute = backward / BACKWARD_SHARE
    bsizes = ddp_buckets(f32_bytes, int(bucket))
    print(f"\n# PROJECTION, DDP step with the allreduce behind backward: {f32_bytes / 1e9:g} GB "
          f"of f32 gradients (1.3 B parameters) in {len(bsizes)} DDP buckets ({bucket / 1e6:g} "
          f"MB, the first 1 MiB), compute {compute * 1e3:.0f} ms (backward {backward * 1e3:g} ms "
          "= 2/3 of it); step ms and overlap share (compute + allreduce alone - step) / "
          "min(compute, allreduce alone)", file=out)
    step_names = ["smddp", "smddp bf16", "ring", "ring bf16 hook"]
    print(f"{'link':>8} {'GPUs':>5} " + " ".join(f"{n:>24}" for n in step_names), file=out)
    for Lg in EFA_LINKS_GBIT:
        for H in (2, 8, 32):
            cells = []
            for n in step_names:
                t_b = [paths(b, H, Lg * 1e9)[n] for b in bsizes]
                st = ddp_step_time(compute, t_b, bsizes)
                alone = sum(t_b)
                cells.append(f"{st * 1e3:9.0f} ms, share {(compute + alone - st) / min(compute, alone):5.2f}")
            print(f"{Lg:>4}Gbit {H * R:>5} " + " ".join(f"{c:>24}" for c in cells), file=out)
    if plot:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, axes = plt.subplots(2, 2, figsize=(12, 9))
        for col, Lg in enumerate(EFA_LINKS_GBIT):
            for row, (kind, xl) in enumerate((("size", "bytes (32 hosts x 8 GPUs)"),
                                              ("gpus", "GPUs (256 MiB)"))):
                ax = axes[row][col]
                xs = [c[0] for c in curves[(kind, Lg)]]
                for i, n in enumerate(names):
                    ax.plot(xs, [c[1][i] for c in curves[(kind, Lg)]], marker="o", label=n)
                ax.set_xscale("log", base=2)
                ax.set_yscale("log")
                ax.set_xlabel(xl)
                ax.set_ylabel("busbw GB/s")
                ax.set_title(f"{Lg} Gbit/s EFA (model)")
                ax.grid(True, alpha=0.3)
                ax.legend()
        fig.tight_layout()
        fig.savefig(plot, dpi=100)
        print(f"\nplot: {plot}", file=out)


# ---------------------------------------------------------------- out of sample
def predict(params, hosts, ranks, rate_bps, sizes, like, burst_bytes=2_500_000):
    """Predicted seconds per allreduce, smddp and Gloo, for `hosts` x `ranks`
    at `rate_bps`, before any measurement of that shape. The tbf refill
    between calls (idle) is taken from `like`, a measured shape's points,
    at the same size (the time between calls is the ranks' refill and
    check of the tensor, which does not depend on the hosts)."""
    L = rate_bps / 8
    share = max(1.0, hosts * ranks / params.get("cores", math.inf))
    between = {q["S"]: q for q in like}
    rows = []
    for S in sizes:
        ref = between.get(S, {})
        q = dict(S=S, H=hosts, R=ranks, N=hosts * ranks, L=L, share=share,
                 idle_smddp=min(burst_bytes / L, ref.get("idle_smddp", 0.0)),
                 idle_gloo=min(burst_bytes / L, ref.get("idle_gloo", 0.0)))
        q["idle_smddp-bf16"] = q["idle_smddp"]
        rows.append({col: model_for(col, q, params) for col in COLUMNS}
                    | {"bytes": S})
    return {"hosts": hosts, "ranks_per_host": ranks, "rate_bps": rate_bps, "rows": rows}


def check(predicted, measured, out=sys.stdout, tol=0.20):
    """Each measured point against its prediction; True if every point of
    1 MiB and up is within `tol`."""
    want = {r["bytes"]: r for r in predicted["rows"]}
    ok, worst = True, 0.0
    cols = [c for c in COLUMNS
            if any(c in r for r in measured["rows"]) and any(c in r for r in predicted["rows"])]
    print(f"# {measured['hosts']} hosts x {measured['ranks_per_host']} rank(s): predicted "
          f"before measuring, against the measurement", file=out)
    print(f"{'size':>6} " + " ".join(f"{c + ' ms':>10} {'predicted':>9} {'err':>7}" for c in cols),
          file=out)
    for row in measured["rows"]:
        pr = want.get(row["bytes"])
        if pr is None:
            continue
        cells = []
        for col in cols:
            if not row.get(col):
                cells.append(f"{'-':>10} {'-':>9} {'-':>7}")
                continue
            err = (pr[col] - row[col]) / row[col]
            if row["bytes"] >= MIB:
                worst = max(worst, abs(err))
                ok &= abs(err) <= tol
            cells.append(f"{row[col] * 1e3:10.3f} {pr[col] * 1e3:9.3f} {err * 100:+6.1f}%")
        print(f"{fmt_bytes(row['bytes']):>6} " + " ".join(cells), file=out)
    print(f"verdict: {'within' if ok else 'NOT within'} {tol:.0%} for every size >= 1 MiB "
          f"(worst {worst:.1%})", file=out)
    return ok


def bucket_times(params, name, sizes, H, R, L):
    """Each DDP bucket's allreduce time by variant `name`, the ranks sharing
    the fitted machine's cores (params['cores'])."""
    share = max(1.0, H * R / params.get("cores", math.inf))
    return [variant_time(name, S, H, R, L, params["smddp"], params["ring"], share) for S in sizes]


def overlap_share(compute, alone, step):
    """(compute + allreduce alone - step) / min(compute, allreduce alone):
    1 when the step takes the larger of the two, 0 when their sum."""
    return (compute + alone - step) / min(compute, alone)


def step_check(params, runs, out=None, tol=0.20):
    """Each variant's DDP step (ddp_step.py --paired --save) against the
    model: its buckets priced by the allreduce model, hidden behind backward
    as ddp_step_time says, with the CPU floor from the run's measured CPU
    seconds (compute alone, the variant's allreduce alone) over its cores.
    True if every step is within `tol`."""
    out = out or sys.stdout
    ok, worst = True, 0.0
    for run in runs:
        H, R = int(run["hosts"]), int(run["ranks_per_host"])
        L = parse_rate(run["rate"]) / 8 if run.get("rate") else math.inf
        sizes = ddp_buckets(run["gradient_bytes"], int(run.get("bucket_mb", 25) * MIB))
        med, cpu = run["median"], run["cpu"]
        compute, cores = med["compute only"], run["cores"]
        print(f"\n# DDP step, {H} hosts x {R} ranks, {run.get('rate')}: "
              f"{run['gradient_bytes'] / 1e6:.0f} MB of gradients in {len(sizes)} buckets; compute "
              f"alone {compute * 1e3:.0f} ms, {cpu['compute only']:.2f} CPU s on {cores} cores",
              file=out)
        print(f"{'variant':>15} {'step ms':>8} {'model':>7} {'err':>7} {'free cores':>10} | "
              f"{'alone ms':>8} {'model':>7} | {'overlap':>7} {'model':>6} {'free cores':>10}",
              file=out)
        for n in run["comm_names"]:
            t_b = bucket_times(params, n, sizes, H, R, L)
            alone = sum(t_b)
            free = ddp_step_time(compute, t_b, sizes)
            bound = ddp_step_time(compute, t_b, sizes, cpu_compute=cpu["compute only"],
                                  cpu_allreduce=cpu[f"{n} allreduce only"], cores=cores)
            step, alone_m = med[n], med[f"{n} allreduce only"]
            err = (bound - step) / step
            worst, ok = max(worst, abs(err)), ok and abs(err) <= tol
            print(f"{n:>15} {step * 1e3:8.0f} {bound * 1e3:7.0f} {err * 100:+6.1f}% "
                  f"{free * 1e3:10.0f} | {alone_m * 1e3:8.0f} {alone * 1e3:7.0f} | "
                  f"{overlap_share(compute, alone_m, step):7.2f} "
                  f"{overlap_share(compute, alone, bound):6.2f} "
                  f"{overlap_share(compute, alone, free):10.2f}", file=out)
    print(f"\nverdict: every step {'within' if ok else 'NOT within'} {tol:.0%} of the model "
          f"(worst {worst:.1%}); 'free cores' is the same step where each rank has cores to "
          "spare (the GPU case): only the tail after backward shows", file=out)
    return ok


STEP_VARIANTS = ("smddp", "gloo", "smddp bf16", "gloo bf16 hook")


def predict_step(params, hosts, ranks, rate_bps, grad_bytes, bucket_mb, compute_s,
                 variants=STEP_VARIANTS, out=None):
    """The DDP step where compute holds no core (ddp_step.py --offcpu-ms):
    for each variant, compute plus the allreduce's tail after backward
    (ddp_step_time), DDP's buckets priced one at a time, and the overlap
    share; predicted before measuring. Returns {variant: (step, alone,
    share)} in seconds and prints a table beside the issue's target."""
    out = out or sys.stdout
    L = rate_bps / 8
    sizes = ddp_buckets(grad_bytes, int(bucket_mb * MIB))
    bound = 2 * (hosts - 1) / hosts * grad_bytes / L
    print(f"{hosts} hosts x {ranks} ranks, {rate_bps / 1e9:g}gbit, bucket_cap_mb {bucket_mb:g}, "
          f"compute {compute_s * 1e3:.0f} ms; link bound {bound * 1e3:.0f} ms, target step <= "
          f"{1.15 * max(compute_s, bound) * 1e3:.0f} ms", file=out)
    print(f"{'variant':>15} {'step ms':>8} {'alone ms':>9} {'share':>6}", file=out)
    res = {}
    for n in variants:
        t_b = bucket_times(params, n, sizes, hosts, ranks, L)
        alone = sum(t_b)
        step = ddp_step_time(compute_s, t_b, sizes)
        ov = overlap_share(compute_s, alone, step)
        res[n] = (step, alone, ov)
        print(f"{n:>15} {step * 1e3:8.0f} {alone * 1e3:9.0f} {ov:6.2f}", file=out)
    return res


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m tools.smddp_model", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("fit", help="fit the parameters to bench --save JSON files")
    f.add_argument("files", nargs="+")
    f.add_argument("--out", help="write the fitted parameters here")
    f.add_argument("--tol", type=float, default=0.20)
    f.add_argument("--a-step", action="store_true",
                   help="model v2: a fixed network latency per call (a_step) beside a_net per "
                        "message")
    f.add_argument("--cores", type=float, default=os.cpu_count(),
                   help="cores of the machine the measurements ran on (namespace cluster: all "
                        "hosts share them; default: this machine's)")
    p = sub.add_parser("project", help="project busbw and DDP overhead onto EFA clusters")
    p.add_argument("--params", required=True)
    p.add_argument("--plot")
    p.add_argument("--backward-ms", type=float, default=300.0)
    p.add_argument("--bucket-mb", type=float, default=25.0)
    p.add_argument("--server-hosts", type=int, help="k extra server hosts (default k = H)")
    p.add_argument("--mem-gbs", type=float, help="host memory bandwidth for smddp's host part, "
                   "GB/s (default: the fitted B_mem)")
    p.add_argument("--pcie-gbs", type=float, help="each GPU's copy bandwidth to and from the host, "
                   "GB/s (the GPU path's staging; gpu_bench.py measures it: 55 on an H200)")
    p.add_argument("--p", type=float, dest="overlap",
                   help="the host part's share that does not overlap the network's, 0 (all of "
                   "it overlaps) to 1 (none does); default: the fit's")
    pr = sub.add_parser("predict", help="predict a shape before measuring it (JSON)")
    pr.add_argument("--params", required=True)
    pr.add_argument("--hosts", type=int, required=True)
    pr.add_argument("--ranks", type=int, default=1)
    pr.add_argument("--rate-bps", type=float, default=2e9)
    pr.add_argument("--like", required=True,
                    help="a measured bench --save JSON whose time between calls to reuse")
    pr.add_argument("--out", required=True)
    st = sub.add_parser("step", help="DDP steps (ddp_step.py --paired --save) against the model")
    st.add_argument("--params", required=True)
    st.add_argument("runs", nargs="+")
    st.add_argument("--tol", type=float, default=0.20)
    ps = sub.add_parser("predict-step", help="predict DDP steps with compute off the CPU "
                        "(ddp_step.py --paired --offcpu-ms) before measuring them")
    ps.add_argument("--params", required=True)
    ps.add_argument("--shapes", nargs="+", default=["2x2", "4x1"], help="HxR, hosts x ranks")
    ps.add_argument("--rate-bps", type=float, default=2e9)
    ps.add_argument("--gradient-bytes", type=int, required=True,
                    help="the model's gradient bytes (ddp_step.py --save writes gradient_bytes)")
    ps.add_argument("--bucket-mb", type=float, nargs="+", default=[25.0, 4.0])
    ps.add_argument("--compute-ms", type=float, nargs="+", default=[400.0, 440.0],
                    help="compute alone, an input: values that bracket the run's 'compute only'")
    ck = sub.add_parser("check", help="a measurement against its prediction")
    ck.add_argument("predicted")
    ck.add_argument("measured")
    ck.add_argument("--tol", type=float, default=0.20)
    args = ap.parse_args(argv)
    if args.cmd == "predict":
        with open(args.params) as fh:
            params = json.load(fh)
        like = load([args.like])
        sizes = sorted({q["S"] for q in like})
        res = predict(params, args.hosts, args.ranks, args.rate_bps, sizes, like)
        res["params"] = params
        with open(args.out, "w") as fh:
            json.dump(res, fh, indent=1)
        for r in res["rows"]:
            print(f"{fmt_bytes(r['bytes']):>6} smddp {r['smddp'] * 1e3:9.3f} ms  "
                  f"gloo {r['gloo'] * 1e3:9.3f} ms")
        return 0
    if args.cmd == "predict-step":
        with open(args.params) as fh:
            params = json.load(fh)
        for shape in args.shapes:
            hosts, ranks = (int(x) for x in shape.lower().split("x"))
            for bucket in args.bucket_mb:
                for compute in args.compute_ms:
                    print()
                    predict_step(params, hosts, ranks, args.rate_bps, args.gradient_bytes,
                                 bucket, compute / 1e3)
        return 0
    if args.cmd == "step":
        with open(args.params) as fh:
            params = json.load(fh)
        runs = []
        for path in args.runs:
            with open(path) as fh:
                runs.append(json.load(fh))
        return 0 if step_check(params, runs, tol=args.tol) else 1
    if args.cmd == "check":
        with open(args.predicted) as fh:
            predicted = json.load(fh)
        with open(args.measured) as fh:
            measured = json.load(fh)
        return 0 if check(predicted, measured, tol=args.tol) else 1
    if args.cmd == "fit":
        pts = load(args.files, args.cores)
        params = {"smddp": fit_smddp(pts, a_step=args.a_step) if any(q.get("smddp") for q in pts)
                  else None,
                  "ring": fit_ring(pts) if any(q.get("gloo") for q in pts) else None}
        if None in params.values():
            raise SystemExit("need both smddp and gloo columns to fit")
        params["cores"] = args.cores
        if args.out:
            with open(args.out, "w") as fh:
                json.dump(params, fh, indent=1)
        print_params(params, pts=pts)
        if any(q["H"] > 1 and not q["tbf"] for q in pts):
            print("note: some files have no burst_bytes (written before bench recorded the tbf "
                  "bucket): their links are modelled with no refill between calls")
        return 0 if report(pts, params, tol=args.tol) else 1
    with open(args.params) as fh:
        params = json.load(fh)
    project(params, plot=args.plot, backward=args.backward_ms / 1e3,
            bucket=args.bucket_mb * 1e6, server_hosts=args.server_hosts,
            mem_bw=args.mem_gbs * 1e9 if args.mem_gbs else None,
            pcie_bw=args.pcie_gbs * 1e9 if args.pcie_gbs else None, overlap=args.overlap)
    return 0


if __name__ == "__main__":
    sys.exit(main())
