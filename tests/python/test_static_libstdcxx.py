"""One libstdc++ per process (cmake/shared_libstdcxx.cmake).

A compiler that links libstdc++ statically into shared libraries put a
second copy of it into _C on a lent GPU machine (its CXX was such a g++), and
every smddp log line crashed there: the loader bound half of _C's references
to torch's libstdc++.so.6 and half to the private copy. Here a g++ (and a
clang++) wrapper that adds -static-libstdc++ builds the probe module, with
and without smddp_use_shared_libstdcxx, and the module is loaded after torch.
The oracle is the text the probe must write, formatted by Python.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VALUE = 12345
EXPECTED = f"[probe {VALUE}]"

LOAD = textwrap.dedent(f"""
    import ctypes, sys
    import torch  # loads the shared libstdc++.so.6 first, as in a training job
    m = ctypes.CDLL(sys.argv[1])
    buf = ctypes.create_string_buffer(64)
    m.smddp_libstdcxx_probe({VALUE}, buf, 64)
    print(buf.value.decode())
""")


def _build(tmp_path, compiler: str, fix: bool):
    """Builds the probe module with `compiler` wrapped to add
    -static-libstdc++; returns (module path, configure output)."""
    wrapper = tmp_path / f"static-{compiler}"
    wrapper.write_text(f'#!/bin/sh\nexec {compiler} "$@" -static-libstdc++\n')
    wrapper.chmod(0o755)
    src = tmp_path / f"src-{compiler}-{fix}"
    src.mkdir()
    (src / "CMakeLists.txt").write_text(textwrap.dedent(f"""
        cmake_minimum_required(VERSION 3.18)
        project(probe CXX)
        include({ROOT}/cmake/shared_libstdcxx.cmake)
        add_library(probe MODULE {ROOT}/cmake/libstdcxx_probe.cc)
        {"smddp_use_shared_libstdcxx(probe)" if fix else ""}
    """))
    build = tmp_path / f"build-{compiler}-{fix}"
    conf = subprocess.run(["cmake", "-S", str(src), "-B", str(build), f"-DCMAKE_CXX_COMPILER={wrapper}"],
                          capture_output=True, text=True, timeout=120)
    assert conf.returncode == 0, conf.stdout + conf.stderr
    made = subprocess.run(["cmake", "--build", str(build)], capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stdout + made.stderr
    return build / "libprobe.so", conf.stdout


def _exports_libstdcxx(module) -> bool:
    syms = subprocess.run(["nm", "-D", "--defined-only", str(module)], capture_output=True, text=True,
                          check=True).stdout
    return "_ZNSt6locale7classicEv" in syms


def _load_after_torch(module) -> str:
    out = subprocess.run([sys.executable, "-c", LOAD, str(module)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, f"loading {module} after torch: exit {out.returncode}\n{out.stderr[-2000:]}"
    return out.stdout.strip()


@pytest.mark.parametrize("compiler", ["g++", "clang++"])
def test_a_compiler_that_links_libstdcxx_statically_still_gives_one_libstdcxx(tmp_path, compiler):
    if not shutil.which(compiler):
        pytest.skip(f"{compiler} is not installed")
    plain, _ = _build(tmp_path, compiler, fix=False)
    # The wrapper does what the GPU machine's g++ did: the module carries
    # its own libstdc++ (so this test runs the case it is about).
    assert _exports_libstdcxx(plain), f"{compiler} -static-libstdc++ exported no libstdc++ of its own"
    fixed, configure = _build(tmp_path, compiler, fix=True)
    assert "links libstdc++ statically into shared libraries" in configure, configure
    assert not _exports_libstdcxx(fixed)
    assert _load_after_torch(fixed) == EXPECTED


def test_the_extension_carries_no_libstdcxx_of_its_own():
    import torch_smddp

    module = torch_smddp._C.__file__
    assert not _exports_libstdcxx(module), f"{module} exports a libstdc++ of its own"
