"""The benchmarks' own logic: torch_smddp.bench checks every timed result
against the closed form (and says which one was wrong), and
benchmarks/ddp_step.py takes turns in the ABBA order its docstring states.
The end-to-end run is bounded by a hard timeout."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time

import pytest
import torch

from torch_smddp import bench

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _load_bench_hosts():
    """benchmarks/bench_hosts.py, with benchmarks/ importable as it expects."""
    sys.path.insert(0, os.path.join(REPO, "benchmarks"))
    spec = importlib.util.spec_from_file_location("bench_hosts",
                                                  os.path.join(REPO, "benchmarks", "bench_hosts.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


bench_hosts = _load_bench_hosts()


def fake_allreduce(t, world, wrong_at=None):
    """An in-place SUM over `world` ranks that each hold r + 1, as a closure
    that counts its calls. It sums what each rank would hold only if `t`
    still holds this rank's input, so it also proves the input is refilled
    before every call; on call `wrong_at` it corrupts element 5."""
    calls = {"n": 0}

    def call():
        i = calls["n"]
        calls["n"] += 1
        mine = t.clone()
        total = sum(float(r + 1) for r in range(world))
        t.copy_(mine * 0 + total if bool((mine == 1.0).all()) else mine * world)
        if i == wrong_at:
            t[5] = -1.0

    return call, calls


def test_closed_form_is_the_sum_of_rank_plus_one():
    for world in (1, 2, 3, 4, 8):
        assert bench.closed_form_sum(world) == sum(r + 1 for r in range(world))


def test_every_timed_call_is_checked_and_starts_from_the_input():
    t = torch.empty(64, dtype=torch.float32)
    call, calls = fake_allreduce(t, world=3)
    seconds, problem = bench.timed_checked_calls(call, t, rank=0, expected=6.0, iters=10)
    assert calls["n"] == 10
    assert problem == ""
    assert seconds >= 0.0


@pytest.mark.parametrize("wrong_at", [0, 6, 9])
def test_a_wrong_result_on_any_iteration_is_reported(wrong_at):
    t = torch.empty(64, dtype=torch.float32)
    call, _ = fake_allreduce(t, world=3, wrong_at=wrong_at)
    _, problem = bench.timed_checked_calls(call, t, rank=0, expected=6.0, iters=10)
    assert problem.startswith(f"iteration {wrong_at}: element 5 of 64 is -1.0, expected 6.0"), problem


def test_a_nan_result_is_reported():
    # The check's fast path compares min and max with the closed form; a
    # NaN must fail it and be found element-wise.
    t = torch.empty(64, dtype=torch.float32)
    inner, _ = fake_allreduce(t, world=3)

    def call():
        inner()
        t[7] = float("nan")

    _, problem = bench.timed_checked_calls(call, t, rank=0, expected=6.0, iters=3)
    assert problem.startswith("iteration 0: element 7 of 64 is nan, expected 6.0"), problem


def load_benchmark(name):
    """benchmarks/NAME.py as a module."""
    spec = importlib.util.spec_from_file_location(name, os.path.join(REPO, "benchmarks", f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def load_ddp_step():
    return load_benchmark("ddp_step")


def test_ddp_step_takes_turns_in_abba_order():
    ddp_step = load_ddp_step()
    two = [ddp_step.abba_order(["A", "B"], i) for i in range(4)]
    assert sum(two, []) == list("ABBAABBA")
    three = [ddp_step.abba_order(["smddp", "gloo", "compute only"], i) for i in range(2)]
    assert three == [["smddp", "gloo", "compute only"], ["compute only", "gloo", "smddp"]]


def test_ddp_step_forwards_every_option_a_worker_reads():
    # Local ranks and the namespace cluster get their worker's command line
    # from worker_args; parsed by the script's own parser it must give the
    # worker what the user asked for.
    ddp_step = load_ddp_step()
    ap = ddp_step.parser()
    asked = ap.parse_args(["--paired", "--steps", "7", "--warmup", "2", "--batch", "3",
                           "--seq", "64", "--threads", "2", "--bucket-view", "--compressed",
                           "--bucket-mb", "4", "--offcpu-ms", "400"])
    got = ap.parse_args(ddp_step.worker_args("paired", asked))
    assert got.worker and got.backend == "paired"
    for field in ("steps", "warmup", "batch", "seq", "threads", "bucket_view", "compressed",
                  "bucket_mb", "offcpu_ms"):
        assert getattr(got, field) == getattr(asked, field), field
    plain = ap.parse_args(ddp_step.worker_args("smddp", ap.parse_args([])))
    assert not plain.bucket_view and not plain.compressed and plain.offcpu_ms == 0.0


def test_fsdp_step_forwards_every_option_a_worker_reads():
    fsdp_step = load_benchmark("fsdp_step")
    ap = fsdp_step.parser()
    asked = ap.parse_args(["--paired", "--steps", "7", "--rounds", "5", "--warmup", "2",
                           "--batch", "3", "--seq", "64", "--threads", "2", "--lr", "0.5",
                           "--rtol", "1e-3", "--atol", "1e-5", "--offcpu-ms", "250", "--pool"])
    got = ap.parse_args(fsdp_step.worker_args(asked))
    assert got.worker
    for field in ("steps", "rounds", "warmup", "batch", "seq", "threads", "lr", "rtol", "atol",
                  "offcpu_ms", "pool"):
        assert getattr(got, field) == getattr(asked, field), field


def test_fsdp_steps_offcpu_model_sleeps_its_share_and_hands_back_the_fill(monkeypatch):
    # Compute off the CPU: every encoder layer is still called as a module
    # (FSDP2's hooks live there), the sleeps add up to the step's compute, a
    # third forward and two thirds backward, and every parameter's gradient
    # is the rank's fill; the embedding's lookup counts as nothing.
    fsdp_step = load_benchmark("fsdp_step")
    ddp_step = load_ddp_step()
    slept = []
    monkeypatch.setattr(fsdp_step.time, "sleep", slept.append)
    torch.manual_seed(0)
    lm = fsdp_step.offcpu_lm(torch, ddp_step.build_model(torch, seq=16, layers=2), 0.6, 3)
    calls = []
    for layer in lm.body.layers:
        layer.register_forward_hook(lambda m, i, o: calls.append(m))
    x, _ = ddp_step.synthetic_batch(torch, 0, 2, 16)
    lm(x).sum().backward()
    assert calls == list(lm.body.layers)
    forward, backward = slept[:len(slept) // 2], slept[len(slept) // 2:]
    assert forward[0] == 0.0 and backward[-1] == 0.0  # the embedding's part
    assert sum(forward) == pytest.approx(0.2) and sum(backward) == pytest.approx(0.4)
    for p in lm.parameters():
        assert torch.equal(p.grad, torch.full_like(p, 4e-3)), p.shape


def test_fsdp_steps_oracle_fails_on_a_difference_and_on_a_model_that_never_moved():
    # The smddp and Gloo copies must agree, and must both have left their
    # initial weights (else agreeing proves nothing).
    fsdp_step = load_benchmark("fsdp_step")
    torch.manual_seed(0)
    a, b = torch.nn.Linear(4, 3), torch.nn.Linear(4, 3)
    b.load_state_dict(a.state_dict())
    initial = [p.detach().clone() for p in a.parameters()]
    models = {"smddp": (a, None), "gloo": (b, None)}
    with pytest.raises(RuntimeError, match="never moved"):
        fsdp_step.check_agree(torch, models, initial, 1e-4, 1e-6)
    with torch.no_grad():
        for p in (*a.parameters(), *b.parameters()):
            p.add_(0.5)
    worst = fsdp_step.check_agree(torch, models, initial, 1e-4, 1e-6)
    assert worst["max_abs_diff"] == 0.0 and worst["min_moved"] == pytest.approx(0.5)
    with torch.no_grad():
        b.bias[1] += 1e-3
    with pytest.raises(RuntimeError, match=r"parameter 1: .* differ at \[1\]"):
        fsdp_step.check_agree(torch, models, initial, 1e-4, 1e-6)


def test_ddp_steps_no_comm_hook_hands_each_bucket_back_untouched():
    # The "ddp no comm" floor: DDP does its own bucket work, and the hook
    # neither communicates nor changes a value.
    class Bucket:
        def __init__(self, t):
            self.t = t

        def buffer(self):
            return self.t

    t = torch.arange(10, dtype=torch.float32)
    fut = load_ddp_step().no_comm_hook(None, Bucket(t))
    assert fut.done() and fut.wait() is t
    assert torch.equal(t, torch.arange(10, dtype=torch.float32))


def test_ddp_steps_offcpu_model_sleeps_its_compute_and_hands_back_each_gradient():
    # --offcpu-ms: the LM's own parameters, in the LM's order (so DDP makes
    # the same buckets), every one of them given a gradient of 1e-3 *
    # (rank + 1), after at least the compute asked for, a third of it in
    # forward.
    ddp_step = load_ddp_step()
    torch.manual_seed(0)
    lm = ddp_step.build_model(torch, vocab=512, d=32, layers=2, heads=2, seq=16)
    model = ddp_step.offcpu_model(torch, lm, 0.3, rank=2)
    assert [id(p) for p in model.parameters()] == [id(p) for p in lm.parameters()]
    x = torch.randint(0, 512, (1, 16))
    t0 = time.monotonic()
    out = model(x)
    t1 = time.monotonic()
    out.sum().backward()
    t2 = time.monotonic()
    assert t1 - t0 >= 0.1 - 1e-3, t1 - t0
    assert t2 - t0 >= 0.3 - 1e-3, t2 - t0
    for name, p in lm.named_parameters():
        assert p.grad is not None and p.grad.shape == p.shape, name
        assert torch.equal(p.grad, torch.full_like(p, 3e-3)), name


def test_bench_runs_and_checks_real_results():
    # Both backends at world 2 on two small sizes: every result is checked
    # inside the benchmark, which exits non-zero on a mismatch.
    cmd = [sys.executable, "-m", "torch_smddp.bench", "--world", "2", "--min", "4K", "--max", "16K",
           "--budget", "65536", "--timeout", "150"]
    p = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]
    assert "WRONG RESULT" not in p.stdout + p.stderr
    assert "allreduce, float32, SUM, world 2" in p.stdout


FAKE_RANK = """
import json, os, sys, time
out = sys.argv[sys.argv.index("--out") + 1]
marker = sys.argv[1]
if os.environ["RANK"] == "0":
    if not os.path.exists(marker):
        open(marker, "w").close()
        sys.exit("TCPStore: EADDRINUSE, address already in use")
    with open(out, "w") as f:
        json.dump({"port": os.environ["MASTER_PORT"]}, f)
