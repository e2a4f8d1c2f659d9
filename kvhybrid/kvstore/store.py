"""The ``hybrid-mpi`` KVStore: what ``gluon.Trainer`` talks to, a thin layer over its parts.

Dense keys are summed across ranks with MPI tensor allreduces (a tensor = a worker's
per-device arrays, reduced locally first). Summation, not averaging, as MXNet's
``dist_sync`` does, so training scripts keep their learning rates: with
``trainer.step(batch_size)`` on each worker, N workers train exactly like one process on
the union of their batches. When the store owns the optimizer (``update_on_kvstore=True``,
the Trainer's default) every rank applies the same update to its own copy of the weights
right after the sum: the copies stay identical without a server.

The parts, each in its own module: ``placement.py`` (who sums where), ``calls.py`` (checks,
agreement, memo), ``dense.py`` (dense sums), ``sparse.py``, ``sparse_push.py``, ``sparse_pull.py``
(row_sparse tables, routes, pushes, pulls), ``modes.py`` (how groups meet), ``stats.py``.

The class derives from MXNet's native ``KVStore`` (holding a handle to an unused native
``local`` store) only because ``gluon.Trainer`` accepts nothing else for sparse gradients
and sparse weights; every method is overridden.
"""
from __future__ import annotations

import atexit
import ctypes
import hashlib
import functools
import logging
import os
import tempfile
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional

import numpy as np
import mxnet as mx
from mxnet.base import _LIB, KVStoreHandle, c_str, check_call

from ..config import StoreConfig
from ..errors import KeyValueError, KVHybridError
from ..tensor_collectives import broadcast_array
from ..tensor_collectives.compression import CompressionParams
from ..tensor_collectives.engine import EngineComm
from ..tensor_collectives.ops import copy_to_all
from .calls import Calls, call_key, keys_text, optimizer_signature, signed_work
from .dense import DensePath, start_engine
from .keys import (Key, KeySlot, Slots, check_key_types, check_matches, check_pull_out, lookup,
                   only_row_sparse, pairs, spec, zeros)
from .modes import AsyncMode, SyncMode
from .placement import Placement
from .ps.link import ServerLink
from .registry import ASYNC_NAME, NAME
from .sparse import RowTables
from .sparse_pull import RowPulls
from .sparse_push import RowPushes
from .stats import StepClock, log_key_stats, write_stats

log = logging.getLogger("kvhybrid")


def unrecorded(method):
    """Gluon calls the store inside ``autograd.record()`` (a sparse weight's first forward
    pass initialises the Trainer's store); the store's writes into weights are not part of
    the model's graph, as with MXNet's own stores, which write from C++. (The recording
    flag only, set and put back: ``autograd.pause()`` makes twice the calls into MXNet.)"""
    @functools.wraps(method)
    def wrapper(*args, **kwargs):
        was = ctypes.c_int()
        check_call(_LIB.MXAutogradSetIsRecording(0, ctypes.byref(was)))
        try:
            return method(*args, **kwargs)
        finally:
            if was.value:
                check_call(_LIB.MXAutogradSetIsRecording(1, ctypes.byref(was)))
    return wrapper


@dataclass
class ResumeState:
    """What a checkpoint saves of a store and puts back (``kvhybrid/gluon/checkpoint.py``
    reads nothing else): named here, so the store's insides can change without breaking it."""
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
    #: ``(key, slot, into)``: a table whose rows live on the servers, whole, on every rank
    pull_table: Callable[[Key, KeySlot, mx.nd.NDArray], None]


