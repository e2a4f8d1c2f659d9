"""Zero-copy access to NDArray memory, so MPI reads and writes it in place.

``asnumpy()`` costs a full copy (15 ms at 64 MB) and ``nd.array`` more; a
view built from ``MXNDArrayGetData`` costs microseconds. MXNet's engine is
asynchronous and does not see writes made through the view, so callers wait
for the array (``wait_to_write``) before touching it and use it before the
engine is given more work on it.

New arrays filled from numpy (``host_array``, ``host_row_sparse``) are written
through a view too: no one else can be using them yet, so they skip the round
trips through the engine that ``mx.nd.array`` and ``row_sparse_array`` wait for
(each a wake-up of an engine thread: about 1 ms on a host with more busy
threads than cores).
"""
from __future__ import annotations

import ctypes
import math
from typing import Optional, Tuple

import numpy as np
import mxnet as mx
from mxnet.base import _LIB, check_call
from mxnet.ndarray import NDArray
from mxnet.ndarray.sparse import RowSparseNDArray, _new_alloc_handle

HOST_DEVICE_TYPES = frozenset({"cpu", "cpu_pinned", "cpu_shared"})


def is_host(arr: NDArray) -> bool:
    """Whether the array lives in host memory that MPI can read directly."""
    return arr.context.device_type in HOST_DEVICE_TYPES


def wait_to_write(arr: NDArray) -> None:
    """Block until the engine has no pending reads or writes of ``arr``."""
    check_call(_LIB.MXNDArrayWaitToWrite(arr.handle))


def host_view(arr: NDArray, dtype=None, count: Optional[int] = None) -> np.ndarray:
    """A flat numpy array sharing ``arr``'s memory; ``arr`` must be a dense host array.

    ``dtype`` and ``count`` may be passed when the caller knows them, to save
    the calls into MXNet that look them up.
    """
    if dtype is None or count is None:
        if arr.stype != "default":
            raise ValueError(f"host_view needs a dense array, got stype={arr.stype!r}")
        if not is_host(arr):
            raise ValueError(f"host_view needs a host array, got one on {arr.context}")
        dtype = np.dtype(arr.dtype)
        count = math.prod(arr.shape)
    dtype = np.dtype(dtype)
    if count == 0:
        return np.empty(0, dtype=dtype)
    ptr = ctypes.c_void_p()
    check_call(_LIB.MXNDArrayGetData(arr.handle, ctypes.byref(ptr)))
    raw = (ctypes.c_char * (count * dtype.itemsize)).from_address(ptr.value)
    raw.owner = arr  # the view (whose base is raw) keeps the NDArray, and so its memory, alive
    return np.frombuffer(raw, dtype=dtype)


def host_array(values: np.ndarray, dtype=None) -> NDArray:
    """A new host NDArray holding a copy of ``values`` (``mx.nd.array`` without its wait
    for the engine)."""
    values = np.asarray(values)
    dtype = values.dtype if dtype is None else np.dtype(dtype)
    arr = mx.nd.empty(values.shape, ctx=mx.cpu(), dtype=dtype)
    np.copyto(host_view(arr, dtype, values.size).reshape(values.shape), values, casting="unsafe")
    return arr


def new_host_row_sparse(ids: np.ndarray, shape,
                        dtype) -> Tuple[RowSparseNDArray, np.ndarray]:
    """A new host row_sparse array of ``shape`` with the sorted unique ``ids`` and room for
    their rows, and a view of those rows for the caller to fill before it hands the array
    on. The indices cost one engine round trip (MXNet has no call that exposes them in
    place), where ``row_sparse_array`` makes four."""
    dtype, count = np.dtype(dtype), len(ids)
    row_shape = (count,) + tuple(shape[1:])
    arr = RowSparseNDArray(_new_alloc_handle("row_sparse", tuple(shape), mx.cpu(), False, dtype,
                                             [np.int64], [(count,)]))
    if not count:
        return arr, np.empty(row_shape, dtype)
    indices = host_array(ids, np.int64)   # (held: its handle must outlive the call)
    check_call(_LIB.MXNDArraySyncCopyFromNDArray(arr.handle, indices.handle, ctypes.c_int(0)))
    return arr, host_view(arr, dtype, math.prod(row_shape)).reshape(row_shape)


def empty_row_sparse(shape, dtype) -> RowSparseNDArray:
    """A new host row_sparse array of ``shape`` with no rows and no memory yet: an out for
    a pull, which sizes it (``mx.nd.sparse.zeros`` runs an operator through the engine for
    the same: 26 us of the caller's CPU against 7)."""
    return RowSparseNDArray(_new_alloc_handle("row_sparse", tuple(shape), mx.cpu(), True,
                                              np.dtype(dtype), [np.int64], [(0,)]))


def host_row_sparse(rows: np.ndarray, ids: np.ndarray, shape, dtype) -> RowSparseNDArray:
    """A new host row_sparse array of ``shape`` holding ``rows`` at the sorted unique
    ``ids`` (``new_host_row_sparse``, filled)."""
    arr, values = new_host_row_sparse(ids, shape, dtype)
    np.copyto(values, np.reshape(rows, values.shape), casting="unsafe")
    return arr


class ViewCache:
    """Host views of the arrays a training loop hands over every step (Gluon's gradients
    and weights are the same NDArrays each step), made once. Keyed by the NDArray's
    handle; the entry keeps the NDArray alive, so a handle cannot be reused meanwhile.
    An NDArray's memory never moves (in-place operators keep it), its shape and dtype
    never change."""

    def __init__(self, limit: int = 8192):
        self._views: dict = {}
        self._limit = limit

    def get(self, arr: NDArray, dtype, count: int) -> np.ndarray:
        entry = self._views.get(arr.handle.value)
        if entry is None or entry[1].dtype != dtype or entry[1].size != count:
            if len(self._views) >= self._limit:  # a loop that makes new arrays every step
                self._views.clear()
            entry = self._views[arr.handle.value] = (arr, host_view(arr, dtype, count))
        return entry[1]

    def __len__(self) -> int:
        return len(self._views)

    def clear(self) -> None:
        self._views.clear()
