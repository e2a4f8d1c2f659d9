"""The ``hybrid-mpi`` KVStore: what ``gluon.Trainer`` talks to.

Dense keys are summed across ranks with one MPI tensor allreduce per key (a
tensor = a worker's per-device arrays, reduced locally first). Summation, not
averaging, as MXNet's ``dist_sync`` does, so training scripts keep their
learning rates: with ``trainer.step(batch_size)`` on each worker, N workers
train exactly like one process on the union of their batches.

When the store owns the optimizer (``update_on_kvstore=True``, the Trainer's
default) every rank applies the same update to its own copy of the weights
right after the allreduce: the copies stay identical without a server.

With several client groups (one ``mpirun`` each, MXNET-MPI Fig. 4/5), each
group's master pushes the group's sum to MXNet's parameter servers, pulls the
result (the sum over groups, or the weight the servers' optimizer updated)
and broadcasts it inside its group.

With one group spanning several hosts and ``KVHYBRID_ROW_MASTERS=host``
(``kvhybrid-launch --row-masters host``), row_sparse gradients are aggregated
per host instead (Parallax's local aggregation): each host's first rank is a
ps-lite worker that pushes and pulls its host's rows, so no single master's
link carries every row; dense keys are still allreduced over the whole group.

row_sparse keys (sparse weights, sparse gradients) move only the rows touched;
``sparse.py`` says where their rows live.

The class derives from MXNet's native ``KVStore`` (holding a handle to an
unused native ``local`` store) only because ``gluon.Trainer`` accepts nothing
else for sparse gradients and sparse weights; every method is overridden.
"""
from __future__ import annotations

import atexit
import collections
import ctypes
import functools
import hashlib
import json
import logging
import os
import tempfile
import time
import weakref
from dataclasses import dataclass
from typing import Deque, Dict, List, Optional

import numpy as np
import mxnet as mx
from mxnet.base import _LIB, KVStoreHandle, c_str, check_call

from ..config import StoreConfig
from ..errors import ConfigError, KeyValueError, KVHybridError
from ..tensor_collectives import Group, allreduce_array, broadcast_array
from ..tensor_collectives.group import GroupSettings
from ..tensor_collectives.ops import broadcast_view
from ..tensor_collectives.fusion import Bucket, FusionBuffer, allreduce_fused, buckets, on_host
from ..tensor_collectives.ndarray_view import ViewCache, is_host
from ..tensor_collectives.ops import copy_to_all, reduce_local, wait_patiently
from ..tensor_collectives.rows import local_ids
from ..tensor_collectives.topology import Topology
from ..tensor_collectives.compression import CompressionParams, TwoBitCompressor
from ..tensor_collectives.engine import EngineComm, thread_level_ok
from . import overlap, routing, sparse
from .agreement import agree
from .keys import Key, KeySlot, check_matches, check_out, lookup, pairs, spec, zeros
from .registry import ASYNC_TYPE, NAME, TYPE
from .ps.link import ServerLink, server_link

log = logging.getLogger("kvhybrid")

#: step times kept for KVHYBRID_STATS_FILE (the tuner reads them): a bounded clock
MAX_TICKS = 10_001


def _unrecorded(method):
    """Gluon calls the store inside ``autograd.record()`` (a sparse weight's first forward
    pass initialises the Trainer's store); the store's writes into weights are not part of
    the model's graph, as with MXNet's own stores, which write from C++."""
    @functools.wraps(method)
    def wrapper(*args, **kwargs):
        with mx.autograd.pause():
            return method(*args, **kwargs)
    return wrapper


def _native_local_handle() -> KVStoreHandle:
    handle = KVStoreHandle()
    check_call(_LIB.MXKVStoreCreate(c_str("local"), ctypes.byref(handle)))
    return handle


def _optimizer_text(optimizer) -> str:
    """What must be equal on every rank, since every rank applies its own copy."""
    fields = {"learning_rate": optimizer.learning_rate, "wd": optimizer.wd,
              "rescale_grad": optimizer.rescale_grad, "clip_gradient": optimizer.clip_gradient}
    for name in ("momentum", "beta1", "beta2", "epsilon", "gamma1", "gamma2"):
        if hasattr(optimizer, name):
            fields[name] = getattr(optimizer, name)
    return f"{type(optimizer).__module__}.{type(optimizer).__name__}(" + \
        ", ".join(f"{k}={v!r}" for k, v in fields.items()) + ")"


#: checked pushpull calls remembered per store
MEMO_LIMIT = 4096


def _handles(arrays):
    """The NDArray handles of a value/out argument (nested lists), for call memos."""
    if isinstance(arrays, mx.nd.NDArray):
        return arrays.handle.value
    if isinstance(arrays, (list, tuple)):
        return tuple(_handles(a) for a in arrays)
    return type(arrays).__name__


def _call_key(key):
    return tuple(key) if isinstance(key, list) else key


@dataclass
class ResumeState:
    """What a checkpoint saves of a store and puts back (``checkpoint.py`` reads nothing
    else of it): named here, so that the store's insides can change without breaking resume."""
    #: every key: shape, dtype, its value on this rank, whether its rows live on the servers
    slots: Dict[Key, KeySlot]
    #: this rank's link to the parameter servers (a master's), else None
    servers: Optional[ServerLink]
    #: the store's own optimizer (None: the Trainer or only the servers update)
    updater: Optional[mx.optimizer.Updater]
    #: this client group's place among the groups, and how many there are
    client_rank: int
    num_clients: int
    #: each group trains its own copy of the weights (async, several groups)
    groups_differ: bool
    #: dense values live on the servers (several groups' weights, or elastic centers)
    dense_on_servers: bool
    #: hybrid-mpi-elastic: each key's steps since its last exchange (restored in place)
    step_counts: Dict[Key, int]


@dataclass
class CheckedCall:
    """A pushpull call that passed its checks, remembered for the next step."""

    work: list                          # [(key, value arrays, out arrays or None)]
    signature: str                      # what the ranks agree on
    plan: Optional[tuple] = None        # its fusion buckets (HybridMPIStore._plan_buckets)
    engine_plan: Optional[tuple] = None  # its engine buckets (overlap.plan)


def _keys_text(pairs_) -> str:
    return ", ".join(f"key {k!r} {spec(arrays[0])}" for k, arrays in pairs_)


