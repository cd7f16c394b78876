"""pip install . -- builds torch_smddp._C against the torch ALREADY INSTALLED
in the environment, by driving the same CMakeLists.txt the Makefile uses
(one build graph). docs/install.md is the user's page; in short:

* torch is never installed, upgraded or downgraded by this build. The
  build requirements (pyproject.toml) leave torch out, and the torch that
  CMake compiles against is the one the installing interpreter sees with
  pip's build isolation taken off its path. The wheel requires the range
  of torch releases the code supports, not a pin, and says in its local
  version which torch and CUDA it was built for (0.1.0+pt214cu130).
* SMDDP_WITH_CUDA=auto (the default): the CUDA path is built when the
  installed torch has CUDA and nvcc is found; on (an error naming what is
  missing otherwise) or off.
* libfabric: SMDDP_LIBFABRIC_ROOT (or LIBFABRIC_ROOT), /opt/amazon/efa,
  then pkg-config (third_party/cmake/FindLibfabric.cmake).
* SMDDP_BUILD_DIR keeps the CMake build in a folder of one's choice (make
  check-cuda reuses it for the CUDA Catch2 tests); SMDDP_CMAKE_ARGS adds
  CMake arguments; SMDDP_BUILD_JOBS sets the parallel jobs (default 2).
"""

import json
import os
import shlex
import shutil
import subprocess
import sys

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

VERSION = "0.1.0"
# The torch releases whose C++ API the code (and csrc/backend/compat) covers.
TORCH_RANGE = "torch>=2.11,<2.15"
# sm_75 and up plus PTX: what `make check-cuda` checks (scripts/check_cuda_archs.sh).
DEFAULT_ARCHS = "7.5;8.0;8.6;8.9;9.0;10.0;12.0+PTX"


def log(msg: str) -> None:
    print(f"torch-smddp build: {msg}", file=sys.stderr, flush=True)


class BuildError(RuntimeError):
    pass


def installed_env() -> dict:
    """The environment with pip's build isolation taken off: pip puts an
    overlay on PYTHONPATH whose sitecustomize hides the environment's own
    site-packages (and so its torch) from the build. The build must see
    that torch, and only that torch."""
    env = dict(os.environ)
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep)
             if p and "pip-build-env-" not in p]
    if paths:
        env["PYTHONPATH"] = os.pathsep.join(paths)
    else:
        env.pop("PYTHONPATH", None)
    if "PYTHONPATH" in os.environ and "pip-build-env-" in os.environ["PYTHONPATH"]:
        env.pop("PYTHONNOUSERSITE", None)  # pip sets it for the build only
    return env


def torch_python() -> str:
    return os.environ.get("SMDDP_TORCH_PYTHON") or sys.executable


_FACTS = None


def torch_facts() -> dict:
    """The installed torch, asked in a child with isolation taken off."""
    global _FACTS
    if _FACTS is None:
        code = ("import json, torch; print(json.dumps({'version': torch.__version__, "
                "'cuda': torch.version.cuda, 'abi': int(torch._C._GLIBCXX_USE_CXX11_ABI), "
                "'file': torch.__file__}))")
        py = torch_python()
        r = subprocess.run([py, "-c", code], env=installed_env(), capture_output=True, text=True)
        if r.returncode != 0:
            raise BuildError(
                f"torch-smddp builds against the torch installed in the environment, and {py} "
                "cannot import torch:\n" + r.stderr.strip()[-1500:] + "\n"
                "Install torch first (for example `pip install torch`; a CUDA build of torch gives "
                "the CUDA build of torch-smddp), then `pip install .` again. With `python -m build`, "
                "pass --no-isolation, or set SMDDP_TORCH_PYTHON to the python whose torch to build "
                "against (docs/install.md).")
        _FACTS = json.loads(r.stdout.strip().splitlines()[-1])
    return _FACTS


def local_version() -> str:
    """'+pt214cu130' / '+pt213cpu', as torch-scatter's wheels say it."""
    try:
        facts = torch_facts()
        cuda = cuda_choice()[0]
    except BuildError as e:
        # Fail before pip resolves the requirements: it would otherwise
        # fetch a torch from the index only for this build to fail after.
        log("error: " + str(e))
        sys.exit(1)
    major, minor = facts["version"].split("+")[0].split(".")[:2]
    tag = "cu" + facts["cuda"].replace(".", "") if facts["cuda"] and cuda else "cpu"
    return f"+pt{major}{minor}{tag}"


