#!/usr/bin/env python3
"""Every include in csrc/ follows its library's declared links (docs/design.md, "Layers").

Reads each `#include "folder/..."` and `#include <...>` of every file under
csrc/ and prints, for each one a folder may not have:

    csrc/engine/x.cc:12: engine may not include hostpath/y.h (it links: common, ...)

A folder may include only the folders it links (its row of LAYERS, which
must match its LINKS in CMakeLists.txt), links only folders below it, and
links none it does not include.

Also: only backend/ includes torch headers (<torch/...>, <ATen/...>,
<c10/...>), and only device/cuda/ and backend/cuda_context.cc include CUDA or
NCCL headers. Exits 1 when anything is wrong. The CMake build runs it before
it compiles (a wrong include fails the build), and so does `make test`.

    scripts/check_layers.py [--root DIR] [--design FILE] [--stamp FILE]

--design checks that the layer table in that file (docs/design.md) names the
same folders, in the same order, with the same "may include" as LAYERS here.
--stamp touches FILE on success (the build's record that it ran).
"""
from __future__ import annotations

import argparse
import pathlib
import re
import sys

# The folders of csrc/, bottom up, and the libraries each links besides
# itself (smddp_<folder> in CMakeLists.txt): what it may include. A folder
# links only folders below it, and declares each one it includes, no more.
# docs/design.md's "Layers" table and CMakeLists.txt say the same (--design
# checks the first, every run the second).
LAYERS: list[tuple[str, list[str]]] = [
    ("common", []),
    ("transport", ["common"]),
    ("reduce", ["common"]),
    ("observe", ["common", "transport"]),
    ("device", ["common"]),
    ("server", ["common", "transport", "reduce"]),
    ("engine", ["common", "transport", "observe"]),
    ("algorithms", ["common", "reduce", "observe", "engine"]),
    ("hostpath", ["common", "transport", "reduce", "observe", "server", "engine", "algorithms"]),
    ("backend", ["common", "transport", "reduce", "observe", "device", "server", "engine",
                 "algorithms", "hostpath"]),
]

TORCH = re.compile(r"^(torch|ATen|c10)/")
CUDA = re.compile(r"^(cuda\w*|nccl\w*|cublas\w*|cusparse\w*|curand\w*|cufft\w*|cusolver\w*|"
                  r"nvml|nvrtc|nvtx\w*)\.h$|^(cub|thrust|nvtx3|c10/cuda|ATen/cuda)/")
INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')
SOURCES = ("*.h", "*.hpp", "*.cc", "*.cpp", "*.cu", "*.cuh")


def may_include_torch(rel: str) -> bool:
    return rel.startswith("backend/")


def may_include_cuda(rel: str) -> bool:
    return rel.startswith("device/cuda/") or rel == "backend/cuda_context.cc"


def check_tree(csrc: pathlib.Path) -> list[str]:
    """Every offending include under `csrc`, as "file:line: why" lines."""
    allowed = {folder: set(links) | {folder} for folder, links in LAYERS}
    used: dict[str, set[str]] = {folder: set() for folder, _ in LAYERS}
    errors = []
    files = sorted({p for pattern in SOURCES for p in csrc.rglob(pattern)})
    for path in files:
        rel = path.relative_to(csrc).as_posix()
        shown = f"csrc/{rel}"
        folder = rel.split("/")[0]
        if folder not in allowed:
            errors.append(f"{shown}:1: {folder}/ is not in the layer table "
                          f"(scripts/check_layers.py, docs/design.md \"Layers\")")
            continue
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
        for number, line in enumerate(lines, 1):
            m = INCLUDE.match(line)
            if not m:
                continue
            quote, target = m.groups()
            where = f"{shown}:{number}: {folder}"
            if quote == "<":
                if CUDA.search(target) and not may_include_cuda(rel):
                    errors.append(f"{where} may not include <{target}> (CUDA and NCCL headers: "
                                  f"device/cuda/ and backend/cuda_context.cc only)")
                elif TORCH.search(target) and not may_include_torch(rel):
                    errors.append(f"{where} may not include <{target}> (torch headers: "
                                  f"backend/ only)")
                continue
            top = target.split("/")[0] if "/" in target else None
            if top is None or top not in allowed:
                continue  # a file beside it, or something outside csrc/
            if top not in allowed[folder]:
                below = ", ".join(f for f, _ in LAYERS if f in allowed[folder] and f != folder)
                errors.append(f"{where} may not include {target} (it links: {below or 'nothing'})")
            elif top != folder:
                used[folder].add(top)
    for folder, links in LAYERS:
        for link in links:
            if link not in used[folder] and (csrc / folder).is_dir():
                errors.append(f"csrc/{folder}/:1: {folder} declares a link to {link} but includes "
                              f"nothing from it: drop it (scripts/check_layers.py, CMakeLists.txt)")
    return errors


