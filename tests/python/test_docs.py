"""The user docs agree with the code: docs/configuration.md is exactly what
`python -m torch_smddp.info --markdown` generates from the parameters the
code declares, and the docs' relative links point at files that exist."""

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


def test_relative_links_in_the_docs_resolve():
    bad = []
    for path in _docs():
        with open(path) as f:
            text = f.read()
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue
            file = target.split("#")[0]
            if not os.path.exists(os.path.normpath(os.path.join(os.path.dirname(path), file))):
                bad.append(f"{os.path.relpath(path, REPO)}: {target}")
    assert not bad, "links to missing files:\n" + "\n".join(bad)
