"""The user docs agree with the code: docs/configuration.md is exactly what
`python -m torch_smddp.info --markdown` generates from the parameters the
code declares, the docs' relative links point at files that exist, and so do
the docs paths that comments in the code cite."""

import os
import re
import subprocess
import sys

import torch_smddp  # noqa: F401  (loads _C)
from torch_smddp import _C, info

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = os.path.join(REPO, "docs", "configuration.md")
REGENERATE = ".venv/bin/python -m torch_smddp.info --markdown > docs/configuration.md"


def test_configuration_page_is_the_generated_one():
    with open(CONFIG) as f:
        committed = f.read()
    generated = info.markdown(_C.param_specs())
    if committed != generated:
        old, new = committed.splitlines(), generated.splitlines()
        first = next((i for i, (a, b) in enumerate(zip(old, new)) if a != b), min(len(old), len(new)))
        raise AssertionError(
            "docs/configuration.md differs from the parameters the code declares "
            f"(first difference at line {first + 1}: committed {old[first:first + 1]}, "
            f"generated {new[first:first + 1]}). Regenerate it from the repository root:\n"
            f"    {REGENERATE}")


def test_configuration_page_lists_every_parameter_once():
    with open(CONFIG) as f:
        text = f.read()
    for p in _C.param_specs():
        assert text.count(f"\n### {p['name']}\n") == 1, p["name"]
        assert p["file"], f"{p['name']}: the registry does not say where it is declared"


def test_markdown_flag_prints_the_page():
    out = subprocess.run([sys.executable, "-m", "torch_smddp.info", "--markdown"], cwd=REPO,
                         capture_output=True, text=True, timeout=120, check=True).stdout
    with open(CONFIG) as f:
        assert out == f.read(), f"regenerate: {REGENERATE}"


def _docs():
    yield os.path.join(REPO, "README.md")
    for d in ("docs", "docs/notes", "tests", "benchmarks"):
        for name in sorted(os.listdir(os.path.join(REPO, d))):
            if name.endswith(".md"):
                yield os.path.join(REPO, d, name)


def _missing(source, targets, base):
    """The targets (a path, optionally with #anchor) that `source` names and
    that resolve against the folder `base` to no file, one line each."""
    bad = []
    for target in targets:
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        file = target.split("#")[0]
        if not os.path.exists(os.path.normpath(os.path.join(base, file))):
            bad.append(f"{os.path.relpath(source, REPO)}: {target}")
    return bad


def test_relative_links_in_the_docs_resolve():
    bad = []
    for path in _docs():
        with open(path) as f:
            text = f.read()
        bad += _missing(path, re.findall(r"\]\(([^)\s]+)\)", text), os.path.dirname(path))
    assert not bad, "links to missing files:\n" + "\n".join(bad)


# Source files whose comments cite the docs, by folder: (folder, suffixes,
# whether to look in its subfolders).
SOURCES = (("csrc", (".h", ".cc", ".cu", ".cuh"), True),
           ("torch_smddp", (".py",), True),
           ("tests", (".py",), True),
           ("tools", (".py",), True),
           ("benchmarks", (".py",), False),
           ("scripts", (".sh",), False))
# A docs page or note, or the results page, as the code cites them: from
# the repository root, optionally with an anchor.
DOC_PATH = re.compile(r"(?<![\w./-])((?:docs/[\w./-]+?\.md|benchmarks/RESULTS\.md)(?:#[\w-]+)?)")


def _sources():
    for folder, suffixes, deep in SOURCES:
        top = os.path.join(REPO, folder)
        for root, dirs, files in os.walk(top):
            if not deep:
                dirs[:] = []
            dirs[:] = sorted(d for d in dirs if not d.startswith((".", "__pycache__")))
            for name in sorted(files):
                if name.endswith(suffixes):
                    yield os.path.join(root, name)


def test_docs_paths_in_code_comments_resolve():
    bad = []
    for path in _sources():
        with open(path, errors="replace") as f:
            text = f.read()
        # A path broken across comment lines ("docs/notes/" then "// 2026-...").
        text = re.sub(r"/\n[ \t]*(?://+|#+|\*)?[ \t]*", "/", text)
        bad += _missing(path, DOC_PATH.findall(text), REPO)
    assert not bad, "code cites docs that do not exist:\n" + "\n".join(bad)
