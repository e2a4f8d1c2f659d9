"""Allreduce through a shared-memory window among the ranks of one host.

Each rank copies a chunk of its buffer into its own slot of an
``MPI.Win.Allocate_shared`` window; after a barrier, rank ``i`` sums slice ``i``
of the chunk over every slot (in its own slot), and after a second barrier each
rank copies every finished slice out. A chunk is small enough that all slots stay
in the last-level cache, so the host's memory sees little more than the copy in
and the copy out. Two generations of slots alternate, so the next chunk's copy in
cannot overwrite a slot another rank is still reading, with two barriers a chunk.

Every slice is summed by one rank, so all ranks get bit-identical results. With
``between(slices)`` (the hierarchical allreduce: the sum across hosts) the chunks go in
two passes: the first sums each rank's slice of every chunk into one array of its own,
``between`` then runs once on that array, and the second copies the slices back out.
Run chunk by chunk, a sum over emulated hosts crossed the link in several rings with the
host's barriers between them, well above the link's bound.
"""
from __future__ import annotations

from typing import Callable, Dict, List, Optional

import numpy as np

#: bytes per rank per chunk: P slots of two generations stay well inside a 32 MB L3
CHUNK_BYTES = 1 << 20


class SharedMemoryAllreduce:
    """Collective to build (allocates the window on ``node``); reused for every call. The
    window is not freed when a store closes: freeing is collective, and a close that only
    some ranks reach must not block; ``windows.free_all`` frees it at exit."""

    def __init__(self, node, MPI, chunk_bytes: Optional[int] = None):
        self.node, self.MPI = node, MPI
        self.size, self.rank = node.Get_size(), node.Get_rank()
        chunk_bytes = chunk_bytes or CHUNK_BYTES
        self.chunk_bytes = max(64, chunk_bytes - chunk_bytes % 64)
        self.win = MPI.Win.Allocate_shared(2 * self.chunk_bytes if self.size > 1 else 0, 1,
                                           comm=node)
        self._slots: List[List[np.ndarray]] = []
        if self.size > 1:
            whole = [np.frombuffer(self.win.Shared_query(i)[0], dtype=np.uint8)
                     for i in range(self.size)]
            self._slots = [[w[g * self.chunk_bytes:(g + 1) * self.chunk_bytes] for w in whole]
                           for g in range(2)]
        self._typed: Dict[tuple, List[np.ndarray]] = {}
        self._generation = 0
        self._own: Dict[str, np.ndarray] = {}   # a rank's slices of every chunk, by dtype

    def _slots_of(self, dtype: np.dtype) -> List[np.ndarray]:
        key = (self._generation, dtype.str)
        typed = self._typed.get(key)
        if typed is None:
            typed = self._typed[key] = [s.view(dtype) for s in self._slots[self._generation]]
        return typed

    def allreduce(self, view: np.ndarray,
                  between: Optional[Callable[[np.ndarray], None]] = None,
                  settle: Optional[Callable[[], None]] = None) -> None:
        """Sum ``view`` (flat, contiguous) over the node's ranks, in place; with ``between``
        (see the module docstring) ``settle`` is the barrier after it, where a rank waits
        for the others' ``between`` (the node's ``Barrier`` if None)."""
        if view.size == 0:
            return
        if self.size == 1:
            if between is not None:
                between(view)
            return
        if between is not None:
            self._in_two_passes(view, between, settle or self.node.Barrier)
            return
        per = self.chunk_bytes // view.itemsize
        size, rank, barrier = self.size, self.rank, self.node.Barrier
        for start in range(0, view.size, per):
            part = view[start:start + per]
            m = part.size
            slots = self._slots_of(view.dtype)
            bounds = [i * m // size for i in range(size + 1)]
            np.copyto(slots[rank][:m], part)
            barrier()
            self._sum_slice(slots, bounds)
            barrier()
            _copy_out(part, slots, bounds)
            self._generation ^= 1

    def _sum_slice(self, slots: List[np.ndarray], bounds: List[int]) -> np.ndarray:
        """This rank's slice of the chunk in ``slots``, summed over the ranks in its slot
        (its own first, then the others' in rank order)."""
        rank = self.rank
        lo, hi = bounds[rank], bounds[rank + 1]
        mine = slots[rank][lo:hi]
        for i in range(self.size):
            if i != rank:
                np.add(mine, slots[i][lo:hi], out=mine)
        return mine

    def _in_two_passes(self, view: np.ndarray, between: Callable[[np.ndarray], None],
                       settle: Callable[[], None]) -> None:
        """Sum this rank's slice of every chunk over the node into one array, ``between``
        it once, then hand every rank every slice. One barrier a chunk in each pass: two
        generations of slots alternate, and a rank past a chunk's barrier knows every rank
        is done reading the slots of the chunk before."""
        per = self.chunk_bytes // view.itemsize
        size, rank, barrier = self.size, self.rank, self.node.Barrier
        starts = range(0, view.size, per)
        spans = []   # per chunk: its part of view, the slices' bounds, this rank's in own
        total = 0
        for start in starts:
            m = min(per, view.size - start)
            bounds = [i * m // size for i in range(size + 1)]
            spans.append((start, m, bounds, total))
            total += bounds[rank + 1] - bounds[rank]
        own = self._own.get(view.dtype.str)
        if own is None or own.size < total:
            own = self._own[view.dtype.str] = np.empty(total, view.dtype)
        own = own[:total]
        for start, m, bounds, at in spans:   # the node's sum of this rank's slices
            slots = self._slots_of(view.dtype)
            np.copyto(slots[rank][:m], view[start:start + m])
            barrier()
            mine = self._sum_slice(slots, bounds)
            own[at:at + mine.size] = mine
            self._generation ^= 1
        between(own)
        settle()   # (every rank done reading the first pass's slots)
        for start, m, bounds, at in spans:   # every rank's finished slices, to all
            slots = self._slots_of(view.dtype)
            lo, hi = bounds[rank], bounds[rank + 1]
            slots[rank][lo:hi] = own[at:at + hi - lo]
            barrier()
            _copy_out(view[start:start + m], slots, bounds)
            self._generation ^= 1


def _copy_out(part: np.ndarray, slots: List[np.ndarray], bounds: List[int]) -> None:
    """Every rank's finished slice of a chunk, from its slot into ``part``."""
    for i in range(len(slots)):
        part[bounds[i]:bounds[i + 1]] = slots[i][bounds[i]:bounds[i + 1]]
