"""tools/smddp_model/: the closed forms, the fit recovering known
parameters from synthetic measurements made by the model itself plus noise,
and the CLI end to end on a small synthetic JSON. No processes, no torch."""

from __future__ import annotations

import io
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)
from tools import smddp_model as m  # noqa: E402
SMDDP = dict(a_host=50e-6, B_mem=3e9, a_net=300e-6, eta=0.9, p=0.2)
RING = dict(a_ring=500e-6, eta_ring=0.7, B_ring=1.5e9)
SHAPES = [(1, 2, 0), (1, 4, 0), (2, 1, 2e9), (2, 2, 2e9), (3, 2, 2e9), (4, 2, 1e9), (4, 1, 2e9)]


def synthetic(tmp_path, noise=0.03, seed=0, shapes=SHAPES, smddp=SMDDP, ring=RING,
              burst=None, between=lambda S: 0.0, cores=math.inf):
    """bench --save files from the model itself, times scaled by exp(N(0, noise)).
    Given `burst` (bytes), the links are tbf-shaped ones whose bucket refills
    for between(S) seconds between calls, as bench records them; given
    `cores`, all ranks of a shape shared that many cores."""
    rng = np.random.default_rng(seed)
    files = []
    for H, R, rate in shapes:
        rows = []
        for e in range(12, 29, 2):
            S = 1 << e
            idle = min(between(S), burst / (rate / 8)) if burst and rate else 0.0
            share = max(1.0, H * R / cores)
            s = float(m.smddp_time(S, H, R, rate / 8, **smddp, share=share, idle=idle))
            g = float(m.ring_time(S, H * R, H, rate / 8, **ring, share=share, idle=idle))
            rows.append(dict(bytes=S, iters=8, smddp=s * math.exp(rng.normal(0, noise)),
                             gloo=g * math.exp(rng.normal(0, noise)),
                             smddp_between=between(S), gloo_between=between(S)))
        path = tmp_path / f"h{H}r{R}.json"
        d = dict(world=H * R, rows=rows, hosts=H, ranks_per_host=R,
                 rate=f"{rate / 1e9:g}gbit", rate_bps=rate)
        if burst:
            d["burst_bytes"] = burst
        path.write_text(json.dumps(d))
        files.append(str(path))
    return files


def check_ring(r, want, rel):
    """Every ring parameter as `want` has it, except that with no shared cores
    (share 1 everywhere) only a step's whole latency, a_ring + a_wait, shows."""
    for k in want:
        got = r[k] + r["a_wait"] if k == "a_ring" else r[k]
        assert got == pytest.approx(want[k], rel=rel), k


def test_ring_closed_forms():
    S, a, B = 64 << 20, 1e-4, 1e9
    # N = 2 on one host: two steps of S/2.
    assert m.ring_time(S, 2, 1, 0, a, 1.0, B) == pytest.approx(2 * (a + S / 2 / B))
    # N = 2 on two hosts, local cost free: the link carries S/2 per step.
    assert m.ring_time(S, 2, 2, B, a, 1.0) == pytest.approx(2 * (a + S / 2 / B))
    # Large N: the link carries 2(N-1)/N * S.
    N = 64
    assert m.ring_time(S, N, N, B, 0.0, 0.5) == pytest.approx(2 * (N - 1) / N * S / (0.5 * B))


def test_smddp_closed_forms():
    S, L = 16 << 20, 1e9
    host = SMDDP["a_host"] + S * 5 / SMDDP["B_mem"]
    assert m.smddp_time(S, 1, 4, 0, **SMDDP) == pytest.approx(host)          # shm only
    net = 2 * 3 * SMDDP["a_net"] + 2 * 3 / 4 * S / (SMDDP["eta"] * L)
    want = max(host, net) + SMDDP["p"] * min(host, net)
    assert m.smddp_time(S, 4, 4, L, **SMDDP) == pytest.approx(want)
    # Network-only: R ranks share the link, so R times the bytes on it.
    assert m.smddp_netonly_time(S, 4, 4, L, **SMDDP) > m.smddp_time(S, 4, 4, L, **SMDDP)
    # k = H server hosts: each link carries S, not 2(H-1)/H * S, so faster at H >= 3.
    assert m.smddp_servers_time(S, 8, 4, L, 8, **SMDDP) < m.smddp_time(S, 8, 4, L, **SMDDP)
    # Too few server hosts taking everything (f = 1): their links (H*S/k) are the bound.
    t1 = m.smddp_servers_time(S, 8, 4, L, 1, **SMDDP, f=1.0)
    assert t1 >= 8 * S / (SMDDP["eta"] * L)


