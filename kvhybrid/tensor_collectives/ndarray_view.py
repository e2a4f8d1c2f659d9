"""Zero-copy access to NDArray memory, so MPI reads and writes it in place.

``asnumpy()`` costs a full copy and ``nd.array`` more; a view built from
``MXNDArrayGetData`` copies nothing. MXNet's engine is
asynchronous and does not see writes made through the view, so callers wait
for the array (``wait_to_write``) before touching it and use it before the
engine is given more work on it.

New arrays filled from numpy (``host_array``, ``host_row_sparse``) are written
through a view too: no one else can be using them yet, so they skip the round
trips through the engine that ``mx.nd.array`` and ``row_sparse_array`` wait for
(each a wake-up of an engine thread, slow on a host with more busy threads
than cores).

A row_sparse array's row ids are read in place too (``row_sparse_ids``), and a new one's
written in place, through the C++ helper ``ndarray_aux.cc`` that setup.py builds against
MXNet's headers: MXNet's ``indices`` is a new array filled by an engine operation, and
setting them is a synchronous engine copy, a round trip each that a push of rows paid for
every gradient and every array of rows it made. The helper also compares a batch's ids
with those handed over where they lie (``ids_equal``), and queues MXNet's own engine copy
(``engine_copy``, ``CopyFromTo``), which a training loop's pull of prefetched rows makes.
"""
from __future__ import annotations

import ctypes
import logging
import math
from typing import Optional, Tuple

import numpy as np
import mxnet as mx
from mxnet.base import _LIB, NDArrayHandle, check_call
from mxnet.ndarray import NDArray
from mxnet.ndarray.ndarray import _DTYPE_NP_TO_MX, _STORAGE_TYPE_STR_TO_ID, _int64_enabled
from mxnet.ndarray.sparse import RowSparseNDArray, _new_alloc_handle

from .native import Helper

log = logging.getLogger("kvhybrid")

HOST_DEVICE_TYPES = frozenset({"cpu", "cpu_pinned", "cpu_shared"})


def is_host(arr: NDArray) -> bool:
    """Whether the array lives in host memory that MPI can read directly."""
    return arr.context.device_type in HOST_DEVICE_TYPES


def wait_to_write(arr: NDArray) -> None:
    """Block until the engine has no pending reads or writes of ``arr``."""
    check_call(_LIB.MXNDArrayWaitToWrite(arr.handle))


class _Memory:
    """Memory at an address, as numpy reads it (``__array_interface__``), holding its owner
    alive: a view of it needs no ctypes array type per length (``(c_char * n)`` and
    ``np.ctypeslib.as_array`` make and cache one for each new length, where rows' counts
    change every step)."""

    __slots__ = ("__array_interface__", "owner")

    def __init__(self, address: int, count: int, dtype: np.dtype, owner) -> None:
        self.__array_interface__ = {"data": (address, False), "shape": (count,),
                                    "typestr": dtype.str, "version": 3}
        self.owner = owner


