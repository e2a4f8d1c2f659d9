"""kvhybrid: a hybrid MPI + parameter-server KVStore for MXNet.

``import kvhybrid`` registers ``mx.kv.create('hybrid-mpi')``.
"""
import os as _os

__version__ = "0.1.0"

if _os.environ.get("DMLC_ROLE") not in ("server", "scheduler"):
    # A scheduler or parameter server (kvstore/ps_node.py) needs only kvstore.auth and
    # kvstore.server_side: not the store, MPI, or MXNet before ps_node imports it.
    from .config import StoreConfig
    from .errors import ConfigError, KeyValueError, KVHybridError, NotInMPIJobError
    from .kvstore import (DistributedTrainer, HybridMPIStore, broadcast_parameters,
                          load_checkpoint, prefetch, register as _register, save_checkpoint)

    __all__ = ["HybridMPIStore", "DistributedTrainer", "broadcast_parameters", "prefetch",
               "save_checkpoint",
               "load_checkpoint", "StoreConfig", "KVHybridError", "KeyValueError",
               "NotInMPIJobError", "ConfigError", "__version__"]

    _register()
