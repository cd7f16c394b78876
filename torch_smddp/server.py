"""Standalone reduction servers: ``python -m torch_smddp.server``.

A CPU-only host adds reduction bandwidth to a job, as in Herring and BytePS:
this process runs N reduction servers that own no ranks. Across hosts, the
job's shared-memory allreduce cuts each step's host partial into H + K
pieces (H hosts, K standalone servers); the hosts' own servers reduce the
first H, these servers the rest, each in host order, so every rank gets the
same bits as without them (docs/design.md, "Standalone reduction servers").

How a job finds the servers (pick one):

* ``SMDDP_SERVER_HOSTS``: start the servers first, then give every worker
  the line this command prints, ``SMDDP_SERVER_HOSTS=host:port,...`` (the
  same list, in the same order, on every worker), and the key file the
  servers got with ``--key-file`` as ``SMDDP_SERVER_KEY_FILE``. With
  ``--port P``, server i listens on P + i, so the list is known in advance.
* A store: ``--rendezvous HOST:PORT`` (a c10d TCPStore) registers the
  servers under ``--job ID``; workers started with ``SMDDP_SERVER_JOB=ID``
  and ``SMDDP_SERVER_COUNT=K`` wait (within the group timeout) until K
  servers registered there, in registration order. The workers look in
  their own job's store (MASTER_ADDR:MASTER_PORT, a port fixed with
  torchrun ``--master-port``), or, with ``SMDDP_SERVER_RENDEZVOUS=HOST:PORT``,
  in the store there: under torchrun's c10d rendezvous the workers' store
  gets a port at run time, so point both at torchrun's ``--rdzv-endpoint``.

Every connection opens with a challenge and a response both ways: a worker
talks only to a server that proves it holds the key, and a server serves
only workers that prove the same. The key is a file (``--key-file``, mode
0600, the workers' ``SMDDP_SERVER_KEY_FILE``), or, with ``--rendezvous`` and
no file, generated per job in that store, where anyone who can read the
store can read it. ``SMDDP_SERVER_INTEGRITY=1`` adds a MAC to every frame
(docs/design.md, "Security").

A server started with ``--job ID`` refuses workers of any other job (their
``SMDDP_SERVER_JOB``). It serves groups until it is stopped (SIGTERM or
Ctrl-C). If it dies, every worker's allreduce fails at once with an error
that names it; a worker that dies makes the server fail its group's other
workers the same way. A job restarted after a server died (torchrun
``--max-restarts``) goes on without it: a server no worker can reach
within ``SMDDP_SERVER_WAIT`` is left out by every rank.
"""

from __future__ import annotations

import argparse
import signal
import socket
import sys
import threading