def test_servers_share_balances_worker_and_server_links():
    """server_wire.h's balanced share, and the bytes on the busier link: 4
    hosts and 2 servers take 60%, so a worker sends S + 2a = 1.2 S and a
    server 4b = 1.2 S (benchmarks/servers.py's table); k = H takes all,
    S each; 8 hosts and 1 server: 1.6 S both."""
    assert m.server_share(4, 2) == pytest.approx(0.6)
    assert m.server_share(4, 4) == 1.0
    assert m.server_share(8, 1) == pytest.approx(0.2)
    S, L = 64 << 20, 2.5e8
    p = dict(SMDDP, p=0.0, a_host=0.0, B_mem=math.inf)   # the link part alone
    for H, k, X in ((4, 2, 1.2 * S), (4, 4, S), (8, 1, 1.6 * S)):
        want = 2 * p["a_net"] + X / (p["eta"] * L)
        assert m.smddp_servers_time(S, H, 1, L, k, **p) == pytest.approx(want), (H, k)
        assert m.smddp_servers_time(S, H, 1, L, k, **p, wire=0.5) == pytest.approx(
            2 * p["a_net"] + X / 2 / (p["eta"] * L)), (H, k)


def test_tbf_refill_closed_forms():
    S, L, a = 16 << 20, 1e8, 1e-4
    link = 2 * 3 / 4 * S / (SMDDP["eta"] * L)
    host = SMDDP["a_host"] + S * 3 / SMDDP["B_mem"]
    for idle in (0.0, 0.05, link + 1.0):   # none, part of the link time, more than all of it
        net = 2 * 3 * SMDDP["a_net"] + max(0.0, link - idle)
        want = max(host, net) + SMDDP["p"] * min(host, net)
        assert m.smddp_time(S, 4, 2, L, **SMDDP, idle=idle) == pytest.approx(want), idle
    # Ring, two hosts of one rank, local cost free: the link carries S in all.
    assert m.ring_time(S, 2, 2, L, a, 1.0, idle=0.03) == pytest.approx(2 * a + S / L - 0.03)
    assert m.ring_time(S, 2, 2, L, a, 1.0, idle=10.0) == pytest.approx(2 * a)
    # One host: no link, nothing to refill.
    assert m.ring_time(S, 2, 1, 0, a, 1.0, 1e9, idle=10.0) == pytest.approx(2 * (a + S / 2 / 1e9))


def test_cpu_bound_network_shared_cores_and_ring_overlap_closed_forms():
    S, L = 16 << 20, 1e12          # a link so fast that the CPU limits
    X = 2 * 1 / 2 * S              # two hosts: each link carries S
    smddp = dict(SMDDP, B_net=2e8, p=0.0)
    host = 3 * (SMDDP["a_host"] + S * 3 / SMDDP["B_mem"])
    net = 3 * (2 * SMDDP["a_net"] + X / 2e8)
    assert m.smddp_time(S, 2, 2, L, **smddp, share=3.0) == pytest.approx(max(host, net))
    # share multiplies the host's fixed cost as well as its bytes.
    one = m.smddp_time(S, 1, 4, 0, **SMDDP)
    assert m.smddp_time(S, 1, 4, 0, **SMDDP, share=2.0) == pytest.approx(2 * one)
    # A ring whose steps overlap the link completely (p_ring = 0) takes the
    # longer of the two; p_ring = 1 (the default) their sum.
    a, N, Lr = 1e-3, 4, 1e8
    cpu = 2 * (N - 1) * a
    link = 2 * (N - 1) * (S / N) / Lr
    assert m.ring_time(S, N, 2, Lr, a, 1.0, p_ring=0.0) == pytest.approx(max(cpu, link))
    assert m.ring_time(S, N, 2, Lr, a, 1.0) == pytest.approx(cpu + link)
    assert m.ring_time(S, N, 2, Lr, a, 1.0, share=2.0) == pytest.approx(2 * cpu + link)
    # a_wait is per step too, but waits in the kernel: share leaves it alone.
    w = 2e-3
    assert m.ring_time(S, N, 2, Lr, a, 1.0, share=2.0, a_wait=w) == pytest.approx(
        2 * cpu + 2 * (N - 1) * w + link)


