"""The SMDDP_* parameters as a user meets them: every variable the Python
package names is one the library declares (each declared next to the code
that reads it, csrc/common/param.h), and `python -m torch_smddp.info` prints
every one of them. tests/python/test_docs.py checks that
docs/configuration.md lists them all."""

import glob
import os
import re
import subprocess
import sys

import torch_smddp  # noqa: F401  (loads _C)
from torch_smddp import _C

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Names the package mentions that are not environment variables: the CMake
# option of the CUDA build.
NOT_PARAMETERS = {"SMDDP_WITH_CUDA"}


def test_every_variable_the_package_names_is_declared():
    declared = {env for env, _typ, _default, _doc in _C.params()}
    assert len(declared) >= 14, declared
    named = {}
    for path in glob.glob(os.path.join(REPO, "torch_smddp", "*.py")):
        with open(path) as f:
            for name in re.findall(r"\bSMDDP_[A-Z0-9_]*[A-Z0-9]\b", f.read()):
                named.setdefault(name, os.path.basename(path))
    missing = {n: f for n, f in named.items() if n not in declared and n not in NOT_PARAMETERS}
    assert not missing, f"named in torch_smddp/ but not declared with SMDDP_PARAM_*: {missing}"


def test_info_prints_every_parameter():
    out = subprocess.run([sys.executable, "-m", "torch_smddp.info"], capture_output=True,
                         text=True, timeout=120, check=True).stdout
    for env, _typ, _default, _doc in _C.params():
        assert env in out, env
