"""Installing as a user does (docs/install.md): in a fresh venv holding
torch 2.13.0 (CPU) and nothing else, the documented `pip install .` builds
the CPU path against that torch and leaves it byte for byte as it was
(tests/install/check_installed.py checks that and the rest against pip's
metadata, ldd and /proc/self/maps). The build takes libfabric from a
prefix named by SMDDP_LIBFABRIC_ROOT (Debian's libfabric copied into EFA's
layout, standing in for /opt/amazon/efa), and the extension loads that
copy. The installed package runs a world-2 allreduce from outside the
source tree (checked against the closed form), and offers torchft as the
optional [ft] extra, which the core does not need. `python -m build` in
its own isolated venv has no torch to build against, and says so at once.
Costs a full compile of the extension (a few minutes). make check-cuda
does the same with the CUDA torch."""

import os
import re
import shutil
import subprocess
import sys
import tempfile
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mp_harness import REPO_ROOT, run_with_deadline  # noqa: E402

SCRIPT = r'''
import os, torch, torch.distributed as dist
import torch_smddp
dist.init_process_group("smddp")
r, w = dist.get_rank(), dist.get_world_size()
t = torch.arange(1000, dtype=torch.float32) * (r + 1)
dist.all_reduce(t)
assert torch.equal(t, torch.arange(1000, dtype=torch.float32) * (w * (w + 1) // 2)), t[:4]
if r == 0:
    print("INSTALLED-OK", torch_smddp.__file__, flush=True)
dist.destroy_process_group()
'''


def _build_failure(text: str, tmp: str) -> str:
    """What a failed build said and what the machine had: the compiler's
    and make's error lines wherever they are in the output (the traceback
    that ends it hides them), the output's tail, free disk and memory."""
    marks = re.compile(r"error:|\*\*\*|Killed|No space|fatal|signal", re.I)
    errors = [l for l in text.splitlines() if marks.search(l) and "Traceback" not in l][:40]
    disk = []
    for where in (REPO_ROOT, tmp, tempfile.gettempdir()):
        st = os.statvfs(where)
        disk.append(f"{where}: {st.f_bavail * st.f_frsize / 2**30:.1f} GiB free")
    with open("/proc/meminfo") as f:
        mem = [l.strip() for l in f if l.startswith(("MemTotal", "MemAvailable"))]
    return ("error lines:\n" + "\n".join(errors) + "\n" + "; ".join(disk + mem) +
            "\ntail:\n" + text[-2500:])


CHECK = os.path.join(REPO_ROOT, "tests", "install", "check_installed.py")


def _fake_efa_prefix(root: str) -> str:
    """Debian's libfabric (libfabric1, libfabric-dev), copied into the
    layout of AWS's EFA installer: include/rdma and lib64."""
    files = subprocess.run(["dpkg", "-L", "libfabric1", "libfabric-dev"], capture_output=True,
                           text=True, check=True).stdout.split()
    lib = next(f for f in files if re.search(r"/libfabric\.so\.\d+\.\d+\.\d+$", f))
    inc = os.path.dirname(next(f for f in files if f.endswith("/rdma/fabric.h")))
    prefix = os.path.join(root, "opt-amazon-efa")
    os.makedirs(os.path.join(prefix, "lib64"))
    shutil.copytree(inc, os.path.join(prefix, "include", "rdma"))
    shutil.copy2(lib, os.path.join(prefix, "lib64"))
    name = os.path.basename(lib)
    os.symlink(name, os.path.join(prefix, "lib64", "libfabric.so.1"))
    os.symlink(name, os.path.join(prefix, "lib64", "libfabric.so"))
    return prefix