def test_fit_recovers_cpu_bound_network_and_ring_overlap(tmp_path):
    """Shapes on 2 cores whose network is CPU-bound for smddp and whose ring
    overlaps steps: the fit, told the cores, finds B_net and p_ring."""
    smddp = dict(SMDDP, B_net=4e8)
    ring = dict(RING, p_ring=0.4)
    pts = m.load(synthetic(tmp_path, noise=0.0, smddp=smddp, ring=ring, cores=2), cores=2)
    s, r = m.fit_smddp(pts), m.fit_ring(pts)
    for k in ("B_net", "B_mem", "eta", "a_net"):
        assert s[k] == pytest.approx(smddp[k], rel=0.05), k
    assert r["p_ring"] == pytest.approx(0.4, abs=0.05)
    assert r["a_ring"] == pytest.approx(RING["a_ring"], rel=0.05)


def test_fit_separates_the_rings_cpu_latency_from_its_kernel_wait(tmp_path):
    """A ring step's latency with a part that needs a core (a_ring, times the
    ranks per core) and a part that waits in the kernel (a_wait): the shapes
    on 2 cores share their cores 1 to 4 ways, which tells the two apart."""
    ring = dict(a_ring=100e-6, a_wait=900e-6, eta_ring=0.9, B_ring=5e9, p_ring=0.1)
    pts = m.load(synthetic(tmp_path, noise=0.0, ring=ring, cores=2), cores=2)
    r = m.fit_ring(pts)
    assert r["a_ring"] == pytest.approx(100e-6, rel=0.05)
    assert r["a_wait"] == pytest.approx(900e-6, rel=0.05)
    assert r["eta_ring"] == pytest.approx(0.9, rel=0.05)


def test_load_caps_the_refill_at_the_bucket(tmp_path):
    """idle = the time between calls, at most burst / L; a file without
    burst_bytes (written before bench recorded it) refills nothing."""
    (f,) = synthetic(tmp_path, shapes=[(2, 2, 8e8)], burst=1_000_000,
                     between=lambda S: S / 1e8)   # 1e8 B/s: 1 MB's bucket = 0.01 s at 8e8 bit/s
    pts = m.load([f])
    for q in pts:
        assert q["tbf"]
        assert q["idle_smddp"] == pytest.approx(min(q["S"] / 1e8, 0.01))
        assert q["idle_gloo"] == q["idle_smddp"]
    d = json.loads(open(f).read())
    del d["burst_bytes"]
    open(f, "w").write(json.dumps(d))
    assert all(q["idle_smddp"] == 0.0 and not q["tbf"] for q in m.load([f]))


def test_fit_recovers_parameters_through_tbf_bursts(tmp_path):
    """Measurements on tbf links whose bucket refills between calls (so
    small transfers read faster than the link): the fit, told the refill,
    finds the link efficiency again, below 1."""
    pts = m.load(synthetic(tmp_path, noise=0.0, burst=2_500_000,
                           between=lambda S: 2e-4 + S / 2e9))
    s, r = m.fit_smddp(pts), m.fit_ring(pts)
    for k in SMDDP:
        assert s[k] == pytest.approx(SMDDP[k], rel=0.02), k
    check_ring(r, RING, rel=0.02)


