"""The SMDDP_* parameters as a user meets them: the README's configuration
table lists exactly the parameters the library declares (each declared next
to the code that reads it, csrc/common/param.h), with the same type and
default, and `python -m torch_smddp.info` prints every one of them."""

import os
import re
import subprocess
import sys

import torch_smddp  # noqa: F401  (loads _C)
from torch_smddp import _C

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _readme_table():
    rows = {}
    with open(os.path.join(REPO, "README.md")) as f:
        for line in f:
            m = re.match(r"^\| `(SMDDP_\w+)` \| (\w+) \| ([^|]*) \|", line)
            if m:
                rows[m.group(1)] = (m.group(2), m.group(3).strip())
    return rows


def test_readme_lists_every_declared_parameter():
    declared = {env: (typ, default) for env, typ, default, _doc in _C.params()}
    documented = _readme_table()
    assert len(declared) >= 14, declared
    assert sorted(declared) == sorted(documented), (
        "README table and declarations differ: only declared "
        f"{sorted(set(declared) - set(documented))}, only in README "
        f"{sorted(set(documented) - set(declared))}")
    for env, (typ, default) in declared.items():
        doc_type, doc_default = documented[env]
        assert doc_type == typ, (env, doc_type, typ)
        # The README writes a string default "" as "(auto)"/"hostname"/...,
        # and "0 (auto)" for numbers with an automatic meaning.
        if typ in ("int", "bytes"):
            assert doc_default.split()[0] == default, (env, doc_default, default)


def test_info_prints_every_parameter():
    out = subprocess.run([sys.executable, "-m", "torch_smddp.info"], capture_output=True,
                         text=True, timeout=120, check=True).stdout
    for env, _typ, _default, _doc in _C.params():
        assert env in out, env
