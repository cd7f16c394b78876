"""The SMDDP_* parameters as a user meets them: every variable the Python
package names is one the library declares (each declared next to the code
that reads it, csrc/common/param.h), and `python -m torch_smddp.info` prints
every one of them. tests/python/test_docs.py checks that
docs/configuration.md lists them all.

And the rest of `python -m torch_smddp.info --json`, each part against a
fact found another way: torch and CUDA from this process and from what _C
links, the libfabric file from ldd and /proc/self/maps, FI_PROVIDER's
effect from libfabric itself, /dev/shm from statvfs and the segment's
closed form."""

import glob
import json
import os
import re
import shutil
import subprocess
import sys

import pytest
import torch

import torch_smddp
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


# --------------------------------------------------------------------------
# `python -m torch_smddp.info --json`: the report, against independent facts
# --------------------------------------------------------------------------

INFO_TIMEOUT = 120
# The environments the report runs in, each its own process: libfabric
# reads FI_PROVIDER once, when the process first calls it.
INFO_RUNS = {
    "plain": ({"LOCAL_WORLD_SIZE": "2", "WORLD_SIZE": "2"}, []),
    "fi_provider_tcp": ({"FI_PROVIDER": "tcp"}, ["--local-world", "4", "--hosts", "2"]),
    "conflict": ({"FI_PROVIDER": "efa", "SMDDP_FI_PROVIDER": "shm"}, []),
}


@pytest.fixture(scope="module")
def info_runs():
    """Each INFO_RUNS entry as (exit code, stdout, stderr), run side by side."""
    procs = {}
    for name, (extra, flags) in INFO_RUNS.items():
        env = {k: v for k, v in os.environ.items()
               if k not in ("FI_PROVIDER", "SMDDP_FI_PROVIDER", "LOCAL_WORLD_SIZE", "WORLD_SIZE")
               and not k.startswith("SMDDP_SHM")}
        env.update(extra)
        procs[name] = subprocess.Popen([sys.executable, "-m", "torch_smddp.info", "--json", *flags],
                                       env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                       text=True)
    out = {}
    for name, p in procs.items():
        try:
            stdout, stderr = p.communicate(timeout=INFO_TIMEOUT)
        except subprocess.TimeoutExpired:
            for q in procs.values():
                q.kill()
            raise
        out[name] = (p.returncode, stdout, stderr)
    return out


def _report(info_runs, name):
    rc, stdout, stderr = info_runs[name]
    return rc, json.loads(stdout), stderr  # one JSON object, nothing else on stdout


def _libfabric_in_maps(pid="self"):
    with open(f"/proc/{pid}/maps") as f:
        return {line.split()[-1] for line in f if "libfabric" in line.split()[-1]}


def test_info_json_torch_cuda_and_devices(info_runs):
    rc, r, stderr = _report(info_runs, "plain")
    assert rc == 0, stderr
    assert r["torch_smddp"] == torch_smddp.__version__
    assert r["torch"]["running"] == torch.__version__
    assert r["torch"]["cxx11_abi_running"] == bool(torch._C._GLIBCXX_USE_CXX11_ABI)
    # _C loaded in this process, so it was built against this torch.
    assert r["torch"]["built"] == torch.__version__ and r["torch"]["match"], r["torch"]
    assert r["cuda"]["torch_cuda_running"] == torch.version.cuda
    assert r["cuda"]["available"] == torch.cuda.is_available()
    # What _C links says whether the build has CUDA: no libcudart, CPU only.
    so = _C.__file__
    linked = subprocess.run(["ldd", so], capture_output=True, text=True, timeout=30, check=True).stdout
    cuda_linked = "libcudart" in linked or "libnccl" in linked
    assert r["cuda"]["built_with_cuda"] == cuda_linked
    if not cuda_linked:
        assert r["cuda"]["archs"] == "CPU only" and r["cuda"]["nccl"] == "CPU only", r["cuda"]
        assert r["devices"] == ["cpu"]
    else:
        assert r["devices"] == ["cpu", "cuda"]
        assert r["cuda"]["archs"] not in (None, "CPU only") and r["cuda"]["nccl"], r["cuda"]
    assert r["cuda"]["reason"], r["cuda"]  # why the build has or lacks CUDA


