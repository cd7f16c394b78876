"""The running torch must be the one torch_smddp._C was built against.

A C++ extension links torch's C++ symbols, which change between torch
releases and between the two C++ ABIs: loading _C under another torch ends
in an undefined-symbol error or worse. So ``import torch_smddp`` compares
the running torch with ``_build_info`` (written by CMake beside _C) before
it loads _C, and raises one ImportError naming both and the command that
rebuilds."""

from __future__ import annotations

REBUILD = ("pip install --force-reinstall --no-deps --no-cache-dir <torch-smddp source>  "
           "(docs/install.md; from a checkout: make build)")


def _release(version: str) -> str:
    """'2.14.1+cu130' -> '2.14.1': the C++ ABI follows the release; the
    local label (cpu, cu130) names the build's devices, which info reports."""
    return version.split("+", 1)[0]


def mismatch(built_version: str, built_abi: bool, running_version: str, running_abi: bool) -> str | None:
    """Why a _C built against (built_version, built_abi) cannot load under
    the running torch, or None when it can."""
    problems = []
    if _release(built_version) != _release(running_version):
        problems.append(f"torch {built_version}, but this process runs torch {running_version}")
    if bool(built_abi) != bool(running_abi):
        problems.append(f"_GLIBCXX_USE_CXX11_ABI={int(built_abi)}, but the running torch uses "
                        f"{int(running_abi)}")
    if not problems:
        return None
    return ("torch_smddp's compiled extension (_C) was built against " + "; and ".join(problems) +
            ". It only loads under the torch it was built against. Rebuild it against this torch: "
            + REBUILD)


def check_torch_matches_build(torch) -> None:
    try:
        from . import _build_info
    except ImportError:
        # A checkout with no build yet: importing _C says what is missing.
        return
    why = mismatch(_build_info.TORCH_VERSION, _build_info.TORCH_CXX11_ABI, torch.__version__,
                   bool(torch._C._GLIBCXX_USE_CXX11_ABI))
    if why:
        raise ImportError(why)
