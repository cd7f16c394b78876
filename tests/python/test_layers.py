"""scripts/check_layers.py: the layer rule of docs/design.md ("Layers").

The tree passes, docs/design.md's table agrees with the script's, and a
copy of csrc/ with a wrong include planted in it fails with a line that
names the file, the line and the include. Runs under pytest, and as
`python3 tests/python/test_layers.py` (ctest runs it that way: no torch,
no pytest needed).
"""
import pathlib
import shutil
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "check_layers.py"


def run_check(root: pathlib.Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), "--root", str(root), *extra],
                          capture_output=True, text=True, timeout=60)


def planted(edits: dict) -> subprocess.CompletedProcess:
    """check_layers.py over a copy of csrc/ with `edits` (path: appended line)."""
    with tempfile.TemporaryDirectory() as tmp:
        copy = pathlib.Path(tmp)
        shutil.copytree(ROOT / "csrc", copy / "csrc")
        for rel, line in edits.items():
            path = copy / "csrc" / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "a", encoding="utf-8") as f:
                f.write(line + "\n")
        return run_check(copy)


def line_of(rel: str) -> int:
    """The line number a line appended to csrc/`rel` gets."""
    return len((ROOT / "csrc" / rel).read_text(encoding="utf-8").splitlines()) + 1


def test_the_tree_and_the_design_table_pass():
    r = run_check(ROOT, "--design", str(ROOT / "docs" / "design.md"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "every include in csrc/ points down" in r.stdout


def test_an_include_that_points_up_is_named():
    rel = "engine/communicator.cc"
    r = planted({rel: '#include "hostpath/fusion_scheduler.h"'})
    assert r.returncode == 1
    assert (f"csrc/{rel}:{line_of(rel)}: engine may not include hostpath/fusion_scheduler.h "
            f"(it links: common, transport, observe)") in r.stdout, r.stdout
    assert r.stdout.count("may not include") == 1, r.stdout


def test_an_include_below_that_the_library_does_not_link_is_named():
    # reduce/ lies below engine/, but smddp_engine does not link smddp_reduce.
    rel = "engine/communicator.cc"
    r = planted({rel: '#include "reduce/shard_plan.h"'})
    assert r.returncode == 1
    assert (f"csrc/{rel}:{line_of(rel)}: engine may not include reduce/shard_plan.h "
            f"(it links: common, transport, observe)") in r.stdout, r.stdout


def test_a_declared_link_nothing_includes_and_a_cmake_that_disagrees_fail():
    with tempfile.TemporaryDirectory() as tmp:
        root = pathlib.Path(tmp)
        (root / "csrc" / "transport").mkdir(parents=True)
        (root / "csrc" / "transport" / "x.cc").write_text("int x;\n")
        (root / "CMakeLists.txt").write_text(
            "smddp_folder_library(smddp_common SOURCES a.cc LINKS Threads::Threads)\n"
            "smddp_folder_library(smddp_reduce\n  SOURCES b.cc\n"
            "  LINKS smddp_transport smddp_common)\n")
        r = run_check(root)
    assert r.returncode == 1
    out = r.stdout
    assert ("csrc/transport/:1: transport declares a link to common but includes nothing "
            "from it") in out, out
    assert "smddp_reduce links ['common', 'transport'], scripts/check_layers.py says ['common']" \
        in out, out
    assert "no smddp_folder_library(smddp_engine ...)" in out, out


def test_torch_and_cuda_headers_stay_where_they_belong():
    r = planted({
        "observe/timeline.cc": "#include <torch/torch.h>",
        "reduce/shard_plan.h": "#include <c10/core/Device.h>",
        "common/error.cc": "#include <cuda_runtime.h>",
        "backend/work.cc": "#include <nccl.h>",
        "device/sim_device.cc": "#include <c10/cuda/CUDAStream.h>",
    })
    assert r.returncode == 1
    out = r.stdout
    assert f"csrc/observe/timeline.cc:{line_of('observe/timeline.cc')}: observe may not include " \
           "<torch/torch.h> (torch headers: backend/ only)" in out, out
    assert "reduce may not include <c10/core/Device.h>" in out, out
    assert "common may not include <cuda_runtime.h> (CUDA and NCCL headers: device/cuda/ and " \
           "backend/cuda_context.cc only)" in out, out
    assert "backend may not include <nccl.h>" in out, out
    assert "device may not include <c10/cuda/CUDAStream.h>" in out, out
    assert out.count("may not include") == 5, out


def test_the_places_that_may_include_them_pass():
    r = planted({
        "backend/work.cc": "#include <ATen/ATen.h>",
        "backend/cuda_context.cc": "#include <cuda_runtime.h>",
        "device/cuda/extra.cc": "#include <nccl.h>",
        "hostpath/host_path.cc": '#include "algorithms/algorithms.h"',
    })
    assert r.returncode == 0, r.stdout + r.stderr


def test_a_folder_outside_the_table_fails():
    r = planted({"newthing/x.cc": '#include "common/error.h"'})
    assert r.returncode == 1
    assert "csrc/newthing/x.cc:1: newthing/ is not in the layer table" in r.stdout, r.stdout


if __name__ == "__main__":
    tests = [f for name, f in sorted(globals().items()) if name.startswith("test_")]
    for t in tests:
        t()
        print(f"ok {t.__name__}")