class HybridMPIStore(mx.kv.KVStore):
    """Synchronous data-parallel KVStore (mpi-SGD): MPI inside a client group, MXNet's
    parameter servers between groups.

    Create it with ``mx.kv.create('hybrid-mpi')`` after ``import kvhybrid``,
    in every rank of every client group, and hand it to ``gluon.Trainer``.
    """

    #: the parameter servers' mode between client groups
    SERVER_MODE = "dist_sync"
    #: whether a pushpull inside one group may take the engine path (overlap.py)
    ENGINE_PATH = True

    def __init__(self, config: Optional[StoreConfig] = None):
        self.config = config or StoreConfig.from_env()
        # this client group: the ranks of one mpirun job
        self.group = Group.world(GroupSettings(self.config.timeout, self.config.stall_warning,
                                               self.config.allreduce,
                                               self.config.emulate_node_size),
                                 self.config.allow_singleton, self.config.abort_on_error)
        super().__init__(_native_local_handle())
        self._slots: Dict[Key, KeySlot] = {}
        self._fusion = FusionBuffer()
        self._views = ViewCache()
        self._memo: Dict[tuple, CheckedCall] = {}   # checked pushpull calls (_checked_call)
        self._param_names: Dict[Key, str] = {}      # Gluon's key index -> Parameter name
        self._clock_key = None                      # the first key pushed: one push per step
        self._ticks: Deque[float] = collections.deque(maxlen=MAX_TICKS)
        self._closed = False
        # With parameter servers, the group's master is a ps-lite worker (with
        # KVHYBRID_ROW_MASTERS=host, each host's first rank); with several client groups,
        # dense keys are summed across groups through the servers.
        self._servers: Optional[ServerLink] = None
        host_masters = self._check_row_masters()
        #: whether dense sums go across client groups, through the servers
        self._sum_across_groups = self.config.num_clients > 1 and not host_masters
        #: the ranks whose row_sparse gradients one master aggregates and exchanges with the
        #: servers: the whole group, or this rank's host (KVHYBRID_ROW_MASTERS=host)
        self.row_group = self._host_group() if host_masters else self.group
        self._check_restart()
        ps_rank = 0
        if self.config.num_servers > 0 and self.row_group.rank == 0:
            self._servers = server_link(self.row_group.watchdog, self.config.connect_timeout,
                                        self.SERVER_MODE, self.config.num_servers,
                                        rejoin=self.config.restart > 0,
                                        pack_keys=self.config.pack_keys)
            ps_rank = self._servers.ps_rank
        self._client_rank, self._num_clients = ((0, 1) if host_masters
                                                else self._agree_on_clients(ps_rank))
        #: some table's rows live on the servers (see _servers_in_step)
        self._rows_at_servers = False
        self._engine = self._start_engine()
        #: dense pushpulls take the engine path (with several groups they go through the
        #: servers, blocking; the engine thread then serves prefetched rows only)
        self._dense_on_engine = self._engine is not None and not self._sum_across_groups
        self._shared_grads = overlap.GradientBuffers()
        #: set_gradient_compression's 2bit compressor (per-key residuals of this worker)
        self._compressor: Optional[TwoBitCompressor] = None
        #: the servers decode MXNet's compressed pushes (a client group per worker)
        self._servers_compressed = False
        self._prefetch_ids: Dict[Key, np.ndarray] = {}         # asked for, sent with the next push
        self._prefetched: Dict[Key, sparse.Prefetch] = {}      # on their way, for the next pull
        ref = weakref.ref(self)
        atexit.register(lambda: ref() is not None and ref().close())
        log.info("kvhybrid: %s store, rank %d of %d (client group %d of %d, %d servers)", NAME,
                 self.rank, self.num_workers, self._client_rank, self._num_clients,
                 self.config.num_servers)

    def _check_restart(self) -> None:
        """A restarted client group rejoins groups that went on without it: only groups
        that never wait for each other (asynchronous and elastic stores) can."""
        if self.config.restart and self.SERVER_MODE == "dist_sync":
            raise ConfigError(
                f"this client group was restarted (KVHYBRID_RESTART={self.config.restart}), and "
                f"the synchronous {NAME} store cannot take it back: the other groups and the "
                "servers wait for every group at every step, so the job is lost. Resume it "
                "from a checkpoint (kvhybrid.load_checkpoint), or train with "
                "hybrid-mpi-async or hybrid-mpi-elastic to survive a lost group")

    def _check_row_masters(self) -> bool:
        """Whether rows are aggregated per host; refuses settings that cannot work, on every
        rank, before anything connects."""
        if self.config.row_masters != "host":
            return False
        if self.config.num_servers == 0:
            raise ConfigError("KVHYBRID_ROW_MASTERS=host sends each host's rows to the parameter "
                              "servers, and this job has none: add servers (kvhybrid-launch "
                              "--servers 1 or more) or unset KVHYBRID_ROW_MASTERS")
        if self.SERVER_MODE != "dist_sync":
            raise ConfigError(f"KVHYBRID_ROW_MASTERS=host is for the synchronous {NAME} store, "
                              f"not {type(self).__name__}: unset it")
        return True

    def _host_group(self) -> Group:
        """This rank's host (KVHYBRID_EMULATE_NODE_SIZE emulates hosts), checked against the
        number of ps-lite workers: one per host."""
        with self.group.watchdog.waiting("the ranks to map their hosts"):
            topology = Topology.of(self.group.MPI, self.group.comm, self.config.emulate_node_size)
        hosts = topology.nodes
        if topology.cross is not None:
            topology.cross.Free()
        if hosts != self.config.num_clients:
            raise ConfigError(f"KVHYBRID_ROW_MASTERS=host makes each of the group's {hosts} hosts "
                              f"a ps-lite worker, but DMLC_NUM_WORKER is "
                              f"{self.config.num_clients}: set DMLC_NUM_WORKER={hosts} "
                              "(kvhybrid-launch --row-masters host does) and run one client "
                              "group")
        group = self.group.derived(topology.node, "host")   # a duplicate
        topology.node.Free()
        return group

    def _agree_on_clients(self, ps_rank: int):
        """Every rank learns its group's place among the groups (the master's ps-lite rank)."""
        masters = self._servers.num_masters if self._servers else self.config.num_clients
        with self.group.watchdog.waiting("the group master to connect to the parameter servers"):
            ps_rank, masters = self.group.comm.bcast((ps_rank, masters), root=0)
        if masters != self.config.num_clients:
            raise KVHybridError(f"ps-lite has {masters} workers but DMLC_NUM_WORKER says "
                                f"{self.config.num_clients}: every client group's master must "
                                "connect to the same scheduler")
        return ps_rank, masters

    def _start_engine(self) -> Optional[EngineComm]:
        """The communication thread of the engine path (overlap.py, prefetched rows), on a
        communicator of its own; None where the path cannot run (then pushpull blocks, as
        before)."""
        if not (self.config.engine and self.ENGINE_PATH):
            return None
        if not thread_level_ok(self.group.MPI):
            if self.group.rank == 0:
                log.warning("kvhybrid: MPI gives no MPI_THREAD_MULTIPLE, so dense sums cannot "
                            "overlap backward: build MPI with thread support, or set "
                            "KVHYBRID_ENGINE=0 to silence this")
            return None
        group = self.group.derived(self.group.comm, f"{self.group.name}-engine")
        group.algorithms.patient = True   # its waits leave the cores to the engine
        return EngineComm(group)

    @property
    def engine_bucket_bytes(self) -> int:
        """The engine path's bucket size (0 when the store blocks instead): fusion off
        (KVHYBRID_FUSION_THRESHOLD=0) makes every key a bucket of its own."""
        if not self._dense_on_engine:
            return 0
        return min(self.config.bucket_bytes, self.config.fusion_threshold) or 1

    @property
    def engine(self) -> Optional[EngineComm]:
        """The engine path's communication thread (None when pushpull blocks instead)."""
        return self._engine

    def collectives(self) -> Dict[str, int]:
        """Collectives this rank has entered so far: on the group (agreements, rows,
        broadcasts: the meetings on the caller's thread) and engine buckets."""
        groups = {self.group, self.row_group}
        return {"group": sum(g.watchdog.collectives for g in groups),
                "engine": self._engine.group.watchdog.collectives if self._engine else 0}

    def dense_stats(self) -> Dict[str, object]:
        """What this rank's dense sums ran, over both paths: fused allreduces (buckets), of
        those the ones summed where the gradients lie, the ones the engine scheduled, and
        calls per allreduce algorithm. Waits for the engine's pending sums first."""
        mx.nd.waitall()
        groups = [self.group] + ([self._engine.group] if self._engine is not None else [])
        calls = {name: sum(g.algorithms.calls[name] for g in groups)
                 for name in self.group.algorithms.calls}
        return {"fused": sum(g.fused_calls for g in groups),
                "in_place": sum(g.fused_in_place for g in groups),
                "engine": self._engine.ops_run if self._engine is not None else 0,
                "algorithms": calls}

    def share_gradient_buffer(self, base: mx.nd.NDArray, views: List[mx.nd.NDArray]) -> None:
        """Tell the store that ``views`` (gradients, in order) lie back to back in ``base``:
        an engine bucket made of exactly them is summed where it lies, with no copy
        (``kvhybrid.DistributedTrainer`` lays its gradients out so)."""
        self._shared_grads.share(base, views)
        self._memo.clear()

    @property
    def _servers_in_step(self) -> bool:
        """Whether a step has a rank talk to the servers while the others wait for it (several
        groups, or rows on the servers): the group's agreements then wait without spinning
        (``wait_patiently``), which leaves the cores to that rank and the servers. So do
        they on the engine path, where the engine computes while the ranks meet."""
        return self._sum_across_groups or self._rows_at_servers or self._dense_on_engine

    def _note_rows_at_servers(self) -> None:
        self._rows_at_servers = any(s.rows_on_servers for s in self._slots.values())

    # -- identity ----------------------------------------------------------------------------
    @property
    def type(self) -> str:
        return TYPE if self.SERVER_MODE == "dist_sync" else ASYNC_TYPE

    @property
    def rank(self) -> int:
        """This worker's rank among all workers of all client groups."""
        return self._client_rank * self.group.size + self.group.rank

    @property
    def num_workers(self) -> int:
        """All workers of all client groups (groups have equal sizes)."""
        return self._num_clients * self.group.size

    # -- checkpoints (checkpoint.py) ------------------------------------------------------------
    def resume_state(self) -> ResumeState:
        """The parts of this store a checkpoint saves and restores (see ``ResumeState``)."""
        self._open()
        return ResumeState(
            slots=self._slots, servers=self._servers, updater=self._updater,
            client_rank=self._client_rank, num_clients=self._num_clients,
            groups_differ=self.SERVER_MODE == "dist_async" and self._num_clients > 1,
            dense_on_servers=self._dense_on_servers(), step_counts=self._step_counts())

    def _step_counts(self) -> Dict[Key, int]:
        return {}   # only elastic averaging counts steps per key

    def agree_on(self, what: str, build, about: str = ""):
        """Run ``build()`` on every rank (it returns (result, signature), or raises
        KeyValueError) and agree: every rank raises the same error if any rank failed or
        the signatures differ; returns this rank's result."""
        return self._check(what, build, about)

    def forget_prefetched(self) -> None:
        """Drop rows fetched ahead (their values are about to be replaced)."""
        self._prefetched.clear()

    def is_capable(self, capability: str) -> bool:
        if capability.lower() == mx.kv.KVStoreBase.OPTIMIZER:
            return True
        raise ValueError(f"unknown capability {capability!r}: the only one is "
                         f"{mx.kv.KVStoreBase.OPTIMIZER!r}")

    # -- helpers -------------------------------------------------------------------------------
    def _check(self, what: str, build, about: str = ""):
        """Run ``build()`` (local checks, returns (result, signature)) and agree with all ranks."""
        try:
            result, signature = build()
            error = None
        except KeyValueError as exc:
            result, signature, error = None, None, str(exc)
        agree(self.group, what, signature, error, about, patient=self._servers_in_step)
        return result

    def _open(self) -> None:
        if self._closed:
            raise KVHybridError("this hybrid-mpi store was closed: create a new one with "
                                "mx.kv.create('hybrid-mpi')")
        if self._engine is not None:   # a collective of the engine thread failed
            self._engine.check()

    # -- init and broadcast --------------------------------------------------------------------
    @_unrecorded
    def init(self, key, value) -> None:
        """Register keys; their value is rank 0's (as in ``dist_sync``)."""
        self._open()

        def build():
            ps = pairs(key, value, sparse_ok=True)
            for k, arrays in ps:
                if k in self._slots:
                    raise KeyValueError(f"key {k!r} is already initialised: init each key once, "
                                        "or use broadcast() to overwrite its value")
                if arrays[0].stype == "row_sparse":
                    self._check_new_table(k, arrays[0])
                    self._check_rows_uncompressed(k, "init of a row_sparse table")
                else:
                    self._check_new_on_servers(k)
                    self._check_compressible(k, arrays[0].dtype)
            return ps, "init " + _keys_text(ps)

        for k, arrays in self._check("init", build, f" of key {key!r}"):
            if arrays[0].stype == "row_sparse":
                self._init_table(k, arrays[0])
            else:
                self._set_from_root(k, arrays[0])

    def _check_new_table(self, key: Key, value: mx.nd.NDArray) -> None:
        self._check_table_rows(key, value.shape[0])
        if self._servers is not None:
            self._servers.check_new(key)

    def _check_table_rows(self, key: Key, rows: int) -> None:
        """Every piece of a table on the servers is split across every server, so each
        needs a row per server at least."""
        servers, pieces = max(1, self.config.num_servers), self.config.partitions
        if rows // pieces < servers:
            fix = (f"set KVHYBRID_PARTITIONS to at most {rows // servers}" if rows >= servers
                   else "give the table more rows, or use a dense parameter")
            raise KeyValueError(f"row_sparse key {key!r} has {rows} rows: split into "
                                f"{pieces} piece(s) over {self.config.num_servers} server(s), "
                                f"some server would get none of a piece's rows; {fix}")

    def _init_table(self, key: Key, value: mx.nd.NDArray) -> None:
        """A sparse weight: rank 0's table, kept on the servers or by every rank."""
        slot = KeySlot(tuple(value.shape), np.dtype(value.dtype), None, sparse_weight=True)
        slot.rows_on_servers = self._rows_on_servers(slot)
        if not slot.rows_on_servers:
            slot.value = zeros(value.shape, value.context, value.dtype)
            if self.group.rank == 0:
                value.copyto(slot.value)
                if self._dense_on_servers() and self._servers is not None:
                    self._servers.init(key, slot.value, slot.value)   # as a dense key
            broadcast_array(slot.value, 0, self.group, name=f"key {key!r}")
        else:
            table = value.tostype("default")
            if self.row_group is not self.group:   # rank 0's table, whichever master inits
                broadcast_array(table, 0, self.group, name=f"key {key!r}")
            if self._servers is not None:
                self._servers.init_rows(key, table, self.config.partitions)
        self._slots[key] = slot
        self._note_rows_at_servers()

    @_unrecorded
    def broadcast(self, key, value, out, priority: int = 0) -> None:
        """Give every rank rank 0's ``value``, written into ``out`` (one array per device)."""
        self._open()

        def build():
            ps = pairs(key, value)
            outs = pairs(key, out, "out")
            for (k, v), (_, o) in zip(ps, outs):
                if k in self._slots:
                    check_matches(k, self._slots[k], v, "value")
                    if self._sum_across_groups:
                        raise KeyValueError(f"key {k!r} is already initialised, and with several "
                                            "client groups a key is broadcast once: broadcast "
                                            "each key once")
                else:
                    self._check_new_on_servers(k)
                for arr in o:
                    if arr.shape != v[0].shape or arr.dtype != v[0].dtype:
                        raise KeyValueError(f"out of key {k!r} has {spec(arr)} but value has "
                                            f"{spec(v[0])}: out arrays must match value")
            return list(zip(ps, outs)), "broadcast " + _keys_text(ps)

        for (k, v), (_, o) in self._check("broadcast", build, f" of key {key!r}"):
            slot = self._set_from_root(k, v[0])
            copy_to_all(slot.value, o)

    def _rows_on_servers(self, slot: KeySlot) -> bool:
        """Whether a key that carries rows keeps them on the servers (``sparse.py``)."""
        return sparse.rows_live_on_servers(slot, self.config.num_servers, self._sum_across_groups)

    def _dense_on_servers(self) -> bool:
        """Whether dense keys also live on the servers (summed across client groups there)."""
        return self._sum_across_groups

    def _check_new_on_servers(self, key: Key) -> None:
        if self._dense_on_servers() and self._servers is not None:
            self._servers.check_new(key)

    def _set_from_root(self, key: Key, value: mx.nd.NDArray) -> KeySlot:
        """The key takes rank 0's value: the group master's, and with several client
        groups the value of the group whose master is ps-lite's rank 0."""
        slot = self._slots.get(key)
        if slot is None:
            slot = KeySlot(tuple(value.shape), np.dtype(value.dtype),
                           zeros(value.shape, value.context, value.dtype))
        if self.group.rank == 0:
            if value.size:  # MXNet's operators reject empty arrays
                value.copyto(slot.value)
            if self._dense_on_servers():
                self._servers.init(key, slot.value, slot.value)
        broadcast_array(slot.value, 0, self.group, name=f"key {key!r}")
        self._slots[key] = slot
        return slot

    # -- push, pull, pushpull ------------------------------------------------------------------
    def _pairs_and_signature(self, op: str, key, value, out=None):
        """Local checks of a push/pushpull: ``([(key, value, out)], signature)``."""
        ps = pairs(key, value, sparse_ok=op == "push")
        outs = pairs(key, out, "out") if out is not None else [(k, None) for k, _ in ps]
        signature = []
        for (k, v), (_, o) in zip(ps, outs):
            slot = lookup(self._slots, k)
            check_matches(k, slot, v, "value")
            stype = v[0].stype
            # host or accelerator decides fusion: part of what ranks must agree on
            where = "host" if on_host(v) and (o is None or on_host(o)) else "device"
            asks = " prefetch" if op == "push" and k in self._prefetch_ids else ""
            signature.append(f"key {k!r} {slot.spec} {stype} {where}{asks}")
            self._check_route(k, slot, stype)
            if o is not None:
                check_out(k, v, o)
        return [(k, v, o) for (k, v), (_, o) in zip(ps, outs)], f"{op} {', '.join(signature)}"

    def _checked_pairs(self, op: str, key, value, out=None):
        return self._check(op, lambda: self._pairs_and_signature(op, key, value, out),
                           f" of key {key!r}")

    def _checked_call(self, key, value, out) -> "CheckedCall":
        """A checked pushpull, once per repeated call. A training loop repeats the same
        pushpull with the same arrays every step, and an NDArray's shape, dtype, storage
        and device never change. The cached call holds the arrays, so their handles cannot
        be reused meanwhile; every call still runs the agreement."""
        ident = (_call_key(key), _handles(value), _handles(out))
        call = self._memo.get(ident)
        if call is not None:
            if self._dense_on_engine:   # off the caller's thread, before the call's buckets
                overlap.check_signature(self._engine, call.signature, f"pushpull of key {key!r}")
            else:
                agree(self.group, "pushpull", call.signature, None, f" of key {key!r}",
                      patient=self._servers_in_step)
            return call

        def build():
            work, signature = self._pairs_and_signature("pushpull", key, value, out)
            return CheckedCall(work, signature), signature

        call = self._check("pushpull", build, f" of key {key!r}")
        if len(self._memo) >= MEMO_LIMIT:  # a loop that makes new arrays every step
            self._memo.clear()
        self._memo[ident] = call
        return call

    def _check_rows_uncompressed(self, key: Key, what: str) -> None:
        if self._servers_compressed:
            raise KeyValueError(
                f"{what} of key {key!r} to the parameter servers with gradient compression: "
                "in this shape (a client group per worker) MXNet's own compressor sends the "
                "pushes, and it refuses row_sparse arrays, as dist_sync does: run client "
                "groups of several workers (kvhybrid-launch --clients fewer than -n), or drop "
                "compression_params")

    def _check_compressible(self, key: Key, dtype) -> None:
        if self._servers_compressed and np.dtype(dtype) != np.float32:
            raise KeyValueError(
                f"key {key!r} is {np.dtype(dtype).name}, and in this shape (a client group per "
                "worker) MXNet's own compressor sends pushes to the servers, which takes "
                "float32 only, as dist_sync does: keep the parameter float32, run client "
                "groups of several workers (--clients fewer than -n), or drop "
                "compression_params")

    def _check_route(self, key: Key, slot: KeySlot, stype: str) -> None:
        if stype != "row_sparse":
            self._check_compressible(key, slot.dtype)
        if stype == "row_sparse":
            to_servers = slot.rows_on_servers or self._rows_on_servers(slot)
            if to_servers:
                self._check_rows_uncompressed(key, "push of row_sparse gradients")
            if to_servers and self._updater is None:
                raise KeyValueError(
                    f"push of row_sparse gradients of key {key!r} to the parameter servers "
                    "needs an optimizer there (without one they overwrite rows instead of "
                    "summing them): call set_optimizer first, as gluon.Trainer does with "
                    "update_on_kvstore=True")
        elif slot.sparse_weight:
            raise KeyValueError(f"key {key!r} holds a sparse weight: push row_sparse gradients "
                                "to it (contrib.nn.SparseEmbedding does)")
        elif slot.rows_on_servers:
            raise KeyValueError(f"key {key!r} took row_sparse gradients, so its rows live on "
                                "the parameter servers: keep pushing row_sparse gradients")

    @_unrecorded
    def pushpull(self, key, value, out=None, priority: int = 0) -> None:
        """Sum ``value`` over devices and ranks; write the result (or, with an optimizer, the
        updated weight) into ``out``, or into ``value`` when ``out`` is None.

        Without an optimizer this is a pure allreduce: the store's own copy of
        the key is left as it was (no extra copy on the hot path).
        """
        self._open()
        self._tick(key)
        call = self._checked_call(key, value, out)
        work = call.work
        if self._compressor is not None:   # key by key: each key has its own residual
            pass
        elif self._dense_on_engine:
            work = self._pushpull_engine(call)
        elif len(work) > 1 and not self._sum_across_groups and self.config.fusion_threshold:
            work = self._pushpull_fused(call)
        elif len(work) > 1 and self._sum_across_groups:
            work = self._pushpull_across_groups(call)
        for k, value_k, out_k in work:
            slot = self._slots[k]
            dst = out_k if out_k is not None else value_k
            target = slot.grad_buffer() if self._updater is not None else dst[0]
            copy_to_all(self._sum_and_update(k, slot, value_k, target), dst)

    def _pushpull_engine(self, call: "CheckedCall"):
        """Push the call's dense sums into MXNet's engine, bucket by bucket (overlap.py);
        returns at once with the keys left to do one by one (none with elements)."""
        if call.engine_plan is None:
            call.engine_plan = overlap.plan(call.work, self._slots, self.engine_bucket_bytes,
                                            self._shared_grads)
        buckets_, rest = call.engine_plan
        for bucket in buckets_:
            overlap.run(bucket, self._engine, self._updater)
        return rest

    def _pushpull_fused(self, call: "CheckedCall"):
        """Sum the dense keys of one call in fused buckets; return the keys left to do one
        by one. Every rank forms the same buckets: the keys, shapes, dtypes and devices
        were agreed on. The buckets are planned once per call."""
        if call.plan is None:
            call.plan = self._plan_buckets(call.work)
        buckets_, rest = call.plan
        for bucket, items in buckets_:
            sums = allreduce_fused(bucket, self.group, self._fusion, self._views)
            for (k, value_k, out_k, slot), total in zip(items, sums):
                dst = out_k if out_k is not None else value_k
                if self._updater is not None:
                    grad = total.array
                    if grad.context != slot.value.context:  # staged: the pinned buffer
                        grad = grad.as_in_context(slot.value.context)
                    self._updater(k, grad, slot.value)
                    copy_to_all(slot.value, dst)
                elif bucket.staged:  # back to the accelerator, by the engine
                    copy_to_all(total.array, dst)
                else:  # the engine is idle: write through views
                    for d, arr in enumerate(dst):
                        if not (d == 0 and total.in_place):
                            np.copyto(self._views.get(arr, slot.dtype, slot.count), total.view)
        return rest

    def _pushpull_across_groups(self, call: "CheckedCall"):
        """Several dense keys with several client groups, as ``_sum_and_update`` does one,
        with a bucket's worth of sync points instead of a key's worth each: the group sums
        a bucket of keys in one fused allreduce, the master sends all of them to the
        servers before it waits for any answer (as ``dist_sync`` does, so the round trips
        overlap), and the answers reach the group in one broadcast. Returns the keys left
        to do one by one."""
        if call.plan is None:
            buckets_, rest = self._plan_buckets(call.work, in_place=False)
            call.plan = ([(b, items, np.empty(b.total, b.dtype)) for b, items in buckets_], rest)
        buckets_, rest = call.plan
        for bucket, items, flat in buckets_:
            sums = allreduce_fused(bucket, self.group, self._fusion, self._views)
            if self._servers is not None:   # the engine is idle: allreduce_fused waited
                self._servers.push_pull_views([(k, total.view, flat[total.span])
                                               for (k, *_), total in zip(items, sums)])
            broadcast_view(flat, 0, self.group, name=f"{bucket.name} from the servers",
                           patient=True)
            for (k, value_k, out_k, slot), total in zip(items, sums):
                answer = flat[total.span]
                dst = list(out_k if out_k is not None else value_k)
                if self._updater is not None:
                    dst.append(slot.value)
                for arr in dst:   # nothing the engine runs uses them now
                    if is_host(arr):
                        np.copyto(self._views.get(arr, slot.dtype, slot.count), answer)
                    else:   # to the device: a synchronous copy from host memory
                        arr[:] = answer.reshape(arr.shape)
        return rest

    def _plan_buckets(self, work, in_place: bool = True):
        """([(Bucket, [(key, value, out, slot)])], keys left to do one by one). With
        ``in_place`` a bucket whose sums may overwrite its gradients is summed there."""
        fused = [(k, v, o, self._slots[k], not (on_host(v) and (o is None or on_host(o))))
                 for k, v, o in work if self._slots[k].count]
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

    @_unrecorded
    def push(self, key, value, priority: int = 0) -> None:
        """Sum ``value`` over devices and ranks into the store (or apply it with the optimizer)."""
        self._open()
        self._tick(key)
        if self._push_with_prefetch(key, value):
            return
        for k, value_k, _ in self._checked_pairs("push", key, value):
            slot = self._slots[k]
            if value_k[0].stype == "row_sparse":  # only the touched rows travel
                self._push_rows(k, slot, value_k)
                continue
            target = slot.grad_buffer() if self._updater is not None else slot.value
            self._sum_and_update(k, slot, value_k, target)

    def _push_with_prefetch(self, key, value) -> bool:
        """The push of a sparse weight that carries the next step's row ids (prefetch_rows),
        in one meeting: its agreement travels in the rows' gather, where the master compares
        the ranks' calls before it pushes anything. Calls that differ reach every rank
        through the communication thread, and every rank raises at its next store call
        (nothing was pushed). Other pushes, and a key's first (its route is decided then),
        agree first. Whether it applies depends only on calls every rank made alike."""
        if isinstance(key, (list, tuple)) or key not in self._prefetch_ids:
            return False
        slot = self._slots.get(key)
        if slot is None or slot.route is None or not slot.rows_on_servers:
            return False
        arrays = ids = None
        try:
            work, signature = self._pairs_and_signature("push", key, value, None)
            call = (None, str(signature))
            arrays = work[0][1]
            ids = local_ids(arrays)
            sparse.count_rows(slot, ids)
        except KeyValueError as exc:
            call, arrays = (str(exc), None), None
        self._prefetched[key] = sparse.push_and_prefetch(
            key, slot, arrays, ids, self._prefetch_ids.pop(key), self.row_group, self._servers,
            self._engine, call)
        return True

    def _push_rows(self, key: Key, slot: KeySlot, arrays) -> None:
        self._prefetched.pop(key, None)   # this push updates the rows it holds
        ids = local_ids(arrays)   # read once: for α and for the push
        sparse.count_rows(slot, ids)
        if slot.route is None:
            slot.route = self._choose_route(key, slot)
        if slot.route == "dense":  # the whole gradient, summed like a dense key's
            target = slot.grad_buffer() if self._updater is not None else slot.value
            self._sum_and_update(key, slot, [a.tostype("default") for a in arrays], target,
                                 compress=False)   # row_sparse gradients: uncompressed
            return
        if not slot.rows_on_servers and self._rows_on_servers(slot):
            # A dense weight's first row_sparse gradient: its rows move to the servers, as a
            # row_sparse table (every group holds the same weight at this point).
            self._check_table_rows(key, slot.shape[0])
            if self._servers is not None:
                self._servers.init_rows(key, slot.value, self.config.partitions)
            slot.rows_on_servers = True
            self._note_rows_at_servers()
            self._memo.clear()   # checked pushpull calls of this key no longer hold
        if slot.rows_on_servers and key in self._prefetch_ids:
            self._prefetched[key] = sparse.push_and_prefetch(
                key, slot, arrays, ids, self._prefetch_ids.pop(key), self.row_group,
                self._servers, self._engine, (None, "agreed"))   # the call agreed already
        elif slot.rows_on_servers:
            sparse.push_to_servers(key, slot, arrays, ids, self.row_group, self._servers)
            self._prefetch_ids.pop(key, None)
        else:
            sparse.push_in_group(key, slot, arrays, ids, self.group, self._updater)

    # -- routing row_sparse keys (Parallax §3.1; kvstore/routing.py) ---------------------------
    def _choose_route(self, key: Key, slot: KeySlot) -> str:
        """A row_sparse key's route, at its first push (before any optimizer state exists):
        forced by KVHYBRID_ROUTES, else by the group's α at this push and Table 3. With
        several client groups the groups cannot agree on a measured α, so only a forced
        route changes the default there."""
        default = "servers" if self._rows_on_servers(slot) else "rows"
        self._check_forced_routes()
        forced = self._forced_route(key)
        if forced is not None:
            if forced not in (default, "dense"):
                raise KeyValueError(f"KVHYBRID_ROUTES sends key {key!r} to {forced!r}, which this "
                                    f"job cannot: its routes are {default!r} and 'dense'")
            if forced == "dense" and self._sum_across_groups:
                raise KeyValueError(f"KVHYBRID_ROUTES sends row_sparse key {key!r} dense, which "
                                    "needs one client group: drop it or run one group")
            route, text = forced, f"key {key!r}: {forced} (forced by KVHYBRID_ROUTES)"
        elif self._sum_across_groups:
            route, text = default, (f"key {key!r}: {default} (α={slot.alpha:.3f} on this rank; "
                                    "several client groups: set KVHYBRID_ROUTES to change it)")
        else:
            with self.group.watchdog.waiting(f"the ranks to measure α of key {key!r}"):
                alpha = self.group.comm.allreduce(slot.alpha) / self.group.size
            decision = routing.decide(alpha, slot.count * slot.dtype.itemsize, self.group.size,
                                      servers=default == "servers",
                                      ar_efficiency=self.config.ar_efficiency)
            route, text = decision.route, decision.describe(key)
        if self.group.rank == 0:
            log.info("route of row_sparse %s", text)
        if route == "dense":
            self._hold_table(key, slot)
        return route

    def _hold_table(self, key: Key, slot: KeySlot) -> None:
        """Every rank keeps the whole table from now on (it may live on the servers)."""
        if slot.rows_on_servers:
            if slot.value is None:
                slot.value = zeros(slot.shape, mx.cpu(), slot.dtype)
            sparse.pull_whole_table(key, slot, slot.value, self.row_group, self._servers)
            slot.rows_on_servers = False
            self._note_rows_at_servers()
        self._memo.clear()

    def _forced_route(self, key: Key) -> Optional[str]:
        routes = self.config.routes
        return routes.get(str(key), routes.get(self._param_names.get(key, "")))

    def _check_forced_routes(self) -> None:
        known = {str(k) for k in self._slots} | set(self._param_names.values())
        unknown = sorted(set(self.config.routes) - known)
        if unknown:
            keys = ", ".join(sorted(map(str, self._slots)))
            raise KeyValueError(f"KVHYBRID_ROUTES names {', '.join(map(repr, unknown))}, which "
                                f"this store does not hold: use its keys ({keys}) or Parameter "
                                "names")

    def _tick(self, key) -> None:
        """The step clock: a training loop pushes the same first key once per step."""
        ident = _call_key(key)
        if self._clock_key is None:
            self._clock_key = ident
        if ident == self._clock_key:
            self._ticks.append(time.perf_counter())

    def step_seconds(self) -> List[float]:
        """Seconds between consecutive steps (one push of the first key per step): the
        last ``MAX_TICKS - 1`` steps, so that a long job's clock does not grow."""
        ticks = list(self._ticks)
        return [b - a for a, b in zip(ticks, ticks[1:])]

    def _write_stats(self) -> None:
        """KVHYBRID_STATS_FILE: rank 0 writes step times and key stats (for the tuner)."""
        path = self.config.stats_file
        if not path or self.rank != 0:
            return
        stats = {"step_seconds": self.step_seconds(), "partitions": self.config.partitions,
                 "workers": self.num_workers, "clients": self._num_clients,
                 "servers": self.config.num_servers,
                 "ps_requests": self._servers.requests if self._servers is not None else 0,
                 "keys": {str(k): v for k, v in self.key_stats().items()}}
        with open(path, "w") as f:
            json.dump(stats, f)

    def key_stats(self) -> Dict[Key, Dict[str, object]]:
        """Per row_sparse key pushed so far: rows, pushes, α as this rank saw it (rows
        touched ÷ rows, averaged over its pushes), and the route its gradients take."""
        return {k: {"name": self._param_names.get(k, str(k)), "rows": s.shape[0],
                    "pushes": s.alpha_steps, "alpha": s.alpha, "route": s.route}
                for k, s in self._slots.items() if s.alpha_steps}

    @_unrecorded
    def pull(self, key, out=None, priority: int = 0, ignore_sparse: bool = True) -> None:
        """Copy the value of ``key`` into ``out``. With one group and no servers every rank
        holds the same copy and the pull is local; otherwise the servers may hold the value
        (in async mode newer than this group's copy), so the pull is a call every rank of
        the group makes. As in MXNet's stores, row_sparse arrays in ``out`` are skipped with
        ``ignore_sparse`` (they take ``row_sparse_pull``) and refused without it."""
        self._open()
        if self.config.num_servers:   # several client groups always have servers
            self._pull_from_servers(key, out, ignore_sparse)
            return
        for k, out_k in self._pull_pairs(key, out, ignore_sparse):
            copy_to_all(self._slots[k].value, out_k)

    def _pull_pairs(self, key, out, ignore_sparse: bool):
        """``[(key, dense outs)]`` of a pull, checked: an unknown key is named before its
        ``out``; a key whose outs are all skipped row_sparse arrays is left out."""
        if out is None:
            raise KeyValueError(f"pull of key {key!r} needs out=: the arrays to write into")
        kept = []
        for k, out_k in pairs(key, out, "out", sparse_ok=True):
            slot = lookup(self._slots, k)
            dense = [o for o in out_k if o.stype == "default"]
            if len(dense) < len(out_k) and not ignore_sparse:
                raise KeyValueError(f"pull of key {k!r} got a row_sparse out: fetch rows with "
                                    f"row_sparse_pull({k!r}, out, row_ids=...), or pass "
                                    "ignore_sparse=True to skip row_sparse outs")
            if dense:
                check_matches(k, slot, dense, "out")
                kept.append((k, dense))
        return kept

    def _pull_from_servers(self, key, out, ignore_sparse: bool = True) -> None:
        def build():
            ps = self._pull_pairs(key, out, ignore_sparse)
            return ps, f"pull {_keys_text(ps)}"

        for k, out_k in self._check("pull", build, f" of key {key!r}"):
            slot = self._slots[k]
            into = slot.value if slot.value is not None else out_k[0]
            if slot.rows_on_servers:
                sparse.pull_whole_table(k, slot, into, self.row_group, self._servers)
            elif self._sum_across_groups:
                if self._servers is not None:
                    self._servers.pull(k, slot.value)
                broadcast_array(slot.value, 0, self.group, name=f"key {k!r} from the servers",
                                patient=True)
            copy_to_all(into, out_k)

    @_unrecorded
    def row_sparse_pull(self, key, out=None, priority: int = 0, row_ids=None) -> None:
        """Write the rows ``row_ids`` of ``key`` into the row_sparse arrays ``out`` (one
        row_ids array per out, or one for all). With servers this is a call every rank of
        the group makes: the master fetches the union of the group's rows once."""
        self._open()

        def build():
            if out is None or row_ids is None:
                raise KeyValueError(f"row_sparse_pull of key {key!r} needs out= (row_sparse "
                                    "arrays) and row_ids= (the rows to fetch)")
            outs = pairs(key, out, "out", sparse_ok=True)
            if isinstance(key, (list, tuple)):
                if not isinstance(row_ids, (list, tuple)) or len(row_ids) != len(outs):
                    raise KeyValueError(f"a list of {len(outs)} keys needs a list of "
                                        f"{len(outs)} row_ids")
                ids_per_key = list(row_ids)
            else:
                ids_per_key = [row_ids]
            work = []
            for (k, o), ids in zip(outs, ids_per_key):
                slot = lookup(self._slots, k)
                check_matches(k, slot, o, "out")
                ids = [ids] * len(o) if isinstance(ids, mx.nd.NDArray) else list(ids)
                work.append((k, slot, o, sparse.checked_row_ids(k, slot, o, ids)))
            return work, f"row_sparse_pull {_keys_text(outs)}"

        if not isinstance(key, (list, tuple)) and key in self._prefetched:
            # the rows first: a push whose calls differed raises here, on every rank, before
            # any meeting (its verdict comes with them)
            self._wait_for_prefetch(self._prefetched[key])
            work = self._prefetch_covers(key, build)   # one small meeting instead of three
            if work is not None:
                for k, slot, outs, ids in work:
                    self._rows_from_prefetch(self._prefetched[k], slot, outs, ids)
                return
            del self._prefetched[key]   # not the ids prefetched (on some rank): the plain pull
        if not self.config.num_servers:  # every rank holds every row: nothing to agree on
            try:
                work = build()[0]
            except KeyValueError as exc:
                raise KeyValueError(f"row_sparse_pull failed: {exc}") from None
        else:
            work = self._check("row_sparse_pull", build, f" of key {key!r}")
        for k, slot, outs, ids in work:
            if slot.rows_on_servers:
                sparse.pull_rows_from_servers(k, slot, outs, ids, self.row_group,
                                              self._servers)
            else:
                sparse.pull_rows_local(slot, outs, ids)

    def _prefetch_covers(self, key, build) -> Optional[list]:
        """The pull's checked work if every rank's prefetched rows hold what it asks for
        and its arguments are fine, else None (then the plain pull, whose agreement raises
        the same error on every rank for bad arguments). One small allreduce decides."""
        prefetch = self._prefetched[key]
        try:
            work = build()[0]
            covered = all(sparse.prefetch_holds(prefetch, ids) for *_, ids in work)
        except KeyValueError:
            work, covered = None, False
        flags = np.array([0 if covered else 1], dtype=np.int64)
        MPI = self.group.MPI
        with self.group.watchdog.waiting(lambda: f"the ranks to agree on using the prefetched "
                                                 f"rows of key {key!r}"):
            wait_patiently(self.group.comm.Iallreduce(MPI.IN_PLACE, flags, op=MPI.MAX))
        return work if flags[0] == 0 else None

    def prefetch_rows(self, key, row_ids) -> None:
        """Hand over the row ids the next forward pass will pull of ``key`` (the next batch's
        word ids, on every rank): the next push of the key sends them along, and its rows
        come back from the servers while the step goes on, so that the next
        ``row_sparse_pull`` of ``key`` meets the other ranks once (a small allreduce: did
        every rank get the rows it asks for?) instead of three times, and waits for no
        round trip. Values are those of the plain pull: the rows are asked for after that
        push. A pull of other rows (an evaluation batch) takes the plain path. Only sparse weights
        on the servers take it (their pulls go through the master); for any other key (a
        table held by every rank, a dense weight, a key not initialised yet, which Gluon
        does at the first step) and a store without the engine path it does nothing."""
        self._open()
        slot = self._slots.get(key)
        if not (slot is not None and slot.sparse_weight and slot.rows_on_servers
                and self._engine is not None and self.row_group is self.group):
            return
        arrays = row_ids if isinstance(row_ids, (list, tuple)) else [row_ids]
        parts = []
        for ids in arrays:
            if isinstance(ids, mx.nd.NDArray):
                ids = ids.asnumpy()
            parts.append(np.asarray(ids).astype(np.int64).reshape(-1))
        unique = np.unique(np.concatenate(parts)) if parts else np.zeros(0, np.int64)
        if len(unique) and (unique[0] < 0 or unique[-1] >= slot.shape[0]):
            bad = unique[0] if unique[0] < 0 else unique[-1]
            raise KeyValueError(f"prefetch_rows of key {key!r} got row id {int(bad)}, outside "
                                f"the table's {slot.shape[0]} rows: pass ids in "
                                f"[0, {slot.shape[0]})")
        self._prefetch_ids[key] = unique

    def _wait_for_prefetch(self, prefetch: "sparse.Prefetch") -> None:
        with self.group.watchdog.waiting(lambda: f"the prefetched rows of key {prefetch.key!r}",
                                         collective=False):
            while not prefetch.ready.wait(0.05):
                self._engine.check()   # its thread failed: the rows will not come
        self._engine.check()

    def _rows_from_prefetch(self, prefetch: "sparse.Prefetch", slot: KeySlot, outs, ids) -> None:
        self._wait_for_prefetch(prefetch)
        sparse.rows_from_prefetch(prefetch, outs, ids, slot)

    def _sum_and_update(self, key: Key, slot: KeySlot, arrays: List[mx.nd.NDArray],
                        target: mx.nd.NDArray, compress: bool = True) -> mx.nd.NDArray:
        """Sum ``arrays`` into ``target`` over devices, the group and (with several client
        groups) the servers; apply the optimizer if one is set. Returns the array that
        holds the key's new value: the updated weight, or ``target`` with the sum."""
        reduce_local(arrays, target)
        if self._compressor is not None and compress:
            self._compressor.allreduce(key, target, self.group, name=f"key {key!r}")
        else:
            allreduce_array(target, "sum", self.group, name=f"key {key!r}")
        result = target if self._updater is None else slot.value
        if slot.count == 0:  # nothing to sum or update (MXNet's operators reject empty arrays)
            return result
        if self._sum_across_groups:
            # The master pushes the group's sum and pulls the servers' answer (the sum over
            # groups, or the weight updated by the servers' optimizer); the group gets it.
            if self._servers is not None:
                self._servers.push_pull(key, target, result)
            broadcast_array(result, 0, self.group, name=f"key {key!r} from the servers",
                            patient=True)
        elif self._updater is not None:
            self._updater(key, target, slot.value)
        return result

    # -- optimizer -----------------------------------------------------------------------------
    def set_optimizer(self, optimizer) -> None:
        """Keep ``optimizer`` (by reference) and apply it after each allreduce, on every rank."""
        self._open()

        def build():
            if not isinstance(optimizer, mx.optimizer.Optimizer):
                raise KeyValueError("set_optimizer needs an mx.optimizer.Optimizer, got "
                                    f"{type(optimizer).__name__}")
            return None, f"set_optimizer({_optimizer_text(optimizer)})"

        self._check("set_optimizer", build)
        self._param_names = {i: p.name for i, p in getattr(optimizer, "param_dict", {}).items()}
        self._set_updater(mx.optimizer.get_updater(optimizer))
        if self.config.num_servers:  # the servers update the keys whose values they hold
            took = (self._servers.set_optimizer(self._server_optimizer(optimizer),
                                                self.config.partitions)
                    if self._servers else True)
            with self.group.watchdog.waiting("the masters to hand the optimizer to the servers"):
                took = all(self.group.comm.allgather(took))
            if not took:
                name = f"{type(optimizer).__module__}.{type(optimizer).__name__}"
                raise KVHybridError(
                    f"the parameter servers could not load the optimizer {name} and would sum "
                    "gradients instead of updating weights: make its module importable on the "
                    "servers (on their PYTHONPATH; a class defined in the training script, "
                    "__main__, never is), or train with update_on_kvstore=False. If the "
                    "servers log 'refused a command signed with another secret', this "
                    "worker's KVHYBRID_SECRET differs from theirs: start every process of the "
                    "job with the same one (kvhybrid-launch does); if they log nothing, they "
                    "run MXNet's own server loop: start them with python -m "
                    "kvhybrid.kvstore.ps.node")

    def _server_optimizer(self, optimizer):
        """What the servers run on the values they hold: the Trainer's optimizer."""
        return optimizer

    def _set_updater(self, updater) -> None:
        self._updater = updater

    def set_gradient_compression(self, compression_params) -> None:
        """MXNet's 2bit compression with error feedback for dense gradients: each rank keeps
        a residual per key and sends 2-bit codes; the sum is the one MXNet's servers make
        of its workers' compressed pushes (tensor_collectives/compression.py). row_sparse
        gradients travel uncompressed, as in MXNet. Call it before the first push."""
        self._open()

        def build():
            params = CompressionParams.parse(compression_params)
            if self._clock_key is not None:
                raise KeyValueError("set_gradient_compression after the first push: residuals "
                                    "start at the first push, so call it before training "
                                    "(gluon.Trainer does, with compression_params)")
            return params, f"set_gradient_compression({params})"

        params = self._check("set_gradient_compression", build)
        self._compressor = TwoBitCompressor(params)
        self._dense_on_engine = False   # compressed sums run key by key, on this thread
        self._memo.clear()
        if self._sum_across_groups and self.group.size == 1 and self.SERVER_MODE == "dist_sync":
            # Every worker is a ps-lite worker (pure PS): what it pushes is its own codes
            # (±t or 0), which MXNet's compressor sends as they are (its residual stays 0)
            # and the servers decode. A bigger group's sum of codes needs more than 2 bits.
            self._servers.set_gradient_compression(params.as_mxnet())
            self._servers_compressed = True
            self._memo.clear()

    def save_optimizer_states(self, fname: str, dump_optimizer: bool = False) -> None:
        """Write the optimizer state (identical on every rank) to ``fname``, atomically."""
        if self._updater is None:
            raise KVHybridError("the store holds no optimizer state: call set_optimizer first "
                                "(gluon.Trainer does so when update_on_kvstore=True)")
        if self._sum_across_groups or any(s.rows_on_servers for s in self._slots.values()):
            raise KVHybridError("the optimizer state of keys held by the parameter servers "
                                "lives there: save it with kvhybrid.save_checkpoint(trainer, "
                                "folder), which saves the servers' part too")
        data = self._updater.get_states(dump_optimizer)
        folder = os.path.dirname(os.path.abspath(fname))
        with tempfile.NamedTemporaryFile("wb", dir=folder, delete=False,
                                         prefix=".kvhybrid-states-") as tmp:
            tmp.write(data)
        os.replace(tmp.name, fname)  # ranks sharing one path never leave a torn file

    def load_optimizer_states(self, fname: str) -> None:
        """Load optimizer state; every rank must load identical bytes."""
        self._open()

        def build():
            if self._updater is None:
                raise KeyValueError("the store has no optimizer to load states into: call "
                                    "set_optimizer first")
            if self._sum_across_groups:
                raise KeyValueError("with several client groups the optimizer state lives on "
                                    "the parameter servers: resume with kvhybrid."
                                    "load_checkpoint(trainer, folder)")
            try:
                with open(fname, "rb") as f:
                    data = f.read()
            except OSError as exc:
                raise KeyValueError(f"cannot read optimizer states from {fname!r}: {exc}") from None
            digest = hashlib.sha256(data).hexdigest()[:12]
            return data, f"load_optimizer_states of a file with sha256 {digest}"

        data = self._check("load_optimizer_states", build, f" from {fname!r}")
        self._updater.set_states(data)

    # -- barrier and lifetime ------------------------------------------------------------------
    def barrier(self) -> None:
        """Wait until every rank of every client group has reached this point (and, with
        servers, until this group's pushes have been answered by them)."""
        with self.group.watchdog.waiting(f"a barrier on group {self.group.name}"):
            self.group.comm.Barrier()
        if self._sum_across_groups or self.row_group is not self.group:
            if self._servers is not None:
                self._servers.barrier()
            with self.group.watchdog.waiting("the masters to leave the servers' barrier"):
                self.group.comm.Barrier()

    _barrier = barrier

    def close(self) -> None:
        """Stop the watchdog and drop the store's arrays (idempotent)."""
        if not self._closed:
            self._closed = True
            self._write_stats()
            stats = self.key_stats()
            if stats and self.group.rank == 0:
                log.info("row_sparse keys (α as rank 0 saw it): %s", "; ".join(
                    f"{k!r} ({v['name']}): {v['rows']} rows, α {v['alpha']:.4f} over "
                    f"{v['pushes']} pushes, route {v['route']}" for k, v in stats.items()))
            self._servers = None  # the process's server link stays for later stores
            if self._engine is not None:   # its operations finish before the thread stops
                with self.group.watchdog.waiting("this rank's engine-scheduled collectives "
                                                 "to finish", collective=False):
                    mx.nd.waitall()
                self._engine.close()
                self._engine.group.close()
            self._shared_grads.clear()
            self._prefetch_ids.clear()
            self._prefetched.clear()
            if self.row_group is not self.group:
                self.row_group.close()
            self.group.close()
            self._slots.clear()
            self._views.clear()
            self._memo.clear()

    def __repr__(self) -> str:
        return f"<HybridMPIStore rank {self.rank} of {self.num_workers}, {len(self._slots)} keys>"


class HybridMPIAsyncStore(HybridMPIStore):
    """mpi-ASGD (MXNET-MPI §4): each client group still sums its gradients synchronously
    with MPI, but the groups meet on parameter servers in ``dist_async`` mode: a group's
    master pushes its sum and pulls the current weights without waiting for the other
    groups. With one group it is the synchronous store.

    Create it with ``mx.kv.create('hybrid-mpi-async')``.
    """

    SERVER_MODE = "dist_async"
