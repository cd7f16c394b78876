"""TORCH_DISTRIBUTED_USE_TORCHCOMMS=1 (torch 2.13): c10d sends every backend
through torchcomms.new_comm. Where torchcomms is missing or is PyPI's
placeholder, torch keeps the c10d path and smddp works unchanged; where a
torchcomms is there, smddp (which has no torchcomms backend) fails with an
error saying so, not with torchcomms' own."""
import os
import subprocess
import sys

from mp_harness import REPO_ROOT, find_free_port

HERE = os.path.dirname(os.path.abspath(__file__))

SCRIPT = """
import os, torch, torch.distributed as dist
import torch_smddp
try:
    dist.init_process_group("smddp", rank=0, world_size=1, init_method="tcp://127.0.0.1:{port}")
    t = torch.ones(3)
    dist.all_reduce(t)
    print("OK", t.tolist())
    dist.destroy_process_group()
except Exception as e:
    print("ERROR", type(e).__name__, e)
"""


def _run(extra_path):
    env = dict(os.environ, TORCH_DISTRIBUTED_USE_TORCHCOMMS="1",
               PYTHONPATH=os.pathsep.join(filter(None, [extra_path, REPO_ROOT, os.environ.get("PYTHONPATH")])))
    out = subprocess.run([sys.executable, "-c", SCRIPT.format(port=find_free_port())], env=env,
                         capture_output=True, text=True, timeout=120)
    return out.stdout + out.stderr


def test_without_a_torchcomms_smddp_works_under_the_flag():
    out = _run(None)
    assert "OK [1.0, 1.0, 1.0]" in out, out[-3000:]


def test_with_a_torchcomms_smddp_says_it_has_no_torchcomms_backend():
    out = _run(os.path.join(HERE, "fake_torchcomms"))
    assert "ERROR" in out and "smddp has no torchcomms backend" in out, out[-3000:]
    assert "torchcomms: no backend named" not in out, out[-3000:]
