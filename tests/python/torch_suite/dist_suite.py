"""PyTorch's own distributed test suite, bound to one backend.

This module is the equivalent of PyTorch's
``test/distributed/test_distributed_spawn.py`` (which only accepts gloo, nccl
and ucc): it defines ``TestDistBackendWithSpawn``, the spawn-harness class
built from ``torch.testing._internal.distributed.distributed_test``
(``TestDistBackend`` + ``DistributedTest._DistTestBase``), for the backend
named by ``$BACKEND`` (default ``smddp``) at ``$WORLD_SIZE`` ranks (default 3,
what PyTorch's CI uses for gloo on CPU-only machines).

Every rank of every test is a fresh ``multiprocessing`` child (``spawn`` as
upstream, or ``forkserver``, see START_METHOD) that unpickles
``TestDistBackendWithSpawn._run`` and therefore imports this module by name,
so everything a rank needs must happen at import time here:

* ``import torch_smddp`` (registers the "smddp" c10d backend) when the
  backend is smddp;
* declare smddp in ``DistTestCases.backend_feature`` *before*
  ``distributed_test`` is imported, because its skip decorators read those
  sets (and ``$BACKEND``) when the class body is executed.  smddp is declared
  a "plugin" (upstream's hook for out-of-tree backends, read by
  ``require_backend_is_available``), and as supporting "ddp" and "subgroup"
  (both work on CPU; without them test_DistributedDataParallel_requires_grad
  and test_new_subgroups_with_group_param are skipped with "The smddp backend
  does not support ...").  It is *not* declared "gpu"/"cuda".

Tests whose import-time skip is only a backend-name allowlist ("Test requires
backend smddp to be one of {'gloo'}", "Only MPI supports all_to_all_single",
...) can be *ungated* (see ``ungate``); selection.txt says which.

Do not run this file directly; ``run_suite.py`` drives it (and
``suite_runner.py`` drives that).
"""

from __future__ import annotations

import os
import re

BACKEND = os.environ.setdefault("BACKEND", "smddp")
os.environ.setdefault("WORLD_SIZE", "3")
# distributed_test reads $INIT_METHOD at import time; the spawn harness itself
# always rendezvouses through a file:// store (TestDistBackend.init_method).
os.environ.setdefault("INIT_METHOD", "env://")

import torch  # noqa: E402

if "smddp" in BACKEND:
    import torch_smddp  # noqa: E402,F401  (registers the backend)

from torch.testing._internal import common_distributed  # noqa: E402
from torch.testing._internal.common_distributed import DistTestCases  # noqa: E402

# Features smddp declares (see module docstring).  Left alone for gloo etc.
SMDDP_FEATURES = ("plugin", "ddp", "subgroup")
if BACKEND == "smddp":
    for _feature in SMDDP_FEATURES:
        DistTestCases.backend_feature[_feature].add("smddp")

# Per-test timeout of MultiProcessTestCase._join_processes (seconds): after it
# the ranks are terminated and the test fails with "Process N terminated or
# timed out".  Upstream's default is 300 s with larger overrides; we clamp.
_TEST_TIMEOUT = int(os.environ.get("DISTRIBUTED_TESTS_DEFAULT_TIMEOUT", "120"))
common_distributed.TIMEOUT_DEFAULT = _TEST_TIMEOUT
for _name in list(common_distributed.TIMEOUT_OVERRIDE):
    common_distributed.TIMEOUT_OVERRIDE[_name] = min(
        common_distributed.TIMEOUT_OVERRIDE[_name], _TEST_TIMEOUT
    )

from torch.testing._internal.distributed.distributed_test import (  # noqa: E402
    DistributedTest,
    TestDistBackend,
)


# How the ranks are started.  "spawn" is what upstream uses: every rank is a
# new interpreter that imports torch + distributed_test (~5 s of CPU each, so
# ~10 s per test at 3 ranks on 2 cores).  "forkserver" forks every rank from a
# server process that has imported this module once (set_forkserver_preload),
# so a rank starts in well under a second; the ranks are still fresh processes
# that never ran a collective, and the parent's per-test environment
# (TEMP_DIR, INIT_METHOD, MASTER_ADDR, ...) is handed to them explicitly.
START_METHOD = os.environ.get("SMDDP_TORCH_SUITE_START", "spawn")
if START_METHOD not in ("spawn", "forkserver"):
    raise ValueError(f"SMDDP_TORCH_SUITE_START={START_METHOD!r}: use spawn or forkserver")

# Variables the harness sets in the parent per test (or per class) that the
# ranks read from os.environ.
_PASSED_ENV = ("TEMP_DIR", "INIT_METHOD", "MASTER_ADDR", "MASTER_PORT", "BACKEND", "WORLD_SIZE")


