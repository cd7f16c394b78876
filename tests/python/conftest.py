"""pytest's set-up for tests/python: the harness (harness/), what the ranks
run (cases/) and the scripts started as programs (workers/) are importable
by name from every test file."""

import os
import sys

# The list of directories is mp_helpers.SUPPORT_PATH's; harness/ first, to
# find mp_helpers.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "harness"))
from mp_helpers import put_support_on_path  # noqa: E402

put_support_on_path()


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "cluster: runs on a scripts/cluster.sh cluster of network namespaces "
        "(root; skipped with the reason where namespaces cannot be made)")
