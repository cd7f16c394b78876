"""Soak: many allreduces in one process group, watching for memory growth.

    .venv/bin/python benchmarks/soak.py [--world 2] [--small 100000] [--large 1000]
                                        [--small-bytes 4K] [--large-bytes 16M]

Each rank runs ``--small`` float32 allreduces of ``--small-bytes`` and then
``--large`` of ``--large-bytes`` on backend smddp. Every result is checked
against the closed form (sum over ranks of rank + 1). After a warm-up (the
first 2% of each phase, at least 20 calls) the script samples the resident
set size (VmRSS), the thread count and the open fds of every rank, and
prints, per phase and rank, RSS after warm-up and at the end, the peak RSS
of the first and of the second half of the samples, and the growth in
percent (second-half peak over first-half peak). Ranks are launched by tests/python/harness/mp_harness.py
(hard deadline: --deadline seconds).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


def _proc_sample() -> dict:
    rss = 0
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) * 1024
    return {"rss": rss, "threads": len(os.listdir("/proc/self/task")),
            "fds": len(os.listdir("/proc/self/fd"))}


def _phase(rank: int, world: int, calls: int, nbytes: int, check_every: int) -> dict:
    import torch
    import torch.distributed as dist

    numel = nbytes // 4
    t = torch.empty(numel, dtype=torch.float32)
    want = float(world * (world + 1) // 2)
    warm = max(20, calls // 50)
    samples = []
    sample_every = max(1, (calls - warm) // 50)
    bad = 0
    t0 = time.monotonic()
    t_warm = None
    for i in range(calls):
        t.fill_(float(rank + 1))
        dist.all_reduce(t)
        # The first and last element every call, all of it now and then.
        if t[0].item() != want or t[-1].item() != want:
            bad += 1
        elif i % check_every == 0 and not bool(torch.all(t == want)):
            bad += 1
        if i + 1 == warm:
            t_warm = time.monotonic()
            samples.append(_proc_sample())
        elif i + 1 > warm and ((i + 1 - warm) % sample_every == 0 or i + 1 == calls):
            samples.append(_proc_sample())
    elapsed = time.monotonic() - t0
    timed = time.monotonic() - (t_warm or t0)
    first, last = samples[0], samples[-1]
    # Growth is judged on peaks, half against half: RSS steps by a few MiB
    # as malloc keeps or returns the large temporaries of the checks, so a
    # single sample says little; a leak raises the later half's peak.
    half = len(samples) // 2
    peak1 = max(s["rss"] for s in samples[:half])
    peak2 = max(s["rss"] for s in samples[half:])
    return {"calls": calls, "bytes": nbytes, "warmup_calls": warm, "wrong_results": bad,
            "seconds": round(elapsed, 2),
            "us_per_call": round(1e6 * timed / max(1, calls - warm), 1),
            "rss_after_warmup": first["rss"], "rss_end": last["rss"],
            "rss_peak": max(s["rss"] for s in samples),
            "rss_peak_first_half": peak1, "rss_peak_second_half": peak2,
            "rss_growth_pct": round(100.0 * (peak2 - peak1) / peak1, 3),
            "rss_samples_kib": [s["rss"] >> 10 for s in samples],
            "threads": [first["threads"], last["threads"]],
            "fds": [first["fds"], last["fds"]]}


def soak_worker(rank: int, world: int, small: int, small_bytes: int, large: int,
                large_bytes: int) -> dict:
    import torch_smddp

    out = {"provider": torch_smddp._backend_of().provider}
    out["small"] = _phase(rank, world, small, small_bytes, check_every=100)
    out["large"] = _phase(rank, world, large, large_bytes, check_every=10)
    out["stats"] = {k: v for k, v in torch_smddp.stats().items()
                    if k in ("collectives", "frames_rejected", "errors")}
    return out


def _bytes(s: str) -> int:
    s = s.strip().upper().rstrip("B").rstrip("I")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1:], 1)
    return int(s[:-1] if s[-1:] in "KMG" else s) * mult


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--small", type=int, default=100_000)
    ap.add_argument("--large", type=int, default=1_000)
    ap.add_argument("--small-bytes", default="4K")
    ap.add_argument("--large-bytes", default="16M")
    ap.add_argument("--deadline", type=float, default=3 * 3600)
    ap.add_argument("--json", help="also write the raw per-rank results here")
    a = ap.parse_args()

    sys.path.insert(0, os.path.join(REPO, "tests", "python", "harness"))
    from mp_harness import run_world

    env = {"PYTHONPATH": HERE + os.pathsep + os.environ.get("PYTHONPATH", "")}
    t0 = time.monotonic()
    results = run_world(a.world, "soak:soak_worker", timeout=a.deadline, env=env,
                        pg_timeout=300,
                        args=(a.small, _bytes(a.small_bytes), a.large, _bytes(a.large_bytes)))
    wall = time.monotonic() - t0
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)
    mib = 1 << 20
    print(f"soak: world {a.world}, provider {results[0]['provider']}, wall {wall:.0f} s")
    print(f"{'phase':>6} {'rank':>4} {'calls':>7} {'bytes':>9} {'us/call':>9} {'wrong':>5} "
          f"{'RSS warm MiB':>12} {'RSS end MiB':>11} {'peak 1st half':>13} {'peak 2nd half':>13} "
          f"{'growth %':>9} {'threads':>8} {'fds':>8}")
    worst = 0.0
    failed = False
    for phase in ("small", "large"):
        for rank, r in enumerate(results):
            p = r[phase]
            worst = max(worst, p["rss_growth_pct"])
            failed |= p["wrong_results"] > 0
            print(f"{phase:>6} {rank:>4} {p['calls']:>7} {p['bytes']:>9} {p['us_per_call']:>9} "
                  f"{p['wrong_results']:>5} {p['rss_after_warmup'] / mib:>12.1f} "
                  f"{p['rss_end'] / mib:>11.1f} {p['rss_peak_first_half'] / mib:>13.1f} "
                  f"{p['rss_peak_second_half'] / mib:>13.1f} "
                  f"{p['rss_growth_pct']:>9.3f} {'->'.join(map(str, p['threads'])):>8} "
                  f"{'->'.join(map(str, p['fds'])):>8}")
    print(f"largest RSS growth after warm-up (peak of the 2nd half over peak of the 1st): "
          f"{worst:.3f}%; wrong results: "
          f"{sum(r[p]['wrong_results'] for r in results for p in ('small', 'large'))}; "
          f"engine stats rank 0: {results[0]['stats']}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
