"""Row-sparse gradients over MPI: gather every rank's rows, sum rows with the same id.

The Horovod-style path for ``row_sparse`` keys when there are no parameter
servers: each rank sends only the rows it touched (ids and values, via
``Allgatherv``), so the bytes moved scale with the rows touched, not with the
table. Every rank sums the same gathered rows in the same order, so every
rank gets bit-identical results.
"""
from __future__ import annotations

from typing import Sequence, Tuple

import numpy as np
import mxnet as mx
from mxnet.ndarray import NDArray

from .group import Group


def local_rows(arrays: Sequence[NDArray]) -> Tuple[np.ndarray, np.ndarray]:
    """(ids, rows) of a worker's per-device row_sparse arrays, concatenated (not yet summed)."""
    ids = [a.indices.asnumpy().astype(np.int64) for a in arrays]
    rows = [a.data.asnumpy() for a in arrays]
    return np.concatenate(ids), np.concatenate(rows)


def allgather_rows(ids: np.ndarray, rows: np.ndarray, group: Group, name: str = "rows"):
    """Every rank's (ids, rows), concatenated in rank order, on every rank."""
    width = int(np.prod(rows.shape[1:], dtype=np.int64))
    dog = group.watchdog
    with dog.waiting(lambda: f"the row counts of {name} on group {group.name}"):
        counts = np.array(group.comm.allgather(len(ids)), dtype=np.int64)
    all_ids = np.empty(int(counts.sum()), dtype=np.int64)
    all_rows = np.empty((int(counts.sum()),) + rows.shape[1:], dtype=rows.dtype)
    group.bytes_sent["rows"] += ids.nbytes + rows.nbytes
    with dog.waiting(lambda: f"allgatherv of {int(counts.sum())} rows of {name} on group "
                             f"{group.name} of {group.size} ranks"):
        group.comm.Allgatherv(np.ascontiguousarray(ids), [all_ids, counts])
        group.comm.Allgatherv(np.ascontiguousarray(rows).reshape(-1),
                              [all_rows.reshape(-1), counts * width])
    return all_ids, all_rows


def sum_rows(ids: np.ndarray, rows: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """Sorted unique ids and the sum of the rows of each id (a valid row_sparse layout)."""
    if len(ids) == 0:
        return ids, rows
    order = np.argsort(ids, kind="stable")
    ids, rows = ids[order], rows[order]
    unique, starts = np.unique(ids, return_index=True)
    return unique, np.add.reduceat(rows, starts, axis=0)


def allreduce_rows(arrays: Sequence[NDArray], group: Group, name: str = "rows") -> NDArray:
    """The sum over a worker's devices and over the group of row_sparse ``arrays``."""
    first = arrays[0]
    ids, rows = sum_rows(*allgather_rows(*local_rows(arrays), group, name))
    return mx.nd.sparse.row_sparse_array((rows, ids), shape=first.shape, ctx=first.context,
                                         dtype=first.dtype)
