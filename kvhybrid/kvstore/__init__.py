"""The store, its registration with MXNet, and key handling."""
from .store import NAME, TYPE, HybridMPIStore
from .registry import register
from .parameters import broadcast_parameters

__all__ = ["HybridMPIStore", "NAME", "TYPE", "register", "broadcast_parameters"]