else:
    deadline = time.time() + 60  # waits for rank 0, as a peer would
    while not os.path.exists(out) and time.time() < deadline:
        time.sleep(0.05)
"""


def test_launch_ranks_restarts_on_a_taken_port_and_stops_the_others(tmp_path):
    # Rank 0 fails once with EADDRINUSE (as when another process took the
    # free port first) while rank 1 would wait a minute: the world is
    # stopped at once and started again on another port.
    marker = str(tmp_path / "failed_once")
    cmd = [sys.executable, "-c", FAKE_RANK, marker]
    import time
    t0 = time.monotonic()
    data = bench.launch_ranks(cmd, 2, 100, "fake world")
    assert os.path.exists(marker)
    assert "port" in data
    assert time.monotonic() - t0 < 50  # not the sleeping rank's 60 s


def test_result_path_is_private_and_goes_whatever_happens():
    # A directory only this user can enter; removed after a normal exit
    # and after an exception alike.
    with bench.result_path("smddp-test-") as p:
        d = os.path.dirname(p)
        assert not os.path.exists(p)
        assert os.stat(d).st_mode & 0o777 == 0o700
        with open(p, "w") as f:
            f.write("{}")
    assert not os.path.exists(d)
    with pytest.raises(RuntimeError):
        with bench.result_path("smddp-test-") as p:
            d = os.path.dirname(p)
            open(p, "w").close()
            raise RuntimeError("a job failed")
    assert not os.path.exists(d)


def test_launch_ranks_reports_other_failures_without_retrying(tmp_path):
    # Once one rank has failed the other is killed, so it reports 3 or -9
    # (SIGKILL) by when it got there; either way no second attempt.
    cmd = [sys.executable, "-c", "import sys; sys.exit(3)"]
    with pytest.raises(SystemExit, match=r"fake world failed: exit codes \[(3, (3|-9)|-9, 3)\]$"):
        bench.launch_ranks(cmd, 2, 60, "fake world")


def test_small_loop_runs_and_checks_its_result():
    # benchmarks/small_loop.py in a group of one rank (plain python): both
    # entries are checked against the closed form before the timed blocks.
    env = dict(os.environ, MASTER_PORT="29671")
    cmd = [sys.executable, os.path.join(REPO, "benchmarks", "small_loop.py"), "--numel", "300",
           "--blocks", "2", "--calls", "50"]
    p = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]
    for entry in ("direct", "dist"):
        line = [x for x in p.stdout.splitlines() if f"numel 300 {entry}:" in x]
        assert len(line) == 1 and len(line[0].split("block ")[1].split()) == 2, p.stdout


def test_link_bound_and_rate_follow_their_closed_forms(capsys):
    cluster = bench_hosts.cluster_tool()  # tools/smddp_cluster.py

    assert cluster.parse_rate("2gbit") == 2e9
    assert cluster.parse_rate("500mbit") == 5e8
    with pytest.raises(ValueError, match="rate '2.5gbit'"):
        cluster.parse_rate("2.5gbit")  # scripts/cluster.sh takes whole numbers
    # Every host sends and receives 2(H-1)/H of the buffer: S for 2 hosts.
    s = 1 << 26
    assert bench.link_bound_seconds(s, 2, 2e9) == pytest.approx(s * 8 / 2e9)
    assert bench.link_bound_seconds(s, 4, 2e9) == pytest.approx(1.5 * s * 8 / 2e9)
    assert bench.link_bound_seconds(s, 1, 2e9) == 0.0
    # The table: algbw = S / t, busbw = algbw x 2(n-1)/n over all H x R ranks.
    bench_hosts.print_cluster_table({"hosts": 2, "ranks_per_host": 2, "rate": "2gbit", "rate_bps": 2e9,
                               "rows": [{"bytes": s, "iters": 8, "smddp": 0.4, "gloo": 0.5}]},
                              ["smddp", "gloo"])
    row = capsys.readouterr().out.strip().splitlines()[-1].split()
    alg = s / 0.4 / 1e9
    assert f"{alg:.3f}" in row and f"{alg * 1.5:.3f}" in row, row
    assert f"{s * 8 / 2e9 / 0.4:.0%}" in row, row


def test_the_time_between_calls_is_reported_apart_from_the_calls():
    # bench --save records it for tools/smddp_model/ (tbf refills then).
    import time
    t = torch.empty(64, dtype=torch.float32)
    call, _ = fake_allreduce(t, world=2)

    def slow_call():
        time.sleep(0.003)
        call()

    untimed = []
    seconds, problem = bench.timed_checked_calls(slow_call, t, rank=0, expected=3.0, iters=5,
                                                 untimed=untimed)
    assert problem == ""
    assert seconds >= 0.003
    assert len(untimed) == 1 and 0.0 <= untimed[0] < 0.003


MESH_SCRIPT = """
import json, sys
import torch.distributed as dist
sys.path.insert(0, sys.argv[1])
import bench_tcp
out = sys.argv[sys.argv.index("--out") + 1]
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
mesh = bench_tcp.TcpMesh(dist.group.WORLD, rank, world, conns=2)
got = []
for n in (3 << 20, 12000):
    mesh.exchange(n)
    got.append([mesh.sent, mesh.received])
