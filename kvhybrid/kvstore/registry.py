"""Filing the store in MXNet's KVStore registry.

``@KVStoreBase.register`` would file the class under its lower-cased class
name; ``hybrid-mpi`` has a hyphen, so the registry entry is written directly.
The store's ``type`` is filed too, so ``mx.kv.create(kv.type)`` round-trips
and ``gluon.Trainer(..., kvstore='dist_sync_hybrid-mpi')`` (a name holding
``dist``, which Gluon needs to create a store for a single device) works.

MXNet's own ``dist_*`` stores in a process that imported kvhybrid sign the optimizer they
send to the servers when the job has a secret (``sign_mxnet_commands``): kvhybrid's servers
(``ps_node``) take no other, so a plain ``dist_sync`` script runs under ``kvhybrid-launch``
with one ``import kvhybrid``.
"""
import functools

from mxnet.kvstore import KVStore, KVStoreBase

from . import auth

from .store import ASYNC_NAME, ASYNC_TYPE, NAME, TYPE, HybridMPIAsyncStore, HybridMPIStore


def sign_mxnet_commands() -> None:
    """Make ``KVStore._send_command_to_servers`` sign pickled commands (``auth.CONTROLLER``)
    with the job's secret, if there is one; idempotent. Every command to the servers goes
    through it: MXNet's ``set_optimizer`` and kvhybrid's masters (``ServerLink``) alike."""
    send = KVStore._send_command_to_servers
    if getattr(send, "kvhybrid_signs", False):
        return

    @functools.wraps(send)
    def signed(self, head, body):
        if head == auth.CONTROLLER and not auth.is_signed(body):
            try:
                secret = auth.job_secret()
            except auth.AuthError:   # no secret: MXNet's own servers, as before
                return send(self, head, body)
            body = auth.sign_pickle(body.encode("utf-8"), secret)
        return send(self, head, body)

    signed.kvhybrid_signs = True
    KVStore._send_command_to_servers = signed


def register() -> None:
    sign_mxnet_commands()
    from ..elastic.store import ELASTIC_NAME, ELASTIC_TYPE, HybridMPIElasticStore
    for name in (ELASTIC_NAME, ELASTIC_TYPE):
        KVStoreBase.kv_registry[name] = HybridMPIElasticStore
    for name in (NAME, TYPE):
        KVStoreBase.kv_registry[name] = HybridMPIStore
    for name in (ASYNC_NAME, ASYNC_TYPE):
        KVStoreBase.kv_registry[name] = HybridMPIAsyncStore
