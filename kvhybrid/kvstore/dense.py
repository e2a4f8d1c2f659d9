"""The dense path: sums of dense keys over the group (MPI) and, with several client groups,
over the groups (the servers); then the store's optimizer, if it has one.

A pushpull takes one of four routes, chosen per call:

- **engine** (the default, ``overlap.py``): buckets pushed into MXNet's engine, each summed
  on the communication thread as soon as backward has written it (with several client
  groups the same job takes the sum to the servers and their answer back to the group; a
  group per worker pushes and pulls through MXNet's engine, ``server_round_trips.py``);
- **fused**: the call's keys summed in fused buffers on the caller's thread (the engine
  path off: ``KVHYBRID_ENGINE=0``, or MPI without thread support);
- **across groups** (the engine path off): fused buckets summed in the group, sent by the
  master to the servers (all before any answer is awaited, as ``dist_sync`` does), answers
  broadcast in the group;
- **key by key** (``sum_and_update``): compressed keys, single keys, pushes.
"""
from __future__ import annotations

import functools
import logging
from typing import Dict, List, Optional

import numpy as np
import mxnet as mx

from ..config import StoreConfig
from ..errors import KeyValueError
from ..tensor_collectives import allreduce_array, broadcast_array
from ..tensor_collectives.compression import CompressionParams, TwoBitCompressor
from ..tensor_collectives.engine import EngineComm, thread_level_ok
from ..tensor_collectives.fusion import Bucket, FusionBuffer, allreduce_fused, buckets, on_host
from ..tensor_collectives.ndarray_view import ViewCache
from ..tensor_collectives.ops import broadcast_view, copy_to_all, reduce_local
from . import overlap, server_round_trips
from .calls import CheckedCall, agree_in_meeting, agree_later
from .keys import Key, KeySlot
from .modes import SyncMode
from .placement import Placement

log = logging.getLogger("kvhybrid")


def start_engine(config: StoreConfig, mode: SyncMode, placement: Placement
                 ) -> Optional[EngineComm]:
    """The communication thread of the engine path (overlap.py, prefetched rows), on a
    communicator of its own; None where the path cannot run (then pushpull blocks)."""
    if not (config.engine and mode.engine_path):
        return None
    group = placement.group
    if not thread_level_ok(group.MPI):
        if group.rank == 0:
            log.warning("kvhybrid: MPI gives no MPI_THREAD_MULTIPLE, so dense sums cannot "
                        "overlap backward: build MPI with thread support, or set "
                        "KVHYBRID_ENGINE=0 to silence this")
        return None
    engine_group = group.derived(group.comm, f"{group.name}-engine")
    engine_group.algorithms.patient = True   # its waits leave the cores to the engine
    return EngineComm(engine_group)