every = [None] * world
dist.all_gather_object(every, got)
mesh.close()
if rank == 0:
    with open(out, "w") as f:
        json.dump(every, f)
# Gloo's worker threads must be joined before the interpreter goes: a
# process that exits with the group alive can abort ("terminate called
# without an active exception").
dist.destroy_process_group()
"""


def test_tcp_mesh_moves_exactly_the_link_bounds_bytes(tmp_path):
    # Three one-rank "hosts" on loopback: each leader must send and receive
    # 2(H-1)/H of the size, the link bound's bytes, and nothing more.
    script = tmp_path / "mesh.py"
    script.write_text(MESH_SCRIPT)
    data = bench.launch_ranks([sys.executable, str(script), os.path.join(REPO, "benchmarks")], 3,
                              120, "tcp mesh",
                              env={"GLOO_SOCKET_IFNAME": "lo", "LOCAL_WORLD_SIZE": "1"})
    for rank_got in data:
        assert rank_got == [[4 << 20, 4 << 20], [16000, 16000]], data


def test_the_installed_bench_is_one_host_and_points_across_hosts_to_the_checkout():
    # The namespace cluster and the tcp row are benchmarks/bench_hosts.py's:
    # the package neither ships nor loads them.
    p = subprocess.run([sys.executable, "-m", "torch_smddp.bench", "--backends", "smddp", "tcp"],
                       cwd=REPO, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "unknown ['tcp']" in p.stderr, p.stderr
    p = subprocess.run([sys.executable, "-m", "torch_smddp.bench", "--hosts", "2"],
                       cwd=REPO, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "benchmarks/bench_hosts.py" in p.stderr, p.stderr
    shipped = os.listdir(os.path.join(REPO, "torch_smddp"))
    assert "bench_tcp.py" not in shipped
    src = open(os.path.join(REPO, "torch_smddp", "bench.py")).read()
    assert "smddp_cluster" not in src and "tools" not in src
    p = subprocess.run([sys.executable, os.path.join(REPO, "benchmarks", "bench_hosts.py"),
                        "--backends", "tcp", "--op", "all_gather"],
                       cwd=REPO, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "needs --op all_reduce" in p.stderr, p.stderr


def test_queued_buckets_splits_as_ddp_and_checks_every_result():
    # benchmarks/queued_buckets.py: DDP's split as the script takes it
    # (tools/smddp_model.ddp_buckets: a first bucket of 1 MiB, then the cap
    # each, the rest last), then a run at world 2 whose every result is
    # checked against the closed form (the script fails on one).
    spec = importlib.util.spec_from_file_location(
        "queued_buckets", os.path.join(REPO, "benchmarks", "queued_buckets.py"))
    qb = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(qb)
    mib = 1 << 20
    assert qb.ddp_buckets(10 * mib + 12, 4 * mib) == [mib, 4 * mib, 4 * mib, mib + 12]
    assert qb.ddp_buckets(mib // 2, 4 * mib) == [mib // 2]
    cmd = [sys.executable, os.path.join(REPO, "benchmarks", "queued_buckets.py"), "--ranks", "2",
           "--mb", "3", "--bucket-mb", "1", "--rounds", "1"]
    p = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]
    rows = {x.rsplit(None, 3)[0].strip(): x.split()[-3:] for x in p.stdout.splitlines()
            if x.split()[:1] in (["smddp"], ["gloo"])}
    assert sorted(rows) == ["gloo", "smddp", "smddp bf16"], p.stdout
    assert all(float(v) > 0 for r in rows.values() for v in r), p.stdout


def test_bench_ops_count_bytes_as_nccl_tests_do():
    from torch_smddp import bench_ops

    assert bench_ops.bus_factor("all_reduce", 4) == 1.5
    assert bench_ops.bus_factor("all_gather", 4) == 0.75
    assert bench_ops.bus_factor("reduce_scatter", 2) == 0.5
    assert bench_ops.bus_factor("all_gather", 1) == 1.0
    s = 1 << 26
    # all_gather: the other hosts' parts come in; reduce_scatter: the other
    # hosts' host-reduced parts go out. Half an allreduce's bytes.
    assert bench.link_bound_seconds(s, 4, 2e9, "all_gather") == pytest.approx(0.75 * s * 8 / 2e9)
    assert bench.link_bound_seconds(s, 2, 2e9, "reduce_scatter") == pytest.approx(0.5 * s * 8 / 2e9)
    ag = bench_ops.OpBuffers("all_gather", 1000, rank=1, world=3)
    assert (ag.inp.numel(), ag.out.numel(), ag.nbytes) == (83, 249, 996)
    rs = bench_ops.OpBuffers("reduce_scatter", 1000, rank=1, world=3)
    assert (rs.inp.numel(), rs.out.numel(), rs.nbytes) == (249, 83, 996)
    with pytest.raises(ValueError, match="unknown op 'broadcast'"):
        bench_ops.OpBuffers("broadcast", 1000, 0, 2)


@pytest.mark.parametrize("op", ["all_gather", "reduce_scatter", "all_reduce", "all_gather_in_place"])
def test_bench_ops_check_each_result_and_their_copy_floor_leaves_it(op):
    # A stand-in collective computes the closed form from what every rank
    # would hold (rank r: r + 1); one that writes nothing, or one wrong
    # element, is caught, named by iteration and element.
    from torch_smddp import bench_ops

    world = 3
    in_place = op.endswith("_in_place")
    op = op.removesuffix("_in_place")
    bufs = bench_ops.OpBuffers(op, 4 * 3 * 8, rank=2, world=world, in_place=in_place)
    per = bufs.nbytes // 4 // world

    def right():
        assert bool((bufs.inp == 3.0).all())  # refilled with this rank's r + 1
        if op == "all_gather":
            bufs.out.copy_(torch.arange(1, world + 1, dtype=torch.float32).repeat_interleave(per))
        elif op == "reduce_scatter":
            bufs.out.copy_(bufs.inp.view(world, per)[0] * 0 + 6.0)
        else:
            bufs.out.fill_(6.0)

    assert bench_ops.timed_checked(right, bufs, 3)[1] == ""
    assert bench_ops.timed_checked(bufs.copy_floor(), bufs, 3)[1] == ""
    if in_place:
        # The input is this rank's part of the output; the floor copies the
        # other parts, 2 of 3, and leaves its own as the refill wrote it.
        assert bufs.inp.data_ptr() == bufs.out.data_ptr() + 2 * per * 4
        bufs.refill()
        bufs.inp.fill_(99.0)
        bufs.copy_floor()()
        assert bool((bufs.inp == 99.0).all()) and bool((bufs.out[:2 * per] == bufs.expected[:2 * per]).all())
    if op != "all_reduce":  # in place, an allreduce that does nothing leaves r + 1
        _, problem = bench_ops.timed_checked(lambda: None, bufs, 2)
        assert problem.startswith("iteration 0: element 0 of"), problem
        assert "is -1.0" in problem

    def wrong_later(calls=[0]):  # noqa: B006
        right()
        calls[0] += 1
        if calls[0] == 2:
            bufs.out[per - 1] = 7.0

    _, problem = bench_ops.timed_checked(wrong_later, bufs, 3)
    assert problem.startswith(f"iteration 1: element {per - 1} of {bufs.out.numel()} is 7.0"), problem


def test_bench_times_all_gather_and_reduce_scatter_and_checks_real_results():
    # One job per op at world 2 against Gloo and the copy floor: every
    # result is checked inside the benchmark, which exits non-zero on a
    # mismatch. The in-place all-gather (FSDP2's form) takes 8 MiB, whose
    # 4 MiB parts go through the host segment's rings.
    for op, extra, big in (("all_gather", [], "1M"), ("reduce_scatter", [], "1M"),
                           ("all_gather", ["--in-place"], "8M")):
        size = str({"1M": 1 << 20, "8M": 8 << 20}[big])
        cmd = [sys.executable, "-m", "torch_smddp.bench", "--op", op, "--world", "2",
               "--sizes", "4096", size, "--budget", "65536", "--timeout", "150",
               "--backends", "smddp", "gloo", "copy", *extra]
        p = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=180)
        assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]
        assert "WRONG RESULT" not in p.stdout + p.stderr
        assert f"# {op}, float32" in p.stdout and "x (n-1)/n" in p.stdout, p.stdout
        assert ("in place (FSDP2's form)" in p.stdout) == bool(extra), p.stdout
        rows = [ln for ln in p.stdout.splitlines() if ln.strip().startswith(("4K", big))]
        assert len(rows) == 2, p.stdout
    with pytest.raises(SystemExit, match="--in-place is all_gather's form"):
        bench.main(["--op", "reduce_scatter", "--in-place", "--world", "2"])
