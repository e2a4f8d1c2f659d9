"""Row-sparse arrays over MPI: only the rows a rank touched travel, never the table.

- ``allreduce_rows``: the Horovod-style path for ``row_sparse`` gradients when
  the rows stay inside the group (``gather_rows`` to every rank; every rank sums
  the same gathered rows in the same order, so results are bit-identical).
- ``gather_patiently`` / ``scatter_bytes``: Parallax's local aggregation around the
  parameter servers. The master gathers the group's rows (and sums them) before
  it pushes, and hands each rank the rows it asked for after it pulls; the ranks
  waiting for the master wait without spinning. Both send one message per rank
  however many arrays it carries (``scatter_bytes``: several keys' rows and a verdict
  at once), through the host's shared memory where the ranks share one
  (``meeting_rows.py``).
"""
from __future__ import annotations

import ctypes
import math
from typing import List, Optional, Sequence, Tuple

import numpy as np
from mxnet.ndarray import NDArray

from .group import Group
from .meeting_rows import by_position
from .native import Helper
from .ndarray_view import host_row_sparse, host_view, is_host, row_sparse_ids
from .ops import wait_all_patiently, wait_patiently


def _wire(flat: np.ndarray) -> np.ndarray:
    """``flat`` as MPI can send it: MPI has no float16, so its bits travel as uint16 (rows
    are only moved here, never reduced by MPI)."""
    return flat.view(np.uint16) if flat.dtype == np.float16 else flat


def local_ids(arrays: Sequence[NDArray]) -> np.ndarray:
    """The row ids of a worker's per-device row_sparse arrays, concatenated."""
    if len(arrays) == 1:
        return row_sparse_ids(arrays[0])
    return np.concatenate([row_sparse_ids(a) for a in arrays])


def local_rows(arrays: Sequence[NDArray],
               ids: Optional[np.ndarray] = None) -> Tuple[np.ndarray, np.ndarray]:
    """(ids, rows) of a worker's per-device row_sparse arrays, concatenated (not yet summed);
    ``ids`` may be passed when the caller has read them already (``local_ids``). The rows
    of one host array are a view of its memory, not a copy: use them before anything else
    is handed to the engine (the next backward pass rewrites them)."""
    if ids is None:
        ids = local_ids(arrays)
    if len(arrays) == 1 and is_host(arrays[0]):   # read in place, skipping data's copy
        grad = arrays[0]                           # (its indices were read: it is ready)
        row_shape = (len(ids),) + tuple(grad.shape[1:])
        view = host_view(grad, grad.dtype, math.prod(row_shape))
        return ids, view.reshape(row_shape)
    return ids, np.concatenate([a.data.asnumpy() for a in arrays])