def parse_endpoint(text: str) -> tuple[str, int]:
    """HOST:PORT (HOST may be a bracketed IPv6 address); ValueError if not."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"'{text}' is not HOST:PORT")
    return host.strip("[]"), int(port)


def _endpoint_arg(text: str) -> tuple[str, int]:
    try:
        return parse_endpoint(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def open_store(endpoint: tuple[str, int], timeout_s: float = 300.0):
    """A client of the TCPStore at `endpoint`."""
    from datetime import timedelta

    import torch.distributed as dist

    return dist.TCPStore(endpoint[0], endpoint[1], is_master=False,
                         timeout=timedelta(seconds=timeout_s))


def register_in_store(store, job: str, addresses: list[str]) -> list[int]:
    """Adds `addresses` to the servers of `job` in `store`: key
    ``smddp_servers/<job>/<i>`` for each, indices in registration order
    (``smddp_servers/<job>/count`` hands them out). Returns the indices."""
    n = len(addresses)
    last = store.add(f"smddp_servers/{job}/count", n)
    first = last - n
    for i, a in enumerate(addresses):
        store.set(f"smddp_servers/{job}/{first + i}", a)
    return list(range(first, last))


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m torch_smddp.server",
        description=__doc__.split("\n\n")[1],
        epilog="\n\n".join(__doc__.split("\n\n")[2:]),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--servers", type=int, default=1, metavar="N",
                   help="reduction servers in this process, each on its own port (default 1)")
    p.add_argument("--bind", default="0.0.0.0", metavar="ADDR",
                   help="numeric address to listen on (default 0.0.0.0)")
    p.add_argument("--port", type=int, default=0, metavar="P",
                   help="server i listens on P + i (default 0: ports the kernel picks)")
    p.add_argument("--advertise", default="", metavar="ADDR",
                   help="the address workers connect to (default: --bind, or this host's "
                        "first non-loopback IPv4 address)")
    p.add_argument("--job", default="", metavar="ID",
                   help="serve only workers whose SMDDP_SERVER_JOB is ID (default: any job)")
    p.add_argument("--rendezvous", type=_endpoint_arg, default=None, metavar="HOST:PORT",
                   help="register the servers in this TCPStore under --job (needs --job); "
                        "without a key file, the job's key is generated there")
    p.add_argument("--key-file", default="", metavar="FILE",
                   help="the key shared with the workers' SMDDP_SERVER_KEY_FILE (mode 0600; "
                        "default: SMDDP_SERVER_KEY_FILE, else the job's key in the "
                        "--rendezvous store)")
    return p


def main(argv=None) -> int:
    p = _parser()
    args = p.parse_args(argv)
    if not 1 <= args.servers <= 1024:
        p.error("--servers must be in 1..1024")
    if args.rendezvous and not args.job:
        p.error("--rendezvous needs --job (the key the workers look the servers up under)")

    from . import _C, job_server_key

    key_file = args.key_file or _C.server_key_file()
    if not key_file and not args.rendezvous:
        p.error("no key: give --key-file FILE (or SMDDP_SERVER_KEY_FILE; the workers get the "
                "same file), or --rendezvous HOST:PORT --job ID for a key generated per job")
    if not key_file:
        # Store mode with no key file: the job's key sits in the store, where
        # whoever reaches it can read it and then pass as a server.
        if not _C.server_insecure():
            p.error("no key file: the job's key would be kept in the store at --rendezvous, "
                    "which anyone who can reach the store can read and then pass as a server; "
                    "give --key-file FILE (the workers get the same file as "
                    "SMDDP_SERVER_KEY_FILE), or set SMDDP_SERVER_INSECURE=1 to accept that")
        print("warning: SMDDP_SERVER_INSECURE=1: no key file, so this server uses the job's key "
              "kept in the store, which whoever can reach the store can read", file=sys.stderr,
              flush=True)
    store = open_store(args.rendezvous) if args.rendezvous else None
    # The job's key from the store only where no key file is given: a key
    # file's contents never go into a store.
    key = "" if key_file else job_server_key(store, args.job)
    # A server proves itself bound to the address a worker dialled: the
    # one its connection reached, or one of --advertise's (behind NAT).
    advertised = []
    if args.advertise:
        try:
            advertised = sorted({a[4][0] for a in socket.getaddrinfo(args.advertise, None)})
        except OSError as e:
            p.error(f"--advertise {args.advertise}: cannot resolve it: {e}")
    try:
        server = _C.StandaloneServer(args.bind, args.port, args.servers, args.job,
                                     key_file=key_file, key=key, advertise=advertised)
    except ValueError as e:
        p.error(str(e))
    host = args.advertise or (args.bind if args.bind not in ("0.0.0.0", "::") else
                              _C.default_address())
    shown = f"[{host}]" if ":" in host else host
    addresses = [f"{shown}:{port}" for port in server.ports]
    if args.rendezvous:
        idx = register_in_store(store, args.job, addresses)
        print(f"registered servers {idx} of job '{args.job}' at "
              f"{args.rendezvous[0]}:{args.rendezvous[1]}", flush=True)
    print("SMDDP_SERVER_HOSTS=" + ",".join(addresses), flush=True)

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    while not stop.wait(0.5):
        pass
    server.stop()
    print(f"stopped: {server.pieces_reduced()} pieces reduced, {server.bytes_reduced()} bytes "
          f"in, {server.refused()} connections refused or failed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
