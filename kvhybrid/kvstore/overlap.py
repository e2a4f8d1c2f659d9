"""The dense path that overlaps backward: a pushpull's keys summed in engine buckets.

A pushpull hands the store its dense keys while MXNet's engine is still running the
backward pass (``loss.backward()`` returns at once). Instead of waiting for all of it
and summing afterwards, the store plans the call's keys into buckets once, in the order
they come (``kvhybrid.DistributedTrainer`` passes them last layer first, the order
backward writes them), a small first bucket and then ``KVHYBRID_BUCKET_BYTES`` each,
as PyTorch DDP's reducer does. Each step, per bucket:

1. the engine copies the bucket's gradients (summed over the worker's devices) into
   the bucket's own host buffer, as soon as backward has written them; a bucket whose
   (first device's) gradients already lie in one buffer in that order
   (``DistributedTrainer`` lays them out so, ``share_gradient_buffer``), or a lone key's
   own array, is summed where it lies, with no copy. Where the call gives outs
   (``update_on_kvstore``: the gradients must stay as they are) such a buffer is copied
   whole, in one copy, by the allreduce's own operation where it lies in host memory;
2. one engine operation allreduces the buffer (``EngineComm``): it starts when the
   copies are done and runs on the communication thread while backward goes on;
3. the optimizer's update (``update_on_kvstore``; MXNet's SGD as one operator over the
   bucket's weights, laid out in one buffer: ``flat_update.py``; for a small bucket the
   same arithmetic made by the allreduce's operation itself, right after the sum, which
   then also copies the weights into host outs) or the copy back into the gradients is
   pushed behind it; the next forward pass waits for it in the engine.

Copies in and out are one ``copyto`` per key, memory copies. One ``concat`` in and one
``split`` out would push fewer operations, but their kernels compute each element's place
(a division and a search per element), many times the copies' CPU with their Python
(``benchmarks/engine_copies.py``).

``pushpull`` returns after pushing all of this: nothing on the caller's thread waits for
communication. Results are the blocking path's: the same sums of the same arrays.
"""
from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import mxnet as mx
from mxnet.ndarray import NDArray

from ..tensor_collectives.engine import EngineArrays, EngineComm
from ..tensor_collectives.group import Group
from ..tensor_collectives.fusion import buckets
from ..tensor_collectives.ndarray_view import host_view, is_host
from ..tensor_collectives.operators import Operator
from ..tensor_collectives.ops import broadcast_view, copy_to_all
from . import flat_update
from .flat_update import FlatSGD
from .keys import Key, KeySlot
from .ps.link import ServerLink

#: the first bucket's bound (PyTorch DDP's ``first_bucket_bytes``)
FIRST_BUCKET_BYTES = 2**20


@dataclass
class _Item:
    key: Key
    value: List[NDArray]            # the key's gradient, one array per device
    out: Optional[List[NDArray]]    # where the result goes (None: into value)
    slot: KeySlot
    total: NDArray                  # the key's part of the bucket buffer, in its shape


class EngineBucket:
    """Keys of one dtype whose sum is one engine-scheduled allreduce."""

    def __init__(self, items: List[_Item], buffer: NDArray, in_place: bool, name: str,
                 source: Optional[NDArray] = None, source_view: Optional[np.ndarray] = None):
        self.items, self.buffer, self.in_place, self.name = items, buffer, in_place, name
        #: the shared gradient buffer the items lie in, in order, where the bucket must copy
        #: them (outs given: with update_on_kvstore): one copy instead of one per key
        self.source = source
        #: the source's memory, where the allreduce's own operation copies it into the
        #: buffer (``_readable_source``): no copy operator pushed from the caller's thread;
        #: else the copy operator
        self.source_view = source_view
        self.copy_in = Operator("_copyto", [source], [buffer]) \
            if source is not None and source_view is None else None
        self.dtype = items[0].slot.dtype
        self.count = sum(it.slot.count for it in items)
        self.weights: Optional[_Weights] = None   # with an optimizer: see _update
        #: (weights, its allreduce's EngineArrays for them): ``_engine_arrays``
        self.engine_arrays: Optional[tuple] = None
        # the memory MPI reduces. Wait first: MXNet allocates an op's output when the engine
        # runs the op, and a pointer taken before that may point to memory it then replaces
        buffer.wait_to_read()
        self.view = host_view(buffer, self.dtype, self.count)
        #: (key, its sum, where its answer goes) for the servers (``_through_servers``)
        ends = np.cumsum([it.slot.count for it in items])
        self.key_views = [(it.key, self.view[end - it.slot.count:end],
                           self.view[end - it.slot.count:end]) for it, end in zip(items, ends)]