def memory_view(address: int, count: int, dtype, owner=None) -> np.ndarray:
    """A flat numpy array of ``count`` ``dtype`` elements at ``address``, which keeps
    ``owner`` (what owns the memory) alive."""
    return np.asarray(_Memory(address, count, np.dtype(dtype), owner))


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
    return memory_view(ptr.value, count, dtype, arr)   # (the view keeps the NDArray alive)


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
    on. The ids are written in place by the C++ helper where it runs (no one else can be
    using the array yet); else they cost one engine round trip (MXNet has no call that
    exposes them in place), where ``row_sparse_array`` makes four."""
    dtype, count = np.dtype(dtype), len(ids)
    row_shape = (count,) + tuple(shape[1:])
    arr = RowSparseNDArray(_new_alloc_handle("row_sparse", tuple(shape), mx.cpu(), False, dtype,
                                             [np.int64], [(count,)]))
    if not count:
        return arr, np.empty(row_shape, dtype)
    if not _write_row_ids(arr, ids):   # (no C++ helper: through the engine)
        indices = host_array(ids, np.int64)   # (held: its handle must outlive the call)
        check_call(_LIB.MXNDArraySyncCopyFromNDArray(arr.handle, indices.handle,
                                                     ctypes.c_int(0)))
    return arr, host_view(arr, dtype, math.prod(row_shape)).reshape(row_shape)


def rows_made_later() -> bool:
    """Whether ``make_rows`` can give an ``empty_row_sparse`` array its rows later, from
    inside an engine operation that writes it (the C++ helper)."""
    return _native_alloc() is not None


def make_rows(arr: RowSparseNDArray, ids: np.ndarray) -> np.ndarray:
    """Give ``arr`` (a host row_sparse array, an ``empty_row_sparse`` one or one holding
    rows, whose memory it reuses where large enough; held by the running engine operation
    that writes it, where ``rows_made_later``, or with nothing queued on it: after
    ``wait_to_write``) the sorted unique ``ids`` and room for their
    rows; returns a view of those rows for the caller to fill. Reads of ``arr`` queued
    before, behind that operation, see the rows it was given."""
    ids_at, rows_at = ctypes.c_void_p(), ctypes.c_void_p()
    answer = _native_alloc()(arr.handle, len(ids), ctypes.byref(ids_at), ctypes.byref(rows_at))
    if answer != 0:
        raise RuntimeError(f"kvhybrid's C++ helper could not give a row_sparse array its rows "
                           f"(kvhybrid_alloc_rows answered {answer}): set KVHYBRID_CPP_HELPER=0 "
                           "(prefetched rows then get their memory on the caller's thread) and "
                           "report it")
    dtype = np.dtype(arr.dtype)
    row_shape = (len(ids),) + tuple(arr.shape[1:])
    if not len(ids):
        return np.empty(row_shape, dtype)
    memory_view(ids_at.value, len(ids), np.int64)[:] = ids
    return memory_view(rows_at.value, math.prod(row_shape), dtype, owner=arr).reshape(row_shape)


def takes_rows_in_place(arr: NDArray, shape, dtype) -> bool:
    """Whether ``make_rows`` can give ``arr`` rows of a table of ``shape`` and ``dtype`` (a
    host row_sparse array of those, with int64 row ids, where ``rows_made_later``): a served
    pull's out then takes its rows itself. One call of the helper."""
    function = _native_alloc() and getattr(_library(), "kvhybrid_takes_rows", None)
    if not function:
        return False
    args = _TABLE_ARGS.get((tuple(shape), dtype))
    if args is None:
        if len(_TABLE_ARGS) >= 1024:
            _TABLE_ARGS.clear()
        args = _TABLE_ARGS[(tuple(shape), dtype)] = (
            ctypes.c_int(len(shape)), (ctypes.c_int64 * len(shape))(*shape),
            ctypes.c_int(int(_DTYPE_NP_TO_MX[np.dtype(dtype).type])))
    return function(arr.handle, *args) == 1


#: ``takes_rows_in_place``'s arguments for a table, by (shape, dtype)
_TABLE_ARGS: dict = {}


def _native_alloc():
    """The helper's ``kvhybrid_alloc_rows``, or None where it was not built (or before it
    was in it), is turned off, or makes an array that MXNet reads otherwise than the one
    ``row_sparse_array`` makes of the same rows."""
    if _ALLOC:
        return _ALLOC[0]
    lib, function = _library(), None
    if lib is not None and hasattr(lib, "kvhybrid_alloc_rows"):
        function = lib.kvhybrid_alloc_rows
        values, ids = np.arange(6, dtype=np.float32).reshape(3, 2), np.array([2, 5, 11])
        want = mx.nd.sparse.row_sparse_array((values, ids), shape=(16, 2))
        made = empty_row_sparse((16, 2), np.float32)
        ids_at, rows_at = ctypes.c_void_p(), ctypes.c_void_p()
        right = function(made.handle, 3, ctypes.byref(ids_at), ctypes.byref(rows_at)) == 0
        if right:
            memory_view(ids_at.value, 3, np.int64)[:] = ids
            memory_view(rows_at.value, 6, np.float32)[:] = values.reshape(-1)
            right = (np.array_equal(made.indices.asnumpy(), ids)
                     and np.array_equal(made.asnumpy(), want.asnumpy()))
        # an array holding rows is given others (a served pull's out)
        right = right and function(made.handle, 2, ctypes.byref(ids_at),
                                   ctypes.byref(rows_at)) == 0
        if right:
            memory_view(ids_at.value, 2, np.int64)[:] = ids[1:]
            memory_view(rows_at.value, 4, np.float32)[:] = values[1:].reshape(-1)
            want = mx.nd.sparse.row_sparse_array((values[1:], ids[1:]), shape=(16, 2))
            right = (np.array_equal(made.indices.asnumpy(), ids[1:])
                     and np.array_equal(made.asnumpy(), want.asnumpy()))
        if not right:
            _reads_wrong("gives this MXNet's arrays their rows")
            function = None
    _ALLOC.append(function)
    return function


