"""Ring allreduce: reduce-scatter then allgather, each rank talking only to its neighbours.

Every rank sends and receives ``2 (P-1)/P`` of the buffer whatever ``P`` is, the
bandwidth-optimal schedule (MXNET-MPI §6, Fig. 9). Each chunk is moved in segments
with two receives in flight, so a segment is added while it is still in cache and
the next one is already on its way (the paper's pipelined rings).
"""
from __future__ import annotations

from typing import Callable, List, Optional, Sequence

import numpy as np

#: bytes per pipelined segment (Open MPI's tuned ring is fastest here near 1 MB)
SEGMENT_BYTES = 1 << 20
_TAG = 7001


def _bounds(n: int, parts: int) -> List[int]:
    return [i * n // parts for i in range(parts + 1)]


def ring_allreduce(view: np.ndarray, comm, MPI, workspace: np.ndarray,
                   segment_bytes: Optional[int] = None,
                   wait_all: Optional[Callable[[Sequence], None]] = None) -> None:
    """Sum ``view`` (flat, contiguous) over ``comm`` in place. ``workspace`` is scratch
    of at least ``ceil(len(view) / P)`` elements of ``view.dtype``. ``wait_all`` waits for
    a list of requests (default MPI's ``Waitall``, which spins; ``ops.wait_all_patiently``
    sleeps, leaving the cores to compute while a slow link carries the segments)."""
    if wait_all is None:
        wait_all = MPI.Request.Waitall
    size, rank = comm.Get_size(), comm.Get_rank()
    if size == 1 or view.size == 0:
        return
    right, left = (rank + 1) % size, (rank - 1) % size
    b = _bounds(view.size, size)
    seg = max(1, (segment_bytes or SEGMENT_BYTES) // view.itemsize)
    raw = view.view(np.uint8)
    scratch = workspace.view(np.uint8)
    item = view.itemsize

    def chunk(i: int) -> slice:
        return slice(b[i], b[i + 1])

    # reduce-scatter: after step s rank r holds the sum of s+2 ranks' chunk (r-s-1) mod P
    for step in range(size - 1):
        send, recv = chunk((rank - step) % size), chunk((rank - step - 1) % size)
        n_recv = recv.stop - recv.start
        starts = list(range(0, n_recv, seg))  # the sender cuts its chunk (the same one) alike
        sends = [comm.Isend([raw[(send.start + s) * item:(min(send.stop, send.start + s + seg)) * item],
                             MPI.BYTE], dest=right, tag=_TAG + j)
                 for j, s in enumerate(range(0, send.stop - send.start, seg))]

        def post(j: int):
            s = starts[j]
            return comm.Irecv([scratch[s * item:min(n_recv, s + seg) * item], MPI.BYTE],
                              source=left, tag=_TAG + j)

        pending = [post(j) for j in range(min(2, len(starts)))]
        for j, s in enumerate(starts):
            wait_all([pending[j]])
            if j + 2 < len(starts):
                pending.append(post(j + 2))
            e = min(n_recv, s + seg)
            mine = view[recv.start + s:recv.start + e]
            np.add(mine, workspace[s:e], out=mine)
        wait_all(sends)
    # allgather: pass the finished chunks around the ring, straight into place
    for step in range(size - 1):
        send, recv = chunk((rank + 1 - step) % size), chunk((rank - step) % size)
        wait_all([comm.Irecv([raw[recv.start * item:recv.stop * item], MPI.BYTE], source=left,
                             tag=_TAG),
                  comm.Isend([raw[send.start * item:send.stop * item], MPI.BYTE], dest=right,
                             tag=_TAG)])