class GradientBuffers:
    """Which gradient arrays are views into one buffer (``share_gradient_buffer``): a
    bucket made of exactly one buffer's views, in order, is summed in place. The engine
    tracks a buffer and its views as one array, so the bucket's operation names the
    buffer alone."""

    def __init__(self):
        self._where: Dict[int, Tuple[NDArray, int, NDArray]] = {}   # handle -> (base, offset, view)

    def share(self, base: NDArray, views: Sequence[NDArray]) -> None:
        offset = 0
        for view in views:
            self._where[view.handle.value] = (base, offset, view)
            offset += view.size
        if offset != base.size:
            raise ValueError(f"the views cover {offset} of the buffer's {base.size} elements")

    def base_of(self, items: List[_Item], outs_ok: bool = False) -> Optional[NDArray]:
        """The buffer the items' (first device's) gradients lie in back to back, covering
        it, or None. Not where an item has an out (its gradient must stay as it is) unless
        ``outs_ok``: the caller only reads the buffer."""
        base, expect = None, 0
        for it in items:
            if it.out is not None and not outs_ok:
                return None
            where = self._where.get(it.value[0].handle.value)
            if where is None or (base is not None and where[0] is not base) \
                    or where[1] != expect:
                return None
            base, expect = where[0], expect + it.slot.count
        return base if base is not None and expect == base.size else None

    def clear(self) -> None:
        self._where.clear()


def bucket_indices(nbytes: Sequence[int], dtypes: Sequence[np.dtype],
                   bucket_bytes: int) -> List[List[int]]:
    """The plan's buckets as indices into the call's keys (DistributedTrainer lays its
    gradient buffers out by the same function)."""
    return buckets(nbytes, dtypes, bucket_bytes, min(FIRST_BUCKET_BYTES, bucket_bytes))


def plan(work, slots: Dict[Key, KeySlot], bucket_bytes: int, shared: GradientBuffers,
         ) -> Tuple[List[EngineBucket], list]:
    """(engine buckets, keys left to the caller) for a checked call's ``work``: every key
    with elements; buckets follow the call's order, one dtype each."""
    items = [_Item(k, list(v), None if o is None or _same_arrays(o, v) else list(o), slots[k],
                   None)
             for k, v, o in work if slots[k].count]
    if not items:
        return [], work
    plan_: List[EngineBucket] = []
    seen = collections.Counter(a.handle.value for it in items for a in it.value)
    outs_before: List[NDArray] = []   # the outs of the buckets so far, this one's included
    for idx in bucket_indices([it.slot.count * it.slot.dtype.itemsize for it in items],
                              [it.slot.dtype for it in items], bucket_bytes):
        members = [items[i] for i in idx]
        name = f"bucket {len(plan_)} (keys {members[0].key!r}..{members[-1].key!r})"
        base = shared.base_of(members)
        if base is None:
            base = _own_array(members, seen)
        source = None
        if base is not None and is_host(base):
            buffer, in_place = base, True
        else:
            total = sum(it.slot.count for it in members)
            buffer = mx.nd.zeros((total,), ctx=mx.cpu(), dtype=members[0].slot.dtype)
            in_place = False
            if all(len(it.value) == 1 for it in members):
                source = shared.base_of(members, outs_ok=True)
        start = 0
        for it in members:
            it.total = buffer[start:start + it.slot.count].reshape(it.slot.shape)
            start += it.slot.count
        outs_before += [o for it in members for o in (it.out or [])]
        plan_.append(EngineBucket(members, buffer, in_place, name, source,
                                  _readable_source(source, outs_before)
                                  if source is not None else None))
    done = {it.key for it in items}
    return plan_, [w for w in work if w[0] not in done]


