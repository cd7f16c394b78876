"""pytest's set-up for tests/python: the harness (harness/), what the ranks
run (cases/) and the scripts started as programs (workers/) are importable
by name from every test file."""

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
for _d in ("workers", "cases", "harness"):
    _p = os.path.join(_HERE, _d)
    if _p not in sys.path:
        sys.path.insert(0, _p)


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "cluster: runs on a scripts/cluster.sh cluster of network namespaces "
        "(root; skipped with the reason where namespaces cannot be made)")
