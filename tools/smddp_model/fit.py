"""The fit (robust Levenberg-Marquardt over log ratios), the variants the
model prices by their benchmark names, and the per-shape report of
measured against modelled."""

from __future__ import annotations

import math
import sys

import numpy as np

from .model import COLUMNS, MIB, ring_time, smddp_time


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
