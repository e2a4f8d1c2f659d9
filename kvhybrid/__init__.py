"""kvhybrid: a hybrid MPI + parameter-server KVStore for MXNet.

``import kvhybrid`` registers ``mx.kv.create('hybrid-mpi')`` (and its async and elastic
siblings) with MXNet: at once if MXNet is loaded, else when it is. The import itself is
light: the store, MPI and MXNet load when first used (``kvhybrid.DistributedTrainer``,
``mx.kv.create``), so ``kvhybrid-launch`` and the parameter servers start without them.
"""
from ._lazy import lazy_exports as _lazy_exports

from .kvstore.registry import file_when_mxnet_loads as _file_when_mxnet_loads

__version__ = "0.1.0"

#: public name -> the module that defines it
_EXPORTS = {
    "HybridMPIStore": ".kvstore.store",
    "DistributedTrainer": ".gluon.trainer", "prefetch": ".gluon.trainer",
    "broadcast_parameters": ".gluon.parameters",
    "save_checkpoint": ".gluon.checkpoint", "load_checkpoint": ".gluon.checkpoint",
    "StoreConfig": ".config",
    "KVHybridError": ".errors", "KeyValueError": ".errors", "NotInMPIJobError": ".errors",
    "ConfigError": ".errors",
}
__all__ = list(_EXPORTS) + ["__version__"]

__getattr__, __dir__ = _lazy_exports(__name__, _EXPORTS, list(globals()))


_file_when_mxnet_loads()