def _pip_install_repo(pip_cmd, env, tmp):
    code, timed_out, text = run_with_deadline(pip_cmd, timeout=1500, env=env)
    if not timed_out and code != 0:
        # Once (CI, 2026-11-28) the compile stopped half way with the
        # compiler's own message scrolled out of the tail: say what the
        # machine looked like, then build once more (a compile error fails
        # again; a killed or starved compiler need not).
        first = _build_failure(text, tmp)
        code, timed_out, text = run_with_deadline(pip_cmd, timeout=1500, env=env)
        assert not timed_out and code == 0, (
            "pip install . failed twice; the first time:\n" + first +
            "\nthe second time:\n" + _build_failure(text, tmp))
        warnings.warn("pip install . failed once, then built:\n" + first)
    assert not timed_out and code == 0, "pip install . failed:\n" + _build_failure(text, tmp)
    return text


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


def test_pip_install_builds_against_the_installed_torch_and_runs_from_a_fresh_venv():
    with tempfile.TemporaryDirectory(prefix="smddp-install-") as tmp:
        env = dict(os.environ)
        env.pop("PYTHONPATH", None)
        venv = os.path.join(tmp, "venv")
        subprocess.run(["python3", "-m", "venv", venv], check=True, timeout=120)
        py = os.path.join(venv, "bin", "python")
        code, timed_out, text = run_with_deadline(
            [py, "-m", "pip", "install", "-q", "torch==2.13.0"], timeout=600, env=env)
        assert not timed_out and code == 0, "pip install torch==2.13.0 failed:\n" + text[-4000:]
        before = os.path.join(tmp, "torch-before.json")
        subprocess.run([py, CHECK, "--record", before], check=True, timeout=120, env=env)

        prefix = _fake_efa_prefix(tmp)
        env_build = dict(env, SMDDP_LIBFABRIC_ROOT=prefix)
        log = _pip_install_repo([py, "-m", "pip", "install", "-v", REPO_ROOT], env_build, tmp)
        # The build log says what it chose and why.
        assert "CUDA path OFF: SMDDP_WITH_CUDA=auto:" in log and "CPU-only build" in log, log[-4000:]
        assert f"SMDDP_LIBFABRIC_ROOT={prefix}" in log, log[-4000:]

        code, timed_out, text = run_with_deadline(
            [py, CHECK, "--torch-before", before, "--expect", "cpu", "--libfabric-prefix", prefix],
            timeout=300, env=env, cwd=tmp)
        assert not timed_out and code == 0 and "CHECK-INSTALLED-OK" in text, text[-4000:]

        run_dir = os.path.join(tmp, "elsewhere")
        os.makedirs(run_dir)
        script = os.path.join(run_dir, "allreduce.py")
        with open(script, "w") as f:
            f.write(SCRIPT)
        env["OMP_NUM_THREADS"] = "1"
        code, timed_out, text = run_with_deadline(
            [py, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", script],
            timeout=120, env=env, cwd=run_dir)
        tail = text[-3000:]
        assert not timed_out and code == 0, tail
        line = next(l for l in text.splitlines() if l.startswith("INSTALLED-OK"))
        assert line.split()[1].startswith(venv), f"imported from outside the venv: {line}"
        # torchft is the optional [ft] extra: the core runs without it (above),
        # and torch_smddp.torchft says how to get it.
        code, _, text = run_with_deadline(
            [py, "-c", "import importlib.metadata as md\n"
                       "reqs = md.requires('torch-smddp')\n"
                       "assert any(r.startswith('torchft==0.2.0') and 'extra' in r for r in reqs), reqs\n"
                       "import importlib.util, sys\n"
                       "assert importlib.util.find_spec('torchft') is None\n"
                       "try:\n    import torch_smddp.torchft\n"
                       "except ImportError as e:\n    print('NO-FT', e)\n"],
            timeout=120, env=env, cwd=run_dir)
        assert code == 0 and "NO-FT" in text and "torch-smddp[ft]" in text, text[-3000:]


def test_bad_build_settings_fail_at_once_naming_what_is_wrong():
    """Before any compile: SMDDP_WITH_CUDA=on where torch has no CUDA, a
    value that means nothing, and a libfabric prefix without libfabric."""
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
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