def find_nvcc():
    """(nvcc, CUDA home) or (None, where it looked)."""
    looked = []
    for var in ("CUDA_HOME", "CUDA_PATH"):
        home = os.environ.get(var)
        if home:
            nvcc = os.path.join(home, "bin", "nvcc")
            looked.append(f"{var}={home}")
            if os.access(nvcc, os.X_OK):
                return nvcc, home
    on_path = shutil.which("nvcc")
    looked.append("PATH")
    if on_path:
        # /usr/local/bin/nvcc is often a link or a wrapper script: the
        # toolkit is where nvcc says it runs from (torch would guess
        # /usr/local and miss the headers).
        here = None
        r = subprocess.run([on_path, "--dryrun", "-c", "-x", "cu", os.devnull, "-o", os.devnull],
                           capture_output=True, text=True)
        for line in (r.stdout + r.stderr).splitlines():
            if line.startswith("#$ _HERE_="):
                here = line.split("=", 1)[1].strip()
        real = os.path.join(here, "nvcc") if here else os.path.realpath(on_path)
        if os.access(real, os.X_OK):
            return real, os.path.dirname(os.path.dirname(real))
    looked.append("/usr/local/cuda")
    if os.access("/usr/local/cuda/bin/nvcc", os.X_OK):
        return "/usr/local/cuda/bin/nvcc", "/usr/local/cuda"
    return None, ", ".join(looked)


def nvcc_version(nvcc: str) -> str:
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout
    for word in out.replace(",", " ").split():
        if word.startswith("V") and word[1:2].isdigit():
            return word[1:]
    return "?"


_CUDA = None


def cuda_choice():
    """(on, reason, nvcc, home) from SMDDP_WITH_CUDA and what is installed."""
    global _CUDA
    if _CUDA is not None:
        return _CUDA
    raw = os.environ.get("SMDDP_WITH_CUDA", "auto").strip().lower() or "auto"
    words = {"auto": "auto", "on": "on", "1": "on", "true": "on", "yes": "on",
             "off": "off", "0": "off", "false": "off", "no": "off"}
    if raw not in words:
        raise BuildError(f"SMDDP_WITH_CUDA={raw!r}: expected auto, on or off")
    mode = words[raw]
    if mode == "off":
        _CUDA = (False, "SMDDP_WITH_CUDA=off", None, None)
        return _CUDA
    facts = torch_facts()
    nvcc, home = find_nvcc()
    missing = []
    if not facts["cuda"]:
        missing.append(f"the installed torch {facts['version']} is a CPU-only build "
                       "(torch.version.cuda is None)")
    if not nvcc:
        missing.append(f"no CUDA compiler: nvcc was not found (looked in {home}); set CUDA_HOME "
                       "to the CUDA toolkit")
    if not missing:
        have = nvcc_version(nvcc)
        if have.split(".")[0] != facts["cuda"].split(".")[0]:
            raise BuildError(
                f"nvcc {nvcc} is CUDA {have}, but the installed torch {facts['version']} was built "
                f"with CUDA {facts['cuda']}: the major versions must match. Set CUDA_HOME to a CUDA "
                f"{facts['cuda'].split('.')[0]} toolkit, or SMDDP_WITH_CUDA=off for the CPU build.")
        _CUDA = (True, f"SMDDP_WITH_CUDA={mode}: torch {facts['version']} has CUDA {facts['cuda']} "
                       f"and nvcc {nvcc} is CUDA {have}", nvcc, home)
    elif mode == "on":
        raise BuildError("SMDDP_WITH_CUDA=on, but " + "; and ".join(missing) + ".")
    else:
        _CUDA = (False, "SMDDP_WITH_CUDA=auto: " + "; and ".join(missing), None, None)
    return _CUDA


def cuda_archs() -> str:
    """TORCH_CUDA_ARCH_LIST ('8.0;9.0+PTX') as CMAKE_CUDA_ARCHITECTURES
    ('80-real;90-real;90-virtual')."""
    given = os.environ.get("TORCH_CUDA_ARCH_LIST", "").strip()
    out = []
    for item in (given or DEFAULT_ARCHS).replace(" ", ";").split(";"):
        if not item:
            continue
        ptx = item.endswith("+PTX")
        num = item[:-4] if ptx else item
        digits = num.replace(".", "")
        if not (digits[:-1].isdigit() and (digits[-1].isdigit() or digits[-1] in "af")):
            raise BuildError(f"TORCH_CUDA_ARCH_LIST={given!r}: cannot read {item!r} (expected "
                             "numbers such as 8.0;9.0+PTX)")
        out.append(f"{digits}-real")
        if ptx:
            out.append(f"{digits}-virtual")
    return ";".join(out)


