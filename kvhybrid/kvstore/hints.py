"""A push's *hint* for the next pull: the rows that push asked the servers for, on their
way (``Prefetch``), and the one-shot flag that says they came (``Flag``). ``sparse_push.py``
makes them; ``sparse_pull.py`` reads them.
"""
from __future__ import annotations

import threading
from typing import List, Optional

import numpy as np
from mxnet.ndarray import NDArray

from ..tensor_collectives.ndarray_view import host_row_sparse, ids_address
from ..tensor_collectives.operators import copy
from .keys import Key, KeySlot

#: what a waiting ``Flag`` waits on (every flag's set wakes it)
_FLAG_SET = threading.Condition()


class Flag:
    """``threading.Event``'s ``set``, ``is_set`` and ``wait`` for a flag made every step and
    set once (a prefetch's rows, a pull's check): making an Event makes a Condition and its
    lock, many times this one's cost on the caller's thread, for a flag that is nearly
    always set before anyone looks. The rare waiter waits on one Condition shared by every
    flag."""

    __slots__ = ("_set",)

    def __init__(self):
        self._set = False

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        with _FLAG_SET:
            self._set = True
            _FLAG_SET.notify_all()

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Whether the flag is set, waiting up to ``timeout`` seconds for it (callers loop,
        so waking for another flag's set only returns early)."""
        with _FLAG_SET:
            if not self._set:
                _FLAG_SET.wait(timeout)
            return self._set


class Prefetch:
    """The rows a ``row_sparse_pull`` of the next step will ask for, on their way: written
    by an engine operation (the hand-out, or MXNet's pull), read by the caller's thread once
    ``ready`` is set, or copied by MXNet's engine behind that operation."""

    def __init__(self, key: Key, ids: Optional[np.ndarray], handed: Optional[np.ndarray],
                 array: Optional[NDArray], rows: Optional[np.ndarray] = None):
        #: this rank's sorted unique ids (None until MXNet's pull sorted them: pure PS)
        self.key, self.ids = key, ids
        #: the ids as ``prefetch_rows`` was handed them (one array, unsorted), if it was,
        #: and where they lie for the C++ helper's compare (``ids_address``)
        self.handed = handed
        self.handed_at = ids_address(handed) if handed is not None else None
        #: the rows as a host row_sparse array, made at the push and written by an engine
        #: operation: a pull of exactly ``ids`` queues an engine copy of it into its out,
        #: which waits in MXNet's engine for that operation, so nothing waits on the
        #: caller's thread (``RowPulls._pull_as_before``); None where no rows were asked
        #: for; ``rows``: a view of its rows (None until that operation gave the array its
        #: rows, where it does: ``make_rows``)
        self.array, self.rows = array, rows
        self.ready = Flag()
        #: why the rows could not be handed over (set with ``ready``; the reader raises it)
        self.error: Optional[str] = None
        #: whether its hand-out waits for nothing (the gradient's rows read in place): a
        #: later step's backward may then be queued before it runs
        self.waits_for_nothing = False

    def holds(self, ids: List[np.ndarray]) -> bool:
        """Whether the rows came for every one of ``ids`` (each out's, sorted unique)."""
        if not len(self.ids):   # (a push that asked for no rows: a plain Trainer's)
            return not any(len(i) for i in ids)
        return all(self._same_ids(i)   # (the usual case, and cheaper)
                   or not len(np.setdiff1d(i, self.ids, assume_unique=True)) for i in ids)

    def write_rows(self, outs: List[NDArray], ids: List[np.ndarray], slot: KeySlot) -> None:
        """The rows into ``outs`` (``ids``: each out's sorted unique ids, which it must
        hold: ``holds``)."""
        for o, i in zip(outs, ids):
            if self.array is not None and self._same_ids(i):
                copy(self.array, o)   # (the engine copies it; nothing writes it again)
                continue
            part = self.rows[np.searchsorted(self.ids, i)]
            host_row_sparse(part, i, slot.shape, slot.dtype).copyto(o)

    def _same_ids(self, ids: np.ndarray) -> bool:
        """Whether ``ids`` are the rows' ids: the very array when the pull's ids were the
        ones handed over (``checked_row_ids`` returns it then), else compared."""
        return ids is self.ids or np.array_equal(ids, self.ids)
