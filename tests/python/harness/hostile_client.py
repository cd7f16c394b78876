"""The attacker's tools of test_server_security.py. A client of the
standalone reduction servers written from the wire's spec
(csrc/server/server_wire.h and server_auth.h; docs/design.md, "Security")
with Python's own struct, hmac and hashlib: it shares no code with the
library, so what the suite sends, with the key or without, is an
independent reading of the protocol. A rogue server (Rogue), a relay
that alters results or only watches the bytes it forwards (Relay), a keyed
server whose narrow results carry a bad scale (Liar), all on one listener
(Listener), and an observer of /dev/shm (ShmWatch). Never imports torch.
"""

from __future__ import annotations

import ctypes
import hashlib
import hmac
import os
import select
import socket
import struct
import threading
import time

# magic u32, version u16, kind, dtype, op, flags, 2 reserved, divisor u32,
# group, seq, step, count, payload (u64 each), hosts, host, stream, server (u16)
HEADER = struct.Struct("<IHBBBB2xIQQQQQHHHH")
assert HEADER.size == 64
MAGIC, VERSION = 0x56534D53, 5
HELLO, WELCOME, DATA, RESULT, ERROR, BYE, CHALLENGE, ANSWER = range(1, 9)
UINT8, SUM = 4, 0  # dtype and op numbers (common/dtype.h)
FIELDS = ("magic", "version", "kind", "dtype", "op", "flags", "divisor", "group", "seq", "step",
          "count", "payload", "hosts", "host", "stream", "server")


def header(kind, *, dtype=0, op=0, flags=0, divisor=1, group=0, seq=0, step=0, count=0,
           payload=0, hosts=0, host=0, stream=0, server=0, magic=MAGIC,
           version=VERSION) -> bytes:
    return HEADER.pack(magic, version, kind, dtype, op, flags, divisor, group, seq, step, count,
                       payload, hosts, host, stream, server)


def connect(port: int, timeout: float = 5.0) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    s.settimeout(timeout)
    return s


def recv_exact(s: socket.socket, n: int) -> bytes:
    """`n` bytes, or fewer if the peer closed or went quiet past the timeout."""
    out = b""
    try:
        while len(out) < n:
            chunk = s.recv(n - len(out))
            if not chunk:
                break
            out += chunk
    except OSError:
        pass
    return out


def read_frame(s: socket.socket, most: int = 4096):
    """(fields, payload) of the next frame, or None if it did not come."""
    raw = recv_exact(s, 64)
    if len(raw) < 64:
        return None
    f = dict(zip(FIELDS, HEADER.unpack(raw)))
    if f["payload"] > most:
        return None
    return f, recv_exact(s, f["payload"])


def mac(key: bytes, *parts: bytes) -> bytes:
    return hmac.new(key, b"".join(parts), hashlib.sha256).digest()


def endpoint(s: socket.socket) -> bytes:
    """The address `s` reached, "ip:port", as the key is bound to it."""
    ip, port = s.getpeername()[:2]
    return (f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}").encode()


def identity_key(key: bytes, job: bytes, dialled: bytes) -> bytes:
    """The key a server proves itself with to a worker of `job` that
    dialled `dialled` (server_auth.h, serverIdentityKey)."""
    return mac(key, b"smddp server v3: identity", struct.pack("<QQ", len(job), len(dialled)),
               job, dialled)


def challenge(nw: bytes, dialled: bytes, job: bytes = b"", pw: bytes = b"") -> bytes:
    """A challenge frame: the nonce, the X25519 share `pw` (default: 32
    random bytes, a valid public key but for a negligible few; this side
    never needs the secret, as it seals nothing), the address dialled
    (`count` bytes), the job."""
    pw = pw or os.urandom(32)
    return header(CHALLENGE, count=len(dialled), payload=64 + len(dialled) + len(job)) + nw + \
        pw + dialled + job


class Session:
    """A connection that proved it holds the key (handshake()). It writes
    no sealed frames (SMDDP_SERVER_INTEGRITY's AES-GMAC is not in Python's
    standard library): the C++ tests cover those."""

    def __init__(self, sock):
        self.sock = sock

    def send(self, head: bytes, payload: bytes = b"") -> None:
        self.sock.sendall(head + payload)


