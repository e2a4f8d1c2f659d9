"""Filing the store in MXNet's KVStore registry.

``@KVStoreBase.register`` would file the class under its lower-cased class
name; ``hybrid-mpi`` has a hyphen, so the registry entry is written directly.
The store's ``type`` is filed too, so ``mx.kv.create(kv.type)`` round-trips
and ``gluon.Trainer(..., kvstore='dist_sync_hybrid-mpi')`` (a name holding
``dist``, which Gluon needs to create a store for a single device) works.
"""
from mxnet.kvstore import KVStoreBase

from .store import ASYNC_NAME, ASYNC_TYPE, NAME, TYPE, HybridMPIAsyncStore, HybridMPIStore


def register() -> None:
    from ..elastic.store import ELASTIC_NAME, ELASTIC_TYPE, HybridMPIElasticStore
    for name in (ELASTIC_NAME, ELASTIC_TYPE):
        KVStoreBase.kv_registry[name] = HybridMPIElasticStore
    for name in (NAME, TYPE):
        KVStoreBase.kv_registry[name] = HybridMPIStore
    for name in (ASYNC_NAME, ASYNC_TYPE):
        KVStoreBase.kv_registry[name] = HybridMPIAsyncStore
