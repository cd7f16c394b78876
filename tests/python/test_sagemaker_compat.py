"""SageMaker scripts run unchanged (compat/sagemaker): the guide's MNIST-style
script under torchrun trains (its checkpoint classifies held-out data, a
closed form of the synthetic task), and under Open MPI's mpirun, as
SageMaker launches it, it trains exactly as a single-process simulation of
two data-parallel ranks does; Open MPI's variables map onto c10d's (the
user's win; across hosts MASTER_ADDR must be given); init_process_group
passes torch's arguments on; and the API's edges: SageMaker names that mean
nothing here raise errors saying so, SMDATAPARALLEL_* and SageMaker's
launcher variables draw a warning naming what replaces them."""
import datetime
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import warnings

import pytest

from mp_harness import REPO_ROOT, find_free_port, run_with_deadline

COMPAT = os.path.join(REPO_ROOT, "compat", "sagemaker")
EXAMPLE = os.path.join(REPO_ROOT, "examples", "sagemaker_mnist.py")
C10D = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def _env(**extra):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [COMPAT, REPO_ROOT,
                                                                   os.environ.get("PYTHONPATH")])))
    env.update(extra)
    return env


def test_the_guides_mnist_script_runs_unchanged_under_torchrun(tmp_path):
    model_dir = tmp_path / "model"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           os.path.join(REPO_ROOT, "examples", "sagemaker_mnist.py"), "--model-dir", str(model_dir),
           "--epochs", "2"]
    code, timed_out, output = run_with_deadline(cmd, timeout=240, env=_env())
    assert code == 0 and not timed_out, output[-4000:]
    losses = [float(line.split()[-1]) for line in output.splitlines() if "train loss" in line]
    assert len(losses) == 2 and losses[1] < losses[0], output[-4000:]
    # The checkpoint rank 0 saved classifies held-out data of the synthetic
    # task (each class lights its own patch), loaded outside the job.
    check = f"""
import sys, torch
sys.argv = ["x"]
sys.path.insert(0, {os.path.join(REPO_ROOT, "examples")!r})
import importlib.util
spec = importlib.util.spec_from_file_location("m", {os.path.join(REPO_ROOT, "examples", "sagemaker_mnist.py")!r})
src = open(spec.origin).read().replace("dist.init_process_group()", "")
ns = {{"__name__": "not_main"}}
exec(compile(src, spec.origin, "exec"), ns)
net = ns["Net"]()
state = torch.load({str(model_dir / "model.pt")!r})
net.load_state_dict({{k.removeprefix("module."): v for k, v in state.items()}})
net.eval()
data = ns["synthetic_mnist"](400, seed=7)
x, y = data.tensors
acc = (net(x).argmax(1) == y).float().mean().item()
print(acc)
"""
    out = subprocess.run([sys.executable, "-c", check], env=_env(), capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert float(out.stdout.split()[-1]) > 0.9, out.stdout


def _py(code, **env):
    return subprocess.run([sys.executable, "-c", code], env=_env(**env), capture_output=True, text=True,
                          timeout=60)


def test_names_that_mean_nothing_here_raise_errors_that_say_so():
    code = """
import warnings, torch
import smdistributed.dataparallel.torch.distributed as dist
from smdistributed.dataparallel.torch.parallel.distributed import DistributedDataParallel as DDP
out = []
for call in (lambda: dist.init_process_group(not_an_argument=1), lambda: dist.get_rank(group=object()),
             lambda: dist.some_other_function, lambda: dist.init_process_group()):
    try:
        call()
        out.append("no error")
    except Exception as e:
        out.append(f"{type(e).__name__}: {e}")
try:
    DDP(torch.nn.Linear(2, 2), find_unused_parameters=True)
except Exception as e:
    out.append(f"{type(e).__name__}: {e}")
print("\\n".join(out))
print(dist.get_local_rank(), dist.get_local_size(), dist.is_available())
"""
    out = _py(code, LOCAL_RANK="3", LOCAL_WORLD_SIZE="4", RANK="", WORLD_SIZE="")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("TypeError") and "not_an_argument" in lines[0], lines
    assert lines[1].startswith("ValueError") and "group.WORLD" in lines[1], lines
    assert lines[2].startswith("AttributeError") and "some_other_function" in lines[2], lines
    assert lines[3].startswith("RuntimeError") and "torchrun" in lines[3] and "RANK" in lines[3], lines
    assert lines[4].startswith("TypeError") and "find_unused_parameters" in lines[4], lines
    assert lines[5].split()[:2] == ["3", "4"], lines


@pytest.mark.parametrize("var", ["SMDATAPARALLEL_LMC_ENABLE", "SM_HOSTS"])
def test_sagemaker_variables_draw_a_warning_naming_them(var):
    out = _py("import warnings; warnings.simplefilter('always')\n"
              "import smdistributed.dataparallel.torch.torch_smddp", **{var: "1"})
    assert out.returncode == 0, out.stderr
    assert var in out.stderr and "mean nothing here" in out.stderr, out.stderr
    quiet = _py("import smdistributed.dataparallel.torch.torch_smddp")
    assert "mean nothing here" not in quiet.stderr


# --------------------------------------------------------------------------
# Open MPI's variables onto c10d's (pure Python: _environment.py alone)
# --------------------------------------------------------------------------

def _load_environment_module():
    path = os.path.join(COMPAT, "smdistributed", "dataparallel", "torch", "_environment.py")
    spec = importlib.util.spec_from_file_location("smddp_sagemaker_environment_under_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


envmod = _load_environment_module()

# mpirun -np 2 on one host, rank 1; mpirun -np 8 over two hosts of 4, rank 5.
OMPI_2_ON_1 = {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2",
               "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}
OMPI_8_ON_2 = {"OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_SIZE": "8",
               "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "4"}
MAPPED_2_ON_1 = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
                 "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
MAPPED_8_ON_2 = {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4",
                 "MASTER_PORT": "29500"}


@pytest.mark.parametrize("environ, added", [
    ({}, {}),                                                           # no launcher
    ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}, {}),          # torchrun's, no mpirun
    ({"OMPI_COMM_WORLD_LOCAL_RANK": "0"}, {}),                          # not mpirun's whole set
    (OMPI_2_ON_1, MAPPED_2_ON_1),                                       # one host: 127.0.0.1
    ({**OMPI_2_ON_1, "RANK": "", "MASTER_PORT": " "}, MAPPED_2_ON_1),   # empty reads as unset
    ({**OMPI_2_ON_1, "RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "1234"},
     {"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}),                     # the user's win
    ({**OMPI_8_ON_2, "SMDDP_MASTER_ADDR": "10.0.0.7"}, {**MAPPED_8_ON_2, "MASTER_ADDR": "10.0.0.7"}),
    ({**OMPI_8_ON_2, "MASTER_ADDR": "algo-1", "SMDDP_MASTER_ADDR": "10.0.0.7"}, MAPPED_8_ON_2),
    ({**OMPI_8_ON_2, "LOCAL_WORLD_SIZE": "8"},                          # the user's local size: one host
     {**MAPPED_8_ON_2, "LOCAL_WORLD_SIZE": None, "MASTER_ADDR": "127.0.0.1"}),
])
def test_open_mpi_variables_map_onto_c10ds_and_the_users_win(environ, added):
    added = {k: v for k, v in added.items() if v is not None}
    before = dict(environ)
    assert envmod.mpi_environment(environ) == added
    assert environ == before, "mpi_environment must not write"
    env = dict(environ)
    assert envmod.apply_mpi_environment(env) == added
    assert env == {**before, **added}
    assert envmod.apply_mpi_environment(env) == {}, "a second pass adds nothing"


def test_open_mpi_across_hosts_without_master_addr_is_an_error_naming_it():
    with pytest.raises(RuntimeError, match="without MASTER_ADDR: set MASTER_ADDR") as e:
        envmod.mpi_environment(dict(OMPI_8_ON_2))
    assert "8 ranks, 4 on this host" in str(e.value) and "SMDDP_MASTER_ADDR" in str(e.value)
    # Not strict (at import): everything else, and MASTER_ADDR left for init to ask for.
    assert envmod.mpi_environment(dict(OMPI_8_ON_2), strict=False) == MAPPED_8_ON_2
    # Without OMPI_COMM_WORLD_LOCAL_SIZE nothing says the ranks share a host.
    unknown = {k: v for k, v in OMPI_2_ON_1.items() if k != "OMPI_COMM_WORLD_LOCAL_SIZE"}
    with pytest.raises(RuntimeError, match="2 ranks, an unknown number on this host"):
        envmod.mpi_environment(unknown)
    with pytest.raises(ValueError, match="OMPI_COMM_WORLD_RANK='one' is not an integer"):
        envmod.mpi_environment({**OMPI_2_ON_1, "OMPI_COMM_WORLD_RANK": "one"})


def test_launcher_values_are_c10ds_else_open_mpis():
    both = {"RANK": "3", "OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "4"}
    assert envmod.launcher_value("RANK", both) == 3
    assert envmod.launcher_value("RANK", {**both, "RANK": ""}) == 1
    assert envmod.launcher_value("LOCAL_WORLD_SIZE", both) == 4
    assert envmod.launcher_value("WORLD_SIZE", both) is None
    with pytest.raises(ValueError, match="'MASTER_PORT' is not one of"):
        envmod.launcher_value("MASTER_PORT", both)


# --------------------------------------------------------------------------
# init_process_group and the queries, torch's init replaced by a recorder
# --------------------------------------------------------------------------

@pytest.fixture
def compat_distributed(monkeypatch):
    """smdistributed.dataparallel.torch.distributed in this process, with no
    launcher variables set and torch's init_process_group recording its
    arguments; os.environ is restored afterwards."""
    saved = dict(os.environ)
    for name in list(os.environ):
        if name in C10D or name.startswith("OMPI_COMM_WORLD_") or name == "SMDDP_MASTER_ADDR":
            del os.environ[name]
    monkeypatch.syspath_prepend(REPO_ROOT)
    monkeypatch.syspath_prepend(COMPAT)
    try:
        import smdistributed.dataparallel.torch.distributed as sdist
        assert not sdist.is_initialized(), "this test needs a process with no default group"
        calls = []
        monkeypatch.setattr(sdist._dist, "init_process_group", lambda **kw: calls.append(kw))
        yield sdist, calls
    finally:
        os.environ.clear()
        os.environ.update(saved)


def test_init_process_group_passes_torchs_arguments_on_with_backend_smddp(compat_distributed):
    sdist, calls = compat_distributed
    store, options, timeout = object(), object(), datetime.timedelta(seconds=42)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # none of these warns
        sdist.init_process_group(init_method="tcp://10.0.0.1:23456", timeout=timeout, world_size=4,
                                 rank=2, group_name="g", pg_options=options, device_id=3)
        sdist.init_process_group(backend="smddp", store=store, world_size=2, rank=1)
        sdist.init_process_group(world_size=2, rank=0)  # env:// with both given needs no RANK
    with pytest.warns(RuntimeWarning, match="backend 'nccl' ignored"):
        sdist.init_process_group("nccl", "file:///tmp/x", timeout, 8, 7)  # torch's positional order
    assert calls == [
        dict(backend="smddp", init_method="tcp://10.0.0.1:23456", timeout=timeout, world_size=4, rank=2,
             group_name="g", pg_options=options, device_id=3),
        dict(backend="smddp", store=store, world_size=2, rank=1),
        dict(backend="smddp", world_size=2, rank=0),
        dict(backend="smddp", init_method="file:///tmp/x", timeout=timeout, world_size=8, rank=7),
    ]
    for bad, named in ((dict(bogus=1), "bogus"), (dict(_ranks=[0]), "_ranks")):
        with pytest.raises(TypeError, match=f"torch.distributed.init_process_group.*{named}"):
            sdist.init_process_group(**bad)
    with pytest.raises(TypeError, match="too many positional arguments"):
        sdist.init_process_group(*range(10))
    with pytest.raises(RuntimeError, match=r"\(RANK and WORLD_SIZE unset\); launch with torchrun, or "
                                           "with Open MPI's mpirun"):
        sdist.init_process_group()
    with pytest.raises(RuntimeError, match=r"\(WORLD_SIZE unset\)"):
        sdist.init_process_group(rank=0)
    assert len(calls) == 4, "a refused call must not reach torch"


def test_init_and_queries_under_open_mpi(compat_distributed):
    sdist, calls = compat_distributed
    # No launcher: torch's error for rank and size, as before; local defaults.
    with pytest.raises(ValueError, match="not been initialized"):
        sdist.get_rank()
    assert (sdist.is_available(), sdist.get_local_rank(), sdist.get_local_size()) == (False, 0, 1)
    os.environ.update(OMPI_2_ON_1, MASTER_PORT="1234")
    queries = (sdist.is_available(), sdist.get_rank(), sdist.get_world_size(), sdist.get_local_rank(),
               sdist.get_local_size())
    assert queries == (True, 1, 2, 1, 2)
    assert "RANK" not in os.environ, "queries read, never write"
    sdist.init_process_group()
    assert calls == [{"backend": "smddp"}]
    assert {k: os.environ.get(k) for k in C10D} == {**MAPPED_2_ON_1, "MASTER_PORT": "1234"}
    # Across hosts: env:// needs MASTER_ADDR, tcp:// does not.
    for name in C10D:
        os.environ.pop(name, None)
    os.environ.update(OMPI_8_ON_2)
    with pytest.raises(RuntimeError, match="without MASTER_ADDR"):
        sdist.init_process_group()
    assert len(calls) == 1
    sdist.init_process_group(init_method="tcp://10.0.0.1:1", world_size=8, rank=5)
    assert calls[-1] == dict(backend="smddp", init_method="tcp://10.0.0.1:1", world_size=8, rank=5)
    assert (sdist.get_rank(), sdist.get_world_size(), sdist.get_local_size()) == (5, 8, 4)


# --------------------------------------------------------------------------
# The example under Open MPI's mpirun, as SageMaker launches it
# --------------------------------------------------------------------------

# What each rank runs: the example, unchanged (runpy runs it as `python
# sagemaker_mnist.py` would), between records of what the rank saw.
_MPI_RANK = r"""
import json, os, runpy, sys
example, model_dir, out_dir = sys.argv[1:4]
c10d = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
rec = {"launched": {k: os.environ.get(k) for k in c10d}}
import smdistributed.dataparallel.torch.torch_smddp  # SageMaker's current way: maps at import
rec["imported"] = {k: os.environ.get(k) for k in c10d}
import smdistributed.dataparallel.torch.distributed as sdist
rec["before_init"] = [sdist.is_initialized(), sdist.is_available(), sdist.get_rank(),
                      sdist.get_world_size(), sdist.get_local_rank(), sdist.get_local_size()]
sys.argv = [example, "--model-dir", model_dir, "--epochs", "2"]
runpy.run_path(example, run_name="__main__")
import torch
rec["backend"] = torch.distributed.get_backend()
rec["after_init"] = [sdist.get_rank(), sdist.get_world_size()]
t = torch.full((3,), float(sdist.get_rank() + 1))
sdist.all_reduce(t)
rec["sum"] = t.tolist()
got = [torch.zeros(1, dtype=torch.int64) for _ in range(sdist.get_world_size())]
sdist.all_gather(got, torch.tensor([int(os.environ["OMPI_COMM_WORLD_RANK"])]))
rec["gathered"] = [int(g) for g in got]
sdist.barrier()
with open(os.path.join(out_dir, "rank%s.json" % os.environ["OMPI_COMM_WORLD_RANK"]), "w") as f:
    json.dump(rec, f)
torch.distributed.destroy_process_group()
"""


def _simulate_two_ranks(epochs, world=2, batch_size=64, lr=1.0):
    """The example's training as `world` data-parallel ranks would do it, in
    this one process and without torch.distributed: each rank's replica
    (its own random stream: dropout, the loaders' seeds; rank 0 alone runs
    the test loader) takes its DistributedSampler shard; the gradients are
    averaged as DDP does (each divided by world, then summed in rank order).
    Returns rank 0's printed losses and the final state dict."""
    import torch
    import torch.nn.functional as F

    src = open(EXAMPLE).read().replace("dist.init_process_group()", "")
    ns = {"__name__": "not_main"}
    exec(compile(src, EXAMPLE, "exec"), ns)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as each rank, one core apiece under mpirun: bitwise the same sums
    try:
        with torch.random.fork_rng():
            torch.manual_seed(1)
            net = ns["Net"]()
            rng = [torch.get_rng_state() for _ in range(world)]
            opt = torch.optim.Adadelta(net.parameters(), lr=lr)
            sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.7)
            train = ns["synthetic_mnist"](2048, seed=0)
            test = torch.utils.data.DataLoader(ns["synthetic_mnist"](512, seed=1), batch_size=256)
            samplers = [torch.utils.data.distributed.DistributedSampler(train, num_replicas=world, rank=r)
                        for r in range(world)]
            loaders = [torch.utils.data.DataLoader(train, batch_size=batch_size // world, sampler=s)
                       for s in samplers]
            losses = []
            for epoch in range(1, epochs + 1):
                batches = []
                for r in range(world):
                    samplers[r].set_epoch(epoch)
                    torch.set_rng_state(rng[r])
                    batches.append(iter(loaders[r]))
                    rng[r] = torch.get_rng_state()
                net.train()
                total = 0.0
                for step in zip(*batches):
                    grads = []
                    for r, (x, y) in enumerate(step):
                        torch.set_rng_state(rng[r])
                        opt.zero_grad()
                        loss = F.nll_loss(net(x), y)
                        loss.backward()
                        rng[r] = torch.get_rng_state()
                        grads.append([p.grad / world for p in net.parameters()])
                        total += loss.item() if r == 0 else 0.0
                    for i, p in enumerate(net.parameters()):
                        p.grad = grads[0][i]
                        for g in grads[1:]:
                            p.grad = p.grad + g[i]
                    opt.step()
                losses.append(total / len(loaders[0]))
                torch.set_rng_state(rng[0])
                net.eval()
                for _ in test:  # rank 0's test pass draws its loader's seed
                    pass
                rng[0] = torch.get_rng_state()
                sched.step()
            return losses, net.state_dict()
    finally:
        torch.set_num_threads(threads)


def test_the_guides_mnist_script_runs_unchanged_under_open_mpis_mpirun(tmp_path, monkeypatch):
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        pytest.skip("mpirun is not installed (Debian: apt-get install openmpi-bin; "
                    "scripts/bootstrap.sh installs it)")
    version = subprocess.run([mpirun, "--version"], capture_output=True, text=True, timeout=30).stdout
    assert "Open MPI" in version, f"this test needs Open MPI's mpirun (openmpi-bin); {mpirun} is: {version}"
    model_dir, out_dir = tmp_path / "model", tmp_path / "out"
    out_dir.mkdir()
    port = find_free_port()
    env = {k: v for k, v in _env().items()
           if k not in C10D and not k.startswith("OMPI_") and k != "SMDDP_MASTER_ADDR"}
    # Loopback only, in a container, as root or not; the user's MASTER_PORT must win.
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", MASTER_PORT=str(port))
    cmd = [mpirun, "-np", "2", "--oversubscribe", "--mca", "btl", "self,tcp", "--mca", "btl_tcp_if_include",
           "lo", "--mca", "oob_tcp_if_include", "lo", sys.executable, "-c", _MPI_RANK, EXAMPLE,
           str(model_dir), str(out_dir)]
    code, timed_out, output = run_with_deadline(cmd, timeout=240, env=env)
    assert code == 0 and not timed_out, output[-4000:]
    recs = [json.loads((out_dir / f"rank{r}.json").read_text()) for r in range(2)]
    for r, rec in enumerate(recs):
        mapped = {"RANK": str(r), "WORLD_SIZE": "2", "LOCAL_RANK": str(r), "LOCAL_WORLD_SIZE": "2",
                  "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        assert rec["launched"] == {**dict.fromkeys(C10D), "MASTER_PORT": str(port)}, rec
        assert rec["imported"] == mapped, rec
        assert rec["before_init"] == [False, True, r, 2, r, 2], rec
        assert rec["backend"] == "smddp" and rec["after_init"] == [r, 2], rec
        assert rec["sum"] == [3.0] * 3 and rec["gathered"] == [0, 1], rec  # 1 + 2; Open MPI's ranks in order
    # Training: rank 0's losses and checkpoint are those of two ranks simulated here.
    losses = [float(line.split()[-1]) for line in output.splitlines() if "train loss" in line]
    monkeypatch.syspath_prepend(REPO_ROOT)
    monkeypatch.syspath_prepend(COMPAT)
    want_losses, want_state = _simulate_two_ranks(epochs=2)
    assert losses == pytest.approx(want_losses, abs=1e-4), (losses, want_losses)
    import torch
    saved = torch.load(model_dir / "model.pt")
    assert sorted(k.removeprefix("module.") for k in saved) == sorted(want_state)
    for k, v in saved.items():
        torch.testing.assert_close(v, want_state[k.removeprefix("module.")], rtol=1e-4, atol=1e-6)
