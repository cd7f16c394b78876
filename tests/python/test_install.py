"""The install's quick checks, before any compile: `python -m build` in
its own isolated venv has no torch to build against, and says so at once;
bad build settings fail naming what is wrong; and on the CPU torch the
build decides, and says, that the CUDA path is off. The full install (a
fresh venv, `pip install .`, the installed package running an allreduce
outside the tree) is tests/install/fresh_venv_install.py, which
`make check-install` runs (make test builds it in the background while
this suite runs); `make check-cuda` does the same with the CUDA torch."""

import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mp_harness import REPO_ROOT, run_with_deadline  # noqa: E402


def test_python_m_build_in_its_own_isolation_says_there_is_no_torch_at_once():
    with tempfile.TemporaryDirectory(prefix="smddp-build-") as tmp:
        env = dict(os.environ)
        env.pop("PYTHONPATH", None)
        code, timed_out, text = run_with_deadline(
            [sys.executable, "-m", "build", "--wheel", "--outdir", tmp, REPO_ROOT], timeout=300, env=env)
        assert not timed_out and code != 0, text[-3000:]
        assert "cannot import torch" in text and "--no-isolation" in text, text[-3000:]
        # At once: before CMake, so no compile.
        assert "Building CXX object" not in text and "-- Configuring" not in text, text[-3000:]


def test_bad_build_settings_fail_at_once_naming_what_is_wrong():
    """Before any compile: SMDDP_WITH_CUDA=on where torch has no CUDA, a
    value that means nothing, and a libfabric prefix without libfabric."""
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    # Left to itself (auto) on this CPU torch, the build is the CPU one, and
    # the version says so.
    code, timed_out, text = run_with_deadline([sys.executable, "setup.py", "--version"], timeout=120, env=env)
    assert not timed_out and code == 0, text[-2000:]
    assert text.strip().splitlines()[-1].endswith("+pt213cpu"), text[-2000:]
    for value, words in (("on", ["SMDDP_WITH_CUDA=on", "CPU-only build"]),
                         ("maybe", ["SMDDP_WITH_CUDA='maybe'", "auto, on or off"])):
        code, timed_out, text = run_with_deadline(
            [sys.executable, "setup.py", "--version"], timeout=120,
            env=dict(env, SMDDP_WITH_CUDA=value))
        assert not timed_out and code != 0 and all(w in text for w in words), (value, text[-2000:])
        assert "Traceback" not in text, text[-2000:]
    with tempfile.TemporaryDirectory(prefix="smddp-prefix-") as tmp:
        empty = os.path.join(tmp, "efa")
        os.makedirs(os.path.join(empty, "lib64"))
        code, timed_out, text = run_with_deadline(
            ["cmake", "-S", REPO_ROOT, "-B", os.path.join(tmp, "b"), "-DSMDDP_BUILD_EXTENSION=OFF",
             "-DSMDDP_BUILD_TESTS=OFF"], timeout=120, env=dict(env, SMDDP_LIBFABRIC_ROOT=empty))
        assert not timed_out and code != 0, text[-2000:]
        assert f"SMDDP_LIBFABRIC_ROOT={empty} holds no usable libfabric" in " ".join(text.split()), text[-2000:]
