"""smddp as a torchft process group (``pip install torch-smddp[ft]``).

torchft keeps training when a replica group dies: a lighthouse decides each
step's quorum, and the survivors rebuild their cross-replica process group
on a new store prefix. ``ProcessGroupSmddp`` is that group with smddp
underneath, in place of torchft's ``ProcessGroupGloo``::

    from torchft import Manager
    from torch_smddp.torchft import DistributedDataParallel, ProcessGroupSmddp

    manager = Manager(pg=ProcessGroupSmddp(), ...)
    model = DistributedDataParallel(manager, model)   # torchft's, its hook fixed

What it adds to torchft's wrapper:

- ``errored()`` returns the group's asynchronous error: the first failure
  that left it unusable (a timeout, a lost peer, an abort), which torchft's
  ``Manager.should_commit`` turns into a skipped step and a reconfigure.
- ``abort()`` from another thread also stops a group that is still forming
  (a reconfigure whose peers never come): ``configure`` then raises within
  a few ms instead of waiting out the timeout.
- A Work's ``wait()`` returns once the call has ended and never raises, as
  with NCCL: a failure stays in its future (``get_future()``), in
  ``exception()`` and in ``errored()``. torchft's Manager relies on that: it
  reports a failed future and skips the step, but a ``wait()`` that raises
  leaves its DDP comm hook without a future (torchft 0.2.0 then fails an
  assertion, as it does with its own Gloo wrapper when a peer dies).

docs/fault-tolerance.md, "Under torchft", has the whole picture.
"""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Optional

import torch
import torch.distributed as dist

try:
    import torchft.ddp
    from torchft.process_group import ProcessGroupWrapper, create_store_client
except ImportError as e:  # pragma: no cover - the message is the point
    raise ImportError(
        "torch_smddp.torchft needs torchft: pip install 'torch-smddp[ft]' "
        "(or pip install torchft==0.2.0)"
    ) from e

import torch_smddp
from torch_smddp import _C

__all__ = ["ProcessGroupSmddp", "DistributedDataParallel"]