class CMakeExtension(Extension):
    def __init__(self, name):
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        try:
            self._build(ext)
        except BuildError as e:
            # One message, not a traceback through setuptools.
            log("error: " + str(e))
            sys.exit(1)

    def _build(self, ext):
        src = os.path.abspath(os.path.dirname(__file__))
        out_dir = os.path.abspath(os.path.dirname(self.get_ext_fullpath(ext.name)))
        build_dir = os.path.abspath(os.environ.get("SMDDP_BUILD_DIR") or
                                    os.path.join(self.build_temp, "cmake"))
        py = torch_python()
        facts = torch_facts()
        on, reason, nvcc, home = cuda_choice()
        log(f"torch {facts['version']} from {os.path.dirname(facts['file'])} ({py})")
        log(f"CUDA path {'ON' if on else 'OFF'}: {reason}")
        # A CMake cache left by another interpreter, torch or CUDA choice
        # points at things that no longer hold.
        cache = os.path.join(build_dir, "CMakeCache.txt")
        want = {"Python3_EXECUTABLE": py, "SMDDP_WITH_CUDA": "ON" if on else "OFF"}
        if os.path.exists(cache):
            have = {}
            with open(cache) as f:
                for line in f:
                    if "=" in line and not line.startswith(("#", "//")):
                        key, value = line.rstrip("\n").split("=", 1)
                        have[key.split(":")[0]] = value
            if any(have.get(k) != v for k, v in want.items()):
                shutil.rmtree(build_dir)
        os.makedirs(build_dir, exist_ok=True)
        args = [
            "cmake", "-S", src, "-B", build_dir,
            f"-DPython3_EXECUTABLE={py}",
            "-DSMDDP_BUILD_TESTS=OFF",
            f"-DSMDDP_EXT_OUTPUT_DIR={out_dir}",
            "-DCMAKE_BUILD_TYPE=Release",
            f"-DSMDDP_CUDA_REASON={reason}",
        ]
        env = installed_env()
        if on:
            archs = cuda_archs()
            args += ["-DSMDDP_WITH_CUDA=ON", f"-DCUDAToolkit_ROOT={home}",
                     f"-DCMAKE_CUDA_COMPILER={nvcc}", f"-DCMAKE_CUDA_ARCHITECTURES={archs}"]
            env["CUDA_HOME"] = home
            env.setdefault("TORCH_CUDA_ARCH_LIST", DEFAULT_ARCHS)
            log(f"CUDA archs {archs} (from {'TORCH_CUDA_ARCH_LIST' if os.environ.get('TORCH_CUDA_ARCH_LIST') else 'the default: sm_75 and up, plus PTX'})")
        else:
            args += ["-DSMDDP_WITH_CUDA=OFF"]
        if shutil.which("ccache"):
            args.append("-DCMAKE_CXX_COMPILER_LAUNCHER=ccache")
        args += shlex.split(os.environ.get("SMDDP_CMAKE_ARGS", ""))
        subprocess.check_call(args, env=env)
        subprocess.check_call(["cmake", "--build", build_dir, "--target", "_C", "-j",
                               os.environ.get("SMDDP_BUILD_JOBS", "2")], env=env)
        with open(os.path.join(out_dir, "_build_info.py")) as f:
            info = f.read()
        lib = next((l.split("=", 1)[1].strip().strip('"') for l in info.splitlines()
                    if l.startswith("LIBFABRIC_LIBRARY")), "?")
        log(f"built _C into {out_dir}: torch {facts['version']}, CUDA {'ON' if on else 'OFF'}, "
            f"libfabric {lib}")


setup(
    name="torch-smddp",
    version=VERSION + local_version(),
    description="SageMaker-style distributed data parallel backend (smddp) for PyTorch c10d",
    packages=find_packages(include=["torch_smddp", "torch_smddp.*"]),
    ext_modules=[CMakeExtension("torch_smddp._C")],
    cmdclass={"build_ext": CMakeBuild},
    python_requires=">=3.10",
    # The range the code supports, never a pin: pip keeps the user's torch.
    install_requires=[TORCH_RANGE],
    # Optional extras: 'torch-smddp[sagemaker]' adds SageMaker's import paths
    # (smdistributed.dataparallel..., a distribution of its own,
    # compat/sagemaker, so it never shadows SageMaker's library);
    # 'torch-smddp[ft]' adds torchft for torch_smddp.torchft, smddp as a
    # torchft process group (docs/fault-tolerance.md). The core imports neither.
    extras_require={"sagemaker": ["torch-smddp-sagemaker"], "ft": ["torchft==0.2.0"]},
)