def test_report_prices_the_bf16_crossing_column(tmp_path):
    """A sweep with a smddp-bf16 column: load reads it with its own refill,
    and report prices it as bf16 crossing (half the bytes cross) beside f32,
    so a miss there fails the verdict too."""
    (f,) = synthetic(tmp_path, noise=0.0, shapes=[(4, 2, 2e9)], burst=2_500_000,
                     between=lambda S: 1e-4)
    d = json.loads(open(f).read())
    for row in d["rows"]:
        row["smddp-bf16"] = float(m.smddp_time(row["bytes"], 4, 2, 2.5e8, **SMDDP, wire=0.5,
                                               idle=1e-4))
        row["smddp-bf16_between"] = 1e-4
    open(f, "w").write(json.dumps(d))
    pts = m.load([f])
    assert all(q["idle_smddp-bf16"] == pytest.approx(1e-4) for q in pts)
    params = {"smddp": dict(SMDDP), "ring": dict(RING)}
    out = io.StringIO()
    assert m.report(pts, params, out=out)
    assert "smddp-bf16 ms" in out.getvalue()
    for row in d["rows"]:
        row["smddp-bf16"] *= 1.3 if row["bytes"] == 1 << 22 else 1.0
    open(f, "w").write(json.dumps(d))
    out = io.StringIO()
    assert not m.report(m.load([f]), params, out=out)
    assert "outside: smddp-bf16 4x2 2gbit 4M -23%" in out.getvalue()


def test_busbw_and_exposed_time():
    assert m.busbw(100, 2, 1.0) == pytest.approx(100)
    assert m.busbw(100, 4, 1.0) == pytest.approx(150)
    # Allreduces faster than buckets arrive: only the last one sticks out.
    assert m.exposed_time(0.001, 10, 1.0) == pytest.approx(0.001)
    # Slower: they queue; the last ends at first-ready + n * t.
    assert m.exposed_time(0.5, 10, 1.0) == pytest.approx(0.1 + 5.0 - 1.0)


def test_fit_recovers_known_parameters(tmp_path):
    pts = m.load(synthetic(tmp_path))
    s, r = m.fit_smddp(pts), m.fit_ring(pts)
    for k in ("B_mem", "eta"):
        assert s[k] == pytest.approx(SMDDP[k], rel=0.10), k
    for k in ("a_host", "a_net"):
        assert s[k] == pytest.approx(SMDDP[k], rel=0.30), k
    assert abs(s["p"] - SMDDP["p"]) < 0.15
    check_ring(r, RING, rel=0.10)


def test_fit_recovers_other_parameters_without_noise(tmp_path):
    smddp = dict(a_host=20e-6, B_mem=8e9, a_net=80e-6, eta=0.6, p=0.5)
    ring = dict(a_ring=60e-6, eta_ring=0.9, B_ring=4e9)
    pts = m.load(synthetic(tmp_path, noise=0.0, smddp=smddp, ring=ring))
    s, r = m.fit_smddp(pts), m.fit_ring(pts)
    for k in smddp:
        assert s[k] == pytest.approx(smddp[k], rel=0.02), k
    check_ring(r, ring, rel=0.02)


def test_local_run_list_reads_as_one_host(tmp_path):
    path = tmp_path / "local.json"
    path.write_text(json.dumps([{"world": 4, "rows": [{"bytes": 1 << 20, "iters": 8,
                                                        "smddp": 1e-3, "gloo": 2e-3}]}]))
    (q,) = m.load([str(path)])
    assert (q["H"], q["R"], q["N"], q["L"], q["share"]) == (1, 4, 4, 0.0, 1.0)
    (q,) = m.load([str(path)], cores=2)   # 4 ranks on 2 cores: host work takes twice as long
    assert q["share"] == 2.0


def test_fit_with_shared_cores(tmp_path):
    """Measurements whose host parts ran N ranks on 2 cores: the fit, told so,
    finds the per-core parameters again."""
    pts = m.load(synthetic(tmp_path, noise=0.0, cores=2), cores=2)
    s, r = m.fit_smddp(pts), m.fit_ring(pts)
    assert s["B_mem"] == pytest.approx(SMDDP["B_mem"], rel=0.02)
    assert r["B_ring"] == pytest.approx(RING["B_ring"], rel=0.02)


def _cli(*args):
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "tools.smddp_model", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)