class HybridMPIStore(mx.kv.KVStore):
    """Synchronous data-parallel KVStore (mpi-SGD): MPI inside a client group, MXNet's
    parameter servers between groups.

    Create it with ``mx.kv.create('hybrid-mpi')`` after ``import kvhybrid``,
    in every rank of every client group, and hand it to ``gluon.Trainer``.
    """

    #: how client groups meet (modes.py): a strategy class, one instance per store
    MODE = SyncMode
    #: the name ``mx.kv.create`` takes, for messages
    NAME = NAME

    def __init__(self, config: Optional[StoreConfig] = None):
        # the handle first: a store whose creation fails below (outside an MPI job) is freed
        # as any KVStore, with no traceback after its error
        handle = KVStoreHandle()
        check_call(_LIB.MXKVStoreCreate(c_str("local"), ctypes.byref(handle)))
        super().__init__(handle)
        self.mode = self.MODE()
        self.config = self.mode.configure(config or StoreConfig.from_env())
        self.placement = Placement(self.config, self.mode, self.NAME)
        self.mode.bind(self.placement)
        self._slots: Slots = Slots()
        #: the store's optimizer (MXNet's Trainer reads stores' ``_updater`` in ``load_states``)
        self._updater: Optional[mx.optimizer.Updater] = None
        self._closed = False
        self._engine = start_engine(self.config, self.mode, self.placement)
        self.calls = Calls(self.group, lambda: self.placement.servers_in_step(self.dense.on_engine))
        self.dense = DensePath(self.config, self.mode, self.placement, self._slots, self._engine)
        self.pulls = RowPulls(self.placement, self._slots, self.calls, self._engine)
        self.tables = RowTables(self.placement, self._slots, self.calls, self.pulls)
        self.pushes = RowPushes(self.placement, self._slots, self.tables, self.dense, self._engine,
                                self.pulls)
        # a meeting on the caller's thread comes after the pulls the communication thread serves
        self.calls.before_meeting = self.pulls.settle
        self.clock = StepClock(self.config.stats_steps, self._write_stats)
        # held until closed: a dropped store still serves its pending pulls at exit
        atexit.register(self.close)
        log.info("kvhybrid: %s store, rank %d of %d (client group %d of %d, %d servers)", self.NAME,
                 self.rank, self.num_workers, self.placement.client_rank,
                 self.placement.num_clients, self.config.num_servers)

    # -- identity ----------------------------------------------------------------------------
    @property
    def type(self) -> str:
        return self.mode.store_type

    @property
    def rank(self) -> int:
        """This worker's rank among all workers of all client groups."""
        return self.placement.rank

    @property
    def num_workers(self) -> int:
        """All workers of all client groups (groups have equal sizes)."""
        return self.placement.num_workers

    @property
    def group(self):
        """This client group (the ranks of one mpirun job)."""
        return self.placement.group

    @property
    def engine(self) -> Optional[EngineComm]:
        """The engine path's communication thread (None when pushpull blocks instead)."""
        return self._engine

    @property
    def engine_bucket_bytes(self) -> int:
        """The engine path's bucket size (0 when pushpull blocks instead)."""
        return self.dense.bucket_bytes

    @staticmethod
    def is_capable(capability: str) -> bool:
        """Whether the store takes ``capability`` (``'optimizer'``: it does); static, as
        MXNet's ``KVStoreBase.is_capable``, so ``type(kv).is_capable(...)`` works too."""
        if capability.lower() == mx.kv.KVStoreBase.OPTIMIZER:
            return True
        raise ValueError(f"unknown capability {capability!r}: the only one is "
                         f"{mx.kv.KVStoreBase.OPTIMIZER!r}")

    def _open(self) -> None:
        if self._closed:
            raise KVHybridError("this hybrid-mpi store was closed: create a new one with "
                                "mx.kv.create('hybrid-mpi')")
        if self._engine is not None:   # a collective of the engine thread failed
            self._engine.check()

    # -- init and broadcast --------------------------------------------------------------------
    @unrecorded
    def init(self, key, value) -> None:
        """Register keys; their value is rank 0's (as in ``dist_sync``)."""
        self._open()

        def build():
            ps = pairs(key, value, sparse_ok=True)
            check_key_types(self._slots.first, [k for k, _ in ps])
            for k, arrays in ps:
                if k in self._slots:
                    raise KeyValueError(f"key {k!r} is already initialised: init each key once, "
                                        "or use broadcast() to overwrite its value")
                if arrays[0].stype == "row_sparse":
                    self.tables.check_new_table(k, arrays[0])
                    self.dense.check_rows_uncompressed(k, "init of a row_sparse table")
                else:
                    self.placement.check_new_on_servers(k)
                    self.dense.check_compressible(k, arrays[0].dtype)
            return ps, "init " + keys_text(ps)

        for k, arrays in self.calls.check("init", build, f" of key {key!r}"):
            if arrays[0].stype == "row_sparse":
                self.tables.init_table(k, arrays[0])
            else:
                self._set_from_root(k, arrays[0])

    @unrecorded
    def broadcast(self, key, value, out, priority: int = 0) -> None:
        """Give every rank rank 0's ``value``, written into ``out`` (one array per device)."""
        self._open()

        def build():
            ps = pairs(key, value)
            outs = pairs(key, out, "out")
            check_key_types(self._slots.first, [k for k, _ in ps])
            for (k, v), (_, o) in zip(ps, outs):
                if k in self._slots:
                    check_matches(k, self._slots[k], v, "value")
                    if self.placement.sum_across_groups:
                        raise KeyValueError(f"key {k!r} is already initialised, and with several "
                                            "client groups a key is broadcast once: broadcast "
                                            "each key once")
                else:
                    self.placement.check_new_on_servers(k)
                for arr in o:   # (another dtype is cast into, as a pull's outs)
                    if arr.shape != v[0].shape:
                        raise KeyValueError(f"out of key {k!r} has {spec(arr)} but value has "
                                            f"{spec(v[0])}: pass out arrays of the value's "
                                            "shape (any dtype: the value is cast into it)")
            return list(zip(ps, outs)), "broadcast " + keys_text(ps)

        for (k, v), (_, o) in self.calls.check("broadcast", build, f" of key {key!r}"):
            slot = self._set_from_root(k, v[0])
            copy_to_all(slot.value, o)

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
            if self.placement.dense_on_servers:
                self.placement.servers.init(key, slot.value, slot.value)
        broadcast_array(slot.value, 0, self.group, name=f"key {key!r}")
        self._slots[key] = slot
        return slot

    # -- push, pull, pushpull ------------------------------------------------------------------
    def _signed(self, op: str, key, value, out=None):
        """``calls.signed_work`` with this store's keys, and each key's route checked."""
        work, signature = signed_work(op, key, value, out, self._slots, self.pushes.asks_prefetch)
        for k, v, _ in work:
            self._check_route(k, self._slots[k], v[0].stype)
        return work, signature

    def _check_route(self, key: Key, slot: KeySlot, stype: str) -> None:
        if stype == "row_sparse":
            self.pushes.check_push(key, slot, self._updater is not None)
            return
        self.dense.check_compressible(key, slot.dtype)
        if slot.sparse_weight:
            raise KeyValueError(f"key {key!r} holds a sparse weight: push row_sparse gradients "
                                "to it (contrib.nn.SparseEmbedding does)")
        if slot.rows_on_servers:
            raise KeyValueError(f"key {key!r} took row_sparse gradients, so its rows live on "
                                "the parameter servers: keep pushing row_sparse gradients")

    @unrecorded
    def pushpull(self, key, value, out=None, priority: int = 0) -> None:
        """Sum ``value`` over devices and ranks; write the result (or, with an optimizer, the
        updated weight) into ``out``, or into ``value`` when ``out`` is None.

        Without an optimizer this is a pure allreduce: the store's own copy of
        the key is left as it was (no extra copy on the hot path).
        """
        self._open()
        self.clock.tick(call_key(key))
        call, agreed = self.calls.pushpull(key, value, out,
                                           lambda: self._signed("pushpull", key, value, out),
                                           self.dense.on_engine)
        self.dense.pushpull(call, self._updater, agreed)

    @unrecorded
    def push(self, key, value, priority: int = 0) -> None:
        """Sum ``value`` over devices and ranks into the store (or apply it with the optimizer)."""
        self._open()
        self.clock.tick(call_key(key))
        if self.pushes.agrees_with_rows(key):   # (checked once: the memo keeps its plan)
            plan = self.calls.recall("push", key, value)
            if plan is None:
                try:
                    plan = self.calls.remember("push", key, value, self.pushes.plan_push(
                        *self._signed("push", key, value)))
                except KeyValueError as exc:
                    plan = self.pushes.failed_push(key, str(exc))
            if self.pushes.summed_in_group(key):   # (else agreed with its rows: hand-out)
                self.calls.check_known("push", plan.call, f" of key {key!r}")
            self.pushes.push(plan, self._updater)
            return
        work = self.calls.check("push", lambda: self._signed("push", key, value),
                                f" of key {key!r}")
        rows = [w for w in work if w[1][0].stype == "row_sparse"]   # only the touched rows travel
        self.pushes.push(self.pushes.plan_push(rows, None), self._updater)
        for k, value_k, _ in (w for w in work if w[1][0].stype != "row_sparse"):
            slot = self._slots[k]
            target = slot.grad_buffer() if self._updater is not None else slot.value
            self.dense.sum_and_update(k, slot, value_k, target, self._updater)

    @unrecorded
    def pull(self, key, out=None, priority: int = 0, ignore_sparse: bool = True) -> None:
        """Copy the value of ``key`` into ``out``: a local copy with one group and no servers,
        else a call every rank of the group makes (the servers may hold a newer value). As in
        MXNet's stores, row_sparse outs are skipped with ``ignore_sparse`` (they take
        ``row_sparse_pull``; a repeated pull of those only is agreed on the communication
        thread); without it they get every row, as MXNet's local stores give."""
        self._open()
        if ignore_sparse and self.config.num_servers and only_row_sparse(out):
            self.calls.check_again("pull", key, out, lambda: (self._pull_pairs(key, out),
                                   "pull (row_sparse outs, skipped)"), f" of key {key!r}",
                                   self._engine)   # (Module's every step)
            return
        self._pull_dense(key, out)   # (its checks, agreed: every rank raises a bad call)
        if not ignore_sparse:
            self.pulls.pull_every_row(key, out)

    def _pull_dense(self, key, out) -> None:
        """``pull``'s dense outs (row_sparse ones skipped)."""
        if not self.config.num_servers:   # several client groups always have servers
            for k, out_k in self._pull_pairs(key, out):
                copy_to_all(self._slots[k].value, out_k)
            return
        def build():   # (a bad call raises in the agreement, on every rank)
            ps = self._pull_pairs(key, out)
            return ps, f"pull {keys_text(ps)}"

        for k, out_k in self.calls.check("pull", build, f" of key {key!r}"):
            slot = self._slots[k]
            into = slot.value if slot.value is not None else out_k[0]
            if slot.rows_on_servers:
                self.pulls.pull_table(k, slot, into)
            elif self.placement.sum_across_groups:
                if self.placement.servers is not None:
                    self.placement.servers.pull(k, slot.value)
                broadcast_array(slot.value, 0, self.group, name=f"key {k!r} from the servers",
                                patient=True)
            copy_to_all(into, out_k)

    def _pull_pairs(self, key, out):
        """``[(key, dense outs)]`` of a pull, checked: an unknown key is named before its
        ``out``; a key whose outs are all row_sparse arrays is left out."""
        if out is None:
            raise KeyValueError(f"pull of key {key!r} needs out=: the arrays to write into")
        kept = []
        for k, out_k in pairs(key, out, "out", sparse_ok=True):
            slot = lookup(self._slots, k)
            dense = [o for o in out_k if o.stype == "default"]
            if dense:
                check_pull_out(k, slot, dense)
                kept.append((k, dense))
        return kept

    @unrecorded
    def row_sparse_pull(self, key, out=None, priority: int = 0, row_ids=None) -> None:
        """Write the rows ``row_ids`` of ``key`` into the row_sparse arrays ``out`` (one
        row_ids array per out, or one for all). With servers this is a call every rank of
        the group makes: the master fetches the union of the group's rows once."""
        self._open()
        self.pulls.pull(key, out, row_ids)

    def prefetch_rows(self, key, row_ids) -> None:
        """Hand over the row ids the next forward pass will pull of ``key`` (the next batch's
        word ids, on every rank): the next push of the key sends them along, and its rows
        come back from the servers while the step goes on, so that the next
        ``row_sparse_pull`` of ``key`` takes them without meeting the other ranks or waiting
        for a round trip (``sparse_pull.py``). Values are those of the plain pull: the rows
        are asked for after that push. Only sparse weights on the servers take it; for any
        other key (a table held by every rank, a dense weight, a key not initialised yet,
        which Gluon does at the first step) and a store without the engine path it does
        nothing."""
        self._open()
        self.pushes.prefetch_rows(key, row_ids)

    # -- optimizer -----------------------------------------------------------------------------
    def set_optimizer(self, optimizer) -> None:
        """Keep ``optimizer`` (by reference) and apply it after each allreduce, on every rank."""
        self._open()

        def build():
            if not isinstance(optimizer, mx.optimizer.Optimizer):
                raise KeyValueError("set_optimizer needs an mx.optimizer.Optimizer, got "
                                    f"{type(optimizer).__name__}")
            return None, f"set_optimizer({optimizer_signature(optimizer)})"

        self.calls.check("set_optimizer", build)
        self.tables.param_names = {i: p.name
                                   for i, p in getattr(optimizer, "param_dict", {}).items()}
        self._updater = mx.optimizer.get_updater(optimizer)
        if self.config.num_servers:  # the servers update the keys whose values they hold
            servers = self.placement.servers
            took = (servers.set_optimizer(self.mode.server_optimizer(optimizer),
                                          self.config.partitions)
                    if servers else True)
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

    def set_gradient_compression(self, compression_params) -> None:
        """MXNet's 2bit compression with error feedback for dense gradients: each rank keeps
        a residual per key and sends 2-bit codes; the sum is the one MXNet's servers make
        of its workers' compressed pushes (tensor_collectives/compression.py). row_sparse
        gradients travel uncompressed, as in MXNet. Call it before the first push."""
        self._open()

        def build():
            params = CompressionParams.parse(compression_params)
            if self.clock.started:
                raise KeyValueError("set_gradient_compression after the first push: residuals "
                                    "start at the first push, so call it before training "
                                    "(gluon.Trainer does, with compression_params)")
            return params, f"set_gradient_compression({params})"

        self.dense.compress(self.calls.check("set_gradient_compression", build))
        self.calls.forget()

    def save_optimizer_states(self, fname: str, dump_optimizer: bool = False) -> None:
        """Write the optimizer state (identical on every rank) to ``fname``, atomically."""
        if self._updater is None:
            raise KVHybridError("the store holds no optimizer state: call set_optimizer first "
                                "(gluon.Trainer does so when update_on_kvstore=True)")
        if self.placement.sum_across_groups or any(s.rows_on_servers
                                                   for s in self._slots.values()):
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
            if self.placement.sum_across_groups:
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

        data = self.calls.check("load_optimizer_states", build, f" from {fname!r}")
        self._updater.set_states(data)

    # -- checkpoints (kvhybrid/gluon/checkpoint.py) ---------------------------------------------
    def resume_state(self) -> ResumeState:
        """The parts of this store a checkpoint saves and restores (see ``ResumeState``)."""
        self._open()
        placement = self.placement
        return ResumeState(
            slots=self._slots, servers=placement.servers, updater=self._updater,
            client_rank=placement.client_rank, num_clients=placement.num_clients,
            groups_differ=self.mode.groups_differ(placement.num_clients),
            dense_on_servers=placement.dense_on_servers, step_counts=self.mode.step_counts(),
            pull_table=self.pulls.pull_table)

    def agree_on(self, what: str, build, about: str = ""):
        """Run ``build()`` on every rank (it returns (result, signature), or raises
        KeyValueError) and agree: every rank raises the same error if any rank failed or
        the signatures differ; returns this rank's result."""
        return self.calls.check(what, build, about)

    def forget_prefetched(self) -> None:
        """Drop rows fetched ahead (their values are about to be replaced)."""
        self.pulls.forget()

    # -- what it did ---------------------------------------------------------------------------
    def share_gradient_buffer(self, base: mx.nd.NDArray, views: List[mx.nd.NDArray]) -> None:
        """Tell the store that ``views`` (gradients, in order) lie back to back in ``base``:
        an engine bucket made of exactly them is summed where it lies, with no copy
        (``kvhybrid.DistributedTrainer`` lays its gradients out so)."""
        self.dense.shared_grads.share(base, views)
        self.calls.forget()

    def collectives(self) -> Dict[str, int]:
        """Collectives this rank has entered so far: on the group (agreements, rows,
        broadcasts: the meetings on the caller's thread) and engine buckets."""
        groups = {self.group, self.placement.row_group}
        engine = {self._engine.group, self.pulls.hand_out_group} if self._engine else set()
        return {"group": sum(g.watchdog.collectives for g in groups),
                "engine": sum(g.watchdog.collectives for g in engine)}

    def dense_stats(self) -> Dict[str, object]:
        """What this rank's dense sums ran, over both paths (``DensePath.stats``)."""
        return self.dense.stats()

    def step_seconds(self) -> List[float]:
        return self.clock.step_seconds()   # (one push of the first key per step)

    def key_stats(self) -> Dict[Key, Dict[str, object]]:
        """Per row_sparse key pushed so far: rows, pushes, α and route (``RowTables``)."""
        return self.tables.key_stats()

    def _write_stats(self, key_stats: Optional[Dict] = None) -> None:
        """Rank 0's KVHYBRID_STATS_FILE: at close, and as step KVHYBRID_STATS_STEPS begins."""
        if self.config.stats_file and self.rank == 0:
            write_stats(self.config, self.placement, self.clock,
                        self.key_stats() if key_stats is None else key_stats)

    # -- barrier and lifetime ------------------------------------------------------------------
    def barrier(self) -> None:
        """Wait until every rank of every client group has reached this point (and, with
        servers, until this group's pushes have been answered by them)."""
        self.pulls.settle()
        with self.group.watchdog.waiting(f"a barrier on group {self.group.name}"):
            self.group.comm.Barrier()
        if self.placement.sum_across_groups or self.placement.row_group is not self.group:
            if self.placement.servers is not None:
                self.placement.servers.barrier()
            with self.group.watchdog.waiting("the masters to leave the servers' barrier"):
                self.group.comm.Barrier()

    _barrier = barrier

    def close(self) -> None:
        """Stop the watchdog and drop the store's arrays (idempotent)."""
        if self._closed:
            return
        atexit.unregister(self.close)
        try:   # a rank may be waiting for this one to serve it a pull
            self.pulls.settle()
        except KVHybridError as exc:
            log.warning("kvhybrid: closing with a pull unserved: %s", exc)
        self._closed = True
        try:   # (rows fetched ahead that a failed collective left unserved)
            stats = self.key_stats()
        except KVHybridError as exc:
            log.warning("kvhybrid: closing after a failed collective: %s", exc)
            stats = {}
        self._write_stats(stats)
        if self.group.rank == 0:
            log_key_stats(stats)
        try:
            if self._engine is not None:   # its operations finish before the thread stops
                with self.group.watchdog.waiting("this rank's engine-scheduled collectives "
                                                 "to finish", collective=False):
                    mx.nd.waitall()
                self._engine.close()
                self._engine.group.close()
            self.dense.close()
            self.pushes.close()
            self.pulls.close()
        finally:   # (the groups' boards say this rank has left: its peers stop waiting)
            self.placement.close()
            self._slots.clear()
            self.calls.forget()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} rank {self.rank} of {self.num_workers}, " \
               f"{len(self._slots)} keys>"


class HybridMPIAsyncStore(HybridMPIStore):
    """mpi-ASGD (``modes.AsyncMode``): synchronous inside a client group, asynchronous
    between groups. Create it with ``mx.kv.create('hybrid-mpi-async')``."""

    MODE = AsyncMode
    NAME = ASYNC_NAME