def check_order() -> list[str]:
    """Every link points down the table."""
    order = [f for f, _ in LAYERS]
    return [f"scripts/check_layers.py: {folder} links {link}, which is not below it"
            for i, (folder, links) in enumerate(LAYERS) for link in links
            if link not in order[:i]]


def cmake_links(text: str) -> dict[str, list[str]]:
    """Each smddp_folder_library(smddp_<folder> ... LINKS ...) of
    CMakeLists.txt: folder -> the smddp_ folders it links."""
    out = {}
    for m in re.finditer(r"smddp_folder_library\(smddp_(\w+)(.*?)\)", text, re.S):
        links = re.search(r"\bLINKS\b(.*)", m.group(2), re.S)
        names = re.findall(r"\bsmddp_(\w+)", links.group(1)) if links else []
        out[m.group(1)] = names
    return out


def check_cmake(path: pathlib.Path) -> list[str]:
    """How CMakeLists.txt's declared links differ from LAYERS (backend/ is
    _C, which links them all)."""
    declared = cmake_links(path.read_text(encoding="utf-8"))
    errors = []
    for folder, links in LAYERS:
        if folder == "backend":
            continue
        if folder not in declared:
            errors.append(f"{path}: no smddp_folder_library(smddp_{folder} ...)")
        elif sorted(declared[folder]) != sorted(links):
            errors.append(f"{path}: smddp_{folder} links {sorted(declared[folder])}, "
                          f"scripts/check_layers.py says {sorted(links)}")
    return errors


def design_table(text: str) -> list[tuple[str, list[str]]]:
    """The layer table of docs/design.md: folder, then what it may include.

    "a ... b" names every folder from a to b in the table's order,
    "nothing" none, "everything above" every folder listed before it.
    """
    rows = []
    for line in text.splitlines():
        m = re.match(r"^\|\s*`([a-z_]+)/`\s*\|.*\|\s*([^|]+?)\s*\|\s*$", line)
        if m:
            rows.append((m.group(1), m.group(2)))
    order = [folder for folder, _ in rows]
    table = []
    for i, (folder, spec) in enumerate(rows):
        names: list[str] = []
        if spec == "everything above":
            names = order[:i]
        elif spec != "nothing":
            for part in (p.strip() for p in spec.split(",")):
                r = re.match(r"^(\w+) \.\.\. (\w+)$", part)
                if r and r.group(1) in order and r.group(2) in order:
                    names += order[order.index(r.group(1)):order.index(r.group(2)) + 1]
                else:
                    names.append(part)
        table.append((folder, names))
    return table


def check_design(path: pathlib.Path) -> list[str]:
    """How the table in `path` differs from LAYERS (empty when it agrees)."""
    doc = design_table(path.read_text(encoding="utf-8"))
    if [f for f, _ in doc] != [f for f, _ in LAYERS]:
        return [f"{path}: its layer table lists {[f for f, _ in doc]}, "
                f"scripts/check_layers.py {[f for f, _ in LAYERS]}"]
    errors = []
    for (folder, theirs), (_, ours) in zip(doc, LAYERS):
        if sorted(theirs) != sorted(ours):
            errors.append(f"{path}: {folder}/ may include {theirs} there, "
                          f"{ours} in scripts/check_layers.py")
    return errors


def main(argv: list[str] | None = None) -> int:
    here = pathlib.Path(__file__).resolve().parent.parent
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=pathlib.Path, default=here, help="the checkout (csrc/ in it)")
    ap.add_argument("--design", type=pathlib.Path, help="also check this file's layer table")
    ap.add_argument("--stamp", type=pathlib.Path, help="touch this file on success")
    args = ap.parse_args(argv)
    errors = check_order() + check_tree(args.root / "csrc")
    if (args.root / "CMakeLists.txt").exists():
        errors += check_cmake(args.root / "CMakeLists.txt")
    if args.design:
        errors += check_design(args.design)
    for e in errors:
        print(e)
    if errors:
        print(f"check_layers: {len(errors)} include(s) against the layer table "
              f"(docs/design.md, \"Layers\")", file=sys.stderr)
        return 1
    if args.stamp:
        args.stamp.touch()
    print("check_layers: every include in csrc/ points down the layer table")
    return 0


if __name__ == "__main__":
    sys.exit(main())
