"""The store, its registration with MXNet, and key handling."""
from .store import NAME, TYPE, HybridMPIAsyncStore, HybridMPIStore
from .registry import register
from .parameters import broadcast_parameters
from .trainer import DistributedTrainer

__all__ = ["HybridMPIStore", "DistributedTrainer", "HybridMPIAsyncStore", "NAME", "TYPE", "register",
           "broadcast_parameters"]