def empty_row_sparse(shape, dtype) -> RowSparseNDArray:
    """A new host row_sparse array of ``shape`` with no rows and no memory yet: an out for
    a pull, which sizes it. The push makes one per table every step, so the C call's
    arguments are built once per shape and dtype (``mx.nd.sparse.zeros`` runs an operator
    through the engine for the same, and MXNet's ``_new_alloc_handle`` builds them each
    call)."""
    key = (tuple(shape), dtype)
    args = _EMPTY_ARGS.get(key)
    if args is None:
        if len(_EMPTY_ARGS) >= 1024:   # (pulls of varying row counts: link.pull_rows)
            _EMPTY_ARGS.clear()
        args = _EMPTY_ARGS[key] = _empty_args(key[0], np.dtype(dtype))
    handle = NDArrayHandle()
    check_call(args[0](*args[1:], ctypes.byref(handle)))
    return RowSparseNDArray(handle)


#: ``empty_row_sparse``'s (C function, its arguments but the out handle), by (shape, dtype)
_EMPTY_ARGS: dict = {}


def _empty_args(shape: Tuple[int, ...], dtype: np.dtype) -> tuple:
    """``MXNDArrayCreateSparseEx``'s arguments for a host row_sparse array of ``shape`` whose
    memory waits for its rows (delayed allocation), with one int64 index of shape (0,):
    what ``mx.nd.sparse``'s ``_new_alloc_handle`` passes for the same."""
    wide = _int64_enabled()   # (MXNet built for int64 tensor sizes: the 64-bit call)
    function = _LIB.MXNDArrayCreateSparseEx64 if wide else _LIB.MXNDArrayCreateSparseEx
    dim, dims = (ctypes.c_int64, ctypes.c_int) if wide else (ctypes.c_uint, ctypes.c_uint)
    int64 = int(_DTYPE_NP_TO_MX[np.int64])
    return (function, ctypes.c_int(int(_STORAGE_TYPE_STR_TO_ID["row_sparse"])),
            (dim * len(shape))(*shape), dims(len(shape)), ctypes.c_int(mx.cpu().device_typeid),
            ctypes.c_int(0), ctypes.c_int(1), ctypes.c_int(int(_DTYPE_NP_TO_MX[dtype.type])),
            ctypes.c_uint(1), (ctypes.c_int * 1)(int64), (ctypes.c_int * 1)(1), (dim * 1)(0))


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
        self._elsewhere: dict = {}   # handle -> an array not in host memory (kept alive)
        self._limit = limit

    def get(self, arr: NDArray, dtype, count: int) -> np.ndarray:
        entry = self._views.get(arr.handle.value)
        if entry is None or entry[1].dtype != dtype or entry[1].size != count:
            if len(self._views) >= self._limit:  # a loop that makes new arrays every step
                self._views.clear()
            entry = self._views[arr.handle.value] = (arr, host_view(arr, dtype, count))
        return entry[1]

    def host(self, arr: NDArray, dtype, count: int) -> Optional[np.ndarray]:
        """``get`` where ``arr`` lies in host memory, else None (where it lies is looked up
        once: ``is_host`` costs a context object each call)."""
        handle = arr.handle.value
        if handle not in self._views:
            if handle in self._elsewhere:
                return None
            if not is_host(arr):
                if len(self._elsewhere) >= self._limit:
                    self._elsewhere.clear()
                self._elsewhere[handle] = arr
                return None
        return self.get(arr, dtype, count)

    def __len__(self) -> int:
        return len(self._views)

    def clear(self) -> None:
        self._views.clear()
        self._elsewhere.clear()


