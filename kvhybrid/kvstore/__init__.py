"""The store, its registration with MXNet, and key handling.

Names are imported when first used (``kvhybrid.kvstore.HybridMPIStore`` imports MXNet and
MPI then), so the light modules here (``registry``, ``ps.auth``) cost no MXNet import.
"""
from .._lazy import lazy_exports as _lazy_exports

#: public name -> the module that defines it
_EXPORTS = {
    "HybridMPIStore": ".store", "HybridMPIAsyncStore": ".store",
    "NAME": ".registry", "TYPE": ".registry", "register": ".registry",
}
__all__ = list(_EXPORTS)

__getattr__, __dir__ = _lazy_exports(__name__, _EXPORTS, list(globals()))
