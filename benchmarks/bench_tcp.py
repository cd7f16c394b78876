"""The `tcp` row of `benchmarks/bench_hosts.py --hosts ... --backends ... tcp`:
plain TCP between the host leaders of a namespace cluster, the links'
ceiling for sizes they limit."""

from __future__ import annotations

import fcntl
import os
import selectors
import socket
import struct
import threading

def _interface_address(name: str) -> str:
    """The IPv4 address of interface `name` (SIOCGIFADDR)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        packed = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name[:15].encode()))
    return socket.inet_ntoa(packed[20:24])


class TcpMesh:
    """The `tcp` row of a cluster run: plain TCP between the host leaders
    (local rank 0), one connection per pair of hosts. exchange(S) has every
    leader send each other host 2S/H bytes (S for H = 2) while it receives
    as much from each: the link bound's bytes, 2(H-1)/H * S each way, and
    nothing else (no reduction, no copies beyond the kernel's). A ceiling
    for sizes the links limit (MiBs): each exchange also starts a Python
    thread per connection, which small sizes would time instead."""

    def __init__(self, gloo, rank: int, world: int, conns: int = 1):
        import torch.distributed as dist

        local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))  # torchrun: ranks by host
        self.hosts, self.host = world // local, rank // local
        self.leader = rank % local == 0
        self.sent = self.received = 0  # by the last exchange
        self.peers: list[socket.socket] = []
        listener, me = None, None
        if self.leader:
            ip = _interface_address(os.environ.get("GLOO_SOCKET_IFNAME", "eth0"))
            listener = socket.create_server((ip, 0), backlog=self.hosts * conns)
            me = (ip, listener.getsockname()[1])
        addrs = [None] * world
        dist.all_gather_object(addrs, me, group=gloo)
        if self.leader:
            leaders = [a for a in addrs if a is not None]
            for j in range(self.host):  # the listeners' backlogs take these
                for _ in range(conns):
                    self.peers.append(socket.create_connection(tuple(leaders[j]), timeout=60))
            listener.settimeout(60)
            for _ in range((self.hosts - 1 - self.host) * conns):
                self.peers.append(listener.accept()[0])
            listener.close()
            for s in self.peers:
                s.settimeout(60)
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.conns = conns
        self.out = bytearray()
        self.scratch = bytearray(4 << 20)
        dist.barrier(group=gloo)

    def exchange(self, nbytes: int) -> None:
        self.sent = self.received = 0
        if not self.leader or self.hosts < 2:
            return
        per = (nbytes if self.hosts == 2 else 2 * nbytes // self.hosts) // self.conns
        if len(self.out) < per:
            self.out = bytearray(per)
        data = memoryview(self.out)[:per]
        failed: list[str] = []

        def send(s):
            try:
                s.sendall(data)
            except OSError as e:  # timeout included: a peer that stopped reading
                failed.append(str(e))

        senders = [threading.Thread(target=send, args=(s,)) for s in self.peers]
        for t in senders:
            t.start()
        left = {s: per for s in self.peers}
        sink = memoryview(self.scratch)
        with selectors.DefaultSelector() as sel:
            for s in left:
                sel.register(s, selectors.EVENT_READ)
            while left:
                ready = sel.select(timeout=60)
                if not ready:
                    raise SystemExit("torch_smddp.bench: no tcp data from a peer for 60 s")
                for key, _ in ready:
                    s = key.fileobj
                    n = s.recv_into(sink, min(left[s], len(sink)))
                    if n == 0:
                        raise SystemExit("torch_smddp.bench: a tcp peer closed its connection")
                    left[s] -= n
                    if not left[s]:
                        sel.unregister(s)
                        del left[s]
        for t in senders:
            t.join()
        if failed:
            raise SystemExit(f"torch_smddp.bench: a tcp send failed: {failed[0]}")
        self.sent = self.received = per * len(self.peers)

    def close(self) -> None:
        for s in self.peers:
            s.close()
