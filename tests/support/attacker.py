"""A hostile process for the security tests: it speaks ps-lite to a parameter server's port
as a ps-lite worker would, with nothing but a TCP socket.

ps-lite's transport is ZeroMQ (a server's port is a ROUTER socket) and its messages carry a
protobuf ``PBMeta``. ``send_command`` performs the ZMTP 3.0 handshake (NULL security, the
only one ps-lite uses), presents itself with a ps-lite node identity, and sends one
``SimpleApp`` request (``head`` = the command id, ``body`` = the bytes given): what
``KVStore._send_command_to_servers`` sends. MXNet's server loop unpickles such a body.

The identity ``ps0<id>`` parses, in ps-lite, to node ``id`` (a live worker, so the server's
answer goes to a node it knows and is ignored there) while being a ZeroMQ identity no live
peer uses (the ROUTER would drop a duplicate).
"""
from __future__ import annotations

import pickle
import socket
import struct

#: the first ps-lite worker's node id (scheduler 1, servers 8, 10, ..., workers 9, 11, ...)
FIRST_WORKER = 9


class CreateFile:
    """Unpickling this creates ``path``: the proof that a server ran the sender's code."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def payload(path: str) -> bytes:
    """A pickle whose loading creates ``path`` (protocol 0, as MXNet sends optimizers)."""
    return pickle.dumps(CreateFile(path), protocol=0)


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number: int, value) -> bytes:
    if isinstance(value, bytes):
        return _varint(number << 3 | 2) + _varint(len(value)) + value
    return _varint(number << 3) + _varint(int(value))


def simple_app_request(head: int, body: bytes, timestamp: int = 0) -> bytes:
    """ps-lite's PBMeta of a SimpleApp request to app 0, customer 0 (src/meta.proto)."""
    return b"".join([_field(1, head), _field(2, body), _field(4, 1), _field(6, 1),
                     _field(7, 0), _field(8, timestamp), _field(10, 0)])


def _frame(data: bytes, more: bool = False, command: bool = False) -> bytes:
    flags = (1 if more else 0) | (4 if command else 0)
    if len(data) > 255:
        return bytes([flags | 2]) + struct.pack(">Q", len(data)) + data
    return bytes([flags, len(data)]) + data


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("the server closed the connection during the handshake")
        data += chunk
    return data


def _recv_frame(sock: socket.socket) -> bytes:
    flags = _recv_exact(sock, 1)[0]
    size = struct.unpack(">Q", _recv_exact(sock, 8))[0] if flags & 2 else _recv_exact(sock, 1)[0]
    return _recv_exact(sock, size)


def send_command(host: str, port: int, head: int, body: bytes,
                 node_id: int = FIRST_WORKER) -> str:
    """Connect to a ps-lite node's port and send it one command request; returns this end's
    ``ip:port`` (what the server sees as the sender)."""
    with socket.create_connection((host, port), timeout=10) as sock:
        me = "%s:%d" % sock.getsockname()[:2]
        greeting = (b"\xff" + b"\x00" * 8 + b"\x7f" + bytes([3, 0]) + b"NULL".ljust(20, b"\x00")
                    + b"\x00" + b"\x00" * 31)
        sock.sendall(greeting)
        _recv_exact(sock, 64)
        props = b"".join(bytes([len(k)]) + k + struct.pack(">I", len(v)) + v
                         for k, v in ((b"Socket-Type", b"DEALER"),
                                      (b"Identity", f"ps0{node_id}".encode())))
        sock.sendall(_frame(b"\x05READY" + props, command=True))
        ready = _recv_frame(sock)
        if not ready.startswith(b"\x05READY"):
            raise ConnectionError(f"unexpected handshake answer {ready[:20]!r}")
        sock.sendall(_frame(simple_app_request(head, body)))
        # the server answers the request (to the node it believes sent it): give it time to
        # read ours before the connection closes
        sock.settimeout(2)
        try:
            sock.recv(1)
        except OSError:
            pass
    return me

