"""torch-smddp: a SageMaker-style data-parallel communication backend for PyTorch.

``import torch_smddp`` registers the c10d backend ``"smddp"``::

    import torch_smddp
    torch.distributed.init_process_group(backend="smddp")
"""

from __future__ import annotations

import os
import time

# Debian's libfabric loads libinfinipath (psm provider), whose fatal-signal
# handler calls exit() inside the handler and writes *.btr files; with our
# engine thread running that turns a torchrun SIGTERM into a crash or hang.
os.environ.setdefault("IPATH_NO_BACKTRACE", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from ._torch_match import check_torch_matches_build  # noqa: E402

check_torch_matches_build(torch)  # before _C: never an undefined-symbol crash

from . import _C  # noqa: E402  (needs torch.distributed's pybind types first)

__version__ = "0.1.0"
__all__ = ["__version__", "all_reduce_", "stats", "reset_stats", "flight_recorder",
           "lost_ranks", "Options", "ProcessGroupSmddp"]

ProcessGroupSmddp = _C.ProcessGroupSmddp


def _servers_from_store(store, timeout):
    """SMDDP_SERVER_COUNT=K without SMDDP_SERVER_HOSTS: the standalone
    reduction servers registered themselves in a store (``python -m
    torch_smddp.server --rendezvous ... --job ID``): the job's own, or the
    one at SMDDP_SERVER_RENDEZVOUS. Waits for K of job SMDDP_SERVER_JOB and
    returns ``(addresses, origin, key)`` for the engine, or None when the
    servers are not to be found in a store. The variables are read and
    checked by ``_C`` (where they are declared), never parsed here; the
    addresses go to the engine directly, not through os.environ.

    The key is the job's: 32 random bytes (hex) at ``smddp_servers/<job>/key``,
    set by whichever of the servers and the workers comes first
    (compare_set), so every one of them reads the same. Whoever can read the
    store can read it (docs/design.md, "Security"): SMDDP_SERVER_KEY_FILE
    keeps the servers' key out of the store."""
    lookup = _C.server_lookup()
    count = lookup["count"]
    if not count or lookup["hosts_given"]:
        return None
    job = lookup["job"]
    where = lookup["rendezvous"].strip()
    if where:
        # Under torchrun's c10d rendezvous the workers' own store gets a
        # port at run time; the servers register at the rendezvous endpoint.
        from torch_smddp.server import parse_endpoint

        try:
            host, port = parse_endpoint(where)
        except ValueError:
            raise ValueError(f"SMDDP_SERVER_RENDEZVOUS='{where}' is not HOST:PORT (the TCPStore the "
                             "servers registered in with python -m torch_smddp.server "
                             "--rendezvous)") from None
        try:
            root = dist.TCPStore(host, port, is_master=False, timeout=timeout,
                                 wait_for_workers=False)
        except Exception as e:  # noqa: BLE001  (the store's own connection error)
            raise RuntimeError(f"smddp: cannot reach the store at SMDDP_SERVER_RENDEZVOUS={where} "
                               f"within {timeout}: {e}") from e
        place = f"the store at SMDDP_SERVER_RENDEZVOUS={where}"
    else:
        root = store
        while isinstance(root, dist.PrefixStore):
            root = root.underlying_store
        place = ("the job's store (under torchrun's c10d rendezvous, set SMDDP_SERVER_RENDEZVOUS "
                 "to its --rdzv-endpoint and start the servers with --rendezvous there)")
    keys = [f"smddp_servers/{job}/{i}" for i in range(count)]
    try:
        root.wait(keys, timeout)
    except Exception as e:  # noqa: BLE001  (the store's own timeout error)
        raise RuntimeError(f"smddp: {count} standalone reduction server(s) of job '{job}' "
                           f"(SMDDP_SERVER_COUNT) did not register in {place} within "
                           f"{timeout}: {e}") from e
    hosts = [root.get(k).decode() for k in keys]
    return hosts, f"registered as smddp_servers/{job}/", job_server_key(root, job)


def job_server_key(store, job: str) -> str:
    """The key of job `job`'s standalone reduction servers in `store`:
    made by the first to ask (a server registering, or a worker), read by
    every later one."""
    import secrets

    return store.compare_set(f"smddp_servers/{job}/key", "", secrets.token_hex(32)).decode()


class Options:
    """One smddp group's own settings, given as ``pg_options``::

        grads = dist.new_group(backend="smddp",
                               pg_options=torch_smddp.Options(cross_host_dtype="bf16"))
        model = DistributedDataParallel(model, process_group=grads)

    Args:
        cross_host_dtype: what the group's f32 partials cross hosts in:
            ``"fp32"``, ``"bf16"`` or ``"fp16"`` (SMDDP_CROSS_HOST_DTYPE,
            which applies when this is None; docs/design.md, "Compression
            between hosts"). Every rank of the group must give the same.
    """

    def __init__(self, cross_host_dtype: str | None = None) -> None:
        if cross_host_dtype is not None and not isinstance(cross_host_dtype, str):
            raise TypeError("torch_smddp.Options: cross_host_dtype must be a str such as 'bf16', "
                            f"not {type(cross_host_dtype).__name__}")
        self.cross_host_dtype = cross_host_dtype

    def __repr__(self) -> str:
        return f"torch_smddp.Options(cross_host_dtype={self.cross_host_dtype!r})"


def _server_kwargs(store, timeout) -> dict:
    """The standalone reduction servers found in a store, as keyword
    arguments of ``_C.ProcessGroupSmddp`` (none when SMDDP_SERVER_HOSTS or
    nothing names them)."""
    found = _servers_from_store(store, timeout)
    if found is None:
        return {}
    hosts, origin, key = found
    return {"server_hosts": hosts, "server_origin": origin, "server_key": key}


def _option_kwargs(options) -> dict:
    """``pg_options`` as keyword arguments of ``_C.ProcessGroupSmddp``."""
    if options is None:
        return {}
    if not isinstance(options, Options):
        raise TypeError("backend 'smddp' takes pg_options=torch_smddp.Options(...), not "
                        f"{type(options).__name__}")
    return {"cross_host_dtype": options.cross_host_dtype or ""}


def _create_backend(dist_backend_opts, backend_options=None):
    opts = dist_backend_opts
    name = str(getattr(opts, "group_id", "default"))
    pg = _C.ProcessGroupSmddp(opts.store, opts.group_rank, opts.group_size, opts.timeout, name,
                              **_server_kwargs(opts.store, opts.timeout),
                              **_option_kwargs(backend_options))
    # torch's flight recorder format names the world group "default_pg" and
    # lists every group's global ranks (TORCH_FR_DUMP_TEMP_FILE dumps).
    ranks = list(getattr(opts, "global_ranks_in_group", []) or [])
    pg._set_torch_group("default_pg" if not ranks else "undefined", ranks)
    return pg


def _register() -> None:
    if "smddp" in dist.Backend.backend_list:
        return  # importing twice is harmless
    # CUDA tensors take the staging pipeline in a build with SMDDP_WITH_CUDA.
    devices = ["cpu", "cuda"] if _C.built_with_cuda() else ["cpu"]
    dist.Backend.register_backend("smddp", _create_backend, extended_api=True, devices=devices)


def _refuse_torchcomms() -> None:
    """Under TORCH_DISTRIBUTED_USE_TORCHCOMMS=1 (torch 2.13), c10d hands every
    backend to ``torchcomms.new_comm(name)`` instead of its registered
    creator. smddp has no torchcomms backend, so a group made that way would
    fail inside torchcomms with an error that does not say why: say why.
    Where torchcomms is missing (or is the placeholder on PyPI, 0.0.1, which
    has no new_comm), torch keeps the c10d path and smddp works unchanged
    (docs/design.md, "torchcomms")."""
    from torch.distributed import distributed_c10d as c10d

    if not getattr(c10d, "_TORCHCOMM_AVAILABLE", False) or getattr(c10d, "_smddp_guarded", False):
        return
    new_comm = c10d.new_comm

    def guarded(backend, *args, **kwargs):
        if str(backend) == "smddp":
            raise RuntimeError(
                "smddp has no torchcomms backend: with TORCH_DISTRIBUTED_USE_TORCHCOMMS=1 (or "
                "dist_config.use_torchcomms) torch creates every backend through "
                "torchcomms.new_comm, which knows nothing of smddp. Unset it for smddp groups "
                "(smddp runs on c10d's backend API).")
        return new_comm(backend, *args, **kwargs)

    c10d.new_comm = guarded
    c10d._smddp_guarded = True


_register()
_refuse_torchcomms()


def _backend_of(group=None):
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    backend = pg._get_backend(torch.device("cpu"))
    # TORCH_DISTRIBUTED_DEBUG=DETAIL wraps each backend to check calls.
    backend = getattr(backend, "wrapped_pg", backend)
    if not isinstance(backend, _C.ProcessGroupSmddp):
        raise ValueError(f"group {pg} does not use the smddp backend on CPU")
    return backend


# all_reduce_'s last group and its backend's direct entry (or None where the
# group has none): resolving them costs more than a small reduction.
_direct = [object(), None]


class _WorldProperty:
    """Where torch lacks the field below: the public property itself."""

    @property
    def _default_pg(self):
        return dist.GroupMember.WORLD


def _world_reader():
    # The default group, as dist.GroupMember.WORLD gives it. That is a
    # property on a metaclass and costs a twentieth of a small call, so
    # read the field behind it where this torch has it (checked once).
    world = getattr(dist.distributed_c10d, "_world", None)
    if world is not None and hasattr(world, "_default_pg") and \
            getattr(type(world), "default_pg", None) is not None:
        return world
    return _WorldProperty()


_world = _world_reader()


def _direct_entry(pg):
    if not isinstance(pg, dist.ProcessGroup):
        return None  # not initialised, or not a member: dist.all_reduce says so
    try:
        backend = pg._get_backend(torch.device("cpu"))
    except RuntimeError:
        return None
    # A wrapped backend (TORCH_DISTRIBUTED_DEBUG=DETAIL) checks every call
    # through c10d: leave the calls to it.
    return backend.all_reduce_now if isinstance(backend, _C.ProcessGroupSmddp) else None


def all_reduce_(tensor, op=dist.ReduceOp.SUM, group=None):
    """``dist.all_reduce(tensor, op, group)``, synchronous, for small tensors.

    The same engine call as ``dist.all_reduce(..., async_op=False)``, with
    the same result bit for bit, but entered directly rather than through
    c10d's Python wrapper, dispatcher, Work and future, which cost more than
    the whole reduction of a few KiB (as DeepSpeed's
    ``inference_all_reduce_`` does for its shared-memory op). It mixes
    freely with c10d calls on the same group: call order, fusion, timeouts,
    the flight recorder and the mismatch checks are the engine's, as for any
    call. Whatever it does not take directly (a group of another backend, a
    non-contiguous, complex or device tensor, PREMUL_SUM, a coalescing
    block, a profiler recording, TORCH_DISTRIBUTED_DEBUG=DETAIL) goes through
    ``dist.all_reduce`` unchanged. Returns ``tensor``.
    """
    pg = group if group is not None else _world._default_pg
    cached = _direct
    if cached[0] is not pg:
        cached[0], cached[1] = pg, _direct_entry(pg)
    entry = cached[1]
    if entry is None or not entry(tensor, op):
        dist.all_reduce(tensor, op=op, group=group)
    return tensor


def stats(group=None, reset: bool = False) -> dict:
    """Engine counters of ``group`` (default: the world group).

    bytes sent and received, fusion buffers flushed and their mean fill,
    chunks in flight, server reduce time, rejected frames and errors;
    ``bytes_sealed`` and ``bytes_opened``, the payload encrypted to and
    decrypted from ranks on other hosts (SMDDP_WIRE_ENCRYPT=1).
    ``collective_counts`` maps each collective ("allreduce", "broadcast",
    ...) to the calls completed; ``latency`` maps it to one entry per size
    class (power-of-4 bytes: ``min_bytes`` .. ``max_bytes``) with ``count``,
    ``mean_us``, ``p50_us`` and ``p99_us``, the time from queued to
    completed, read from log-spaced bins (two per octave, so within a factor
    sqrt(2)). ``allreduce_path`` is "shared-memory" or the libfabric
    provider; ``allreduce_schedule`` describes the path as the set-up log
    does (chunks, fusion, reduction servers, bf16 crossing, pairwise
    rounds). ``gather_scatter_path`` says how all-gather and reduce-scatter
    run: through shared memory (one host: all-gather of large parts among
    three ranks or more through each rank's ring in the host segment, the
    rest and reduce-scatter reading the peers' buffers), in a hierarchy across hosts ("hierarchy: ..."), or over the
    network. With ``reset=True`` the counters are zeroed after reading.
    """
    backend = _backend_of(group)
    out = backend.stats()
    if reset:
        backend.reset_stats()
    return out


def reset_stats(group=None) -> None:
    """Zeroes ``group``'s counters and latency histograms (see stats())."""
    _backend_of(group).reset_stats()


def lost_ranks(group=None, wait: float = 2.0) -> list:
    """The ranks of ``group`` (default: the world group) known to be gone: a
    process on this host that died, a rank on another host whose liveness
    connection closed without a goodbye or fell silent. What a survivor
    hands ``dist.shrink_group`` after a call failed naming a lost rank
    (examples/shrink_on_failure.py).

    A call can fail on a peer's report before this rank has its own
    evidence: a rank on the dead rank's host hears from another host first,
    while the kernel is still tearing the dead process down and holds its
    lock. So when the group has failed and no rank is known gone yet, this
    looks again for up to ``wait`` seconds (never longer than that)."""
    backend = _backend_of(group)
    lost = list(backend.lost_ranks())
    if lost or backend.errored() is None:
        return lost
    deadline = time.monotonic() + max(0.0, wait)
    while not lost and time.monotonic() < deadline:
        time.sleep(0.01)
        lost = list(backend.lost_ranks())
    return lost


def flight_recorder(group=None) -> list:
    """The flight recorder of ``group`` (default: the world group).

    Its last ``SMDDP_TRACE_BUFFER_SIZE`` collectives, oldest first, each a
    dict: ``seq``, ``collective``, ``call`` (e.g. ``"allreduce(SUM, float32,
    100 elements)"``), ``dtype``, ``op``, ``numel``, ``root``, ``bytes``,
    ``state`` (``"issued, not started"``, ``"started"``, ``"completed"``,
    ``"failed"``), ``path`` (``"shared-memory"``, ``"hierarchy"``,
    ``"network"``), ``batch`` (first sequence of the fusion batch it ran in)
    and ``batch_calls``, ``on_caller``, the wall-clock times ``queued``,
    ``started`` and ``ended`` (seconds, as ``time.time()``; None when not
    reached) and ``error``. Empty when ``SMDDP_TRACE_BUFFER_SIZE=0``.
    """
    return _backend_of(group).flight_recorder()