def _readable_source(source: NDArray, outs_before: Sequence[NDArray]) -> Optional[np.ndarray]:
    """A host view of a bucket's gradients (``source``) if its allreduce may copy them into
    its buffer itself, else None: a host array that no out of the call's buckets so far
    lies in, its own included: an earlier bucket would write it first (the copies pushed
    first read what the gradients held at the call), and an operation may not both read an
    array and write a view of it (MXNet's engine refuses the same variable twice)."""
    if not is_host(source):
        return None
    source.wait_to_read()   # (MXNet may allocate an array when its first writer runs)
    mine = host_view(source)
    for o in outs_before:
        if o.stype == "default" and is_host(o):
            o.wait_to_read()
            if np.may_share_memory(host_view(o), mine):
                return None
    return mine


def _same_arrays(out: Sequence[NDArray], value: Sequence[NDArray]) -> bool:
    """Whether a key's outs are its values themselves (``pushpull(k, a, out=a)``): the sum
    may then be made where the values lie, as with no out."""
    return len(out) == len(value) and all(o.handle.value == v.handle.value
                                          for o, v in zip(out, value))


def _own_array(members: List[_Item], seen: collections.Counter) -> Optional[NDArray]:
    """A lone key's own gradient (its first device's), flat, to sum where it lies: a
    pushpull of one key with no out, or with its values as outs (gluon.Trainer's, key by
    key, or a user's) then copies nothing in or out, as the blocking path: at large sizes
    the two copies took longer than the allreduce. Not when the call names the array twice,
    or with another out (the
    gradient must stay as it is)."""
    if len(members) != 1 or members[0].out is not None:
        return None
    first = members[0].value[0]
    if seen[first.handle.value] != 1 or first.stype != "default":
        return None
    return first.reshape((members[0].slot.count,))


class _Weights:
    """The weights a bucket's update reads and writes (the store's, ``slot.value``), and the
    sums it reads: the bucket's views where the weights are, else copies made each step;
    how it updates them (``flat``: one SGD operator over the bucket, else MXNet's
    Updater); and where the updated weights go (``outs``: one array per key, all of them,
    when one engine operation can copy them all, see ``multicast``)."""

    def __init__(self, bucket: EngineBucket, updater):
        slots = [it.slot for it in bucket.items]
        same_device = all(it.total.context == s.value.context
                          for it, s in zip(bucket.items, slots))
        self.updater = updater
        self.flat = FlatSGD(updater, [it.key for it in bucket.items], slots, bucket.buffer,
                            bucket.view) \
            if flat_update.fits(updater, slots, bucket.buffer) else None
        self.values = [s.value for s in slots]
        self.grads = [it.total for it in bucket.items] if same_device else None
        dsts = [it.out if it.out is not None else it.value for it in bucket.items]
        #: the outs the bucket's allreduce writes itself, after its C++ update (no
        #: operator pushed), else None
        self.written = _host_outs(bucket, self.flat, dsts)
        #: whether the bucket's allreduce makes the update itself (the C++ SGD, see ``_sum``)
        self.in_allreduce = self.flat is not None and self.flat.kernel is not None
        self.outs = [d[0] for d in dsts] if self.written is None \
            and _one_copy(self.values, dsts) else None
        self.copy_out = multicast(self.values, self.outs) if self.outs is not None else None

    def current(self, bucket: EngineBucket, updater) -> bool:
        """Whether every key's weight is still the one seen here (a new init or another
        call's bucket may have replaced one), and the update still the one chosen here."""
        return (updater is self.updater
                and all(it.slot.value is v for it, v in zip(bucket.items, self.values))
                and (self.flat is None or self.flat.current()))


def _host_outs(bucket: EngineBucket, flat: Optional[FlatSGD],
               dsts: List[List[NDArray]]) -> Optional[List[NDArray]]:
    """The outs, one per key, if the bucket's allreduce may copy the updated weights into
    them after its C++ update (``FlatSGD.copy_after``): outs the call gave (Gluon's
    parameters: not the gradients, which backward may be writing now), host arrays of the
    bucket's dtype, each once, none in memory the allreduce already writes; else None."""
    if flat is None or flat.kernel is None or any(it.out is None for it in bucket.items) \
            or any(len(d) != 1 for d in dsts):
        return None
    outs = [d[0] for d in dsts]
    if len({o.handle.value for o in outs}) != len(outs) or not all(
            o.stype == "default" and np.dtype(o.dtype) == bucket.dtype and is_host(o)
            for o in outs):
        return None
    for o in outs:   # (once: MXNet may allocate an array when its first writer runs)
        o.wait_to_read()
    views = [host_view(o, bucket.dtype, o.size) for o in outs]
    written = [bucket.view] + [host_view(b, bucket.dtype, b.size) for b in flat.buffers]
    if any(np.may_share_memory(v, w) for v in views for w in written):
        return None   # (a gradient as its own out: copied back by the caller's thread)
    flat.copy_after(views)
    return outs


