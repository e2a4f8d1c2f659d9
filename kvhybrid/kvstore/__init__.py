"""The store, its registration with MXNet, and key handling."""
import os as _os

if _os.environ.get("DMLC_ROLE") not in ("server", "scheduler"):   # see kvhybrid/__init__.py
    from .store import NAME, TYPE, HybridMPIAsyncStore, HybridMPIStore
    from .registry import register
    from .parameters import broadcast_parameters
    from .trainer import DistributedTrainer, prefetch
    from .checkpoint import load_checkpoint, save_checkpoint

    __all__ = ["HybridMPIStore", "DistributedTrainer", "HybridMPIAsyncStore", "NAME", "TYPE",
               "register", "broadcast_parameters", "prefetch", "save_checkpoint", "load_checkpoint"]