def gather_rows(ids: np.ndarray, rows: np.ndarray, group: Group,
                name: str = "rows") -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every rank's (ids, rows), concatenated in rank order, on every rank, and how many
    each rank gave (``Iallgatherv``). Waits without spinning, as ``gather_patiently``: the
    caller's thread waits here for the slowest rank's backward pass, and on a host with
    more processes than cores a spinning wait takes the CPU that rank needs."""
    comm, dog = group.comm, group.watchdog
    counts = np.empty(group.size, np.int64)
    with dog.waiting(lambda: f"the row counts of {name} on group {group.name}"):
        wait_patiently(comm.Iallgather(np.array([len(ids)], np.int64), counts))
    group.bytes_sent["rows"] += ids.nbytes + rows.nbytes
    ids, flat = np.ascontiguousarray(ids), _wire(np.ascontiguousarray(rows).reshape(-1))
    width = math.prod(rows.shape[1:])
    all_ids = np.empty(int(counts.sum()), dtype=np.int64)
    all_rows = np.empty((int(counts.sum()),) + rows.shape[1:], dtype=rows.dtype)
    with dog.waiting(lambda: f"allgatherv of {int(counts.sum())} rows of {name} on group "
                             f"{group.name} of {group.size} ranks"):
        wait_all_patiently([comm.Iallgatherv(ids, [all_ids, counts]),
                            comm.Iallgatherv(flat, [_wire(all_rows.reshape(-1)),
                                                    counts * width])])
    return all_ids, all_rows, counts


def gather_patiently(arrays: Sequence[np.ndarray], group: Group, root: int = 0,
                     name: str = "rows") -> Optional[List[Tuple[np.ndarray, np.ndarray]]]:
    """Every rank's ``arrays`` on ``root`` (None elsewhere): for each position, the ranks'
    arrays concatenated in rank order and each rank's length (``by_rank`` splits them
    without a copy). Position i holds one dtype and one row shape on every rank; the
    lengths may differ.

    Where the ranks share a host, the host barrier's meeting carries them
    (``meeting_rows.py``). Elsewhere (or for a message too large for its slot) ``comm.gather``
    would pickle, and its ranks would spin until the root arrives: on a host with more
    processes than cores they take the CPU from the ranks still computing (the root waits
    for the slowest backward pass). There the lengths travel in one ``Igather`` and every
    array of a rank, packed as bytes, in one ``Igatherv`` (one message per rank however
    many arrays); the ranks that only send post both at once and wait for them without
    spinning (``wait_all_patiently``). The root waits without spinning too, after a first
    short spell of tests that answer it at once when the others are there: its blocking waits
    spun on the caller's thread for the slowest backward pass (a third of an NMT master's
    gather CPU on 2 cores)."""
    comm, is_root = group.comm, group.rank == root
    counts = np.array([len(a) for a in arrays], dtype=np.int64)
    units = np.array([a.dtype.itemsize * math.prod(a.shape[1:]) for a in arrays], np.int64)
    exchange = group.meeting_rows()
    with group.watchdog.waiting(lambda: f"the gather of {name} on group {group.name} of "
                                        f"{group.size} ranks"):
        if exchange is not None:   # (its meeting is the group's: none follows)
            in_slots, gathered = exchange.gather(arrays, counts, units, root)
            if in_slots:
                group.bytes_sent["rows"] += int(counts @ units)
                return gathered
        packed = np.concatenate([np.ascontiguousarray(a).reshape(-1).view(np.uint8)
                                 for a in arrays])
        table = np.empty((group.size, len(arrays)), dtype=np.int64) if is_root else None
        if exchange is None:
            group.meet()
        first = comm.Igather(counts, table, root=root)
        if is_root:   # the lengths first: they size the receive buffer
            wait_patiently(first)
            sizes = table @ units   # bytes from each rank
            buf = np.empty(int(sizes.sum()), dtype=np.uint8)
            wait_patiently(comm.Igatherv(packed, [buf, sizes], root=root))
        else:
            wait_all_patiently([first, comm.Igatherv(packed, None, root=root)])
    group.bytes_sent["rows"] += packed.nbytes
    if not is_root:
        return None
    return by_position(arrays, table, units, np.split(buf, np.cumsum(sizes)[:-1]))


def by_rank(whole: np.ndarray, counts: np.ndarray) -> List[np.ndarray]:
    """``gather_patiently``'s concatenation split into each rank's part (views)."""
    return np.split(whole, np.cumsum(counts)[:-1])


def scatter_bytes(packed: Optional[Tuple[np.ndarray, np.ndarray]], out: np.ndarray,
                  group: Group, root: int = 0, name: str = "rows") -> np.ndarray:
    """Rank r gets its part of the root's ``packed`` (bytes, each rank's byte count: see
    built in place by the caller) into ``out`` (C-contiguous, as many
    bytes as rank r's part). One message to each rank however many arrays it carries (a
    push's verdict and every table's rows): in the host's shared memory where the ranks
    share one (``meeting_rows.py``), else by MPI's ``Iscatterv``. Every rank, the root too,
    waits without spinning: the root only goes on to its own copy, and spinning would take
    the CPU from the ranks it waits for."""
    received = out.reshape(-1).view(np.uint8)
    exchange = group.meeting_rows()
    in_slots = exchange is not None and exchange.may_scatter()
    with group.watchdog.waiting(lambda: f"rank {root} to hand out {name} on group "
                                        f"{group.name}"):
        if group.rank == root:
            send, sizes = packed
            if in_slots and exchange.put(send, sizes, received, root):
                group.from_root(root)
                return out
            request = group.comm.Iscatterv([send, sizes], received, root=root)
            group.from_root(root)
            wait_patiently(request)
        else:
            group.from_root(root)
            if in_slots and exchange.take(received):
                return out
            wait_patiently(group.comm.Iscatterv(None, received, root=root))
    return out


_SUMS = {np.dtype(np.float32): "kvhybrid_sum_rows_f32",
         np.dtype(np.float64): "kvhybrid_sum_rows_f64"}
_P, _N = ctypes.c_void_p, ctypes.c_int64   # (a pointer, a count)
_HELPER = Helper("_rows", "KVHYBRID_CPP_HELPER",
                 "the master's unions, sums and hand-outs of rows are numpy's", {
                     "kvhybrid_unique_ids": (_N, [_P, _N, _N, _P]),
                     "kvhybrid_union_ids": (_N, [_N, _P, _P, _P]),
                     "kvhybrid_take_rows": (_N, [_P, _N, _P, _N, _N, _P, _P, _P, _P]),
                     **{name: (_N, [_N, _P, _P, _P, _N, _P, _P]) for name in _SUMS.values()}})


#: a batch's ids cast and checked (ids.cc): a Python module, called on the caller's thread
_IDS = Helper("_ids", "KVHYBRID_CPP_HELPER", "a batch's ids are cast and checked by numpy", {},
              imported=True)


def _helper() -> Optional[ctypes.CDLL]:
    return _HELPER.library()


def _int64s(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.int64)


def ids_in_table(ids: np.ndarray, rows: int) -> Optional[np.ndarray]:
    """``ids`` (a batch's row ids, any shape) copied into a new flat int64 array, if every
    one lies in [0, ``rows``): one call of the compiled ``_ids``. None where one does not,
    or it cannot read them (another dtype, not contiguous, not built or switched off): the
    caller then reads them with numpy, which names a bad id."""
    module = _IDS.library()
    if module is None:
        return None
    out = np.empty(ids.size, np.int64)
    return out if module.ids_in_table(ids, out, rows) else None


def unique_ids(ids: np.ndarray, rows: int) -> np.ndarray:
    """``np.unique`` of a batch's row ids, each in [0, ``rows``): in the C++ helper a bitmap
    of their span (a vocabulary's), else numpy's sort."""
    lib = _helper()
    if lib is not None and len(ids):
        ids = _int64s(ids)
        out = np.empty(len(ids), np.int64)
        n = lib.kvhybrid_unique_ids(ids.ctypes.data, len(ids), rows, out.ctypes.data)
        if n >= 0:
            return out[:n]
    return np.unique(ids)


def union_ids(ids: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """The sorted union of the ranks' sorted unique ``ids`` (``gather_patiently``'s
    concatenation, ``counts`` per rank): one merge in the C++ helper, else ``np.unique``."""
    lib = _helper()
    if lib is not None and len(ids):
        ids, counts = _int64s(ids), _int64s(counts)
        out = np.empty(len(ids), np.int64)
        n = lib.kvhybrid_union_ids(len(counts), ids.ctypes.data, counts.ctypes.data,
                                   out.ctypes.data)
        if n >= 0:
            return out[:n]
    return np.unique(ids)


def take_rows(have: np.ndarray, table: np.ndarray, wanted: np.ndarray, counts: np.ndarray,
              out: np.ndarray, offsets: np.ndarray) -> None:
    """Each rank's rows of its sorted unique ``wanted`` ids (``counts`` per rank, back to
    back) out of ``table`` (the rows of the sorted unique ``have``, which holds every one of
    them) into the bytes ``out`` from rank r's byte offset ``offsets[r]`` on: one merge per
    rank in the C++ helper, else numpy's search and take."""
    lib = _helper()
    row_bytes = table.itemsize * math.prod(table.shape[1:])
    if lib is not None and table.flags.c_contiguous:
        have, wanted, counts, offsets = (_int64s(a) for a in (have, wanted, counts, offsets))
        if lib.kvhybrid_take_rows(have.ctypes.data, len(have), table.ctypes.data, row_bytes,
                                  len(counts), wanted.ctypes.data, counts.ctypes.data,
                                  out.ctypes.data, offsets.ctypes.data) == 0:
            return
    for at, mine in zip(offsets.tolist(), by_rank(wanted, counts)):
        into = out[at:at + len(mine) * row_bytes].view(table.dtype)
        np.take(table, np.searchsorted(have, mine), axis=0,
                out=into.reshape((len(mine),) + table.shape[1:]))