def test_info_json_names_the_libfabric_this_process_loaded(info_runs):
    rc, r, stderr = _report(info_runs, "plain")
    assert rc == 0, stderr
    lf = r["libfabric"]
    # The loader's view: the file _C's dependency resolves to, and the one
    # mapped into this process (which imported the same _C).
    linked = subprocess.run(["ldd", _C.__file__], capture_output=True, text=True, timeout=30,
                            check=True).stdout
    resolved = [line.split("=>")[1].split("(")[0].strip() for line in linked.splitlines()
                if "libfabric" in line and "=>" in line]
    assert len(resolved) == 1, linked
    assert os.path.isfile(lf["loaded"]), lf
    assert lf["loaded"] == os.path.realpath(resolved[0])
    assert _libfabric_in_maps() == {lf["loaded"]}
    assert lf["version"] == _C.libfabric_version()
    if shutil.which("fi_info"):  # the same library, asked by libfabric's own tool
        fi = subprocess.run(["ldd", shutil.which("fi_info")], capture_output=True, text=True,
                            timeout=30).stdout
        if os.path.realpath(lf["loaded"]) in {os.path.realpath(p.split("=>")[1].split("(")[0].strip())
                                             for p in fi.splitlines() if "libfabric" in p and "=>" in p}:
            v = subprocess.run(["fi_info", "--version"], capture_output=True, text=True,
                               timeout=30).stdout
            api = re.search(r"libfabric api: (\d+\.\d+)", v)
            assert api and api.group(1) == lf["version"], v
    assert lf["loaded_is_linked"] == (os.path.realpath(lf["linked"]) == lf["loaded"])
    assert lf["fi_provider"] is None and lf["smddp_fi_provider"] is None
    assert "shm" in lf["providers"] and "tcp;ofi_rxm" in lf["providers"], lf["providers"]
    assert lf["choice_one_host"] == {"provider": "shm", "error": None,
                                     "reason": "all ranks report the same host: shared memory"}
    assert lf["choice_several_hosts"]["provider"] == "tcp;ofi_rxm"


def test_info_json_takes_fi_provider_into_account(info_runs):
    rc, r, stderr = _report(info_runs, "fi_provider_tcp")
    assert rc == 0, stderr
    lf = r["libfabric"]
    assert lf["fi_provider"] == "tcp"
    assert lf["providers"] == ["tcp;ofi_rxm"]  # libfabric itself left the rest out
    one = lf["choice_one_host"]
    assert one["provider"] == "tcp;ofi_rxm" and "FI_PROVIDER=tcp hides shm" in one["reason"], one
    assert "FI_PROVIDER=tcp allows it" in lf["choice_several_hosts"]["reason"]
    assert not r["shm"]["shm_provider_offered"]
    # 4 ranks per host over 2 hosts: 256 KiB slots, 16 deep, a server per
    # rank, and each rank's all-gather ring (8 x 128 KiB).
    shm = r["shm"]
    assert (shm["local_world"], shm["hosts"], shm["local_world_from"]) == (4, 2, "--local-world")
    slots = 4 * (4 + 1) * 16 * 262144 + 4 * 8 * 131072
    assert slots <= shm["need_bytes"] < slots + (1 << 20), shm


def test_info_json_reports_a_conflict_and_fails(info_runs):
    rc, r, stderr = _report(info_runs, "conflict")
    assert rc == 1, stderr  # group creation would fail the same way
    for key in ("choice_one_host", "choice_several_hosts"):
        err = r["libfabric"][key]["error"]
        assert err and "SMDDP_FI_PROVIDER=shm" in err and "FI_PROVIDER=efa hides" in err, err
        assert "unset FI_PROVIDER" in err, err


def test_info_dev_shm_check(monkeypatch):
    from torch_smddp import info

    st = os.statvfs("/dev/shm")
    free, total = st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize
    r = info.report(local_world=2, hosts=1)["shm"]
    assert r["total_bytes"] == total
    assert abs(r["free_bytes"] - free) < (64 << 20)  # others may write meanwhile
    # 2 servers x (2 ranks + a result) x 4 deep x 128 KiB, and 2 all-gather
    # rings of 8 x 128 KiB.
    slots = 2 * 3 * 4 * 131072 + 2 * 8 * 131072
    assert slots <= r["need_bytes"] < slots + (1 << 20)
    assert r["ok"] == (r["need_bytes"] <= r["free_bytes"])
    # A huge world: 64 ranks per host over 2 hosts with 256 MiB slots.
    monkeypatch.setenv("SMDDP_SHM_SLOT_BYTES", "256M")
    r = info.report(local_world=64, hosts=2)["shm"]
    need = 64 * 65 * 16 * (256 << 20) + 64 * 8 * 131072  # the slots, then the rings
    assert need <= r["need_bytes"] < need + (1 << 20)
    assert not r["ok"]
    m = re.fullmatch(r"too small: need (.+), have (.+) free \(of (.+)\); docker: --shm-size=(\d+)([mg])",
                     r["verdict"])
    assert m, r["verdict"]
    suggested = int(m.group(4)) << (20 if m.group(5) == "m" else 30)
    assert suggested >= need
    # Bad input names itself: the environment's, and the flag's.
    monkeypatch.delenv("SMDDP_SHM_SLOT_BYTES")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "eight")
    r = info.report()["shm"]
    assert not r["ok"] and "LOCAL_WORLD_SIZE='eight'" in r["error"], r
    with pytest.raises(SystemExit) as e:
        info.main(["--local-world", "0"])
    assert e.value.code == 2
