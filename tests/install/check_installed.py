"""Checks an installed torch-smddp from the interpreter that runs this file,
against facts taken independently of the package (pip's metadata, the
torch files' hashes, ldd, /proc/self/maps). Used by
tests/install/fresh_venv_install.py (a fresh venv with the CPU torch) and by
`make check-cuda` (.venv-cuda, the CUDA torch).

    check_installed.py --record FILE
        before `pip install .`: write the environment's torch (version and
        the sha256 of torch/__init__.py) to FILE, importing nothing.
    check_installed.py --torch-before FILE --expect cpu|cuda [--libfabric-prefix P]
                       [--mismatch-checkout DIR]
        after it: torch is byte for byte what FILE recorded; torch_smddp
        imports from this environment's site-packages; the build is the
        expected one (CUDA or CPU only) and registered smddp for the right
        devices; the wheel's version names torch and CUDA; it requires a
        torch range, not a pin; libfabric came from P when given; and a
        checkout built against another torch (DIR) fails to import with
        the one error that names both torches.
Prints CHECK-INSTALLED-OK at the end; any failed check exits non-zero
naming it.
"""

import argparse
import hashlib
import importlib.metadata as md
import importlib.util
import json
import os
import subprocess
import sys
import sysconfig


def torch_fingerprint() -> dict:
    spec = importlib.util.find_spec("torch")
    assert spec and spec.origin, "no torch in this environment"
    with open(spec.origin, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    return {"version": md.version("torch"), "init_sha256": digest, "file": spec.origin}


def fail(msg: str) -> None:
    print(f"CHECK-INSTALLED-FAILED: {msg}", flush=True)
    sys.exit(1)


def check(cond: bool, msg: str) -> None:
    if not cond:
        fail(msg)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--record")
    ap.add_argument("--torch-before")
    ap.add_argument("--expect", choices=["cpu", "cuda"])
    ap.add_argument("--libfabric-prefix")
    ap.add_argument("--mismatch-checkout")
    a = ap.parse_args()
    if a.record:
        with open(a.record, "w") as f:
            json.dump(torch_fingerprint(), f)
        print("recorded", torch_fingerprint())
        return 0

    with open(a.torch_before) as f:
        before = json.load(f)
    now = torch_fingerprint()
    check(now == before, f"torch changed under the install: before {before}, after {now}")
    print(f"torch unchanged: {now['version']}, torch/__init__.py sha256 {now['init_sha256'][:16]}...")

    import torch
    import torch.distributed as dist

    import torch_smddp
    from torch_smddp import _build_info as bi

    site = os.path.realpath(sysconfig.get_paths()["purelib"])
    check(os.path.realpath(torch_smddp.__file__).startswith(site),
          f"torch_smddp imported from {torch_smddp.__file__}, not this environment's {site}")
    check(bi.TORCH_VERSION == torch.__version__,
          f"built against torch {bi.TORCH_VERSION}, running {torch.__version__}")

    version = md.version("torch-smddp")
    major, minor = torch.__version__.split("+")[0].split(".")[:2]
    cuda_tag = "cu" + torch.version.cuda.replace(".", "") if torch.version.cuda else None
    devices = dist.Backend.backend_capability.get("smddp")
    if a.expect == "cuda":
        check(cuda_tag is not None, f"--expect cuda, but torch {torch.__version__} has no CUDA")
        check(bi.WITH_CUDA and torch_smddp._C.built_with_cuda(),
              f"the CUDA path was not built: {bi.CUDA_REASON}")
        # The archs smddp_cuda was built for: TORCH_CUDA_ARCH_LIST's, or sm_75 and up plus PTX.
        want = os.environ.get("SMDDP_EXPECT_ARCHS", "75-real;80-real;86-real;89-real;90-real;100-real;"
                                                    "120-real;120-virtual")
        check(bi.NCCL_VERSION and bi.CUDA_ARCHS == want,
              f"NCCL {bi.NCCL_VERSION}, archs {bi.CUDA_ARCHS} (expected {want})")
        check(version.endswith(f"+pt{major}{minor}{cuda_tag}"), f"wheel version {version}")
        check(devices == ["cpu", "cuda"], f"smddp registered for {devices}")
    else:
        check(not bi.WITH_CUDA and not torch_smddp._C.built_with_cuda(),
              f"expected the CPU build, got CUDA ({bi.CUDA_REASON})")
        check(version.endswith(f"+pt{major}{minor}cpu"), f"wheel version {version}")
        check(devices == ["cpu"], f"smddp registered for {devices}")
    print(f"torch-smddp {version}: {'CUDA ' + bi.CUDA_VERSION + ', NCCL ' + bi.NCCL_VERSION + ', archs ' + bi.CUDA_ARCHS if bi.WITH_CUDA else 'CPU only'} [{bi.CUDA_REASON}]; registered for {devices}")

    reqs = md.requires("torch-smddp") or []
    torch_reqs = [r for r in reqs if r.replace(" ", "").startswith("torch") and "extra" not in r
                  and not r.startswith("torchft")]
    check(len(torch_reqs) == 1 and "==" not in torch_reqs[0] and ">=" in torch_reqs[0],
          f"the wheel must require a torch range, not a pin: {reqs}")
    files = [str(f) for f in md.files("torch-smddp") or []]
    shipped = [f for f in files if ".dist-info/" not in f and not f.startswith("..")]
    check(shipped and all(f.startswith("torch_smddp/") for f in shipped),
          f"the wheel holds more than torch_smddp/: {shipped}")
    check(not {"torch_smddp/cluster.py", "torch_smddp/model.py"} & set(shipped), str(shipped))

    ext = torch_smddp._C.__file__
    ldd = subprocess.run(["ldd", ext], capture_output=True, text=True).stdout
    linked = next((l.split("=>")[1].split("(")[0].strip() for l in ldd.splitlines()
                   if "libfabric.so" in l and "=>" in l), None)
    with open("/proc/self/maps") as f:
        loaded = sorted({l.split()[-1] for l in f if "libfabric.so" in l})
    print(f"libfabric: ldd resolves {linked}; loaded {loaded}; built from {bi.LIBFABRIC_ORIGIN}")
    if a.libfabric_prefix:
        p = os.path.realpath(a.libfabric_prefix)
        check(linked and os.path.realpath(linked).startswith(p),
              f"ldd resolves libfabric to {linked}, not the copy under {p}:\n{ldd}")
        check(loaded and all(os.path.realpath(x).startswith(p) for x in loaded),
              f"the process loaded {loaded}, not the copy under {p}")
        check(os.path.realpath(bi.LIBFABRIC_LIBRARY).startswith(p), bi.LIBFABRIC_LIBRARY)

    # What `python -m torch_smddp.info --json` says agrees with the above.
    r = subprocess.run([sys.executable, "-m", "torch_smddp.info", "--json", "--local-world", "1"],
                       capture_output=True, text=True, timeout=300)
    check(r.returncode == 0, f"info --json failed: {r.stderr[-2000:]}")
    rep = json.loads(r.stdout)
    check(rep["torch"]["match"] and rep["torch"]["built"] == torch.__version__, f"info: {rep['torch']}")
    check(rep["cuda"]["built_with_cuda"] == (a.expect == "cuda") and rep["devices"] == devices,
          f"info: cuda {rep['cuda']}, devices {rep['devices']}")
    if a.expect == "cuda":
        check(rep["cuda"]["nccl"] == bi.NCCL_VERSION and rep["cuda"]["archs"] == bi.CUDA_ARCHS,
              f"info: {rep['cuda']}")
    else:
        check(rep["cuda"]["toolkit"] == "CPU only", f"info: {rep['cuda']}")
    check(loaded and os.path.realpath(rep["libfabric"]["loaded"]) == os.path.realpath(loaded[0]),
          f"info says libfabric {rep['libfabric']['loaded']} was loaded; /proc/self/maps: {loaded}")
    print(f"info --json: torch {rep['torch']['built']} match, cuda {rep['cuda']['toolkit']}, "
          f"devices {rep['devices']}, libfabric {rep['libfabric']['loaded']}")

    if a.mismatch_checkout:
        info = os.path.join(a.mismatch_checkout, "torch_smddp", "_build_info.py")
        check(os.path.exists(info), f"no build in {a.mismatch_checkout} to import (run make build)")
        spec = importlib.util.spec_from_file_location("other_build", info)
        other = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(other)
        check(other.TORCH_VERSION.split("+")[0] != torch.__version__.split("+")[0],
              f"{a.mismatch_checkout} is built against this same torch {other.TORCH_VERSION}")
        r = subprocess.run([sys.executable, "-c",
                            f"import sys; sys.path.insert(0, {a.mismatch_checkout!r}); import torch_smddp"],
                           capture_output=True, text=True, cwd="/", timeout=300)
        err = r.stderr.strip().splitlines()
        last = err[-1] if err else ""
        check(r.returncode != 0 and last.startswith("ImportError:") and other.TORCH_VERSION in last
              and torch.__version__ in last and "pip install --force-reinstall" in last
              and "undefined symbol" not in r.stderr,
              f"importing a build for torch {other.TORCH_VERSION} under {torch.__version__}: "
              f"rc {r.returncode}\n{r.stderr[-3000:]}")
        print(f"a build for torch {other.TORCH_VERSION} under {torch.__version__}: {last}")
    print("CHECK-INSTALLED-OK", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
