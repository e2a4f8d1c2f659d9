"""Tensor fusion: many small keys summed by one allreduce (Horovod's tensor fusion).

A model's step pushes one key per parameter; most are small, and each
allreduce pays a fixed cost (the MPI call, the cross-rank agreement, Python)
that dwarfs the bytes. ``buckets`` groups consecutive tensors of one dtype and
one kind (host or accelerator) into runs of at most ``threshold`` bytes;
``allreduce_fused`` sums a :class:`Bucket` across the group once and hands back
per-tensor sums.

Host tensors are packed through zero-copy views of NDArray memory (numpy copies
of a few microseconds per key), or not packed at all when they already lie back
to back. Tensors on an accelerator are summed over their devices there, copied
into one pinned host buffer by the engine, and copied back by the caller.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence

import numpy as np
import mxnet as mx
from mxnet.ndarray import NDArray

from . import ndarray_view
from .group import Group
from .ndarray_view import ViewCache, host_view, memory_view



def on_host(arrays: Sequence[NDArray]) -> bool:
    """Whether a tensor's arrays all lie in host memory (else its bucket is staged)."""
    return all(ndarray_view.is_host(a) for a in arrays)


def buckets(nbytes: Sequence[int], dtypes: Sequence[np.dtype], threshold: int,
            first_threshold: Optional[int] = None) -> List[List[int]]:
    """Indices of tensors (given by their bytes and dtypes) grouped into runs of one dtype
    and at most ``threshold`` bytes (a tensor larger than that is a bucket of its own).
    ``first_threshold`` bounds the first bucket instead (PyTorch DDP's small first bucket:
    the first gradients of backward start moving early)."""
    out: List[List[int]] = []
    size, current = 0, None
    for i, (n, dtype) in enumerate(zip(nbytes, dtypes)):
        limit = first_threshold if len(out) == 1 and first_threshold is not None else threshold
        if out and dtype == current and size + n <= limit:
            out[-1].append(i)
            size += n
        else:
            out.append([i])
            size, current = n, dtype
    return out


class FusionBuffer:
    """A reusable flat host NDArray per dtype, grown to the largest bucket seen; a pinned
    one for buckets staged from an accelerator."""

    def __init__(self):
        self._bufs: Dict[tuple, NDArray] = {}

    def get(self, count: int, dtype, pinned: bool = False) -> NDArray:
        key = (np.dtype(dtype).str, pinned)
        buf = self._bufs.get(key)
        if buf is None or buf.size < count:
            ctx = mx.cpu_pinned(0) if pinned else mx.cpu()
            buf = mx.nd.empty((max(count, 1),), ctx=ctx, dtype=dtype)
            self._bufs[key] = buf
        return buf


class FusedSum:
    """One tensor's sum after a fused allreduce: a numpy view of it, and an NDArray
    holding it (made on demand: a slice of the fusion buffer, or the tensor's own first
    array when the sum was made in place)."""

    __slots__ = ("view", "_buf", "_start", "_stop", "_shape", "_array")

    def __init__(self, view: np.ndarray, buf: NDArray, start: int, stop: int, shape,
                 array: Optional[NDArray] = None):
        self.view, self._buf, self._start, self._stop = view, buf, start, stop
        self._shape, self._array = shape, array

    @property
    def span(self) -> slice:
        """Where the tensor lies in its bucket's flat sum."""
        return slice(self._start, self._stop)

    @property
    def in_place(self) -> bool:
        return self._array is not None

    @property
    def array(self) -> NDArray:
        if self._array is None:
            self._array = self._buf[self._start:self._stop].reshape(self._shape)
        return self._array