@dataclass(frozen=True)
class Agreement:
    """A call's agreement, made in its first bucket's meeting (``agree_in_meeting``)."""
    what: str                          # the call, for the wait's name: "pushpull of key 0"
    meet: Callable[[Group], bool]      # meets (True), or raises on every rank


@dataclass(frozen=True)
class AcrossGroups:
    """With several client groups a bucket's group sum goes on, in the same job, to the
    servers through the group's master (``link``: its link, None on the other ranks), and
    their answer (the sum over groups, or the weights their optimizer updated) comes back
    to every rank of the group, as ``DensePath.sum_and_update`` does key by key. The
    master packs the call's small keys when it plans the call (``ServerLink.packs_of``)."""
    link: Optional[ServerLink]


def run(buckets_: Sequence[EngineBucket], comm: EngineComm, updater, priority: int = 0,
        agreement: Optional[Agreement] = None, across: Optional[AcrossGroups] = None) -> None:
    """Push one step of a call's buckets (see module): every bucket's gradients into its
    buffer first, then each bucket's allreduce and its update or copy back. Gathering all
    first makes a call that names one array for two keys sum what the array held, not a
    sum written back into it, as MXNet's stores (every push before any pull).
    ``agreement``: the call's, made in the first bucket's meeting (``agree_in_meeting``)."""
    for bucket in buckets_:
        _gather(bucket)
    for i, bucket in enumerate(buckets_):
        _sum(bucket, comm, updater, priority, agreement if i == 0 else None, across)


def _gather(bucket: EngineBucket) -> None:
    if bucket.copy_in is not None:
        bucket.copy_in()   # (bucket.source.copyto(bucket.buffer))
        return
    if bucket.source_view is not None:   # (copied by its allreduce's operation: _sum)
        return
    for it in bucket.items:   # the sum over this worker's devices, into the bucket
        arrays = it.value
        if len(arrays) > 1:   # (in place, it.total is the first device's gradient itself)
            mx.nd.add_n(*[a.as_in_context(it.total.context) for a in arrays], out=it.total)
        elif not bucket.in_place:
            arrays[0].copyto(it.total)


def _sum(bucket: EngineBucket, comm: EngineComm, updater, priority: int,
         agreement: Optional[Agreement] = None, across: Optional[AcrossGroups] = None) -> None:
    group, view, source = comm.group, bucket.view, bucket.source_view
    agreeing = f"the ranks to agree on {agreement.what}, then " if agreement else ""
    # (across groups the servers update the weights: their answer is copied, as a sum is)
    weights = _weights(bucket, updater) if updater is not None and across is None else None
    # a small bucket's SGD is made by its allreduce, right after the sum (flat_update.py)
    update = weights.flat.prepare() if weights is not None and weights.in_allreduce else None

    def allreduce() -> None:   # on the communication thread: the only one using group.comm
        if source is not None:   # (the gradients, which stay as backward wrote them)
            np.copyto(view, source)
        with group.watchdog.waiting(lambda: f"{agreeing}the engine allreduce of {bucket.name} "
                                            f"({view.nbytes / 2**20:.2f} MB) on group "
                                            f"{group.name} of {group.size} ranks"):
            group.algorithms.allreduce(
                view, meet=None if agreement is None else lambda: agreement.meet(group))
        if across is not None:
            _through_servers(bucket, group, across.link)
        if update is not None:
            update()
        group.bytes_sent["dense"] += view.nbytes
        group.fused_calls += 1
        group.fused_in_place += bucket.in_place

    # (the master's later calls of the link wait for this job: ps-lite sees its push first)
    done = across.link.defer() if across is not None and across.link is not None else None
    try:
        comm.submit(bucket.name, _engine_arrays(bucket, weights), allreduce, priority,
                    cleanup=done)
    except BaseException:   # (nothing was queued: the link must not wait for it)
        if done is not None:
            done()
        raise
    if weights is not None:
        _update(bucket, weights, updated=update is not None)
        return
    for it in bucket.items:
        dst = it.out if it.out is not None else it.value
        if across is not None and updater is not None:   # (the servers' updated weight)
            it.total.copyto(it.slot.value)
        for d, arr in enumerate(dst):
            if not (bucket.in_place and d == 0):
                it.total.copyto(arr)


