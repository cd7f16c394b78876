"""The command line, `python -m tools.smddp_model fit|project|predict|check|
step|predict-step` (__main__.py runs main); its help is the package docstring."""

from __future__ import annotations

import argparse
import json
import os
import sys

from .check import check, predict, predict_step, step_check
from .data import load
from .fit import fit_ring, fit_smddp, fmt_bytes, print_params, report
from .project import project


def main(argv=None):
    # The help is the package's docstring (__init__.py), the model's documentation.
    ap = argparse.ArgumentParser(prog="python -m tools.smddp_model",
                                 description=sys.modules[__package__].__doc__,
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
