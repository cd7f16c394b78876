"""SageMaker scripts run unchanged (compat/sagemaker): the guide's MNIST-style
script under torchrun trains (its checkpoint classifies held-out data, a
closed form of the synthetic task), and the API's edges: SageMaker names
that mean nothing here raise errors saying so, SMDATAPARALLEL_* and
SageMaker's launcher variables draw a warning naming what replaces them."""
import os
import subprocess
import sys

import pytest

from mp_harness import REPO_ROOT, run_with_deadline

COMPAT = os.path.join(REPO_ROOT, "compat", "sagemaker")


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
for call in (lambda: dist.init_process_group("nccl"), lambda: dist.get_rank(group=object()),
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
    assert lines[0].startswith("TypeError") and "takes no arguments" in lines[0], lines
    assert lines[1].startswith("ValueError") and "group.WORLD" in lines[1], lines
    assert lines[2].startswith("AttributeError") and "some_other_function" in lines[2], lines
    assert lines[3].startswith("RuntimeError") and "torchrun" in lines[3], lines
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
