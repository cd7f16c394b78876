#!/usr/bin/env python3
"""No function over 80 lines: C++ under csrc/ and the shipped Python package.

    scripts/check_function_length.py [--root DIR] [--limit 80]

Prints "file:line: name is N lines (limit 80)" for each one and exits 1.
Python functions are measured with ast (def line to last line); C++
functions from the line that names them to their closing brace, with a brace scanner that drops comments and literals and
takes a brace as a function's when the text before it, at namespace or
class level, ends in a parameter list (not a control statement, a lambda
or an initializer). Nested lambdas count toward the function they are in.
"""
from __future__ import annotations

import argparse
import ast
import pathlib
import re
import sys

LIMIT = 80
# The last line before a brace that opens a block, not a function body:
# a control statement, a lambda, or an initializer.
CONTROL = re.compile(r"^\s*(if|for|while|switch|catch|do|else|try|return|case)\b"
                     r"|\]\s*\(.*\)\s*(mutable\s*)?(->.*)?$|\]\s*$|=\s*$"
                     r"|\[[^\]]*\]\s*\([^)]*\)")
# The text before a brace that opens a namespace, class or other type body.
TYPE = re.compile(r"\b(namespace|class|struct|enum|union)\b[^()]*$|^\s*extern\s+\"C\"")


def strip_cpp(src: str) -> str:
    """`src` without comments and with every string and character literal
    emptied, newlines kept (so line numbers hold)."""
    out, i, n = [], 0, len(src)
    while i < n:
        if src.startswith("//", i):
            end = src.find("\n", i)
            i = n if end < 0 else end
        elif src.startswith("/*", i):
            end = src.find("*/", i + 2)
            end = n if end < 0 else end + 2
            out.append("\n" * src.count("\n", i, end))
            i = end
        elif src.startswith('R"', i) and (m := re.match(r'R"([^(]*)\(', src[i:])):
            end = src.find(")" + m.group(1) + '"', i)
            end = n if end < 0 else end + len(m.group(1)) + 2
            out.append("\n" * src.count("\n", i, end) + '""')
            i = end
        elif src[i] in "\"'":
            quote, j = src[i], i + 1
            while j < n and src[j] != quote:
                j += 2 if src[j] == "\\" else 1
            out.append(quote * 2)
            i = j + 1
        else:
            out.append(src[i])
            i += 1
    return "".join(out)


def scan_cpp(text: str) -> list[tuple[int, int, str]]:
    """(lines, first line, name) of every function body in C++ `text`."""
    s = strip_cpp(text)
    found = []
    open_blocks = []  # (kind: "fn", "type" or "block", first line, name)
    head_start, line = 0, 1
    for i, c in enumerate(s):
        if c == "\n":
            line += 1
        elif c == ";":
            head_start = i + 1
        elif c == "{":
            head = s[head_start:i].strip()
            if any(kind == "fn" for kind, _, _ in open_blocks):
                kind = "block"
            elif not head or TYPE.search(head):
                kind = "type"
            elif ")" in head and not CONTROL.search(head.split("\n")[-1]):
                kind = "fn"
            else:
                kind = "block"
            # A function counts from the line that names it, not from its
            # brace; a signature holds no blank line, so what precedes the
            # last one (macro declarations, which end in no `;`) is not it.
            blank = list(re.finditer(r"\n[ \t]*\n", s[head_start:i]))
            sig_start = head_start + (blank[-1].end() if blank else 0)
            name = re.search(r"([~\w:]+)\s*\(", s[sig_start:i])
            first = line - s.count("\n", sig_start + name.start(), i) if name else line
            open_blocks.append((kind, first, name.group(1) if name else head[:40]))
            head_start = i + 1
        elif c == "}":
            if open_blocks:
                kind, first, name = open_blocks.pop()
                if kind == "fn":
                    found.append((line - first + 1, first, name))
            head_start = i + 1
    return found


def scan_python(text: str) -> list[tuple[int, int, str]]:
    """(lines, first line, name) of every function in Python `text`."""
    out = []
    for n in ast.walk(ast.parse(text)):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out.append((n.end_lineno - n.lineno + 1, n.lineno, n.name))
    return out


def long_functions(root: pathlib.Path, limit: int = LIMIT) -> list[str]:
    found = []
    for p in sorted((root / "csrc").rglob("*")):
        if p.suffix in (".cc", ".h", ".cu", ".cuh"):
            found += [(p, *f) for f in scan_cpp(p.read_text(errors="replace"))]
    for p in sorted((root / "torch_smddp").rglob("*.py")):
        found += [(p, *f) for f in scan_python(p.read_text())]
    return [f"{p.relative_to(root)}:{first}: {name} is {n} lines (limit {limit})"
            for p, n, first, name in found if n > limit]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=pathlib.Path,
                    default=pathlib.Path(__file__).resolve().parent.parent)
    ap.add_argument("--limit", type=int, default=LIMIT)
    args = ap.parse_args(argv)
    errors = long_functions(args.root, args.limit)
    for e in errors:
        print(e)
    if errors:
        print(f"check_function_length: {len(errors)} function(s) over {args.limit} lines",
              file=sys.stderr)
        return 1
    print(f"check_function_length: no function over {args.limit} lines")
    return 0


if __name__ == "__main__":
    sys.exit(main())