def _contiguous(views: Sequence[np.ndarray]) -> Optional[np.ndarray]:
    """One view spanning ``views`` if they follow each other in memory (gradients that
    kvhybrid.DistributedTrainer placed in one buffer), else None."""
    ptr = start = views[0].__array_interface__["data"][0]
    for v in views:
        if v.__array_interface__["data"][0] != ptr:
            return None
        ptr += v.nbytes
    dtype = views[0].dtype   # (the views keep their NDArrays, and so the memory, alive)
    return memory_view(start, (ptr - start) // dtype.itemsize, dtype, views)


class Bucket:
    """Tensors of one dtype summed by one allreduce. A training loop repeats the same
    call with the same arrays, whose memory never moves: the bucket is built once per
    call, and where its arrays lie is worked out on first use."""

    def __init__(self, tensors: Sequence[Sequence[NDArray]], counts: Sequence[int], shapes,
                 dtype, in_place: bool, name: str = "", staged: bool = False):
        self.tensors, self.counts, self.shapes = list(tensors), list(counts), list(shapes)
        self.dtype, self.name = np.dtype(dtype), name
        #: the tensors lie on an accelerator: packed into a pinned host buffer by the engine
        self.staged = staged
        self.in_place = in_place and not staged
        self.total = sum(self.counts)
        self._firsts: Optional[List[np.ndarray]] = None  # views of each tensor's first array
        self.region: Optional[np.ndarray] = None          # one view over them, if back to back

    def firsts(self, views: ViewCache) -> List[np.ndarray]:
        if self._firsts is None:
            self._firsts = [views.get(arrays[0], self.dtype, count)
                            for arrays, count in zip(self.tensors, self.counts)]
            if self.in_place and len(self._firsts) > 1:
                self.region = _contiguous(self._firsts)
        return self._firsts


def allreduce_fused(bucket: Bucket, group: Group, buffer: FusionBuffer,
                    views: ViewCache) -> List[FusedSum]:
    """Sum a bucket of tensors over their devices and the group; one :class:`FusedSum`
    per tensor (on the host), valid until the next call on ``buffer``.

    An ``in_place`` bucket whose first arrays follow each other in memory is reduced
    where it lies, with no copy in or out (PyTorch DDP's gradient-as-bucket-view);
    otherwise the tensors are packed into ``buffer``. MXNet's engine has finished every
    pending operation when this returns, so callers may write NDArrays through views.
    """
    dtype, total, name = bucket.dtype, bucket.total, bucket.name
    if bucket.staged:
        buf = buffer.get(total, dtype, pinned=True)
        _pack_on_devices(bucket, buf)
    # One wait for the whole engine (the gradients are written, no operation still reads
    # the last step's sums or the outputs): a wait per array would cost a wake-up each.
    with group.watchdog.waiting(lambda: f"the MXNet engine to finish the arrays of {name}",
                                collective=False):
        mx.nd.waitall()
    if bucket.staged:
        flat = host_view(buf, dtype, buf.size)
        out, start = [], 0
        for count, shape in zip(bucket.counts, bucket.shapes):
            out.append(FusedSum(flat[start:start + count], buf, start, start + count, shape))
            start += count
    else:
        flat, buf, out = _pack_on_host(bucket, buffer, views)
    algorithm = group.algorithms.select(total * dtype.itemsize)
    with group.watchdog.waiting(lambda: f"fused allreduce ({algorithm}) of {len(bucket.tensors)} "
                                        f"keys ({total * dtype.itemsize / 2**20:.1f} MB) {name} on "
                                        f"group {group.name} of {group.size} ranks"):
        if total:
            group.algorithms.allreduce(flat[:total])
    group.bytes_sent["dense"] += total * dtype.itemsize
    group.fused_calls += 1
    if buf is None:
        group.fused_in_place += 1
    return out


def _pack_on_devices(bucket: Bucket, buf: NDArray) -> None:
    """Queue each tensor's sum over its devices, copied into its place in ``buf``."""
    start = 0
    for arrays, count in zip(bucket.tensors, bucket.counts):
        first = arrays[0]
        total = first if len(arrays) == 1 else mx.nd.add_n(
            first, *[a.as_in_context(first.context) for a in arrays[1:]])
        total.reshape((count,)).copyto(buf[start:start + count])
        start += count


def _pack_on_host(bucket: Bucket, buffer: FusionBuffer, views: ViewCache):
    """(the flat view to reduce, the fusion buffer or None when reduced in place, sums)."""
    dtype, total = bucket.dtype, bucket.total
    firsts = bucket.firsts(views)
    flat, buf = bucket.region, None
    if flat is None:
        buf = buffer.get(total, dtype)
        flat = host_view(buf, dtype, total)
    out = []
    start = 0
    for arrays, count, shape, first in zip(bucket.tensors, bucket.counts, bucket.shapes, firsts):
        stop = start + count
        part = flat[start:stop]
        if buf is not None:
            np.copyto(part, first)
        for arr in arrays[1:]:
            np.add(part, views.get(arr, dtype, count), out=part)
        out.append(FusedSum(part, buf, start, stop, shape, arrays[0] if buf is None else None))
        start = stop
    return flat, buf, out