class ProcessGroupSmddp(ProcessGroupWrapper):
    """A reconfigurable smddp process group for ``torchft.Manager``.

    Args:
        timeout: the group's timeout: every collective's bound, and the
            bound on forming the group (as for torchft's ProcessGroupGloo).
    """

    def __init__(self, timeout: timedelta = timedelta(seconds=60)) -> None:
        super().__init__(timeout=timeout)
        self._lock = threading.Lock()
        # The cancel handle of the group being formed now, if any.
        self._forming: Optional[_C.FormationCancel] = None  # guarded by _lock
        # Set by abort(): errored() reports it until the next configure.
        self._aborted: Optional[Exception] = None  # guarded by _lock
        # The failed group errored() has begun to release (_release_failed),
        # until the next configure.
        self._released: Optional[dist.ProcessGroup] = None  # guarded by _lock

    def getBackendName(self) -> str:
        return "torchft-smddp"

    def _wrap_work(self, work: dist.Work, opts: object) -> dist.Work:
        return _FailureInFutureWork(work)

    def configure(
        self,
        store_addr: str,
        replica_id: str,
        rank: int,
        world_size: int,
        quorum_id: Optional[int] = None,
        group_rank: Optional[int] = None,
        group_world_size: Optional[int] = None,
        global_ranks: Optional[list[int]] = None,
    ) -> None:
        """Drops the current group and forms a new one on ``store_addr``
        (a new prefix each time). Blocks until every rank joined; raises if
        the group cannot form within the timeout or ``abort()`` is called
        meanwhile."""
        self._replica_id = replica_id
        self._quorum_id = quorum_id
        self._group_rank = group_rank
        self._group_world_size = group_world_size
        self._rank = rank
        self._global_ranks = global_ranks

        # One step under the lock: the old group leaves and this formation's
        # cancel handle takes its place, so an abort() from another thread
        # from now on either cancels the formation or finds the new group
        # installed; none falls between the two and is lost.
        cancel = _C.FormationCancel()
        with self._lock:
            old, self._pg = self._pg, None
            if self._forming is not None:
                self._forming.cancel()
            self._forming = cancel
            self._aborted = None
            self._released = None  # the old group is gone: hold it no longer
        if old is not None:
            _abort_backend(old)
        pg = None
        try:
            store = create_store_client(store_addr, timeout=self._timeout)
            pg = self._create_pg(store, rank, world_size, cancel)
        finally:
            with self._lock:
                if self._forming is cancel:
                    self._forming = None
                installed = pg is not None and not cancel.cancelled
                if installed:
                    self._pg = pg
        if installed:
            return
        # abort() came after the group formed but before it was installed.
        _abort_backend(pg)
        raise RuntimeError("smddp: the group was aborted while it was being configured")

    def _create_pg(self, store: dist.Store, rank: int, world_size: int,
                   cancel: Optional[_C.FormationCancel] = None) -> dist.ProcessGroup:
        name = "torchft"
        if self._quorum_id is not None:
            name = f"torchft_quorum_{self._quorum_id}"
            if self._group_rank is not None and self._group_world_size:
                name += f"_rank_{self._group_rank % self._group_world_size}"
        # Standalone reduction servers registered in a store (SMDDP_SERVER_COUNT).
        _check_server_store()
        backend = _C.ProcessGroupSmddp(store, rank, world_size, self._timeout, name,
                                       cancel=cancel, keep_spare=True,
                                       **torch_smddp._server_kwargs(store, self._timeout))
        # torch's flight-recorder dumps (TORCH_FR_DUMP_TEMP_FILE) describe
        # each group and list its ranks in the job; torchft knows them.
        given = getattr(self, "_global_ranks", None)
        ranks = list(given) if given else list(range(world_size))
        backend._set_torch_group(name, ranks)
        pg = dist.ProcessGroup(store, rank, world_size)
        pg._set_default_backend(dist.ProcessGroup.BackendType.CUSTOM)
        pg._register_backend(torch.device("cpu"), dist.ProcessGroup.BackendType.CUSTOM, backend)
        if _C.built_with_cuda() and torch.cuda.is_available():
            pg._register_backend(torch.device("cuda"), dist.ProcessGroup.BackendType.CUSTOM,
                                 backend)
        return pg

    def abort(self, errored: bool = True) -> None:
        """Aborts the current group, or stops the one being formed."""
        with self._lock:
            if self._forming is not None:
                self._forming.cancel()
            if errored:
                self._aborted = RuntimeError("smddp: the group was aborted")
            pg, self._pg = self._pg, None
        super().abort(errored=errored)  # torchft's error log; the group is ours to abort
        if pg is not None:
            _abort_backend(pg)

    def shutdown(self) -> None:
        """Shuts the current group down (its peers hear it leave), and stops
        one being formed."""
        with self._lock:
            if self._forming is not None:
                self._forming.cancel()
            pg, self._pg = self._pg, None
        if pg is not None:
            backend = _backend(pg)
            if backend is not None:
                backend.shutdown()

    def errored(self) -> Optional[Exception]:
        """The group's asynchronous error, or None while it is healthy."""
        with self._lock:
            aborted = self._aborted
            pg = self._pg
        backend = _backend(pg) if pg is not None else None
        message = backend.errored() if backend is not None else None
        if message is not None:
            self._release_failed(pg)
            return dist.DistBackendError(message)
        return aborted

    def _release_failed(self, pg: dist.ProcessGroup) -> None:
        """A group with an error can make no more calls, and torchft drops it
        at its next configure, which Manager.should_commit's errored() sets
        in motion about a second ahead (the lighthouse's join timeout). Its
        resources (threads, liveness connections, endpoint: 1-4 ms) go now,
        on a thread of their own, so that configure, on the path of the
        recovery, finds the group closed. The group keeps its error; a
        later abort() waits for this one."""
        with self._lock:
            if self._released is pg:
                return
            self._released = pg
        threading.Thread(target=_abort_backend, args=(pg,), name="smddp-release-failed",
                         daemon=True).start()

    def set_timeout(self, timeout: timedelta) -> None:
        """The timeout of groups formed from now on, and of the current one."""
        super().set_timeout(timeout)
        with self._lock:
            pg = self._pg
        backend = _backend(pg) if pg is not None else None
        if backend is not None:
            backend.set_timeout(timeout)


