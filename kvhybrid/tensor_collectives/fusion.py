"""Tensor fusion: many small keys summed by one allreduce (Horovod's tensor fusion).

A model's step pushes one key per parameter; most are small, and each
allreduce pays a fixed cost (the MPI call, the cross-rank agreement, Python)
that dwarfs the bytes. ``allreduce_fused`` packs consecutive host tensors of
one dtype into a flat buffer of at most ``threshold`` bytes, sums it across
the group once, and hands back per-tensor views into the buffer.

Packing works on zero-copy views of NDArray memory (numpy copies of a few
microseconds per key); arrays on an accelerator are not fused (the caller
reduces them key by key).
"""
from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

import numpy as np
import mxnet as mx
from mxnet.ndarray import NDArray

from .group import Group
from .ndarray_view import ViewCache, host_view, is_host
from .ops import _mpi_buffer, _mpi_op

Bucket = List[int]


def fusable(arrays: Sequence[NDArray]) -> bool:
    """Host arrays (the caller checked that they are dense)."""
    return all(is_host(a) for a in arrays)


def buckets(nbytes: Sequence[int], dtypes: Sequence[np.dtype], threshold: int) -> List[Bucket]:
    """Indices of tensors (given by their bytes and dtypes) grouped into runs of one dtype
    and at most ``threshold`` bytes (a tensor larger than that is a bucket of its own)."""
    out: List[Bucket] = []
    size, current = 0, None
    for i, (n, dtype) in enumerate(zip(nbytes, dtypes)):
        if out and dtype == current and size + n <= threshold:
            out[-1].append(i)
            size += n
        else:
            out.append([i])
            size, current = n, dtype
    return out


class FusionBuffer:
    """A reusable flat host NDArray per dtype, grown to the largest bucket seen."""

    def __init__(self):
        self._bufs: Dict[str, NDArray] = {}

    def get(self, count: int, dtype) -> NDArray:
        key = np.dtype(dtype).str
        buf = self._bufs.get(key)
        if buf is None or buf.size < count:
            buf = mx.nd.empty((max(count, 1),), ctx=mx.cpu(), dtype=dtype)
            self._bufs[key] = buf
        return buf


def allreduce_fused(tensors: Sequence[Sequence[NDArray]], counts: Sequence[int], dtype,
                    group: Group, buffer: FusionBuffer, views: ViewCache,
                    name: str = "") -> List[Tuple[np.ndarray, NDArray, int, int]]:
    """Sum one bucket of host tensors (``counts`` elements of ``dtype`` each) over their
    devices and the group.

    Returns, per tensor, ``(view, buf, start, stop)``: a numpy view of its sum in
    the fusion buffer and where it sits there (``buf[start:stop]``), valid until
    the next call on this buffer. MXNet's engine has finished every pending
    operation when it returns, so callers may write NDArrays through views.
    """
    dtype = np.dtype(dtype)
    total = sum(counts)
    buf = buffer.get(total, dtype)
    # One wait for the whole engine (the gradients are written, no operation still reads
    # the last step's sums or the outputs): a wait per array costs ~75 us each.
    with group.watchdog.waiting(lambda: f"the MXNet engine to finish the arrays of {name}",
                                collective=False):
        mx.nd.waitall()
    flat = host_view(buf, dtype, total)
    out = []
    start = 0
    for arrays, count in zip(tensors, counts):
        stop = start + count
        part = flat[start:stop]
        for d, arr in enumerate(arrays):
            src = views.get(arr, dtype, count)
            if d == 0:
                np.copyto(part, src)
            else:
                np.add(part, src, out=part)
        out.append((part, buf, start, stop))
        start = stop
    MPI = group.MPI
    mpi_op = _mpi_op(MPI, "sum", dtype)
    with group.watchdog.waiting(lambda: f"fused allreduce of {len(tensors)} keys "
                                        f"({total * dtype.itemsize / 2**20:.1f} MB) {name} on "
                                        f"group {group.name} of {group.size} ranks"):
        if total:
            group.comm.Allreduce(MPI.IN_PLACE, _mpi_buffer(MPI, flat[:total]), op=mpi_op)
    group.bytes_sent["dense"] += total * dtype.itemsize
    group.fused_calls += 1
    return out
