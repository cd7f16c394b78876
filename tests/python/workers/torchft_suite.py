"""torchft's own tests (shipped in its wheel) with smddp in Gloo's place:
``python torchft_suite.py RESULT.json MODULE[:TEST_ID_REGEX] ...``.

Each MODULE (``process_group_test``, ``manager_integ_test``,
``local_sgd_integ_test``) is imported from the installed torchft, or from
this directory where a file of that name exists (``torchft_adapted``: the
copies adapted to smddp). The name ``ProcessGroupGloo`` in the test modules
and their helpers (torchft._test.*) is pointed at
``torch_smddp.torchft.ProcessGroupSmddp`` (same constructor arguments), so
every test written for torchft's Gloo wrapper builds smddp groups instead;
nothing else in them changes. TEST_ID_REGEX picks tests by id. They run
under unittest in this process, their replicas as threads, as torchft runs
them. RESULT.json gets one entry per test ("pass", "fail: ..." or
"skip: ...") and "smddp_groups", the smddp groups they formed.
SMDDP_TORCHFT_SUITE_PG=gloo runs the same tests on torchft's Gloo wrapper,
for reference.

test_torchft.py runs this under a hard deadline; faulthandler dumps every
thread's stack shortly before it, so a hang shows where it stuck.
"""

from __future__ import annotations

import faulthandler
import importlib
import json
import os
import re
import sys
import time
import unittest


# How many smddp groups the tests formed (the result's "smddp_groups"):
# proof that they ran on smddp, not on Gloo.
_FORMED = [0]


def _patched(module_name: str):
    local = os.path.exists(os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                        module_name + ".py"))
    mod = importlib.import_module(module_name if local else f"torchft.{module_name}")
    if os.environ.get("SMDDP_TORCHFT_SUITE_PG", "smddp") == "gloo":
        return mod  # the reference run: torchft's own Gloo wrapper
    from torch_smddp.torchft import ProcessGroupSmddp

    if not getattr(ProcessGroupSmddp, "_counted", False):
        create = ProcessGroupSmddp._create_pg

        def counted(self, *args, **kwargs):
            pg = create(self, *args, **kwargs)
            _FORMED[0] += 1
            return pg

        ProcessGroupSmddp._create_pg = counted
        ProcessGroupSmddp._counted = True
    # The test modules and their helpers (torchft._test.diloco_trainer).
    for name, m in list(sys.modules.items()):
        if name.startswith("torchft.") and (name.endswith("_test") or "._test." in name) and \
                hasattr(m, "ProcessGroupGloo"):
            m.ProcessGroupGloo = ProcessGroupSmddp
    return mod


def _ids(suite):
    for t in suite:
        if isinstance(t, unittest.TestSuite):
            yield from _ids(t)
        else:
            yield t


class _Recorder(unittest.TestResult):
    def __init__(self, out: dict, path: str):
        super().__init__()
        self.out = out
        self.path = path
        self.t0 = 0.0

    def startTest(self, test):
        super().startTest(test)
        self.t0 = time.monotonic()
        print(f"--- {test.id()}", flush=True)

    def _put(self, test, what):
        # A class fixture's failure comes as a _ErrorHolder, named after it.
        self.out[getattr(test, "description", None) or test.id()] = what
        self.out["smddp_groups"] = _FORMED[0]
        print(f"    {what[:2000]} ({time.monotonic() - self.t0:.1f} s)", flush=True)
        with open(self.path + ".tmp", "w") as f:
            json.dump(self.out, f, indent=1)
        os.replace(self.path + ".tmp", self.path)

    def addSuccess(self, test):
        self._put(test, "pass")

    def addFailure(self, test, err):
        self._put(test, "fail: " + self._exc_info_to_string(err, test)[-3000:])

    def addError(self, test, err):
        self._put(test, "fail: " + self._exc_info_to_string(err, test)[-3000:])

    def addSkip(self, test, reason):
        self._put(test, f"skip: {reason}")


def main() -> None:
    out_path = sys.argv[1]
    deadline = float(os.environ.get("SMDDP_TORCHFT_SUITE_DEADLINE", "0"))
    faulthandler.enable()
    if deadline > 5:
        faulthandler.dump_traceback_later(deadline - 5, exit=False)
    results: dict[str, str] = {}
    loader = unittest.TestLoader()
    for spec in sys.argv[2:]:
        module_name, _, want = spec.partition(":")
        mod = _patched(module_name)
        # One suite, so that class fixtures (setUpClass) run as unittest runs them.
        chosen = [t for t in _ids(loader.loadTestsFromModule(mod))
                  if not want or re.search(want, t.id())]
        unittest.TestSuite(chosen).run(_Recorder(results, out_path))
    sys.stdout.flush()
    os._exit(0)  # torchft's executors and servers need not wind down


if __name__ == "__main__":
    main()
