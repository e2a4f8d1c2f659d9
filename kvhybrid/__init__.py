"""kvhybrid: a hybrid MPI + parameter-server KVStore for MXNet.

``import kvhybrid`` registers ``mx.kv.create('hybrid-mpi')``.
"""
from .config import StoreConfig
from .errors import ConfigError, KeyValueError, KVHybridError, NotInMPIJobError
from .kvstore import DistributedTrainer, HybridMPIStore, broadcast_parameters, register as _register

__version__ = "0.1.0"
__all__ = ["HybridMPIStore", "DistributedTrainer", "broadcast_parameters", "StoreConfig", "KVHybridError",
           "KeyValueError", "NotInMPIJobError", "ConfigError", "__version__"]

_register()
