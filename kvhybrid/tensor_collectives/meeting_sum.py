"""Small sums made in the host barrier's meeting, without an MPI call.

A patient collective of a group whose ranks share a host starts with a meeting in the host
barrier (``Group.meet``): every rank sleeps until the last one arrives. A sum below
``algorithms.SMALL_BYTES`` then went to MPI's non-blocking ``Iallreduce``, waited for by
polling: on 4 ranks and 2 cores the LM's 79 KB bucket cost each communication thread about
130 us of CPU a step beside the meeting's 50 (2026-11-29). Here the meeting is all the
synchronisation the sum needs: each rank copies its array into its own slot of a
shared-memory window *before* it arrives, and once the barrier opens it adds every rank's
slot into its array, in rank order, so every rank gets the same bits.

Two sets of slots alternate, one per call's parity: a rank writes a set again two calls
later, after the meeting of the call between, which no rank reaches before it has read
this call's slots. A rank brings a digest of the sum (its kind and byte count) to a meeting
of its own (no agreement rides in it): a rank that meets for another collective raises, and
so does this one (``Group.meet``), instead of adding memory nobody wrote.
"""
from __future__ import annotations

from typing import Callable, Dict, List, Tuple

import numpy as np

from . import windows

#: the largest sum made this way, in bytes (``algorithms.SMALL_BYTES``: larger ones are
#: bound by bandwidth and measured among the other algorithms)
CAPACITY = 256 * 2**10

#: what a sum brings to a meeting of its own: this bit and its byte count (distinct from a
#: plain meeting's 0, an agreement's digest with bit 62 set and a pull check's negative
#: number: ``kvstore/agreement.py``)
SUM_MEETING = 1 << 61


def sum_digest(nbytes: int, dtype: np.dtype) -> int:
    """What a rank brings to a meeting of its own for a sum of ``nbytes`` of ``dtype``."""
    return SUM_MEETING | (dtype.num << 40) | nbytes


class MeetingSum:
    """The slots of one group's ranks (see module). Made by every rank of the group at the
    same call (it allocates a shared-memory window on the group's communicator)."""

    def __init__(self, group, MPI):
        size, rank = group.size, group.rank
        total = 2 * size * CAPACITY
        self.win = MPI.Win.Allocate_shared(total if rank == 0 else 0, 1, comm=group.comm)
        buf, _ = self.win.Shared_query(0)
        #: [parity][rank]: the bytes each rank leaves for the call of that parity
        self._slots = np.frombuffer(buf, dtype=np.uint8, count=total).reshape(2, size, CAPACITY)
        self._rank, self._size = rank, size
        self._calls = 0
        #: (parity, bytes, dtype) -> each rank's part, typed (a training loop repeats sizes)
        self._parts: Dict[Tuple[int, int, str], List[np.ndarray]] = {}
        windows.register(f"{group.key}/meeting-sum", self.win, group.comm)

    def allreduce(self, view: np.ndarray, meet: Callable[[], object]) -> None:
        """Sum ``view`` (C-contiguous, at most ``CAPACITY`` bytes) over the group in place.
        ``meet()``: the meeting every rank holds next (it must return only once every rank
        has arrived, or raise on every rank)."""
        parity = self._calls & 1
        self._calls += 1
        parts = self._parts.get((parity, view.nbytes, view.dtype.str))
        if parts is None:
            if view.nbytes > CAPACITY:
                raise ValueError(f"a meeting sum takes at most {CAPACITY} bytes, got "
                                 f"{view.nbytes}")
            if len(self._parts) >= 64:   # (a loop of ever new sizes)
                self._parts.clear()
            parts = self._parts[(parity, view.nbytes, view.dtype.str)] = [
                s.view(view.dtype) for s in self._slots[parity, :, :view.nbytes]]
        flat = view.reshape(-1)
        np.copyto(parts[self._rank], flat)
        meet()   # every rank's part lies in its slot once this returns
        np.add(parts[0], parts[1], out=flat)
        for part in parts[2:]:
            np.add(flat, part, out=flat)