class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
    """Upstream test_distributed_spawn.py's class, plus the forkserver option."""

    def setUp(self):
        super().setUp()
        self._spawn_processes()
        torch.backends.cudnn.flags(enabled=True, allow_tf32=False).__enter__()

    def _spawn_processes(self) -> None:
        if START_METHOD == "spawn":
            super()._spawn_processes()
            self._rank_pids = [p.pid for p in self.processes]
            return
        ctx = torch.multiprocessing.get_context("forkserver")
        # The forkserver is a `python -c` process that ignores the sys.path it
        # is handed (CPython 3.11) and swallows the ImportError of a preload,
        # in which case every rank imports this module itself (~5 s each).
        # Put this directory on its PYTHONPATH (inherited when it starts).
        here = os.path.dirname(os.path.abspath(__file__))
        paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
        if here not in paths:
            os.environ["PYTHONPATH"] = os.pathsep.join([here] + [p for p in paths if p])
        ctx.set_forkserver_preload([__name__])
        self._start_processes(ctx.Process)

    def _start_processes(self, proc) -> None:
        # MultiProcessTestCase._start_processes, plus parent_env in kwargs.
        self.processes = []
        env = {k: os.environ[k] for k in _PASSED_ENV if k in os.environ}
        for rank in range(int(self.world_size)):
            parent_conn, child_conn = torch.multiprocessing.Pipe()
            process = proc(
                target=self.__class__._run,
                name="process " + str(rank),
                args=(rank, self._current_test_name(), self.file_name, child_conn),
                kwargs={"fake_pg": getattr(self, "fake_pg", False), "parent_env": env},
            )
            process.start()
            self.pid_to_pipe[process.pid] = parent_conn
            self.processes.append(process)
        # Kept past tearDown (which empties self.processes) for run_suite.py.
        self._rank_pids = [p.pid for p in self.processes]

    @classmethod
    def _run(cls, rank, test_name, file_name, pipe, parent_env=None, **kwargs):
        if parent_env:
            os.environ.update(parent_env)
        if os.environ.get("SMDDP_TORCH_SUITE_TRACE"):
            import atexit
            import time as _t

            t0 = _t.time()
            print(f"TRACE rank {rank} {test_name} start {t0:.3f}", flush=True)
            atexit.register(lambda: print(f"TRACE rank {rank} exit +{_t.time() - t0:.2f}", flush=True))
        super()._run(rank, test_name, file_name, pipe, **kwargs)


# Skip reasons that only say "this test is written for backend X" (decided at
# import time from the $BACKEND string) and that a test can be *ungated* from.
# Upstream never runs these test bodies for a backend outside the allowlist,
# yet many of them are plain CPU collective/DDP tests; the selection file
# marks the ones that pass on gloo (ungated the same way) with "ungate".
BACKEND_GATE_REASONS = tuple(
    re.compile(p)
    for p in (
        r"^Test requires backend \w+ to be one of \{[^}]*'gloo'[^}]*\}$",
        r"^get_future is only supported on mpi, nccl and gloo$",
        r"^Only gloo backend supports timeouts$",
        r"^GLOO Batch Send Recv CPU$",
        r"^Only Gloo backend supports sparse all reduce$",
        r"^Only MPI supports (CPU )?all_to_all(_single)?$",
    )
)


def is_backend_gate(reason: str) -> bool:
    return any(p.search(reason) for p in BACKEND_GATE_REASONS)


def gate_reason(name: str) -> str | None:
    """The import-time skip reason of test ``name`` for this $BACKEND, if any."""
    fn = getattr(DistributedTest._DistTestBase, name)
    if getattr(fn, "__unittest_skip__", False):
        return getattr(fn, "__unittest_skip_why__", "")
    return None


def ungate(names, strict: bool = True) -> dict:
    """Clear backend-name skips of ``names`` (before instantiating the tests).

    Returns {name: removed reason}.  A test that is not gated is left alone.
    A test skipped for any other reason (CUDA, world size, upstream issue)
    raises ValueError when ``strict``, else is left skipped.
    """
    removed = {}
    for name in names:
        why = gate_reason(name)
        if why is None:
            continue
        if not is_backend_gate(why):
            if strict:
                raise ValueError(f"{name}: skip reason {why!r} is not a backend-name gate")
            continue
        getattr(DistributedTest._DistTestBase, name).__unittest_skip__ = False
        removed[name] = why
    return removed


def all_test_names() -> list[str]:
    return sorted(n for n in dir(TestDistBackendWithSpawn) if n.startswith("test"))