def handshake(s: socket.socket, key: bytes, *, hosts: int, host: int, group: int, stream=0,
              job: bytes = b"", max_piece: int = 1 << 20, wait_ms: int = 5000):
    """A worker's handshake (challenge, the server's proof checked, hello
    with this side's proof). Returns (Session, "") once welcomed, else
    (None, why): the server's error text, or what was wrong."""
    nw, pw = os.urandom(32), os.urandom(32)
    dialled = endpoint(s)
    key = identity_key(key, job, dialled)
    s.sendall(challenge(nw, dialled, job, pw))
    body, why = _answer(s, ANSWER)
    if why:
        return None, why
    if len(body) != 96:
        return None, f"an answer of {len(body)} bytes"
    ns, ps, proof = body[:32], body[32:64], body[64:]
    if not hmac.compare_digest(proof, mac(key, b"smddp server v5: server proof", nw, ns, pw, ps)):
        return None, "the server's proof is wrong"
    hello = header(HELLO, group=group, seq=host, step=wait_ms, count=max_piece,
                   payload=32 + len(job), hosts=hosts, host=host, stream=stream)
    s.sendall(hello + mac(key, b"smddp server v5: worker proof", nw, ns, pw, ps, hello, job) + job)
    _, why = _answer(s, WELCOME)
    return (None, why) if why else (Session(s), "")


def _answer(s, kind):
    """The payload of the server's next frame if it is of `kind`, else
    (None, why): its error text, or what came instead."""
    got = read_frame(s)
    if got is None:
        return None, f"no frame of kind {kind}"
    f, body = got
    if f["kind"] == ERROR:
        return None, body.decode("utf-8", "replace")
    if f["kind"] != kind:
        return None, f"kind {f['kind']} where {kind} was expected"
    return body, ""


