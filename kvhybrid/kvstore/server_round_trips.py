"""The dense path of a client group of one rank: MXNet's own push and pull, in the engine.

With a client group per worker (pure PS) there is no group to sum in: a worker's dense
sum is its devices' gradients, which go to the parameter servers as they do with
``dist_sync``. ``dist_sync`` pushes each key into MXNet's engine and returns: the key
travels once backward has written it, and the next forward pass waits in the engine for
its answer. Doing the round trips on the caller's thread instead (the path of bigger
groups, ``DensePath._across_groups``) makes that thread wait for the whole backward pass
and every answer, each step. So here a pushpull, planned once per call:

1. copies each key's gradient into what it travels in: its pack (``ps/packs.py``: small
   keys share one ps-lite key, which spares the servers and ps-lite a request, and the
   servers an update call, per key) or an array of its own (``ServerLink.wire``). The
   copies are engine operations, one ``amp_multicast`` for a whole pack or bucket where
   the arrays allow, so a pack travels once backward has written its members, and the
   gradients stay as they are, as on every other path;
2. pushes every key and pack, and pulls every answer, in one C call each
   (``link.RoundTrips``): MXNet writes an unpacked key's answer into its outs (and the
   store's copy of the weight) itself; a pack's answer is copied out by the engine;
3. pushes one engine operation that reads every out and ends the wait the watchdog times
   (``Watchdog.watch``): a server that never answers aborts the job, naming the keys,
   instead of leaving the next forward pass waiting forever.

Nothing here waits. The servers' answers are those of the blocking path: MXNet's store
pushes and pulls the same sums.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import mxnet as mx
from mxnet.ndarray import NDArray

from ..tensor_collectives.engine import when_ready
from ..tensor_collectives.fusion import buckets
from ..tensor_collectives.ndarray_view import host_array, is_host
from ..tensor_collectives.operators import Operator
from .keys import Key, KeySlot
from .overlap import MULTICAST_DTYPES, bucket_indices, multicast
from .ps.link import RoundTrips, ServerLink


class RoundTripPlan:
    """One checked pushpull call's dense keys, laid out once: what the engine runs before
    the round trips (copies in, devices' sums), the round trips, what it runs after (a
    pack's answers out), and the arrays every answer ends in."""

    def __init__(self, before: List[Operator], trips: RoundTrips, after: List[Operator],
                 answers: List[NDArray], name: str, updater,
                 weights: List[Tuple[KeySlot, Optional[NDArray]]], nbytes: int):
        self.before, self.trips, self.after = before, trips, after
        self.answers, self.name = answers, name
        self._updater, self._weights = updater, weights
        #: the bytes each step pushes (the arrays' own: a pack's mask included)
        self.nbytes = nbytes

    def current(self, updater) -> bool:
        """Whether the plan still holds: the same updater, and each key's weight the one the
        answers were laid out to go to."""
        return updater is self._updater and all(s.value is v for s, v in self._weights)

    def run(self, group, priority: int = 0) -> None:
        """Push one step of the call (see the module docstring); ``group``: the client
        group (its watchdog times the answers; its counters take the bytes pushed)."""
        group.bytes_sent["servers"] += self.nbytes
        watchdog = group.watchdog
        for op in self.before:
            op()
        self.trips(priority)
        for op in self.after:
            op()
        done = watchdog.watch(lambda: f"the parameter servers' answers to the pushpull of "
                                      f"{self.name}", outward=True)
        when_ready("answers of " + self.name, self.answers, done)


def plan(work, slots: Dict[Key, KeySlot], servers: ServerLink, updater,
         bucket_bytes: int) -> Tuple[Optional[RoundTripPlan], list]:
    """(the plan, keys left to the caller) for a checked call's ``work``: every key with
    elements. ``updater``: the store's (the answers are then updated weights, which the
    store's copy of each weight takes too, as on the blocking path)."""
    items = [(k, list(v), o, slots[k]) for k, v, o in work if slots[k].count]
    if not items:
        return None, work
    packed = servers.packs_of([k for k, *_ in items])
    ins: List[Tuple[NDArray, NDArray]] = []     # (gradient, the array it travels in)
    pushes, pulls, answers = [], [], []
    in_packs: Dict[int, tuple] = {}             # pack_key -> (pack, {member index: item})
    for k, value, out, slot in items:
        dst = list(out if out is not None else value)
        if updater is not None:
            dst.append(slot.value)
        answers += dst
        hit = packed.get(k)
        if hit is not None:
            in_packs.setdefault(hit[0].pack_key, (hit[0], {}))[1][hit[1]] = (value, dst, slot)
            continue
        if len(value) == 1 and is_host(value[0]):
            wire = servers.wire(k)
            ins.append((value[0], wire))
            pushes.append((k, [wire]))
        else:   # MXNet sums the devices' arrays into a buffer of its own (or copies one
            pushes.append((k, value))   # device's to the host): the gradients stay
        pulls.append((k, dst))   # (MXNet writes the answer into each)
    before, after = _copies(ins, bucket_bytes), []
    for pack, members in in_packs.values():
        pack_ins = [(_mask(pack, members), pack.array[:len(pack.members)])]
        sums, outs = [], []
        for i, (value, dst, slot) in sorted(members.items()):
            m = pack.members[i]
            region = pack.array[m.start:m.end].reshape(slot.shape)
            if len(value) == 1:
                pack_ins.append((value[0], region))
            else:   # the devices' sum, into the pack
                sums += _device_sum(value, region)
            outs += [(region, d) for d in dst]
        before += _copies(pack_ins) + sums
        after += _copies(outs)
        pushes.append((pack, [pack.array]))
        pulls.append((pack, [pack.array]))
    name = f"keys {items[0][0]!r}..{items[-1][0]!r}" if len(items) > 1 \
        else f"key {items[0][0]!r}"
    unique = list({a.handle.value: a for a in answers}.values())
    nbytes = sum(arrays[0].size * np.dtype(arrays[0].dtype).itemsize for _, arrays in pushes)
    plan_ = RoundTripPlan(before, servers.round_trips(pushes, pulls), after, unique, name,
                          updater, [(s, s.value) for *_, s in items], nbytes)
    done = {k for k, *_ in items}
    return plan_, [w for w in work if w[0] not in done]


def _device_sum(value: Sequence[NDArray], into: NDArray) -> List[Operator]:
    """Engine operations that sum a key's arrays on several devices into ``into``: each
    array on another device copied next to it first (into an array made once), then one
    ``add_n``."""
    ops, near = [], []
    for v in value:
        if v.context == into.context:
            near.append(v)
        else:
            stage = mx.nd.empty(v.shape, ctx=into.context, dtype=v.dtype)
            ops.append(Operator("_copyto", [v], [stage]))
            near.append(stage)
    return ops + [Operator("add_n", near, [into], num_args=len(near))]


def _mask(pack, members) -> NDArray:
    """The pack's presence mask for this call (1 for the members it carries), as a host
    array the engine copies into the pack's head before each push (the answer overwrites
    it)."""
    return host_array([1 if i in members else 0 for i in range(len(pack.members))],
                      pack.dtype)


def _copies(pairs: Sequence[Tuple[NDArray, NDArray]], bucket_bytes: int = 0) -> List[Operator]:
    """Engine copies of ``(source, destination)`` pairs: one ``amp_multicast`` (a copy of
    each input into its output) per run of host arrays of one float dtype, cut into
    ``bucket_bytes`` buckets as the engine path's (0: one run per dtype) so that a bucket
    goes once backward wrote it; a ``_copyto`` for each other pair (another device)."""
    host, other = [], []
    for s, d in pairs:
        same = is_host(s) and is_host(d) and s.dtype == d.dtype \
            and np.dtype(s.dtype).type in MULTICAST_DTYPES
        (host if same else other).append((s, d))
    sizes = [s.size * np.dtype(s.dtype).itemsize for s, _ in host]
    dtypes = [np.dtype(s.dtype) for s, _ in host]
    runs = bucket_indices(sizes, dtypes, bucket_bytes) if bucket_bytes \
        else buckets(sizes, dtypes, max(sum(sizes), 1))
    ops = [Operator("_copyto", [s], [d]) for s, d in other]
    for idx in runs:
        run = [host[i] for i in idx]
        ops.append(Operator("_copyto", [run[0][0]], [run[0][1]]) if len(run) == 1
                   else multicast([s for s, _ in run], [d for _, d in run]))
    return ops
