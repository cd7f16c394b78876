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

F.json is what ``benchmarks/bench_hosts.py --hosts H --ranks R --rate RATE
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

# The package's names, as `from tools import smddp_model as m` and the
# benchmarks have used them: model.py (closed forms), data.py (load), fit.py,
# project.py (EFA projection, DDP buckets and step), check.py (out of
# sample), cli.py (main; __main__.py runs it).
from .model import (MIB, COLUMNS, EFA_SOURCES, EFA_LINKS_GBIT, EFA_ETA, NVLINK_BUSBW, EFA_ALPHA,
                    _combine, smddp_host, link_time, net_bytes_time, smddp_time,
                    smddp_netonly_time, server_share, smddp_servers_time, ring_time, busbw)
from .data import load
from .fit import (levenberg_marquardt, ROBUST, _robust, _exp, _smddp_params, _ring_params, _arrays,
                  fit_smddp, fit_ring, VARIANTS, variant_time, model_for, fmt_bytes, report,
                  print_params)
from .project import (exposed_time, exposed_tail, ddp_buckets, BACKWARD_SHARE, ddp_step_time,
                      project)
from .check import (predict, check, bucket_times, overlap_share, step_check, STEP_VARIANTS,
                    predict_step)
from .cli import main
