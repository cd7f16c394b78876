"""pip install . (or python -m build --wheel) -- builds torch_smddp._C by
driving the same CMakeLists.txt the Makefile uses (one build graph), against
the torch of the build environment: pyproject.toml pins torch==2.13.0 for
pip's isolated build, and `pip install --no-build-isolation .` uses the
torch already installed."""

import os
import shutil
import subprocess
import sys

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext


class CMakeExtension(Extension):
    def __init__(self, name):
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        src = os.path.abspath(os.path.dirname(__file__))
        out_dir = os.path.abspath(os.path.dirname(self.get_ext_fullpath(ext.name)))
        build_dir = os.path.join(os.path.abspath(self.build_temp), "cmake")
        # pip's isolated builds each get a new environment: a CMake cache
        # left by another one points at a torch that no longer exists.
        cache = os.path.join(build_dir, "CMakeCache.txt")
        if os.path.exists(cache):
            with open(cache) as f:
                same = any(line.startswith("Python3_EXECUTABLE:") and
                           line.rstrip("\n").split("=", 1)[1] == sys.executable for line in f)
            if not same:
                shutil.rmtree(build_dir)
        os.makedirs(build_dir, exist_ok=True)
        subprocess.check_call([
            "cmake", "-S", src, "-B", build_dir,
            f"-DPython3_EXECUTABLE={sys.executable}",
            "-DSMDDP_BUILD_TESTS=OFF",
            f"-DSMDDP_EXT_OUTPUT_DIR={out_dir}",
            "-DCMAKE_BUILD_TYPE=Release",
        ] + (["-DCMAKE_CXX_COMPILER_LAUNCHER=ccache"] if shutil.which("ccache") else []))
        subprocess.check_call(["cmake", "--build", build_dir, "--target", "_C", "-j",
                               os.environ.get("SMDDP_BUILD_JOBS", "2")])


setup(
    name="torch-smddp",
    version="0.1.0",
    description="SageMaker-style distributed data parallel backend (smddp) for PyTorch c10d",
    packages=find_packages(include=["torch_smddp", "torch_smddp.*"]),
    ext_modules=[CMakeExtension("torch_smddp._C")],
    cmdclass={"build_ext": CMakeBuild},
    python_requires=">=3.10",
    install_requires=["torch==2.13.0"],
    # Optional extras: 'torch-smddp[sagemaker]' adds SageMaker's import paths
    # (smdistributed.dataparallel..., a distribution of its own,
    # compat/sagemaker, so it never shadows SageMaker's library);
    # 'torch-smddp[ft]' adds torchft for torch_smddp.torchft, smddp as a
    # torchft process group (docs/fault-tolerance.md). The core imports neither.
    extras_require={"sagemaker": ["torch-smddp-sagemaker"], "ft": ["torchft==0.2.0"]},
)
