"""The model's closed forms: the figures the projection takes for EFA, and
the allreduce times of smddp's paths and of a ring as the package docstring
derives them."""

from __future__ import annotations

import math

import numpy as np

MIB = 1 << 20
# The columns of a bench --save sweep that the model prices (fit.py's VARIANTS).
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
