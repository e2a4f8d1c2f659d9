"""Filing the stores in MXNet's KVStore registry, without importing MXNet or MPI.

``import kvhybrid`` calls ``file_when_mxnet_loads``: if MXNet is loaded, the stores are
filed at once; else the moment ``import mxnet`` finishes (an import hook), so
``import kvhybrid`` alone stays light (the launcher, ``kvhybrid-launch``, needs no MXNet).
What is filed is a small factory per name that imports the store's module when
``mx.kv.create(name)`` first builds one: MPI starts then, not at import.

``@KVStoreBase.register`` would file a class under its lower-cased class name;
``hybrid-mpi`` has a hyphen, so the registry entries are written directly. Each store's
``type`` is filed too, so ``mx.kv.create(kv.type)`` round-trips and
``gluon.Trainer(..., kvstore='dist_sync_hybrid-mpi')`` works.

MXNet's front doors take a store's name too (``gluon.Trainer(kvstore=...)``,
``Module.fit`` and ``init_optimizer``), through ``model._create_kvstore``, which creates a
store by name only where the name holds ``dist`` or a worker has several devices: with one
device ``kvstore='hybrid-mpi'`` would train every rank alone, silently. ``create_by_name``
makes that function create kvhybrid's names first.

MXNet's own ``dist_*`` stores in a process that imported kvhybrid sign the optimizer they
send to the servers when the job has a secret (``sign_mxnet_commands``): kvhybrid's servers
(``ps.node``) take no other, so a plain ``dist_sync`` script runs under ``kvhybrid-launch``
with one ``import kvhybrid``.
"""
from __future__ import annotations

import functools
import importlib
import importlib.abc
import importlib.machinery
import sys
from typing import Callable, Dict, Tuple

from .ps import auth

NAME = "hybrid-mpi"
#: ``'dist'`` and ``'sync'`` in the type make Gluon treat the store as a
#: synchronous distributed one, as it treats MXNet's ``dist_sync``.
TYPE = "dist_sync_hybrid-mpi"
#: mpi-ASGD: synchronous inside a client group, asynchronous between groups.
ASYNC_NAME = "hybrid-mpi-async"
#: ``'async'`` in the type makes Gluon update on the store, as with ``dist_async``.
ASYNC_TYPE = "dist_async_hybrid-mpi"
#: mpi-ESGD (kvhybrid/elastic/); "async": Gluon then updates on the store
ELASTIC_NAME = "hybrid-mpi-elastic"
ELASTIC_TYPE = "dist_async_hybrid-mpi-elastic"

_SYNC = ("kvhybrid.kvstore.store", "HybridMPIStore")
_ASYNC = ("kvhybrid.kvstore.store", "HybridMPIAsyncStore")
_ELASTIC = ("kvhybrid.elastic.store", "HybridMPIElasticStore")
#: what ``mx.kv.create(name)`` builds: (module, class)
STORES: Dict[str, Tuple[str, str]] = {
    NAME: _SYNC, TYPE: _SYNC, ASYNC_NAME: _ASYNC, ASYNC_TYPE: _ASYNC,
    ELASTIC_NAME: _ELASTIC, ELASTIC_TYPE: _ELASTIC}


def store_class(name: str) -> type:
    """The class ``mx.kv.create(name)`` builds (imports its module, hence MXNet and MPI)."""
    module, cls = STORES[name]
    return getattr(importlib.import_module(module), cls)


def _factory(name: str) -> Callable[[], object]:
    module, cls = STORES[name]

    def create():
        return store_class(name)()

    create.__module__, create.__name__, create.__qualname__ = module, cls, cls
    return create


def sign_mxnet_commands() -> None:
    """Make ``KVStore._send_command_to_servers`` sign pickled commands (``auth.CONTROLLER``)
    with the job's secret, if there is one; idempotent. Every command to the servers goes
    through it: MXNet's ``set_optimizer`` and kvhybrid's masters (``ServerLink``) alike."""
    from mxnet.kvstore import KVStore
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


def create_by_name() -> None:
    """Make ``model._create_kvstore`` create kvhybrid's stores from their names, wherever
    MXNet calls it from (``gluon.Trainer``, ``Module``); idempotent."""
    from mxnet import kvstore, model
    original = model._create_kvstore
    if getattr(original, "kvhybrid_names", False):
        return

    @functools.wraps(original)
    def create(store, num_device, arg_params):
        if isinstance(store, str) and store in STORES:
            store = kvstore.create(store)
        return original(store, num_device, arg_params)

    create.kvhybrid_names = True
    for name in ("mxnet.model", "mxnet.gluon.trainer", "mxnet.module.module"):
        module = importlib.import_module(name)
        if getattr(module, "_create_kvstore", None) is original:
            module._create_kvstore = create


def register() -> None:
    """File every kvhybrid store in MXNet's registry (MXNet must be loaded)."""
    from mxnet.kvstore import KVStoreBase
    sign_mxnet_commands()
    create_by_name()
    for name in STORES:
        KVStoreBase.kv_registry[name] = _factory(name)


class _RegisterAfterMXNet(importlib.abc.MetaPathFinder):
    """Finds ``mxnet`` as Python would and calls ``register`` once its import finished."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "mxnet":
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        loader = getattr(spec, "loader", None)
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        run = loader.exec_module

        def exec_module(module):
            run(module)
            if self in sys.meta_path:
                sys.meta_path.remove(self)
            register()

        loader.exec_module = exec_module
        return spec


def file_when_mxnet_loads() -> None:
    """``register`` now if MXNet is loaded, else right after ``import mxnet``."""
    mxnet = sys.modules.get("mxnet")
    if mxnet is not None and hasattr(mxnet, "kvstore"):
        register()
    elif not any(isinstance(f, _RegisterAfterMXNet) for f in sys.meta_path):
        sys.meta_path.insert(0, _RegisterAfterMXNet())
