"""The projection onto EFA clusters, and DDP's buckets and step time with
the allreduce behind backward (ddp_buckets, ddp_step_time)."""

from __future__ import annotations

import math
import sys

from .fit import fmt_bytes, variant_time
from .model import (EFA_ALPHA, EFA_ETA, EFA_LINKS_GBIT, EFA_SOURCES, MIB, NVLINK_BUSBW, busbw,
                    smddp_netonly_time, smddp_servers_time)


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