def test_cli_fit_reports_agreement_and_projects(tmp_path):
    files = synthetic(tmp_path, shapes=[(1, 2, 0), (2, 2, 2e9), (3, 1, 1e9), (4, 2, 2e9)])
    params = tmp_path / "params.json"
    p = _cli("fit", *files, "--out", str(params), "--cores", "64")  # made without contention
    assert p.returncode == 0, p.stdout + p.stderr
    assert "# 4 host(s) x 2 rank(s), 2 Gbit/s" in p.stdout
    assert "verdict: the model AGREES" in p.stdout
    assert set(json.loads(params.read_text())) == {"smddp", "ring", "cores"}
    plot = tmp_path / "proj.png"
    p = _cli("project", "--params", str(params), "--plot", str(plot))
    assert p.returncode == 0, p.stdout + p.stderr
    for text in ("https://github.com/NVIDIA/nccl/issues/527", "busbw GB/s, 400 Gbit/s",
                 "DDP step overhead", "   256 "):
        assert text in p.stdout, text
    assert plot.stat().st_size > 0


def test_cli_fit_says_when_it_does_not_agree(tmp_path):
    (f,) = synthetic(tmp_path, shapes=[(2, 2, 2e9)])
    data = json.loads(open(f).read())
    data["rows"][-1]["smddp"] *= 2   # one large point the model cannot follow
    open(f, "w").write(json.dumps(data))
    p = _cli("fit", f, "--cores", "64")
    assert p.returncode == 1
    assert "verdict: the model DOES NOT AGREE" in p.stdout


def test_narrow_wire_halves_the_link_and_adds_the_pack_passes():
    """wire=0.5 (bf16/fp16 crossing): half the bytes on the link, and the
    pack and unpack of the host's partial, 2(1+w)S bytes, in the host part."""
    S, L = 64 << 20, 2.5e8
    p = dict(SMDDP, p=0.0)
    X = 2 * 3 / 4 * S
    link = 2 * 3 * p["a_net"] + X * 0.5 / (p["eta"] * L)
    host = p["a_host"] + (S * 3 + 2 * 1.5 * S) / p["B_mem"]
    assert m.smddp_time(S, 4, 2, L, **p, wire=0.5) == pytest.approx(max(host, link))
    assert m.smddp_host(S, 2, p["a_host"], p["B_mem"], wire=1.0) == pytest.approx(
        p["a_host"] + 3 * S / p["B_mem"])
    # One host: nothing crosses, so nothing narrows (as in the library).
    assert m.smddp_time(S, 1, 4, 0, **p, wire=0.5) == pytest.approx(m.smddp_time(S, 1, 4, 0, **p))
    # a_step: a fixed network latency per call, beside a_net per message.
    assert m.smddp_time(4096, 3, 1, L, **p, a_step=1e-3) == pytest.approx(
        max(p["a_host"] + 2 * 4096 / p["B_mem"],
            2 * (1e-3 + 2 * p["a_net"]) + 2 * 2 / 3 * 4096 / (p["eta"] * L)))


def test_ddp_buckets_and_the_tail_after_backward():
    assert m.ddp_buckets(60 << 20, 25 << 20) == [1 << 20, 25 << 20, 25 << 20, 9 << 20]
    # Each bucket ready when backward has made its bytes: [1, 1] over 1 s.
    assert m.exposed_tail([0.1, 0.1], [1, 1], 1.0) == pytest.approx(0.1)
    # The first is slow: the second queues behind it.
    assert m.exposed_tail([0.9, 0.1], [1, 1], 1.0) == pytest.approx(0.5)
    # Fast buckets hide entirely but for the last.
    assert m.exposed_tail([0.01] * 4, [1] * 4, 1.0) == pytest.approx(0.01)
    # Free cores: compute + tail. backward = 2/3 of compute.
    assert m.ddp_step_time(0.3, [0.1, 0.1], [1, 1]) == pytest.approx(0.3 + 0.1)
    # Cores held by compute: the CPU floor wins when it is larger.
    assert m.ddp_step_time(0.3, [0.1, 0.1], [1, 1], cpu_compute=0.6, cpu_allreduce=0.4,
                           cores=2) == pytest.approx(0.5)
    assert m.ddp_step_time(0.3, [0.1, 0.1], [1, 1], cpu_compute=0.2, cpu_allreduce=0.1,
                           cores=2) == pytest.approx(0.4)


