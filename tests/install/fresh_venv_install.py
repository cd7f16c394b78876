"""Installing as a user does (docs/install.md), in two steps that
`make check-install` runs one after the other (`make test` runs the first
in the background, at idle priority, while pytest runs: it is a full
compile of the extension, several minutes of CPU):

    fresh_venv_install.py build DIR
        a fresh venv in DIR holding torch 2.13.0 (CPU) and nothing else;
        Debian's libfabric copied into the layout of AWS's EFA installer
        (DIR/opt-amazon-efa, standing in for /opt/amazon/efa); then the
        documented `pip install .`, with SMDDP_LIBFABRIC_ROOT naming that
        prefix, its output in DIR/pip-install.log.
    fresh_venv_install.py check DIR
        the build log says what it chose and why; check_installed.py finds
        torch byte for byte as it was, and the CPU build loading the
        prefix's libfabric (it checks against pip's metadata, ldd and
        /proc/self/maps); the installed package runs a world-2 allreduce
        under torchrun from outside the source tree, against the closed
        form; and torchft is the optional [ft] extra, which the core does
        not need.

`make check-cuda` does the same with the CUDA torch. Exits non-zero naming
the first thing that failed."""

import os
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python", "harness"))
from mp_harness import REPO_ROOT, run_with_deadline  # noqa: E402

CHECK = os.path.join(HERE, "check_installed.py")
TORCH_PIN = "torch==2.13.0"

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

FT_EXTRA = (
    "import importlib.metadata as md\n"
    "reqs = md.requires('torch-smddp')\n"
    "assert any(r.startswith('torchft==0.2.0') and 'extra' in r for r in reqs), reqs\n"
    "import importlib.util\n"
    "assert importlib.util.find_spec('torchft') is None\n"
    "try:\n    import torch_smddp.torchft\n"
    "except ImportError as e:\n    print('NO-FT', e)\n")


def fail(msg: str) -> None:
    print(f"fresh_venv_install: FAILED: {msg}", flush=True)
    sys.exit(1)


def clean_env() -> dict:
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    return env


def build_failure(text: str, where: str) -> str:
    """What a failed build said and what the machine had: the compiler's
    and make's error lines wherever they are in the output (the traceback
    that ends it hides them), the output's tail, free disk and memory."""
    marks = re.compile(r"error:|\*\*\*|Killed|No space|fatal|signal", re.I)
    errors = [l for l in text.splitlines() if marks.search(l) and "Traceback" not in l][:40]
    disk = []
    for path in (REPO_ROOT, where, tempfile.gettempdir()):
        st = os.statvfs(path)
        disk.append(f"{path}: {st.f_bavail * st.f_frsize / 2**30:.1f} GiB free")
    with open("/proc/meminfo") as f:
        mem = [l.strip() for l in f if l.startswith(("MemTotal", "MemAvailable"))]
    return ("error lines:\n" + "\n".join(errors) + "\n" + "; ".join(disk + mem) +
            "\ntail:\n" + text[-2500:])


def fake_efa_prefix(root: str) -> str:
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


def pip_install_repo(pip_cmd, env, where) -> str:
    code, timed_out, text = run_with_deadline(pip_cmd, timeout=1500, env=env)
    if not timed_out and code != 0:
        # Once (CI, 2026-11-28) the compile stopped half way with the
        # compiler's own message scrolled out of the tail: say what the
        # machine looked like, then build once more (a compile error fails
        # again; a killed or starved compiler need not).
        first = build_failure(text, where)
        print("fresh_venv_install: pip install . failed once; building again. The first time:\n" + first,
              flush=True)
        code, timed_out, text = run_with_deadline(pip_cmd, timeout=1500, env=env)
    if timed_out or code != 0:
        fail("pip install . failed:\n" + build_failure(text, where))
    return text


def build(root: str) -> None:
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root)
    env = clean_env()
    venv = os.path.join(root, "venv")
    subprocess.run(["python3", "-m", "venv", venv], check=True, timeout=120)
    py = os.path.join(venv, "bin", "python")
    code, timed_out, text = run_with_deadline([py, "-m", "pip", "install", "-q", TORCH_PIN],
                                              timeout=600, env=env)
    if timed_out or code != 0:
        fail(f"pip install {TORCH_PIN} failed:\n" + text[-4000:])
    subprocess.run([py, CHECK, "--record", os.path.join(root, "torch-before.json")],
                   check=True, timeout=120, env=env)
    prefix = fake_efa_prefix(root)
    log = pip_install_repo([py, "-m", "pip", "install", "-v", REPO_ROOT],
                           dict(env, SMDDP_LIBFABRIC_ROOT=prefix), root)
    with open(os.path.join(root, "pip-install.log"), "w") as f:
        f.write(log)
    print(f"fresh_venv_install: built into {venv}", flush=True)


def check(root: str) -> None:
    venv = os.path.join(root, "venv")
    py = os.path.join(venv, "bin", "python")
    prefix = os.path.join(root, "opt-amazon-efa")
    try:
        with open(os.path.join(root, "pip-install.log")) as f:
            log = f.read()
    except FileNotFoundError:
        fail(f"no build in {root}: run `fresh_venv_install.py build {root}` first")
    # The build log says what it chose and why.
    if not ("CUDA path OFF: SMDDP_WITH_CUDA=auto:" in log and "CPU-only build" in log):
        fail("the build log does not say why the CUDA path is off:\n" + log[-4000:])
    if f"SMDDP_LIBFABRIC_ROOT={prefix}" not in log:
        fail(f"the build log does not name SMDDP_LIBFABRIC_ROOT={prefix}:\n" + log[-4000:])
    env = clean_env()
    run_dir = os.path.join(root, "elsewhere")
    os.makedirs(run_dir, exist_ok=True)
    code, timed_out, text = run_with_deadline(
        [py, CHECK, "--torch-before", os.path.join(root, "torch-before.json"), "--expect", "cpu",
         "--libfabric-prefix", prefix], timeout=300, env=env, cwd=run_dir)
    if timed_out or code != 0 or "CHECK-INSTALLED-OK" not in text:
        fail("check_installed.py:\n" + text[-4000:])
    script = os.path.join(run_dir, "allreduce.py")
    with open(script, "w") as f:
        f.write(SCRIPT)
    env["OMP_NUM_THREADS"] = "1"
    code, timed_out, text = run_with_deadline(
        [py, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", script],
        timeout=120, env=env, cwd=run_dir)
    if timed_out or code != 0:
        fail("the world-2 allreduce from outside the tree:\n" + text[-3000:])
    line = next((l for l in text.splitlines() if l.startswith("INSTALLED-OK")), "")
    if not line.split()[1:2] or not line.split()[1].startswith(venv):
        fail(f"imported from outside the venv: {line or text[-2000:]}")
    # torchft is the optional [ft] extra: the core runs without it (above),
    # and torch_smddp.torchft says how to get it.
    code, _, text = run_with_deadline([py, "-c", FT_EXTRA], timeout=120, env=env, cwd=run_dir)
    if code != 0 or "NO-FT" not in text or "torch-smddp[ft]" not in text:
        fail("the [ft] extra:\n" + text[-3000:])
    print("fresh_venv_install: CHECK-OK", flush=True)


def main() -> None:
    if len(sys.argv) != 3 or sys.argv[1] not in ("build", "check"):
        sys.exit("usage: fresh_venv_install.py build|check DIR")
    (build if sys.argv[1] == "build" else check)(os.path.abspath(sys.argv[2]))


if __name__ == "__main__":
    main()
