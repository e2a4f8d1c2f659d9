"""Ring allreduce: reduce-scatter then allgather, each rank talking only to its neighbours.

Every rank sends and receives ``2 (P-1)/P`` of the buffer whatever ``P`` is, the
bandwidth-optimal schedule (MXNET-MPI §6, Fig. 9). The ``2 (P-1)`` steps form one
pipeline (the paper's pipelined rings): each chunk moves in segments, and a segment is
passed on to the right neighbour as soon as it has arrived from the left and been added,
not when its whole step is done. The chunk a rank receives at one step is the chunk it
sends at the next, in both phases, so a link never waits for a step to finish: small
segments come close to the link's bound where a segment per chunk goes step by step
(``python -m benchmarks.ring_segments --hosts 4 --rate 1gbit``).
"""
from __future__ import annotations

from collections import deque
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

#: a chunk moves in about this many segments ...
SEGMENTS_PER_CHUNK = 8
#: ... of at least and at most these many bytes. Small segments keep a slow link busy;
#: every segment costs a turn of Python, which dominates in shared memory
#: (``benchmarks/ring_segments.py``)
MIN_SEGMENT_BYTES = 128 << 10
MAX_SEGMENT_BYTES = 1 << 20
#: receives in flight (each in its own segment of the workspace during the reduce-scatter)
WINDOW = 4
_TAG = 7002


def _bounds(n: int, parts: int) -> List[int]:
    return [i * n // parts for i in range(parts + 1)]


def segment_elements(n: int, itemsize: int, parts: int) -> int:
    """Elements per segment when ``n`` elements are summed over ``parts`` ranks."""
    chunk_bytes = -(-n // parts) * itemsize
    nbytes = min(MAX_SEGMENT_BYTES, max(MIN_SEGMENT_BYTES, chunk_bytes // SEGMENTS_PER_CHUNK))
    return max(1, nbytes // itemsize)


def _longest_segment(n: int, itemsize: int, parts: int) -> int:
    return min(segment_elements(n, itemsize, parts), -(-n // parts))


def workspace_elements(n: int, itemsize: int, parts: int) -> int:
    """Scratch ``ring_allreduce`` needs for ``n`` elements over ``parts`` ranks: a slot of
    the longest segment for each receive in flight."""
    return WINDOW * _longest_segment(n, itemsize, parts)


def ring_allreduce(view: np.ndarray, comm, MPI, workspace: np.ndarray,
                   wait_all: Optional[Callable[[Sequence], None]] = None) -> None:
    """Sum ``view`` (flat, contiguous) over ``comm`` in place. ``workspace`` is scratch
    of at least ``workspace_elements(view.size, view.itemsize, P)`` elements of
    ``view.dtype``. ``wait_all`` waits for a list of requests (default MPI's ``Waitall``,
    which spins; ``ops.wait_all_patiently`` sleeps, leaving the cores to compute while a
    slow link carries the segments)."""
    if wait_all is None:
        wait_all = MPI.Request.Waitall
    size, rank = comm.Get_size(), comm.Get_rank()
    if size == 1 or view.size == 0:
        return
    right, left = (rank + 1) % size, (rank - 1) % size
    bounds = _bounds(view.size, size)
    seg = segment_elements(view.size, view.itemsize, size)
    slot_size = _longest_segment(view.size, view.itemsize, size)
    raw, item = view.view(np.uint8), view.itemsize

    def segments(chunk: int) -> List[Tuple[int, int]]:
        start, stop = bounds[chunk], bounds[chunk + 1]
        return [(s, min(stop, s + seg)) for s in range(start, stop, seg)]

    def message(lo: int, hi: int):
        return [raw[lo * item:hi * item], MPI.BYTE]

    # At step t (0 .. 2P-3) a rank receives chunk (rank - t - 1) and sends chunk (rank - t):
    # added to its own during the reduce-scatter (t < P-1), in place during the allgather.
    # Its left neighbour sends in exactly this order, and MPI matches one source's
    # messages of one tag in the order they were posted.
    arrivals = [(t, lo, hi) for t in range(2 * size - 2)
                for lo, hi in segments((rank - t - 1) % size)]
    sending: Dict[Tuple[int, int], object] = {}   # region -> its send in flight
    for lo, hi in segments(rank):
        sending[(lo, hi)] = comm.Isend(message(lo, hi), dest=right, tag=_TAG)
    posted: deque = deque()

    def post(i: int) -> None:
        t, lo, hi = arrivals[i]
        if t < size - 1:
            slot = (i % WINDOW) * slot_size
            into = workspace[slot:slot + hi - lo]
            posted.append((comm.Irecv([into.view(np.uint8), MPI.BYTE], source=left, tag=_TAG),
                           t, lo, hi, into))
            return
        earlier = sending.pop((lo, hi), None)   # this region went right at an earlier step
        if earlier is not None:
            wait_all([earlier])
        posted.append((comm.Irecv(message(lo, hi), source=left, tag=_TAG), t, lo, hi, None))

    for i in range(min(WINDOW, len(arrivals))):
        post(i)
    following = len(posted)
    while posted:
        request, t, lo, hi, into = posted.popleft()
        wait_all([request])
        if into is not None:
            mine = view[lo:hi]
            np.add(mine, into, out=mine)
        if t < 2 * size - 3:
            sending[(lo, hi)] = comm.Isend(message(lo, hi), dest=right, tag=_TAG)
        if following < len(arrivals):
            post(following)
            following += 1
    wait_all(list(sending.values()))