def test_step_check_against_a_step_built_from_the_model(capsys):
    """A ddp_step --save result made from the model's own numbers agrees;
    one 30% slower does not."""
    params = {"smddp": dict(SMDDP), "ring": dict(RING), "cores": 2.0}
    grad = 82 << 20
    sizes = m.ddp_buckets(grad, 25 << 20)
    H, R, L = 2, 2, 2e9 / 8
    med, cpu = {"compute only": 0.4}, {"compute only": 0.8}
    for n in ("smddp", "gloo"):
        t_b = [m.variant_time(n, S, H, R, L, params["smddp"], params["ring"], 2.0) for S in sizes]
        cpu[f"{n} allreduce only"] = 0.3
        med[f"{n} allreduce only"] = sum(t_b)
        med[n] = m.ddp_step_time(0.4, t_b, sizes, cpu_compute=0.8, cpu_allreduce=0.3, cores=2)
    run = dict(hosts=H, ranks_per_host=R, rate="2gbit", gradient_bytes=grad, bucket_mb=25,
               median=med, cpu=cpu, cores=2, comm_names=["smddp", "gloo"])
    assert m.step_check(params, [run])
    slow = dict(run, median=dict(med, smddp=med["smddp"] * 1.3))
    assert not m.step_check(params, [slow])
    assert "NOT within" in capsys.readouterr().out


def test_predict_step_reproduces_the_committed_off_cpu_predictions(capsys):
    """benchmarks/cluster/predicted_offcpu_steps.txt was written before the
    runs by a script of its own; `predict-step` must give the same tables."""
    path = os.path.join(REPO, "benchmarks", "cluster", "predicted_offcpu_steps.txt")
    with open(path) as fh:
        committed = [ln for ln in fh.read().splitlines() if not ln.startswith("#")]
    assert m.main(["predict-step", "--params",
                   os.path.join(REPO, "benchmarks", "cluster", "params_v2.json"),
                   "--gradient-bytes", "82178048"]) == 0
    assert capsys.readouterr().out.splitlines() == committed


def test_predict_step_closed_form(capsys):
    """One bucket, free cores: the step is compute plus that bucket's whole
    allreduce (it is ready only at the end of backward)."""
    params = {"smddp": dict(SMDDP), "ring": dict(RING), "cores": 64.0}
    res = m.predict_step(params, 2, 1, 2e9, 1 << 20, 25.0, 0.4, variants=("smddp",))
    t = m.variant_time("smddp", 1 << 20, 2, 1, 2e9 / 8, params["smddp"], params["ring"])
    step, alone, share = res["smddp"]
    assert alone == pytest.approx(t)
    assert step == pytest.approx(0.4 + t)
    assert share == pytest.approx(0.0)
    assert "target step <= 460 ms" in capsys.readouterr().out


def _busbw_row(text, table, size):
    """The numbers of `size`'s row in the projection's first table titled `table`."""
    part = text[text.index(table):]
    for line in part.splitlines()[2:]:
        cells = line.split()
        if cells and cells[0] == size:
            return [float(c) for c in cells[1:]]
    raise AssertionError(f"no {size} row under {table!r}")


def test_project_p_sets_the_overlap_of_the_host_part():
    """--p replaces the fitted p: at p 0 smddp's call is max(host, net), at
    p 1 their sum, so its busbw is higher at p 0; the ring's columns do not
    use p and stay the same."""
    params = {"smddp": dict(SMDDP, B_net=math.inf, a_step=0.0), "ring": dict(RING), "cores": 2.0}
    outs = {}
    for p in (0.0, 1.0):
        buf = io.StringIO()
        m.project(params, overlap=p, out=buf)
        outs[p] = buf.getvalue()
        assert f"p {p:.2f} (--p)" in outs[p]
    table = "# busbw GB/s, 100 Gbit/s EFA, 32 hosts x 8 GPUs"
    lo, hi = _busbw_row(outs[1.0], table, "1G"), _busbw_row(outs[0.0], table, "1G")
    assert hi[0] > lo[0] * 1.05          # smddp f32
    assert hi[-2:] == lo[-2:]            # ring, ring bf16 hook
    buf = io.StringIO()
    m.project(params, out=buf)
    assert "p 0.20 (fit)" in buf.getvalue()
