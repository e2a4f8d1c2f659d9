"""A kvhybrid parameter server or scheduler: ``python -m kvhybrid.kvstore.ps.node``.

The same ps-lite node MXNet starts with ``DMLC_ROLE=server python -c "import mxnet"``
(ps-lite's loop and MXNet's C++ server handle pushes and pulls), with one difference:
commands (the optimizer, checkpoints, pack layouts) are unpickled only when signed with
the job's secret (``auth``). MXNet's own loop unpickles whatever reaches the port.

Started with the usual ``DMLC_*`` variables and ``KVHYBRID_SECRET`` (or
``KVHYBRID_SECRET_FILE``); ``kvhybrid-launch`` starts its scheduler and servers this way.
A server without a usable secret exits at once with the reason.
"""
from __future__ import annotations

import ctypes
import logging
import os
import socket
import sys
from typing import Set

from ... import procnet
from . import auth

log = logging.getLogger("kvhybrid.server")


def connected_peers() -> Set[str]:
    """``ip:port`` of every TCP connection made *to* this process (to a port it listens on):
    ps-lite does not tell a command handler its sender, the kernel does (IPv4)."""
    try:
        ours = procnet.tcp_sockets(tables=("tcp",))
    except OSError:
        return set()
    listening = {procnet.port(r[1]) for r in ours if r[3] == procnet.LISTEN}

    def address(field: str) -> str:
        ip, _ = field.split(":")
        return f"{socket.inet_ntoa(bytes.fromhex(ip)[::-1])}:{procnet.port(field)}"

    return {address(r[2]) for r in ours
            if r[3] == procnet.ESTABLISHED and procnet.port(r[1]) in listening}


def _import_mxnet_quietly():
    """Import MXNet without its import-time server loop (it runs when DMLC_ROLE names a
    server or scheduler), then restore the role for ps-lite."""
    role = os.environ.pop("DMLC_ROLE")
    try:
        import mxnet
    finally:
        os.environ["DMLC_ROLE"] = role
    return mxnet


def main() -> int:
    role = os.environ.get("DMLC_ROLE")
    if role not in ("server", "scheduler"):
        print(f"kvhybrid ps.node: DMLC_ROLE must be server or scheduler, got {role!r} "
              "(workers run the training script)", file=sys.stderr)
        return 2
    verifier = None
    if role == "server":
        try:
            verifier = auth.Verifier(auth.job_secret())
        except auth.AuthError as exc:
            print(f"kvhybrid server: {exc}", file=sys.stderr)
            return 2
    mx = _import_mxnet_quietly()
    from mxnet.base import _LIB, check_call
    from mxnet.kvstore.kvstore_server import KVStoreServer

    kv = mx.kv.create("dist")
    server = KVStoreServer(kv)   # found by server._server_rank
    signed = []                  # names of the optimizers signed commands installed
    job_peers: Set[str] = set()  # connections to this server when the first one came

    def refuse_to_sum(key, grad, weight) -> None:
        log.error("server %d: a push to key %s arrived, and the only optimizer sent to this "
                  "server was unsigned: ending the server rather than storing gradients as "
                  "weights. A plain MXNet script sends it so: add `import kvhybrid` to it (its "
                  "dist stores then sign their optimizer with KVHYBRID_SECRET)", kv.rank, key)
        logging.shutdown()
        os._exit(1)

    def controller(cmd_id: int, body: bytes, _) -> None:
        if cmd_id != auth.CONTROLLER:
            log.warning("server %d: unknown command %d ignored", kv.rank, cmd_id)
            return
        try:
            optimizer = verifier.load(body or b"")
        except auth.AuthError as exc:
            peers = connected_peers()
            new = sorted(peers - job_peers) if job_peers else []
            sender = (f"from {', '.join(new)} (connected since the job's first command)" if new
                      else f"from one of {', '.join(sorted(peers)) or 'no open connection'}")
            log.error("server %d: refused %s, %s; nothing was unpickled, the job goes on",
                      kv.rank, exc, sender)
            # unsigned, before any signed optimizer: a plain MXNet worker of this job? Its
            # pushes must not be summed into weights. (A worker with another secret finds
            # out from kvhybrid's optimizer probe, and says so.)
            if not signed and not auth.is_signed((body or b"").decode("ascii", "replace")):
                kv._set_updater(refuse_to_sum)
            return
        except Exception:   # a signed body that fails to load: the worker's probe sees it
            log.exception("server %d: a signed command failed to load", kv.rank)
            return
        try:
            kv.set_optimizer(optimizer)
            if not signed:   # every node of the job is connected by now (ps-lite's barrier)
                job_peers.update(connected_peers())
            signed.append(type(optimizer).__name__)
        except Exception:
            log.exception("server %d: installing the command's optimizer failed", kv.rank)

    logging.basicConfig(level=logging.INFO,
                        format=f"%(asctime)s kvhybrid {role}: %(message)s")
    proto = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)
    callback = proto(controller)   # referenced until the loop returns
    check_call(_LIB.MXKVStoreRunServer(server.handle, callback, None))
    del callback
    return 0


if __name__ == "__main__":
    sys.exit(main())