# -- the C++ helper (ndarray_aux.cc) -----------------------------------------------------------
_HELPER = Helper("_ndarray_aux", "KVHYBRID_CPP_HELPER", "row ids are read through MXNet's engine",
                 {"kvhybrid_row_sparse_ids": (ctypes.c_int, [ctypes.c_void_p,
                                                             ctypes.POINTER(ctypes.c_void_p),
                                                             ctypes.POINTER(ctypes.c_int64)]),
                  "kvhybrid_ids_equal": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_void_p,
                                                        ctypes.c_int64]),
                  "kvhybrid_engine_copy": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_void_p,
                                                          ctypes.c_int]),
                  "kvhybrid_pull_prefetched": (ctypes.c_int, [
                      ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p,
                      ctypes.c_void_p, ctypes.c_int]),
                  "kvhybrid_alloc_rows": (ctypes.c_int, [
                      ctypes.c_void_p, ctypes.c_int64, ctypes.POINTER(ctypes.c_void_p),
                      ctypes.POINTER(ctypes.c_void_p)]),
                  "kvhybrid_takes_rows": (ctypes.c_int, [
                      ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_int]),
                  "kvhybrid_ids_in_table": (ctypes.c_int, [
                      ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64,
                      ctypes.POINTER(ctypes.c_int64)])})
_NATIVE: list = []    # [kvhybrid_row_sparse_ids, or None], once checked
_PULL: list = []      # [(kvhybrid_ids_equal, kvhybrid_engine_copy, kvhybrid_pull_prefetched
#                        or None), or None], once checked
_ALLOC: list = []     # [kvhybrid_alloc_rows, or None], once checked
_IDS: list = []       # [kvhybrid_ids_in_table, or None], once checked
_IDS_ROOM = [4096]    # how many ids ``ids_in_table_of`` makes room for first: the last count


def _library() -> Optional[ctypes.CDLL]:
    return _HELPER.library()


def _reads_wrong(what: str) -> None:
    log.warning("kvhybrid's C++ helper (%s) %s wrong: not using it (rebuild it against this "
                "MXNet: pip install --no-build-isolation -e .)", _library()._name, what)


def _native_row_ids():
    """The helper's ``kvhybrid_row_sparse_ids``, or None where it was not built, is turned
    off (``KVHYBRID_CPP_HELPER=0``) or does not read MXNet's arrays right (an MXNet other
    than the one it was built against): it must return the very ids MXNet's ``indices``
    does on an array made here."""
    if _NATIVE:
        return _NATIVE[0]
    function = None
    lib = _library()
    if lib is not None:
        function = lib.kvhybrid_row_sparse_ids
        probe = mx.nd.sparse.row_sparse_array(
            (np.ones((3, 2), np.float32), np.array([2, 5, 11], np.int64)), shape=(16, 2))
        if not np.array_equal(_read_row_ids(function, probe), probe.indices.asnumpy()):
            _reads_wrong("reads this MXNet's arrays")
            function = None
    _NATIVE.append(function)
    return function


