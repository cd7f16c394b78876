"""Out of sample: predictions made before measuring a shape (allreduce and
DDP step), and the checks of measurements against them and the model."""

from __future__ import annotations

import math
import sys

from tools.smddp_cluster import parse_rate

from .fit import fmt_bytes, model_for, variant_time
from .model import COLUMNS, MIB
from .project import ddp_buckets, ddp_step_time


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
