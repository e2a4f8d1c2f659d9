"""Allreduce through a shared-memory window among the ranks of one host.

Each rank copies a chunk of its buffer into its own slot of an
``MPI.Win.Allocate_shared`` window; after a barrier, rank ``i`` sums slice ``i``
of the chunk over every slot (in its own slot), and after a second barrier each
rank copies every finished slice out. A chunk is small enough that all slots stay
in the last-level cache, so the host's memory sees little more than the copy in
and the copy out. Two generations of slots alternate, so the next chunk's copy in
cannot overwrite a slot another rank is still reading, with two barriers a chunk.

Every slice is summed by one rank, so all ranks get bit-identical results. An
optional ``between(slice)`` runs on each rank's finished slice before the copy out:
the hierarchical allreduce sums it across hosts there.
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

    def _slots_of(self, dtype: np.dtype) -> List[np.ndarray]:
        key = (self._generation, dtype.str)
        typed = self._typed.get(key)
        if typed is None:
            typed = self._typed[key] = [s.view(dtype) for s in self._slots[self._generation]]
        return typed

    def allreduce(self, view: np.ndarray,
                  between: Optional[Callable[[np.ndarray], None]] = None) -> None:
        """Sum ``view`` (flat, contiguous) over the node's ranks, in place."""
        if view.size == 0:
            return
        if self.size == 1:
            if between is not None:
                between(view)
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
            lo, hi = bounds[rank], bounds[rank + 1]
            mine = slots[rank][lo:hi]
            for i in range(size):
                if i != rank:
                    np.add(mine, slots[i][lo:hi], out=mine)
            if between is not None:
                between(mine)
            barrier()
            for i in range(size):
                part[bounds[i]:bounds[i + 1]] = slots[i][bounds[i]:bounds[i + 1]]
            self._generation ^= 1