def _native_pull():
    """The helper's ``kvhybrid_ids_equal``, ``kvhybrid_engine_copy`` and
    ``kvhybrid_pull_prefetched`` (None in a helper built before it), or None where it was
    not built (or before they were in it), is turned off, or any answers otherwise than
    numpy and ``_copyto`` on arrays made here."""
    if _PULL:
        return _PULL[0]
    lib, functions = _library(), None
    if lib is not None and hasattr(lib, "kvhybrid_engine_copy"):
        equal, copy = lib.kvhybrid_ids_equal, lib.kvhybrid_engine_copy
        functions = (equal, copy, getattr(lib, "kvhybrid_pull_prefetched", None))
        ids = np.array([2, 5, 11], np.int64)
        answers = [_ids_equal(functions, mx.nd.array(values, dtype=dtype), ids)
                   for values, dtype in (([2, 5, 11], "float32"), ([2, 5, 11], "int64"),
                                         ([2, 5, 12], "float32"), ([2.5, 5, 11], "float64"))]
        rows = mx.nd.sparse.row_sparse_array((np.arange(6, dtype=np.float32).reshape(3, 2),
                                              ids), shape=(16, 2))
        out = empty_row_sparse((16, 2), np.float32)
        copied = copy(rows.handle, out.handle, 0) == 0 and \
            np.array_equal(out.asnumpy(), rows.asnumpy())
        both = functions[2]
        if both is not None:   # not equal: nothing copied; equal: copied
            again = empty_row_sparse((16, 2), np.float32)
            other, same = mx.nd.array([2, 5, 12]), mx.nd.array([2, 5, 11])
            copied = copied and both(other.handle, ids.ctypes.data, 3, rows.handle,
                                     again.handle, 0) == 0 \
                and again.asnumpy().sum() == 0 \
                and both(same.handle, ids.ctypes.data, 3, rows.handle, again.handle, 0) == 1 \
                and np.array_equal(again.asnumpy(), rows.asnumpy())
        if answers != [True, True, False, False] or not copied:
            _reads_wrong("compares or copies this MXNet's arrays")
            functions = None
    _PULL.append(functions)
    return functions


def ids_equal(arr: NDArray, ids: np.ndarray) -> Optional[bool]:
    """Whether the dense host array ``arr`` holds the int64 ``ids``, value by value as
    numpy's ``==`` compares them, read in place once the engine has written it (a batch's
    ids: ``asnumpy`` would copy them into a new array first); None where the helper cannot
    tell (no helper, another device or dtype): compare in numpy then."""
    functions = _native_pull()
    if functions is None or ids.dtype != np.int64 or not ids.flags.c_contiguous:
        return None
    return _ids_equal(functions, arr, ids)


def _ids_equal(functions, arr: NDArray, ids: np.ndarray) -> Optional[bool]:
    answer = functions[0](arr.handle, ids.ctypes.data, len(ids))
    return None if answer < 0 else bool(answer)


def ids_in_table_of(arr: NDArray, rows: int) -> Optional[np.ndarray]:
    """A batch's row ids in the dense host array ``arr`` (float32, float64, int32 or int64),
    once the engine has written them, copied flat as int64 if each lies in [0, ``rows``):
    one call of the helper. None where it cannot (no helper, another device or dtype) or
    an id lies outside: read them with numpy then, which names it."""
    function = _native_ids()
    if function is None:
        return None
    count = ctypes.c_int64()
    out = np.empty(_IDS_ROOM[0], np.int64)
    answer = function(arr.handle, rows, out.ctypes.data, len(out), ctypes.byref(count))
    if answer == 1:   # (more than the last batch: room for them, and again)
        out = np.empty(count.value, np.int64)
        answer = function(arr.handle, rows, out.ctypes.data, len(out), ctypes.byref(count))
    if answer != 0:
        return None
    _IDS_ROOM[0] = max(count.value, 1)   # (a loop's batches: room for the next, exactly)
    return out[:count.value]


def _native_ids():
    """The helper's ``kvhybrid_ids_in_table``, or None where it was not built (or before
    it was in it), is turned off, or answers otherwise than numpy on arrays made here."""
    if _IDS:
        return _IDS[0]
    lib = _library()
    function = getattr(lib, "kvhybrid_ids_in_table", None) if lib is not None else None
    if function is not None:
        def read(arr, rows=16):
            out, count = np.empty(8, np.int64), ctypes.c_int64()
            answer = function(arr.handle, rows, out.ctypes.data, len(out), ctypes.byref(count))
            return out[:count.value].tolist() if answer == 0 else answer

        answers = [read(mx.nd.array([11, 2, 5.9, 2], dtype=dtype))
                   for dtype in ("float32", "float64", "int32", "int64")]
        answers += [read(mx.nd.array([2, 16], dtype="int64")), read(mx.nd.array([-1, 2])),
                    read(mx.nd.array([2, 5]), rows=5), read(mx.nd.arange(9)),
                    read(mx.nd.array([2, 5], dtype="uint8"))]
        if answers != [[11, 2, 5, 2]] * 2 + [[11, 2, 5, 2]] * 2 + [-5, -5, -5, 1, -2]:
            _reads_wrong("reads this MXNet's row ids")
            function = None
    _IDS.append(function)
    return function