def sum_rows(ids: np.ndarray, rows: np.ndarray,
             counts: Optional[np.ndarray] = None) -> Tuple[np.ndarray, np.ndarray]:
    """Sorted unique ids and the sum of the rows of each id (a valid row_sparse layout),
    each id's rows added in their order in ``ids``. ``counts``: how many of ``ids`` each
    rank gave, where each rank's are sorted unique (``gather_patiently``'s): then the C++
    helper merges them in one pass, with the same bits."""
    if len(ids) == 0:
        return ids, rows
    lib = _helper()
    name = _SUMS.get(rows.dtype)
    if lib is not None and counts is not None and name is not None \
            and rows.flags.c_contiguous:
        ids, counts = _int64s(ids), _int64s(counts)
        out_ids, out_rows = np.empty(len(ids), np.int64), np.empty_like(rows)
        n = getattr(lib, name)(len(counts), ids.ctypes.data, counts.ctypes.data,
                               rows.ctypes.data, math.prod(rows.shape[1:]),
                               out_ids.ctypes.data, out_rows.ctypes.data)
        if n >= 0:
            return out_ids[:n], out_rows[:n]
    order = np.argsort(ids, kind="stable")
    ids = ids[order]
    starts = np.flatnonzero(np.concatenate(([True], ids[1:] != ids[:-1])))
    runs = np.diff(np.append(starts, len(ids)))   # how many ranks sent each id
    total = rows[order[starts]]
    # one pass per extra copy of an id (at most a rank's worth): numpy's reduceat over
    # rows is much slower on short runs
    for k in range(1, int(runs.max())):
        more = np.flatnonzero(runs > k)
        total[more] += rows[order[starts[more] + k]]
    return ids[starts], total


def allreduce_rows(arrays: Sequence[NDArray], group: Group, name: str = "rows",
                   ids: Optional[np.ndarray] = None) -> NDArray:
    """The sum over a worker's devices and over the group of row_sparse ``arrays`` (whose
    ids the caller may have read already)."""
    first = arrays[0]
    ids, rows = sum_rows(*gather_rows(*local_rows(arrays, ids), group, name=name))
    total = host_row_sparse(rows, ids, first.shape, first.dtype)
    return total if is_host(first) else total.as_in_context(first.context)