class Listener:
    """What the fake servers and the relay share: a socket listening at
    `host`:`port` (0: the kernel picks; ``port`` says which) and a thread
    that hands every connection it accepts to ``accepted`` until close() or
    `deadline_s` pass. A subclass sets its own fields before calling this
    constructor: the thread may accept at once."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, backlog: int = 8,
                 deadline_s: float = 120.0):
        self.sock = socket.socket()
        # The relay takes the port the kernel gave the server on another
        # address; connections an earlier relay accepted there may linger
        # in TIME_WAIT (ci62: EADDRINUSE on 127.0.0.2).
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, port))
        self.sock.listen(backlog)
        self.port = self.sock.getsockname()[1]
        self.deadline_s = deadline_s
        self.done = threading.Event()
        threading.Thread(target=self.run, daemon=True).start()

    def run(self):
        end = time.monotonic() + self.deadline_s
        self.sock.settimeout(0.5)
        while not self.done.is_set() and time.monotonic() < end:
            try:
                c, _ = self.sock.accept()
            except OSError:
                continue
            self.accepted(c)

    def accepted(self, c: socket.socket) -> None:
        raise NotImplementedError

    def close(self):
        self.done.set()
        self.sock.close()


class Rogue(Listener):
    """A listener that answers challenges with a proof it cannot compute and
    records every byte each connection sends afterwards."""

    def __init__(self):
        self.got = []
        super().__init__()

    def accepted(self, c):
        c.settimeout(5)
        got = read_frame(c)
        data = b"" if got is None else HEADER.pack(*got[0].values()) + got[1]
        c.sendall(header(ANSWER, payload=96) + os.urandom(96))
        data += recv_exact(c, 1 << 20)  # whatever follows, until it closes
        self.got.append(len(data))
        c.close()


class Relay(Listener):
    """A man in the middle at `host`:`port`: for each connection it
    accepts it opens its own to the server at 127.0.0.1:`target` and
    forwards every byte both ways. By default it adds 1 to the first float
    of every f32 result frame on the way back (with the workers'
    SMDDP_SERVER_INTEGRITY=0, the frames carry no tags); with `look_for`
    (byte strings) it changes nothing and counts, in ``seen``, where each
    occurs in what it forwards either way (a passive eavesdropper).
    ``connections``, ``altered`` and ``forwarded`` (bytes) count what it
    did."""

    def __init__(self, target: int, host: str = "127.0.0.1", port: int = 0,
                 look_for: tuple = ()):
        self.target, self.look_for = target, tuple(look_for)
        self.connections = self.altered = self.forwarded = 0
        self.seen = {p: 0 for p in self.look_for}
        self.lock = threading.Lock()  # guards seen and forwarded
        super().__init__(host, port, backlog=16)

    def accepted(self, w):
        try:
            s = connect(self.target, timeout=30)
        except OSError:
            w.close()
            return
        w.settimeout(30)
        self.connections += 1
        back = self.copy if self.look_for else self.rewrite
        threading.Thread(target=self.copy, args=(w, s), daemon=True).start()
        threading.Thread(target=back, args=(s, w), daemon=True).start()

    def watch(self, tail: bytes, chunk: bytes) -> bytes:
        """Counts the patterns in `chunk`, with the end of the previous
        chunk in front (a pattern may straddle two); the new tail."""
        if not self.look_for:
            return b""
        keep = max(len(p) for p in self.look_for) - 1
        data = tail + chunk
        with self.lock:
            self.forwarded += len(chunk)
            for p in self.look_for:
                # Only occurrences that end inside this chunk: none counted twice.
                at = data.find(p, max(0, len(tail) - len(p) + 1))
                while at >= 0:
                    self.seen[p] += 1
                    at = data.find(p, at + 1)
        return data[-keep:] if keep else b""

    def copy(self, a, b):
        tail = b""
        try:
            while not self.done.is_set():
                chunk = a.recv(65536)
                if not chunk:
                    break
                tail = self.watch(tail, chunk)
                b.sendall(chunk)
        except OSError:
            pass
        try:
            b.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def rewrite(self, a, b):
        try:
            while not self.done.is_set():
                raw = recv_exact(a, 64)
                if len(raw) < 64:
                    break
                f = dict(zip(FIELDS, HEADER.unpack(raw)))
                body = bytearray(recv_exact(a, min(f["payload"], 1 << 28)))
                if f["kind"] == RESULT and f["dtype"] == FLOAT32 and len(body) >= 4:
                    body[:4] = struct.pack("<f", struct.unpack("<f", body[:4])[0] + 1.0)
                    self.altered += 1
                b.sendall(raw + bytes(body))
        except OSError:
            pass
        for c in (a, b):
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


FLOAT32 = 0  # dtype number of f32 (common/dtype.h)
NARROW = 2  # kServerFlagNarrowWire


class Liar(Listener):
    """A server that holds the key and proves it, as a real one does, then
    answers every narrow piece at once with the bytes it was sent, its
    4-byte scale replaced by ``scale`` (3.0: not a power of two), and
    every other piece with its own bytes: a server with a fault that the
    handshake cannot catch. ``answered`` counts the narrow pieces."""

    def __init__(self, key: bytes, scale: float = 3.0):
        self.key, self.scale = key, struct.pack("<f", scale)
        self.answered = 0
        super().__init__()

    def accepted(self, c):
        threading.Thread(target=self.serve, args=(c,), daemon=True).start()

    def serve(self, c):
        c.settimeout(30)
        got = read_frame(c)
        if got is None or got[0]["kind"] != CHALLENGE:
            c.close()
            return
        body, ns = got[1], os.urandom(32)
        nw, pw, ps = body[:32], body[32:64], os.urandom(32)
        dialled = body[64:64 + got[0]["count"]]
        job = body[64 + got[0]["count"]:]
        c.sendall(header(ANSWER, payload=96) + ns + ps +
                  mac(identity_key(self.key, job, dialled), b"smddp server v5: server proof",
                      nw, ns, pw, ps))
        got = read_frame(c)
        if got is None or got[0]["kind"] != HELLO:
            c.close()
            return
        c.sendall(header(WELCOME))
        while not self.done.is_set():
            raw = recv_exact(c, 64)
            if len(raw) < 64:
                break
            f = dict(zip(FIELDS, HEADER.unpack(raw)))
            if f["kind"] != DATA:
                break
            body = recv_exact(c, f["payload"])
            if f["flags"] & NARROW and len(body) >= 4:
                body = self.scale + body[4:]
                self.answered += 1
            c.sendall(raw[:6] + bytes([RESULT]) + raw[7:] + body)
        c.close()


IN_CREATE, IN_MOVED_TO = 0x100, 0x80


class ShmWatch:
    """Every name created in /dev/shm while it runs (inotify), with its mode
    where it could still be read: what an observer of /dev/shm sees."""

    def __init__(self):
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.fd = self.libc.inotify_init1(os.O_NONBLOCK)
        assert self.fd >= 0
        assert self.libc.inotify_add_watch(self.fd, b"/dev/shm", IN_CREATE | IN_MOVED_TO) >= 0
        self.seen = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        while not self.stop.is_set():
            r, _, _ = select.select([self.fd], [], [], 0.1)
            if not r:
                continue
            buf = os.read(self.fd, 65536)
            i = 0
            while i + 16 <= len(buf):
                _, _, _, n = struct.unpack_from("iIII", buf, i)
                name = buf[i + 16:i + 16 + n].rstrip(b"\0").decode()
                try:
                    mode = os.stat("/dev/shm/" + name).st_mode & 0o777
                except OSError:
                    mode = None
                self.seen.append((name, mode))
                i += 16 + n

    def close(self):
        self.stop.set()
        self.thread.join(timeout=5)
        os.close(self.fd)