class DensePath:
    """Sums dense keys (see the module docstring) for one store."""

    def __init__(self, config: StoreConfig, mode: SyncMode, placement: Placement,
                 slots: Dict[Key, KeySlot], engine: Optional[EngineComm]):
        self.config, self.mode, self.placement, self.slots = config, mode, placement, slots
        self.engine = engine
        #: dense pushpulls go to the servers through MXNet's engine (a client group of one
        #: rank with servers: server_round_trips.py)
        self.round_trips = (engine is not None and placement.sum_across_groups
                            and placement.group.size == 1 and placement.servers is not None)
        #: dense pushpulls take the engine path (with several groups the group's sum goes
        #: on to the servers in the same job: ``overlap.AcrossGroups``)
        self.on_engine = engine is not None and not self.round_trips
        self._across = overlap.AcrossGroups(placement.servers) \
            if placement.sum_across_groups else None
        self.round_trip_calls = 0   # pushpulls that took that path
        self.shared_grads = overlap.GradientBuffers()
        self._fusion = FusionBuffer()
        self.views = ViewCache()
        #: set_gradient_compression's 2bit compressor (per-key residuals of this worker)
        self.compressor: Optional[TwoBitCompressor] = None
        #: the servers decode MXNet's compressed pushes (a client group per worker)
        self.servers_compressed = False

    @property
    def bucket_bytes(self) -> int:
        """The engine path's bucket size (0 when the store blocks instead): fusion off
        (KVHYBRID_FUSION_THRESHOLD=0) makes every key a bucket of its own."""
        if not (self.on_engine or self.round_trips):
            return 0
        return min(self.config.bucket_bytes, self.config.fusion_threshold) or 1

    # -- pushpull ------------------------------------------------------------------------------
    def pushpull(self, call: CheckedCall, updater, agreed: bool = True) -> None:
        """Sum the call's keys and write the sums (or, with ``updater``, the updated weights)
        into its outs, or into its values when an out is None. ``agreed``: False for a
        repeated call on the engine path, whose agreement is made here, on the
        communication thread (in its first bucket's meeting where the ranks share a host)."""
        work = call.work
        across = self.placement.sum_across_groups
        if self.compressor is not None:   # key by key: each key has its own residual
            if not agreed:
                agree_later(self.engine, "pushpull", call.signature, call.about)
        elif self.on_engine:
            work = self._on_engine(call, updater, agreed)
        elif self.round_trips:
            work = self._round_trips(call, updater)
        elif len(work) > 1 and not across and self.config.fusion_threshold:
            work = self._fused(call, updater)
        elif len(work) > 1 and across:
            work = self._across_groups(call, updater)
        for k, value_k, out_k in work:
            slot = self.slots[k]
            dst = out_k if out_k is not None else value_k
            target = slot.grad_buffer() if updater is not None else dst[0]
            copy_to_all(self.sum_and_update(k, slot, value_k, target, updater), dst)

    def _on_engine(self, call: CheckedCall, updater, agreed: bool):
        """Push the call's dense sums into MXNet's engine, bucket by bucket (overlap.py);
        returns at once with the keys left to do one by one (none with elements). A call
        not ``agreed`` yet is agreed on the communication thread: in its first bucket's
        meeting where the ranks share a host (no collective of its own, which delayed the
        start of a lone pushpull's sum), else in a small allreduce before its buckets."""
        across = self._across
        if call.engine_plan is None:
            call.engine_plan = overlap.plan(call.work, self.slots, self.bucket_bytes,
                                            self.shared_grads)
            if across is not None and across.link is not None:   # (every master, alike)
                across.link.packs_of([it.key for b in call.engine_plan[0] for it in b.items])
            if call.engine_plan[0] and self.engine.group.meets_on_host:   # (made once)
                call.meeting = overlap.Agreement(
                    f"pushpull{call.about}", functools.partial(
                        agree_in_meeting, what="pushpull", signature=call.signature,
                        about=call.about))
        buckets_, rest = call.engine_plan
        if not agreed and call.meeting is None:
            agree_later(self.engine, "pushpull", call.signature, call.about)
        overlap.run(buckets_, self.engine, updater,
                    agreement=call.meeting if not agreed else None, across=across)
        return rest

    def _round_trips(self, call: CheckedCall, updater):
        """Push the call's keys to the servers and their answers' pulls into MXNet's engine
        (server_round_trips.py); returns at once with the keys left to do one by one (none
        with elements). A new updater or weight makes a new plan."""
        if call.plan is None or (call.plan[0] is not None and not call.plan[0].current(updater)):
            call.plan = server_round_trips.plan(call.work, self.slots, self.placement.servers,
                                                updater, self.bucket_bytes)
        round_trips, rest = call.plan
        if round_trips is not None:
            round_trips.run(self.placement.group)
            self.round_trip_calls += 1
        return rest

    def _fused(self, call: CheckedCall, updater):
        """Sum the dense keys of one call in fused buckets; return the keys left to do one
        by one. Every rank forms the same buckets: the keys, shapes, dtypes and devices
        were agreed on. The buckets are planned once per call."""
        if call.plan is None:
            call.plan = self.plan_buckets(call.work)
        buckets_, rest = call.plan
        for bucket, items in buckets_:
            sums = allreduce_fused(bucket, self.placement.group, self._fusion, self.views)
            for (k, value_k, out_k, slot), total in zip(items, sums):
                dst = out_k if out_k is not None else value_k
                if updater is not None:
                    grad = total.array
                    if grad.context != slot.value.context:  # staged: the pinned buffer
                        grad = grad.as_in_context(slot.value.context)
                    updater(k, grad, slot.value)
                    copy_to_all(slot.value, dst)
                elif bucket.staged:  # back to the accelerator, by the engine
                    copy_to_all(total.array, dst)
                else:  # the engine is idle: write through views
                    for d, arr in enumerate(dst):
                        if not (d == 0 and total.in_place):
                            np.copyto(self.views.get(arr, slot.dtype, slot.count), total.view)
        return rest

    def _across_groups(self, call: CheckedCall, updater):
        """Several dense keys with several client groups, as ``sum_and_update`` does one,
        with a bucket's worth of sync points instead of a key's worth each: the group sums
        a bucket of keys in one fused allreduce, the master sends all of them to the
        servers before it waits for any answer (as ``dist_sync`` does, so the round trips
        overlap), and the answers reach the group in one broadcast. Returns the keys left
        to do one by one."""
        group, servers = self.placement.group, self.placement.servers
        if call.plan is None:
            buckets_, rest = self.plan_buckets(call.work, in_place=False)
            call.plan = ([(b, items, np.empty(b.total, b.dtype)) for b, items in buckets_], rest)
        buckets_, rest = call.plan
        for bucket, items, flat in buckets_:
            sums = allreduce_fused(bucket, group, self._fusion, self.views)
            if servers is not None:   # the engine is idle: allreduce_fused waited
                servers.push_pull_views([(k, total.view, flat[total.span])
                                         for (k, *_), total in zip(items, sums)])
            broadcast_view(flat, 0, group, name=f"{bucket.name} from the servers",
                           patient=True)
            for (k, value_k, out_k, slot), total in zip(items, sums):
                answer = flat[total.span]
                dst = list(out_k if out_k is not None else value_k)
                if updater is not None:
                    dst.append(slot.value)
                for arr in dst:   # nothing the engine runs uses them now
                    view = self.views.host(arr, slot.dtype, slot.count)
                    if view is not None:
                        np.copyto(view, answer)
                    else:   # to the device: a synchronous copy from host memory
                        arr[:] = answer.reshape(arr.shape)
        return rest

    def plan_buckets(self, work, in_place: bool = True):
        """([(Bucket, [(key, value, out, slot)])], keys left to do one by one). With
        ``in_place`` a bucket whose sums may overwrite its gradients is summed there."""
        fused = [(k, v, o, self.slots[k], not (on_host(v) and (o is None or on_host(o))))
                 for k, v, o in work if self.slots[k].count]
        if len(fused) < 2:
            return [], work
        plan = []
        # a bucket holds one dtype, and host tensors or staged ones, never both
        kinds = [(s.dtype, staged) for *_, s, staged in fused]
        for idx in buckets([s.count * s.dtype.itemsize for *_, s, _ in fused], kinds,
                           self.config.fusion_threshold):
            items = [fused[i][:4] for i in idx]
            bucket = Bucket([v for _, v, _, _ in items], [s.count for *_, s in items],
                            [s.shape for *_, s in items], items[0][3].dtype,
                            in_place=in_place and all(o is None for _, _, o, _ in items),
                            name=f"(keys {items[0][0]!r}..{items[-1][0]!r})",
                            staged=fused[idx[0]][4])
            plan.append((bucket, items))
        done = {k for k, *_ in fused}
        return plan, [w for w in work if w[0] not in done]

    def sum_and_update(self, key: Key, slot: KeySlot, arrays: List[mx.nd.NDArray],
                       target: mx.nd.NDArray, updater, compress: bool = True) -> mx.nd.NDArray:
        """Sum ``arrays`` into ``target`` over devices, the group and (with several client
        groups) the servers; apply the optimizer if one is set. Returns the array that
        holds the key's new value: the updated weight, or ``target`` with the sum."""
        self.mode.check_update(updater is not None)
        result = self._sum_and_update(key, slot, arrays, target, updater, compress)
        self.mode.after_update(key, slot)
        return result

    def _sum_and_update(self, key: Key, slot: KeySlot, arrays: List[mx.nd.NDArray],
                        target: mx.nd.NDArray, updater, compress: bool) -> mx.nd.NDArray:
        group, servers = self.placement.group, self.placement.servers
        reduce_local(arrays, target)
        if self.compressor is not None and compress:
            self.compressor.allreduce(key, target, group, name=f"key {key!r}")
        else:
            allreduce_array(target, "sum", group, name=f"key {key!r}")
        result = target if updater is None else slot.value
        if slot.count == 0:  # nothing to sum or update (MXNet's operators reject empty arrays)
            return result
        if self.placement.sum_across_groups:
            # The master pushes the group's sum and pulls the servers' answer (the sum over
            # groups, or the weight updated by the servers' optimizer); the group gets it.
            if servers is not None:
                servers.push_pull(key, target, result)
            broadcast_array(result, 0, group, name=f"key {key!r} from the servers",
                            patient=True)
        elif updater is not None:
            updater(key, target, slot.value)
        return result

    # -- gradient compression ------------------------------------------------------------------
    def compress(self, params: CompressionParams) -> None:
        """Compress dense sums from now on (``set_gradient_compression``)."""
        self.compressor = TwoBitCompressor(params)
        self.on_engine = self.round_trips = False   # compressed sums: key by key, here
        placement = self.placement
        if placement.sum_across_groups and placement.group.size == 1 \
                and self.mode.compresses_on_servers():
            # Every worker is a ps-lite worker (pure PS): what it pushes is its own codes
            # (±t or 0), which MXNet's compressor sends as they are (its residual stays 0)
            # and the servers decode. A bigger group's sum of codes needs more than 2 bits.
            placement.servers.set_gradient_compression(params.as_mxnet())
            self.servers_compressed = True

    def check_compressible(self, key: Key, dtype) -> None:
        if self.servers_compressed and np.dtype(dtype) != np.float32:
            raise KeyValueError(
                f"key {key!r} is {np.dtype(dtype).name}, and in this shape (a client group per "
                "worker) MXNet's own compressor sends pushes to the servers, which takes "
                "float32 only, as dist_sync does: keep the parameter float32, run client "
                "groups of several workers (--clients fewer than -n), or drop "
                "compression_params")

    def check_rows_uncompressed(self, key: Key, what: str) -> None:
        if self.servers_compressed:
            raise KeyValueError(
                f"{what} of key {key!r} to the parameter servers with gradient compression: "
                "in this shape (a client group per worker) MXNet's own compressor sends the "
                "pushes, and it refuses row_sparse arrays, as dist_sync does: run client "
                "groups of several workers (kvhybrid-launch --clients fewer than -n), or drop "
                "compression_params")

    # -- what it ran ---------------------------------------------------------------------------
    def stats(self) -> Dict[str, object]:
        """Fused allreduces (buckets), of those the ones summed where the gradients lie, the
        ones the engine scheduled, calls per allreduce algorithm, and pushpulls whose keys
        went to the servers through the engine (``round_trips``). Waits for the engine's
        pending sums first."""
        mx.nd.waitall()
        group = self.placement.group
        groups = [group] + ([self.engine.group] if self.engine is not None else [])
        calls = {name: sum(g.algorithms.calls[name] for g in groups)
                 for name in group.algorithms.calls}
        return {"fused": sum(g.fused_calls for g in groups),
                "in_place": sum(g.fused_in_place for g in groups),
                "engine": self.engine.ops_run if self.engine is not None else 0,
                "round_trips": self.round_trip_calls,
                "algorithms": calls}

    def close(self) -> None:
        self.shared_grads.clear()
        self.views.clear()
