"""Tensor collectives over MPI communicators (MXNET-MPI §6).

``allreduce(tensor, op, group)`` and ``broadcast(tensor, src, group)`` take a
tensor = an NDArray or the list of a worker's per-device NDArrays.
"""
from .group import Group
from .ops import allreduce, allreduce_array, broadcast, broadcast_array, reduce_local

__all__ = ["Group", "allreduce", "allreduce_array", "broadcast", "broadcast_array",
           "reduce_local"]
