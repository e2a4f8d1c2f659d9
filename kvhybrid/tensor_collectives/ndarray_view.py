"""Zero-copy access to NDArray memory, so MPI reads and writes it in place.

``asnumpy()`` costs a full copy (15 ms at 64 MB) and ``nd.array`` more; a
view built from ``MXNDArrayGetData`` costs microseconds. MXNet's engine is
asynchronous and does not see writes made through the view, so callers wait
for the array (``wait_to_write``) before touching it and use it before the
engine is given more work on it.

New arrays filled from numpy (``host_array``, ``host_row_sparse``) are written
directly too: no one else can be using them yet, so they skip the round trips
through the engine that ``mx.nd.array`` and ``row_sparse_array`` wait for (each a
wake-up of an engine thread: about 1 ms on a host with more busy threads than
cores). MXNet has no call that writes a row_sparse array's indices in place, so
a row_sparse array is loaded from the bytes of its saved form, as unpickling
does (``MXNDArrayLoadFromRawBytes``).
"""
from __future__ import annotations

import ctypes
import math
import struct
from typing import Optional, Tuple

import numpy as np
import mxnet as mx
from mxnet.base import _LIB, NDArrayHandle, check_call
from mxnet.ndarray import NDArray
from mxnet.ndarray.ndarray import _DTYPE_NP_TO_MX
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


#: MXNet's mark of a saved array with a storage type (``NDArray::Save``, ``NDARRAY_V2_MAGIC``)
_SAVED_V2 = 0xF993FAC9
_ROW_SPARSE, _INT64 = 1, _DTYPE_NP_TO_MX[np.int64]


def _saved_row_sparse_head(count: int, shape, dtype: np.dtype) -> bytes:
    """What ``NDArray::Save`` writes before the rows and the ids of a host row_sparse array
    of ``shape`` holding ``count`` rows (every integer little-endian, shapes as int64)."""
    rows = (count,) + tuple(shape[1:])
    return b"".join((struct.pack("<Iii", _SAVED_V2, _ROW_SPARSE, len(rows)),
                     struct.pack(f"<{len(rows)}q", *rows),
                     struct.pack("<i", len(shape)), struct.pack(f"<{len(shape)}q", *shape),
                     struct.pack("<iii", 1, 0, _DTYPE_NP_TO_MX[dtype.type]),   # cpu(0), dtype
                     struct.pack("<iiq", _INT64, 1, count)))                   # the ids' type, shape


def _load_row_sparse(ids: np.ndarray, shape, dtype: np.dtype,
                     rows: Optional[np.ndarray]) -> RowSparseNDArray:
    """A new host row_sparse array holding ``rows`` (None: rows left unset) at ``ids``,
    loaded from its saved form: MXNet copies the bytes into new memory, with no engine
    operation."""
    head = _saved_row_sparse_head(len(ids), shape, dtype)
    width = len(ids) * math.prod(shape[1:]) * dtype.itemsize
    raw = np.empty(len(head) + width + 8 * len(ids), dtype=np.uint8)
    raw[:len(head)] = np.frombuffer(head, dtype=np.uint8)
    if rows is not None:
        raw[len(head):len(head) + width].view(dtype)[:] = np.reshape(rows, -1)
    raw[len(head) + width:].view(np.int64)[:] = ids
    handle = NDArrayHandle()
    check_call(_LIB.MXNDArrayLoadFromRawBytes(raw.ctypes.data_as(ctypes.c_void_p),
                                              ctypes.c_size_t(raw.nbytes), ctypes.byref(handle)))
    return RowSparseNDArray(handle)


def new_host_row_sparse(ids: np.ndarray, shape,
                        dtype) -> Tuple[RowSparseNDArray, np.ndarray]:
    """A new host row_sparse array of ``shape`` with the sorted unique ``ids`` and room for
    their rows, and a view of those rows for the caller to fill before it hands the array
    on. No engine round trip (``row_sparse_array`` makes four)."""
    dtype, count = np.dtype(dtype), len(ids)
    row_shape = (count,) + tuple(shape[1:])
    if not count:
        arr = RowSparseNDArray(_new_alloc_handle("row_sparse", tuple(shape), mx.cpu(), False,
                                                 dtype, [np.int64], [(0,)]))
        return arr, np.empty(row_shape, dtype)
    arr = _load_row_sparse(np.asarray(ids, dtype=np.int64), shape, dtype, None)
    return arr, host_view(arr, dtype, math.prod(row_shape)).reshape(row_shape)


def host_row_sparse(rows: np.ndarray, ids: np.ndarray, shape, dtype) -> RowSparseNDArray:
    """A new host row_sparse array of ``shape`` holding ``rows`` at the sorted unique
    ``ids`` (``new_host_row_sparse``, filled)."""
    dtype = np.dtype(dtype)
    if not len(ids):
        return new_host_row_sparse(ids, shape, dtype)[0]
    return _load_row_sparse(np.asarray(ids, dtype=np.int64), shape, dtype, rows)


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
