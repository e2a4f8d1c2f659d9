"""Sums of up to 1 MB made in the host barrier's meeting, without an MPI call.

A patient collective of a group whose ranks share a host starts with a meeting in the host
barrier (``Group.meet``): every rank sleeps until the last one arrives. A sum below
``algorithms.SMALL_BYTES`` then went to MPI's non-blocking ``Iallreduce``, waited for by
polling, which cost each communication thread several times the meeting's own CPU
(docs/performance.md). Here the meeting is all the
synchronisation the sum needs: each rank copies its array into its own slot of a
shared-memory window *before* it arrives, and once the barrier opens it adds every rank's
slot into its array, in rank order, so every rank gets the same bits.

Up to 1 MB (``capacity``), the first engine bucket's bound: MPI's ``Allreduce``
spins in its waits while the ranks it waits for may not even be running; here no rank spins.
Every rank adds every part, so in a larger group (from ``SLICED_RANKS``, from
``SLICED_BYTES``) each rank adds only its slice of the parts into a shared result (a
reduce-scatter), and a second meeting opens the whole sum to every rank, which copies it
out: every element is still added in rank order by one rank, so every rank gets the same
bits. On 4 ranks that costs about as much as adding everything, whose work grows with the
ranks.

Two sets of slots (and results) alternate, one per call's parity: a rank writes a set
again two calls later, after the meetings of the call between, which no rank reaches
before it has read this call's slots and result. A rank brings a digest of the sum (its
kind and byte count) to a meeting of its own (no agreement rides in it): a rank that meets
for another collective raises, and so does this one (``Group.meet``), instead of adding
memory nobody wrote.
"""
from __future__ import annotations

from typing import Callable, Dict, List, Tuple

import numpy as np

from . import windows

#: the largest sum made this way, in bytes, where the group is small enough (larger ones
#: are measured among the other algorithms: ``algorithms.py``); ``capacity``
CAPACITY = 2**20

#: the shared memory one group's slots may take (a container's /dev/shm may hold 64 MB)
WINDOW_BYTES = 16 * 2**20

#: in a group of this many ranks or more, from this many bytes on, each rank adds its
#: slice only, and a second meeting follows
SLICED_RANKS, SLICED_BYTES = 5, 128 * 2**10

#: what a sum brings to a meeting of its own: this bit and its byte count (distinct from a
#: plain meeting's 0, an agreement's digest with bit 62 set and a pull check's negative
#: number: ``kvstore/calls.py``)
SUM_MEETING = 1 << 61


def capacity(ranks: int) -> int:
    """The largest sum a group of ``ranks`` makes in its meeting, in bytes: ``CAPACITY``
    where its slots fit ``WINDOW_BYTES``, else less, down to 256 KB."""
    fits = WINDOW_BYTES // (2 * (ranks + 1)) // 4096 * 4096
    return max(256 * 2**10, min(CAPACITY, fits))


def sum_digest(nbytes: int, dtype: np.dtype) -> int:
    """What a rank brings to a meeting of its own for a sum of ``nbytes`` of ``dtype``."""
    return SUM_MEETING | (dtype.num << 40) | nbytes


class MeetingSum:
    """The slots of one group's ranks (see module). Made by every rank of the group at the
    same call (it allocates a shared-memory window on the group's communicator)."""

    def __init__(self, group, MPI):
        size, rank = group.size, group.rank
        self.capacity = capacity(size)
        total = 2 * (size + 1) * self.capacity
        self.win = MPI.Win.Allocate_shared(total if rank == 0 else 0, 1, comm=group.comm)
        buf, _ = self.win.Shared_query(0)
        #: [parity][rank]: the bytes each rank leaves for the call of that parity; [parity]
        #: [size]: a sliced sum's result
        self._slots = np.frombuffer(buf, dtype=np.uint8, count=total).reshape(
            2, size + 1, self.capacity)
        self._group, self._rank, self._size = group, rank, size
        self._calls = 0
        #: (parity, bytes, dtype) -> each rank's part, typed (a training loop repeats sizes)
        self._parts: Dict[Tuple[int, int, str], List[np.ndarray]] = {}
        windows.register(f"{group.key}/meeting-sum", self.win, group.comm)

    def allreduce(self, view: np.ndarray, meet: Callable[[], object]) -> None:
        """Sum ``view`` (C-contiguous, at most ``capacity`` bytes) over the group in place.
        ``meet()``: the meeting every rank holds next (it must return only once every rank
        has arrived, or raise on every rank)."""
        parity = self._calls & 1
        self._calls += 1
        parts = self._parts.get((parity, view.nbytes, view.dtype.str))
        if parts is None:
            if view.nbytes > self.capacity:
                raise ValueError(f"a meeting sum takes at most {self.capacity} bytes, got "
                                 f"{view.nbytes}")
            if len(self._parts) >= 64:   # (a loop of ever new sizes)
                self._parts.clear()
            parts = self._parts[(parity, view.nbytes, view.dtype.str)] = [
                s.view(view.dtype) for s in self._slots[parity, :, :view.nbytes]]
        flat = view.reshape(-1)
        np.copyto(parts[self._rank], flat)
        meet()   # every rank's part lies in its slot once this returns
        if view.nbytes < SLICED_BYTES or self._size < SLICED_RANKS:
            _add(parts[:-1], flat)
            return
        # this rank's slice of the sum into the result, then every rank reads all of it
        per = -(-flat.size // self._size)
        mine = slice(self._rank * per, (self._rank + 1) * per)
        _add([part[mine] for part in parts[:-1]], parts[-1][mine])
        self._group.meet(sum_digest(view.nbytes, view.dtype))
        np.copyto(flat, parts[-1])


def _add(parts: List[np.ndarray], out: np.ndarray) -> None:
    """``out`` = the sum of ``parts`` (two at least), added in their order."""
    np.add(parts[0], parts[1], out=out)
    for part in parts[2:]:
        np.add(out, part, out=out)