def _through_servers(bucket: EngineBucket, group: Group, link: Optional[ServerLink]) -> None:
    """On the communication thread, after the group's sum: the master pushes each key's sum
    and pulls the servers' answer into the bucket's buffer (``link``; the other ranks have
    none), then the group gets it."""
    if link is not None:
        with link.deferred(group.watchdog):
            # (packed at the plan: packing waits for all of MXNet's engine, this job too)
            link.push_pull_views(bucket.key_views, new_packs=False)
    broadcast_view(bucket.view, 0, group, name=f"{bucket.name} from the servers", patient=True)


def _engine_arrays(bucket: EngineBucket, weights: Optional[_Weights]) -> EngineArrays:
    """What the bucket's allreduce mutates (its buffer; where it makes the update itself,
    ``_sum``'s ``update``, the weights, momenta and outs too) and reads (the gradients it
    copies in), laid out once for these ``weights`` (a new layout makes new ones)."""
    kept = bucket.engine_arrays
    if kept is None or kept[0] is not weights:
        mutated = [bucket.buffer] + (weights.flat.buffers + (weights.written or [])
                                     if weights is not None and weights.in_allreduce else [])
        reads = [bucket.source] if bucket.source_view is not None else []
        kept = bucket.engine_arrays = (weights, EngineArrays(mutated, reads))
    return kept[1]


def _weights(bucket: EngineBucket, updater) -> _Weights:
    """The bucket's weights as they are now (laid out again where they changed)."""
    weights = bucket.weights
    if weights is None or not weights.current(bucket, updater):
        weights = bucket.weights = _Weights(bucket, updater)
    return weights


def _update(bucket: EngineBucket, weights: _Weights, updated: bool) -> None:
    """The bucket's keys in one call, unless its allreduce makes the update (``updated``):
    one SGD operator over the bucket where it makes the same update (``flat_update``),
    else MXNet's Updater, which updates up to its optimizer's aggregate_num keys per
    operator (multi_sgd_update), as gluon.Trainer does; then the weights go to the
    outputs, unless the allreduce copied them there too (``_Weights.written``)."""
    if updated:
        if weights.written is not None:   # (and the weights copied into the outs)
            return
    elif weights.flat is not None:
        weights.flat.update()
    else:
        grads = weights.grads or [it.total.as_in_context(v.context)
                                  for it, v in zip(bucket.items, weights.values)]
        weights.updater([it.key for it in bucket.items], grads, weights.values)
    if weights.copy_out is not None:
        weights.copy_out()
        return
    for it in bucket.items:
        copy_to_all(it.slot.value, it.out if it.out is not None else it.value)


#: dtypes ``amp_multicast`` copies (it casts to the widest of its inputs: one dtype, a copy)
MULTICAST_DTYPES = (np.float16, np.float32, np.float64)


def _one_copy(values: List[NDArray], dsts: List[List[NDArray]]) -> bool:
    """Whether a bucket's updated weights can reach their outs in one engine operation:
    several keys of one float dtype, one out each, on the weights' device, no array twice."""
    if len(values) < 2 or any(len(d) != 1 for d in dsts):
        return False
    arrays = values + [d[0] for d in dsts]
    first = values[0]
    return (np.dtype(first.dtype).type in MULTICAST_DTYPES
            and all(a.context == first.context and a.dtype == first.dtype
                    and a.stype == "default" for a in arrays)
            and len({a.handle.value for a in arrays}) == len(arrays))


def multicast(values: List[NDArray], outs: List[NDArray]) -> Operator:
    """Every weight into its out in one engine operation: ``amp_multicast`` of one dtype is
    a copy of each input into its output: one operation pushed instead of one ``copyto``
    per key from the caller's thread (and its arrays laid out once)."""
    return Operator("amp_multicast", values, outs, num_outputs=len(values))