def ids_address(ids: np.ndarray) -> Optional[int]:
    """Where int64 ``ids`` lie, for ``copy_if_ids_equal`` (None: it cannot read them)."""
    return ids.ctypes.data if ids.dtype == np.int64 and ids.flags.c_contiguous else None


def copy_if_ids_equal(arr: NDArray, ids: np.ndarray, address: Optional[int], src: NDArray,
                      dst: NDArray) -> Optional[bool]:
    """``ids_equal(arr, ids)`` and, if equal, ``engine_copy(src, dst)``, in one call of the
    helper (``address``: ``ids_address(ids)``): True copied, False not equal (nothing
    done), None where the helper cannot tell or copy (compare and copy apart then)."""
    functions = _native_pull()
    if functions is None or functions[2] is None or address is None:
        return None
    answer = functions[2](arr.handle, address, len(ids), src.handle, dst.handle, 0)
    return None if answer < 0 else bool(answer)


def engine_copy(src: NDArray, dst: NDArray) -> bool:
    """Queue MXNet's engine copy of ``src`` into ``dst`` through the helper (the copy
    MXNet's kvstore makes of pulled rows, without ``_copyto``'s operator dispatch); False,
    having done nothing, where it cannot (then copy through ``_copyto``)."""
    functions = _native_pull()
    return functions is not None and functions[1](src.handle, dst.handle, 0) == 0


def _read_row_ids(function, arr: NDArray, wait: bool = True) -> Optional[np.ndarray]:
    if wait:
        check_call(_LIB.MXNDArrayWaitToRead(arr.handle))
    ptr, count = ctypes.c_void_p(), ctypes.c_int64()
    if function(arr.handle, ctypes.byref(ptr), ctypes.byref(count)) != 0:
        return None   # (not a host row_sparse array with int64 ids)
    if not count.value:
        return np.zeros(0, np.int64)
    return memory_view(ptr.value, count.value, np.int64).copy()


def _write_row_ids(arr: NDArray, ids: np.ndarray) -> bool:
    """Write ``ids`` where a new host row_sparse array (its memory allocated, no operation
    pushed on it yet) keeps its row ids, through the C++ helper; False where it cannot."""
    function = _native_row_ids()
    if function is None:
        return False
    ptr, count = ctypes.c_void_p(), ctypes.c_int64()
    if function(arr.handle, ctypes.byref(ptr), ctypes.byref(count)) != 0 \
            or count.value != len(ids):
        return False
    np.copyto(memory_view(ptr.value, count.value, np.int64), ids, casting="unsafe")
    return True


def row_sparse_ids(arr: NDArray, wait: bool = True) -> np.ndarray:
    """A copy of the row ids of a row_sparse array, once the engine has written it: read in
    place where the C++ helper can (a host array), else through MXNet's ``indices``.
    ``wait`` False: the caller knows the array is written and holds it from writers (an
    engine operation that reads it: waiting there could wait behind a write queued after
    that operation); the array must then be one ``reads_row_ids_in_place`` accepts."""
    function = _native_row_ids()
    ids = _read_row_ids(function, arr, wait) if function is not None else None
    if ids is None and not wait:
        raise ValueError("row_sparse_ids(wait=False) needs a host row_sparse array and the "
                         "C++ helper: check reads_row_ids_in_place first")
    return ids if ids is not None else np.asarray(arr.indices.asnumpy(), dtype=np.int64)


def reads_row_ids_in_place(arr: Optional[NDArray] = None) -> bool:
    """Whether ``row_sparse_ids`` reads host arrays in place (the C++ helper was built and
    reads this MXNet's arrays right), and, given ``arr``, whether it reads that one so (a
    host row_sparse array)."""
    if _native_row_ids() is None:
        return False
    return arr is None or (arr.stype == "row_sparse" and is_host(arr))
