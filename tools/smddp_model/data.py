"""The data: the points of `bench --save` JSON files, as the fit and the
checks read them."""

from __future__ import annotations

import json
import math

from .model import COLUMNS


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