class DistributedDataParallel(torchft.ddp.DistributedDataParallel):
    """torchft's DDP (``torchft.ddp.DistributedDataParallel(manager, module)``)
    with its comm hook fixed for failures, whatever the process group.

    Once a step has failed, ``Manager.allreduce`` returns a placeholder Work
    for the step's remaining buckets, and torchft 0.2.0's hook fails an
    assertion on it (``fut._fut``): a survivor of a dead peer crashes in
    backward for any model of more than one DDP bucket. Here the hook hands
    DDP the placeholder's own (completed) future instead; the step is then
    not committed, as torchft intends.
    """

    @staticmethod
    def _comm_hook(state, bucket):  # no annotations: DDP checks them (and this
        # module's are strings)
        work = state.allreduce(bucket.buffer())
        work.wait()
        fut = work.get_future()
        inner = getattr(fut, "_fut", None)  # a _ManagedFuture's chain
        return inner if inner is not None else fut


class _FailureInFutureWork(dist.Work):
    """A Work whose wait() never raises (NCCL's model, which torchft expects):
    a failure stays in the future, exception() and the group's errored()."""

    def __init__(self, work: dist.Work) -> None:
        super().__init__()
        self._work = work
        self._future = work.get_future()

    def wait(self, timeout: Optional[timedelta] = None) -> bool:
        try:
            if timeout is None:
                self._work.wait()
            else:
                self._work.wait(timeout)
        except Exception:  # noqa: BLE001 - kept in the future and errored()
            pass
        return True

    def get_future(self) -> torch.futures.Future:
        return self._future

    def is_completed(self) -> bool:
        return self._work.is_completed()

    def is_success(self) -> bool:
        return self._work.is_success()

    def exception(self):
        return self._work.exception()

    def source_rank(self) -> int:
        return self._work.source_rank()

    def result(self) -> list:
        return self._work.result()

    def synchronize(self) -> None:
        self.wait()


def _backend(pg: dist.ProcessGroup) -> Optional[_C.ProcessGroupSmddp]:
    try:
        backend = pg._get_backend(torch.device("cpu"))
    except RuntimeError:
        return None
    return backend if isinstance(backend, _C.ProcessGroupSmddp) else None


def _check_server_store() -> None:
    """Standalone servers found through a store (SMDDP_SERVER_COUNT without
    SMDDP_SERVER_HOSTS) must be found in one that outlives every replica.
    The quorum's store belongs to whichever replica is primary: a dead
    primary would take the servers' registrations and key with it, and the
    next quorum could not find them."""
    lookup = _C.server_lookup()
    if lookup["count"] and not lookup["hosts_given"] and not lookup["rendezvous"].strip():
        raise ValueError(
            "smddp under torchft: SMDDP_SERVER_COUNT finds the standalone servers in a store, "
            "and the quorum's store dies with its primary replica; set "
            "SMDDP_SERVER_RENDEZVOUS=HOST:PORT to a store that outlives the replicas (start the "
            "servers with python -m torch_smddp.server --rendezvous HOST:PORT), or name the "
            "servers with SMDDP_SERVER_HOSTS")


def _abort_backend(pg: dist.ProcessGroup) -> None:
    backend = _backend(pg)
    if backend is not None:
        backend.abort()
