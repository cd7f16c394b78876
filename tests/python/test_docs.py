"""The user docs agree with the code: docs/configuration.md is exactly what
`python -m torch_smddp.info --markdown` generates from the parameters the
code declares, the docs' relative links point at files (and headings) that
exist, and so do the docs paths that comments in the code cite."""

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


def _anchors(path):
    """The anchors GitHub gives the headings of the Markdown file `path`."""
    anchors, seen, fenced = set(), {}, False
    with open(path) as f:
        for line in f:
            if line.startswith("```"):
                fenced = not fenced
            m = None if fenced else re.match(r"#{1,6} +(.*)", line)
            if not m:
                continue
            heading = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", m.group(1).strip().lower())
            slug = re.sub(r"[^\w\- ]", "", heading).replace(" ", "-")
            n = seen.get(slug, 0)
            seen[slug] = n + 1
            anchors.add(slug if n == 0 else f"{slug}-{n}")
    return anchors


def _missing(source, targets, base):
    """The targets (a path, optionally with #anchor) that `source` names and
    that resolve against the folder `base` to no file, or to a Markdown file
    without that heading; one line each."""
    bad = []
    for target in targets:
        if re.match(r"[a-z]+:", target):
            continue
        file, _, anchor = target.partition("#")
        path = os.path.normpath(os.path.join(base, file)) if file else source
        if not os.path.exists(path):
            bad.append(f"{os.path.relpath(source, REPO)}: {target}")
        elif anchor and path.endswith(".md") and anchor not in _anchors(path):
            bad.append(f"{os.path.relpath(source, REPO)}: {target} (no such heading)")
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
