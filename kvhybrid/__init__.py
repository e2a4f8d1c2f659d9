"""kvhybrid: a hybrid MPI + parameter-server KVStore for MXNet.

``import kvhybrid`` registers ``mx.kv.create('hybrid-mpi')``.
"""
import os as _os

__version__ = "0.1.0"

if _os.environ.get("DMLC_ROLE") not in ("server", "scheduler"):
    # A parameter server imports only kvhybrid.kvstore.server_side, while ``import mxnet``
    # is still running its server loop: the store cannot be imported there.
    from .config import StoreConfig
    from .errors import ConfigError, KeyValueError, KVHybridError, NotInMPIJobError
    from .kvstore import (DistributedTrainer, HybridMPIStore, broadcast_parameters,
                          load_checkpoint, prefetch, register as _register, save_checkpoint)

    __all__ = ["HybridMPIStore", "DistributedTrainer", "broadcast_parameters", "prefetch",
               "save_checkpoint",
               "load_checkpoint", "StoreConfig", "KVHybridError", "KeyValueError",
               "NotInMPIJobError", "ConfigError", "__version__"]

    _register()
