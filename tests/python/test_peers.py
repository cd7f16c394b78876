"""benchmarks/peers.py and peers_mpi.py: smddp, Gloo and the copy floor
timed in blocks and checked against the closed form; MPICH's results
merged by op; the pairs' medians and wins (torch_smddp.bench's own tests
are in test_bench.py)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

def test_peers_runs_without_the_peers_and_checks_real_results():
    # benchmarks/peers.py with what this venv has (smddp through c10d and
    # direct, Gloo; DeepSpeed and MPICH live in the peers' venv): each
    # backend's result is checked against the closed form before and after
    # the timed rounds, and a wrong one exits non-zero.
    cmd = [sys.executable, os.path.join(REPO, "benchmarks", "peers.py"), "--world", "2",
           "--sizes", "4096", "65536", "--backends", "smddp", "smddp_direct", "smddp_pool", "gloo",
           "--rounds", "2", "--block-s", "0.002", "--max-iters", "20", "--timeout", "150"]
    p = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]
    assert "WRONG RESULT" not in p.stdout + p.stderr
    rows = [line for line in p.stdout.splitlines() if line.startswith("| 2 |")]
    assert len(rows) == 2, p.stdout
    assert "best peer / smddp_direct" in p.stdout, p.stdout
    assert "smddp_pool at world 2: n/a (allreduce's buffers are the model's" in p.stdout, p.stdout


@pytest.mark.parametrize("op", ["all_gather", "reduce_scatter"])
def test_peers_gather_and_scatter_check_real_results(op):
    # --op all_gather (in place, FSDP2's form) / reduce_scatter: smddp, Gloo
    # and the copy floor checked against the closed form (all-gather's part
    # j holds j + 1, reduce-scatter n(n+1)/2) into a poisoned output;
    # smddp_direct has no entry for them and reads n/a with the reason. The
    # floor is no peer: the table sets smddp against it in a column of its
    # own. smddp_pool: the same call on buffers from the backend's
    # allocate_tensor (the shared pool), checked the same way. torch: the
    # same entry on torch's fake backend, a floor too, never the best peer.
    cmd = [sys.executable, os.path.join(REPO, "benchmarks", "peers.py"), "--op", op, "--world", "2",
           "--sizes", "4096", "65536", "--backends", "smddp", "smddp_direct", "smddp_pool", "gloo",
           "copy", "torch",
           "--rounds", "2", "--block-s", "0.002", "--max-iters", "20", "--timeout", "150",
           *(["--in-place"] if op == "all_gather" else [])]
    p = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]
    assert "WRONG RESULT" not in p.stdout + p.stderr
    assert ("size = the whole output" if op == "all_gather" else "size = the whole input") in p.stdout
    assert ("in place (FSDP2's form" in p.stdout) == (op == "all_gather"), p.stdout
    assert "algbw x (n-1)/n" in p.stdout
    assert "| smddp / copy |" in p.stdout and "| smddp_pool / copy |" in p.stdout, p.stdout
    assert "| best peer / smddp_pool |" in p.stdout, p.stdout
    rows = [line for line in p.stdout.splitlines() if line.startswith("| 2 |")]
    assert len(rows) == 2 and all(" n/a |" in r for r in rows), p.stdout
    assert all(" gloo |" in r for r in rows), p.stdout  # the best peer, never a floor
    assert "| torch us |" in p.stdout, p.stdout  # torch's layer alone (its fake backend)
    assert "smddp_direct at world 2: n/a (torch_smddp has a direct entry for allreduce only" in p.stdout


def test_peers_mpi_loads_the_bench_helpers_without_the_extension():
    # peers_mpi.py must not import the torch_smddp package (its extension
    # brings an MPI of its own, which mpi4py then takes for the mpich
    # wheel's, every rank a world of one): only bench.py and bench_ops.py.
    code = ("import importlib.util, sys\n"
            f"spec = importlib.util.spec_from_file_location('pm', {os.path.join(REPO, 'benchmarks', 'peers_mpi.py')!r})\n"
            "pm = importlib.util.module_from_spec(spec); spec.loader.exec_module(pm)\n"
            "assert pm.fmt_size(1 << 20) == '1M', pm.fmt_size(1 << 20)\n"
            "assert 'torch' not in sys.modules and 'torch_smddp._C' not in sys.modules\n")
    p = subprocess.run([sys.executable, "-c", code], cwd="/", capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr[-2000:]


def test_peers_refuses_mpich_results_of_another_op(tmp_path):
    import json
    peers = _peers_module()
    mpi = tmp_path / "mpich.json"
    mpi.write_text(json.dumps([{"world": 2, "op": "all_reduce", "rows": []}]))
    with pytest.raises(SystemExit, match="MPICH's all_reduce, this job timed all_gather"):
        peers.merge_mpi([{"world": 2, "op": "all_gather", "rows": [], "backends": []}], str(mpi))


def _peers_module():
    spec = importlib.util.spec_from_file_location("peers", os.path.join(REPO, "benchmarks", "peers.py"))
    peers = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(peers)
    return peers


def test_peers_pairs_take_each_pairs_median_and_count_the_pairs_won(monkeypatch, capsys):
    # Two pairs at world 2, one size: in pair 1 smddp_direct (10 us) beats
    # MPICH (12) and DeepSpeed (11); in pair 2 (20) it loses to MPICH (15).
    import json
    import types
    peers = _peers_module()
    ours = iter([[10e-6, 9e-6, 11e-6], [20e-6, 21e-6, 19e-6]])
    theirs = iter([[12e-6, 12e-6, 12e-6], [15e-6, 16e-6, 14e-6]])
    mpi_runs = []

    def fake_mpi(cmd, **kw):
        out = cmd[cmd.index("--out") + 1]
        mpi_runs.append(cmd)
        with open(out, "w") as f:
            json.dump([{"world": 2, "rows": [{"bytes": 4096, "times": next(theirs)}]}], f)
        return types.SimpleNamespace(returncode=0, stderr="")

    def fake_world(world, args):
        return {"world": world, "backends": ["smddp_direct", "deepspeed"],
                "rows": [{"bytes": 4096, "times": {"smddp_direct": next(ours),
                                                    "deepspeed": [11e-6] * 3}}]}

    monkeypatch.setattr(peers.subprocess, "run", fake_mpi)
    monkeypatch.setattr(peers, "run_world", fake_world)
    args = types.SimpleNamespace(pairs=2, world=[2], sizes=[4096], rounds=3, block_s=0.2,
                                 min_iters=3, max_iters=2000, warmup=5, timeout=60, op="all_reduce")
    (d,) = peers.run_pairs(args)
    assert len(mpi_runs) == 2
    row = d["rows"][0]
    assert row["times"]["smddp_direct"] == pytest.approx([10e-6, 20e-6])
    assert row["times"]["mpich"] == pytest.approx([12e-6, 15e-6])
    assert row["pairs_won"] == "1 of 2"
    peers.print_table([d])
    out = capsys.readouterr().out
    assert "median over pairs" in out and "| 1 of 2 |" in out
