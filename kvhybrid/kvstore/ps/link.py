"""The link from a client group's master to MXNet's parameter servers (MXNET-MPI Fig. 4/5).

Only the master (rank 0 of the group) holds one: a native ``dist_sync`` store,
i.e. a ps-lite worker. The number of ps-lite workers (``DMLC_NUM_WORKER``) is
therefore the number of client groups, not of MPI ranks.

Every ps-lite wait runs under the group's watchdog, because ps-lite waits
forever when a server or another master is gone.

A key whose rows live on the servers (a sparse weight, or a dense weight that
gets row_sparse gradients from several groups) is stored there as a
``row_sparse`` array under a ps-lite key of its own (``ROWS_KEY_BASE`` + the
key's id): a dense key on the servers crashes them when a row_sparse push
arrives (MXNet issues #19949, #21118).
"""
from __future__ import annotations

import atexit
import contextlib
import copy
import functools
import logging
import math
import os
import threading
import time
from typing import Callable, Dict, List, Optional, Tuple

import ctypes

import numpy as np
import mxnet as mx
from mxnet.base import _LIB, NDArrayHandle, check_call, mx_uint
from mxnet.ndarray import NDArray

from ...errors import KeyValueError
from ...tensor_collectives.ndarray_view import (empty_row_sparse, host_array, host_row_sparse,
                                                host_view, wait_to_write)
from ...tensor_collectives.operators import copy as copy_array
from ...tensor_collectives.watchdog import Watchdog, current_step
from ..keys import Key
from . import packs
from .server import Command, MultipliersCommand, PackCommand, ServerOptimizer

log = logging.getLogger("kvhybrid")

# ps-lite keys. MXNet picks a small key's server as ``(key * 9973) % servers`` in 32-bit
# arithmetic, so every ps-lite key must stay below 2**31 / 9973 (215,329) or it overflows
# onto a server that does not exist (a crash, or worse, a wrong server).
#: int keys are used as they are, below this
INT_KEY_LIMIT = 1 << 15
#: str keys get ids from here up; optimizer probes count down from PROBE_KEY_TOP
STR_KEY_BASE = INT_KEY_LIMIT
PROBE_KEY_TOP = (1 << 16) - 1
#: the row_sparse copy of a key lives at ROWS_KEY_BASE + the key's id (its first piece)
ROWS_KEY_BASE = 1 << 16
#: piece i >= 1 of a partitioned table lives at PIECES_KEY_BASE + (i - 1) * PIECE_STRIDE +
#: the table's compact id (below PIECE_STRIDE: int keys below 2048, and the first 2048 str
#: keys), so that every piece key stays below the 215,329 limit above.
PIECE_STRIDE = 1 << 12
PIECES_KEY_BASE = 1 << 17
MAX_PARTITIONS = 1 + ((2 ** 31 // 9973) - PIECES_KEY_BASE) // PIECE_STRIDE   # 21
#: packs of small keys (packs.py) take the ids left above the last piece: 2,337 of them
PACK_KEY_BASE = PIECES_KEY_BASE + (MAX_PARTITIONS - 1) * PIECE_STRIDE
PACK_KEY_END = 2 ** 31 // 9973


def multipliers(optimizer, key: Key) -> Tuple[float, float]:
    """(lr_mult, wd_mult) that ``optimizer`` applies to the store's ``key``, looked up in
    MXNet's order (``Optimizer._get_lrs``): the Parameter, the key, then its name."""
    if key in optimizer.param_dict:
        param = optimizer.param_dict[key]
        return float(param.lr_mult), float(param.wd_mult)

    def find(table) -> float:
        if key in table:
            return float(table[key])
        return float(table.get(optimizer.idx2name.get(key), 1.0))
    return find(optimizer.lr_mult), find(optimizer.wd_mult)


def piece_key(index: int, piece: int) -> Optional[int]:
    """The ps-lite key of piece ``piece`` of the table whose key id is ``index``; None when
    the id has no room for pieces (a key that cannot be split)."""
    if piece == 0:
        return ROWS_KEY_BASE + index
    half = PIECE_STRIDE // 2
    compact = index if index < half else \
        half + index - STR_KEY_BASE if STR_KEY_BASE <= index < STR_KEY_BASE + half else None
    if compact is None:
        return None
    return PIECES_KEY_BASE + (piece - 1) * PIECE_STRIDE + compact


def piece_bounds(rows: int, pieces: int) -> np.ndarray:
    """First row of each of ``pieces`` row ranges, and ``rows``: piece i is
    ``[bounds[i], bounds[i + 1])``."""
    return np.array([i * rows // pieces for i in range(pieces + 1)], dtype=np.int64)


def scheduler_address() -> str:
    return f"{os.environ.get('DMLC_PS_ROOT_URI', '?')}:{os.environ.get('DMLC_PS_ROOT_PORT', '?')}"


def _servers_hint() -> str:
    """What to do when a wait on the servers runs out."""
    return ("a parameter server or a worker of another client group is stuck or unreachable "
            "(the launcher's summary and that group's output name which), or another group "
            "ran fewer batches and has finished (every group must make the same number of "
            f"steps; this rank is at step {current_step()}); if this wait is legitimately "
            "longer, raise KVHYBRID_TIMEOUT")

_LINK: Optional["ServerLink"] = None


def server_link(watchdog: Watchdog, connect_timeout: float, mode: str, num_servers: int,
                rejoin: bool = False, pack_keys: bool = True) -> "ServerLink":
    """The process's link (ps-lite starts once per process; every store of the process
    shares it), now timed by ``watchdog`` and packing as the newest store says."""
    global _LINK
    if _LINK is None:
        _LINK = ServerLink(watchdog, connect_timeout, mode, rejoin)
        atexit.register(_LINK.close)
    if _LINK.mode != mode:
        raise KeyValueError(f"this process already talks to the servers in {_LINK.mode} mode: "
                            f"one process cannot mix {_LINK.mode} and {mode} stores")
    _LINK.take_over(watchdog, num_servers, pack_keys)
    return _LINK


def _in_order(method):
    """A call that talks to the servers: made after the work handed to another thread
    (``ServerLink.defer``), so that ps-lite sees this process's requests in the order the
    program made them (a pull after a push gets the rows that push updated)."""
    @functools.wraps(method)
    def call(self, *args, **kwargs):
        self._fence()
        return method(self, *args, **kwargs)
    return call


class ServerLink:
    """A group master's ps-lite connection; keys are mapped to ints in call order."""

    def __init__(self, watchdog: Watchdog, connect_timeout: float, mode: str = "dist_sync",
                 rejoin: bool = False):
        self._watchdog = watchdog
        self.mode = mode
        #: a restarted master (ps-lite gives it its old node id): the servers' keys exist
        #: and hold the job's current values, which an init would overwrite (MXNet's init
        #: from ps-lite rank 0 is a push), so keys are only pulled
        self.rejoin = rejoin
        address = scheduler_address()
        with watchdog.waiting(f"the scheduler at {address}, the parameter servers and the other "
                              "client groups' masters to connect", collective=False,
                              timeout=connect_timeout,
                              hint=f"check that the scheduler runs at {address} and that this "
                                   "host reaches it, that DMLC_NUM_SERVER and DMLC_NUM_WORKER "
                                   "match the servers and client groups started, or raise "
                                   "KVHYBRID_CONNECT_TIMEOUT"):
            self._kv = mx.kv.create(mode)
        self._ids: Dict[Key, int] = {}
        self._bounds: Dict[Key, np.ndarray] = {}   # row ranges of each table's pieces
        self._probes = 0  # probe keys count down from PROBE_KEY_TOP
        self._optimizer = None   # the last one sent to the servers (``_send_multipliers``)
        #: small keys travel packed once the servers run kvhybrid's optimizer (packs.py);
        #: ``take_over`` sets these from the store's config (KVHYBRID_PACK_KEYS)
        self.pack_keys = True
        self.packing = False
        self.num_servers = 1
        self._claimed: set = set()   # pack keys handed out
        self._packs: List[packs.Pack] = []
        self._packed: Dict[Key, Tuple[packs.Pack, int]] = {}
        self._wires: Dict[Key, Tuple[NDArray, np.ndarray]] = {}   # unpacked keys' arrays
        self._row_wires: Dict[Key, NDArray] = {}                  # see rows_wire
        #: per key, its whole table as this master last pulled it, until it writes the key
        #: (``_keep``); the count of its writes tells a pull that a write came while it flew
        self._tables: Dict[Key, _Kept] = {}
        self._writes: Dict[Key, int] = {}
        self._shapes: Dict[Key, Tuple[tuple, np.dtype]] = {}      # dense keys' shape, dtype
        self._requests = 0   # see requests
        #: pieces of work with this link handed to another thread and not yet done
        #: (``defer``); a call on any other thread waits for them first (``_fence``)
        self._deferred = 0
        self._deferred_done = threading.Condition()
        #: per thread: the watchdog of a thread doing deferred work (``deferred``)
        self._thread = threading.local()
        #: held around the calls into MXNet's store that may come from two threads at once
        #: (deferred rows on the communication thread, ``RoundTrips`` on the caller's; a
        #: group's deferred dense sums come with no caller's call beside them, fenced): the
        #: store keeps its per-key buffers in maps that a first push of a key inserts into
        self.kv_lock = threading.Lock()

    def take_over(self, watchdog: Watchdog, num_servers: int, pack_keys: bool) -> None:
        """A new store of this process uses the link: its waits are timed by that store's
        watchdog, and small keys are packed as its settings say."""
        self._watchdog = watchdog
        self.num_servers, self.pack_keys = num_servers, pack_keys

    @property
    def requests(self) -> int:
        """ps-lite requests sent so far (pushes and pulls; ps-lite keeps 8 bytes for each),
        the deferred work's included: read after it is done, as a call of the link is."""
        self._fence()
        return self._requests

    def defer(self) -> Callable[[], None]:
        """Count a piece of work another thread will do with this link (inside
        ``deferred``) before any later call of this one; returns what that thread calls
        once it is done, or skipped (``EngineComm.enqueue``'s cleanup)."""
        with self._deferred_done:
            self._deferred += 1

        def done() -> None:
            with self._deferred_done:
                self._deferred -= 1
                self._deferred_done.notify_all()
        return done

    @contextlib.contextmanager
    def deferred(self, watchdog: Watchdog):
        """Do deferred work on this thread: its waits are timed by ``watchdog`` (this
        thread's own: two threads must not share one), and its calls pass the fence."""
        self._thread.watchdog = watchdog
        try:
            yield
        finally:
            self._thread.watchdog = None

    def _fence(self) -> None:
        """Wait for the deferred work (see ``_in_order``)."""
        if not self._deferred or getattr(self._thread, "watchdog", None) is not None:
            return
        with self._watchdog.waiting_behind("the communication thread to hand this group's "
                                           "rows or sums to the parameter servers",
                                           hint=_servers_hint):
            with self._deferred_done:
                while self._deferred:
                    self._deferred_done.wait(0.05)

    def _waiting(self, what):
        """Guard a wait on the servers. It also waits for every other client group, so it is
        an outward wait (a longer limit): when a worker of another group is stuck, that
        group's own ranks, who wait on it directly, report it by name first."""
        return (getattr(self._thread, "watchdog", None) or self._watchdog).waiting(
            what, collective=False, outward=True, hint=_servers_hint)

    @property
    def ps_rank(self) -> int:
        return self._kv.rank

    @property
    def num_masters(self) -> int:
        return self._kv.num_workers

    def _next_id(self, key: Key) -> int:
        """The ps-lite key: an int key is itself (the optimizer sent to the servers looks
        its multipliers up by the Trainer's index); a str key gets an int of its own, in
        call order (the same on every master) — ps-lite's own str ids collide with ints."""
        if isinstance(key, int):
            return key
        return STR_KEY_BASE + sum(1 for k in self._ids if not isinstance(k, int))

    def check_new(self, key: Key) -> None:
        """Raise KeyValueError unless ``key`` can be put on the servers."""
        if key in self._ids:
            raise KeyValueError(f"key {key!r} is already on the parameter servers: with servers, "
                                "each key is initialised once per process (one store per "
                                "process, one init or broadcast per key)")
        if isinstance(key, int) and not 0 <= key < INT_KEY_LIMIT:
            raise KeyValueError(f"int key {key} is outside [0, {INT_KEY_LIMIT}), the int keys "
                                "the parameter servers can route: use smaller int keys (gluon."
                                "Trainer uses 0, 1, ...) or str keys")
        if self._next_id(key) >= PROBE_KEY_TOP - self._probes:
            raise KeyValueError(f"key {key!r}: the parameter servers hold at most "
                                f"{PROBE_KEY_TOP - STR_KEY_BASE - self._probes} str keys per "
                                "process: use int keys")

    def _rows_index(self, key: Key) -> int:
        if key not in self._ids:  # a key seen first here (a sparse weight) takes its id now
            self._ids[key] = self._next_id(key)
        return self._ids[key]

    @_in_order
    def init_rows(self, key: Key, value: NDArray, pieces: int = 1) -> None:
        """Put the table ``value`` (dense, every row) on the servers as ``pieces`` row_sparse
        keys of consecutive row ranges (Parallax's partitions); ps-lite rank 0's table wins.
        Every row is sent, zero rows included: the servers store the rows of an init in the
        order they arrive and abort on an empty one."""
        index = self._rows_index(key)
        if pieces > 1 and piece_key(index, 1) is None:
            raise KeyValueError(f"key {key!r} cannot be split into pieces on the servers (only "
                                f"int keys below {PIECE_STRIDE // 2} and the first "
                                f"{PIECE_STRIDE // 2} str keys can): set KVHYBRID_PARTITIONS=1")
        self._wrote(key)
        bounds = self._bounds[key] = piece_bounds(value.shape[0], pieces)
        for i in range(pieces):
            lo, hi = int(bounds[i]), int(bounds[i + 1])
            part = mx.nd.sparse.row_sparse_array(
                (value[lo:hi], mx.nd.arange(hi - lo, ctx=value.context, dtype="int64")),
                shape=(hi - lo,) + tuple(value.shape[1:]), ctx=value.context, dtype=value.dtype)
            if self.rejoin:
                continue
            with self._waiting(lambda: f"the other client groups to init the rows of key "
                                       f"{key!r} on the parameter servers"):
                self._kv.init(piece_key(index, i), part)   # blocks until every master has
        self._send_multipliers(key)

    def _pieces(self, key: Key, ids: np.ndarray):
        """(piece, its first row, the slice of the sorted ``ids`` that fall in it)."""
        bounds = self._bounds[key]
        cuts = np.searchsorted(ids, bounds)
        for i in range(len(bounds) - 1):
            yield i, int(bounds[i]), slice(int(cuts[i]), int(cuts[i + 1]))

    @_in_order
    def push_rows(self, key: Key, ids: np.ndarray, rows: np.ndarray, shape, dtype) -> None:
        """Push the group's summed gradient rows (sorted unique ``ids``; there may be none)
        to the pieces of the table. In sync mode the servers wait for every master's push
        of every piece, so a piece this group did not touch gets an empty push; in async
        mode only the pieces touched are pushed."""
        index, bounds = self._ids[key], self._bounds[key]
        self._wrote(key)
        with self._waiting(lambda: f"the parameter servers to take the rows of key {key!r} "
                                   f"(scheduler at {scheduler_address()})"):
            for i, first, part in self._pieces(key, ids):
                if part.start == part.stop and self.mode == "dist_async":
                    continue
                n = int(bounds[i + 1]) - first
                array = host_row_sparse(rows[part], ids[part] - first, (n,) + tuple(shape[1:]),
                                        dtype)
                # a push waits for the key's previous round trip: inside the guard
                with self.kv_lock:   # ps-lite reuses the array: a new one each time
                    self._kv.push(piece_key(index, i), array)
                self._requests += 1

    @_in_order
    def pull_rows(self, key: Key, ids: np.ndarray, shape, dtype) -> np.ndarray:
        """The servers' current rows ``ids`` (sorted, unique, non-empty) of ``key``: only the
        pieces that hold some of them are asked, or none where this master keeps the key's
        table (``_keep``: an eval's pull of every row, then a checkpoint's, cost one round
        trip)."""
        with self._waiting(lambda: f"the parameter servers to return {len(ids)} rows of key "
                                   f"{key!r} (scheduler at {scheduler_address()})"):
            kept = self._tables.get(key)
            if kept is not None:
                table = kept.rows()
                return table if len(ids) == len(table) else table[ids]
            writes = self._writes.get(key, 0)
            outs = self._ask_rows(key, ids, shape, dtype)
            if len(ids) == shape[0]:
                return self._keep(key, _Kept(outs, shape, dtype), writes).rows()
            return _read_rows(outs, shape, dtype)

    @_in_order
    def pull_every_row_in_engine(self, key: Key, out: NDArray) -> None:
        """Every row of ``key``'s one piece into the row_sparse array ``out`` through MXNet's
        engine (whoever reads ``out`` waits for them there), or an engine copy of the
        table this master keeps."""
        kept = self._tables.get(key)
        if kept is None:
            writes = self._writes.get(key, 0)
            every_row = np.arange(out.shape[0], dtype=np.int64)
            kept = self._keep(key, _Kept(self._ask_rows(key, every_row, out.shape, out.dtype),
                                         out.shape, out.dtype), writes)
        copy_array(kept.outs[0][0], out)

    def _keep(self, key: Key, table: "_Kept", writes: int) -> "_Kept":
        """Keep a pull of every row of ``key`` until this master writes the key (each write
        drops it): in sync mode the servers change a key only once every master has pushed
        it, this one included. A pull that a write of the key overtook (``writes``, the
        count as it was asked) is not kept."""
        if self.mode == "dist_sync" and self._writes.get(key, 0) == writes:
            self._tables[key] = table
        return table

    def _wrote(self, key: Key) -> None:
        self._writes[key] = self._writes.get(key, 0) + 1
        self._tables.pop(key, None)

    def forget(self, key: Optional[Key] = None) -> None:
        """Drop the table kept of ``key`` (of every key: None), whose rows this store no
        longer reads from the servers."""
        if key is None:
            self._tables.clear()
        else:
            self._tables.pop(key, None)

    def holds_table(self, key: Key) -> bool:
        """Whether this master keeps ``key``'s table (``pull_rows`` sends no request)."""
        return key in self._tables

    @_in_order
    def start_pull_rows(self, key: Key, ids: np.ndarray, shape, dtype):
        """Ask for rows as ``pull_rows`` does, without waiting: returns the function that
        waits for them (it may run on another thread; its caller guards the wait). ps-lite
        sends this master's requests in order, so a pull started after a push of the same
        key gets the rows that push updated."""
        return functools.partial(_read_rows, self._ask_rows(key, ids, shape, dtype), shape,
                                 dtype)

    def _ask_rows(self, key: Key, ids: np.ndarray, shape, dtype) -> List[Tuple[NDArray, int]]:
        """Ask each piece that holds some of the sorted unique ``ids`` for them: (the
        row_sparse array the rows come into, how many) per piece asked."""
        index, bounds = self._ids[key], self._bounds[key]
        outs = []
        with self._waiting(lambda: f"the parameter servers to take a pull of key {key!r} "
                                   f"(scheduler at {scheduler_address()})"):
            for i, first, part in self._pieces(key, ids):
                if part.start == part.stop:
                    continue
                n = int(bounds[i + 1]) - first
                out = empty_row_sparse((n,) + tuple(shape[1:]), dtype)
                row_ids = host_array(ids[part] - first, np.int64)
                with self.kv_lock:
                    self._kv.row_sparse_pull(piece_key(index, i), out=out, row_ids=row_ids)
                self._requests += 1
                outs.append((out, part.stop - part.start))
        return outs

    def rows_alone(self, key: Key) -> bool:
        """Whether ``push_rows_in_engine`` can take ``key``: a table in one piece, on
        ``dist_sync`` servers (on ``dist_async`` ones ``push_rows`` skips empty pushes,
        which this path cannot see before the engine has run backward)."""
        bounds = self._bounds.get(key)
        return self.mode == "dist_sync" and bounds is not None and len(bounds) == 2

    @_in_order
    def push_rows_in_engine(self, key: Key, grad: NDArray, next_ids: Optional[NDArray],
                            out: Optional[NDArray]) -> None:
        """Push the host row_sparse array ``grad`` (this master's sum: it alone pushes for
        its group) to ``key``'s one piece, then ask for the rows ``next_ids`` into the
        host row_sparse array ``out``, through MXNet's engine, as ``dist_sync`` does: the
        push goes once the engine has written ``grad``, and the pull writes the rows once
        the servers have taken every master's push (MXNet pulls into the pushed array,
        after its push: ``grad`` is overwritten). Only work handed to the communication
        thread before it is waited for (``_in_order``)."""
        kid = piece_key(self._ids[key], 0)
        self._wrote(key)
        with self.kv_lock:
            self._kv.push(kid, grad)
            self._requests += 1
            if next_ids is not None:
                self._kv.row_sparse_pull(kid, out=out, row_ids=next_ids)
                self._requests += 1

    @_in_order
    def pull_rows_in_engine(self, key: Key, ids: NDArray, out: NDArray) -> None:
        """Ask for the rows ``ids`` of ``key``'s one piece into the row_sparse array ``out``
        through MXNet's engine, as ``dist_sync``'s ``row_sparse_pull`` does: the rows come
        after this process's pushes of the key (the engine orders those it made; a push
        handed to the communication thread is waited for first), and whoever reads ``out``
        waits for them there."""
        with self.kv_lock:
            self._kv.row_sparse_pull(piece_key(self._ids[key], 0), out=out, row_ids=ids)
            self._requests += 1

    def rows_wire(self, key: Key, shape, dtype) -> NDArray:
        """A host row_sparse array of the table ``key``'s ``shape`` and ``dtype`` that only
        ``push_rows_in_engine``'s callers use (MXNet overwrites what it pushes)."""
        if key not in self._row_wires:
            self._row_wires[key] = empty_row_sparse(shape, dtype)
        return self._row_wires[key]

    @_in_order
    def init(self, key: Key, value: NDArray, out: NDArray) -> None:
        """Register ``key`` on the servers (ps-lite rank 0's value wins); pull it into ``out``."""
        self.check_new(key)
        kid = self._ids[key] = self._next_id(key)
        self._shapes[key] = tuple(value.shape), np.dtype(value.dtype)
        with self._waiting(lambda: f"the other client groups to init key {key!r} on the "
                                   "parameter servers"):
            if not self.rejoin:
                self._kv.init(kid, value)
            self._kv.pull(kid, out=out)
            out.wait_to_read()
        self._send_multipliers(key)

    @_in_order
    def push_pull(self, key: Key, value: NDArray, out: NDArray) -> None:
        """Push this group's sum; pull the servers' value (the sum of all groups, or the
        weight the servers' optimizer updated) into ``out``. MXNet keeps a pushed CPU array
        as the key's buffer and pulls into it: ``value`` is overwritten too, so push a copy
        of anything that must survive (the elastic store does)."""
        if key in self._packed:
            got = np.empty(out.shape, dtype=np.dtype(out.dtype)).reshape(-1)
            self.push_pull_views([(key, value.asnumpy().reshape(-1), got)], new_packs=False)
            out[:] = got.reshape(out.shape)
            return
        kid = self._ids[key]
        with self._waiting(lambda: f"the parameter servers to return key {key!r} "
                                   f"(scheduler at {scheduler_address()})"):
            self._kv.push(kid, value)   # waits for the key's previous round trip
            self._kv.pull(kid, out=out)
            self._requests += 2
            out.wait_to_read()

    @_in_order
    def push_pull_views(self, items: List[Tuple[Key, np.ndarray, np.ndarray]],
                        new_packs: bool = True) -> None:
        """``push_pull`` of several dense keys ``(key, flat sum, flat answer)`` given as host
        views: packed keys travel in their packs, the others in arrays of their own; every
        push and pull is issued before the first wait, so the servers work on all at once.
        With ``new_packs``, keys not yet packed are packed now (every master makes the same
        calls, so every master makes the same packs)."""
        if new_packs:
            self._pack_new([key for key, _, _ in items])
        sent = {}   # pack_key -> the packs pushed, masks cleared before their first member
        waits = []
        keys = ", ".join(repr(k) for k, _, _ in items[:8]) + (" ..." if len(items) > 8 else "")
        with self._waiting(lambda: f"the parameter servers to return keys {keys} "
                                   f"(scheduler at {scheduler_address()})"):
            for key, src, _ in items:
                hit = self._packed.get(key)
                if hit is not None:
                    pack, i = hit
                    if pack.pack_key not in sent:
                        sent[pack.pack_key] = pack
                        pack.mask[:] = 0
                    pack.mask[i] = 1
                    np.copyto(pack.region(i), src)
                else:
                    array, view = self._wire(key)
                    np.copyto(view, src)
                    waits.append(self._push_pull_array(self._ids[key], array))
            waits += [self._push_pull_array(pack.pack_key, pack.array) for pack in sent.values()]
            for array in waits:
                array.wait_to_read()
        for key, _, dst in items:
            hit = self._packed.get(key)
            np.copyto(dst, hit[0].region(hit[1]) if hit is not None else self._wires[key][1])

    def _push_pull_array(self, kid: int, array: NDArray) -> NDArray:
        self._kv.push(kid, array)
        self._kv.pull(kid, out=array)
        self._requests += 2
        return array

    @_in_order
    def packs_of(self, keys: List[Key]) -> Dict[Key, Tuple[packs.Pack, int]]:
        """(pack, member index) of each of ``keys`` that travels packed: packed now if not
        yet, when the servers run kvhybrid's optimizer (every master makes the same calls,
        so the same packs); a packed key never travels alone again."""
        self._pack_new(keys)
        return {key: self._packed[key] for key in keys if key in self._packed}

    def _pack_new(self, keys: List[Key]) -> None:
        """Pack those of ``keys`` not packed yet, when the servers run kvhybrid's optimizer."""
        if self.packing:
            self._make_packs([key for key in keys if key not in self._packed])

    def round_trips(self, pushes: List[Tuple[object, List[NDArray]]],
                    pulls: List[Tuple[object, List[NDArray]]]) -> "RoundTrips":
        """``RoundTrips`` of dense keys that travel alone and of packs (``packs.Pack``)."""
        return RoundTrips(self, [(self._ps_id(k), arrays) for k, arrays in pushes],
                          [(self._ps_id(k), arrays) for k, arrays in pulls])

    def _ps_id(self, key_or_pack) -> int:
        if isinstance(key_or_pack, packs.Pack):
            return key_or_pack.pack_key
        if key_or_pack in self._packed:
            raise KeyValueError(f"key {key_or_pack!r} travels packed with other keys: it "
                                "cannot be pushed alone")
        return self._ids[key_or_pack]

    def wire(self, key: Key) -> NDArray:
        """A host array of ``key``'s shape that only the link's round trips use."""
        return self._wire(key)[0]

    def _wire(self, key: Key) -> Tuple[NDArray, np.ndarray]:
        """The array an unpacked key travels in (MXNet pulls into the array it pushed
        from; a key of its own each, or every key's round trip would wait for the one
        before), and its host view."""
        if key not in self._wires:
            shape, dtype = self._shapes[key]
            array = mx.nd.zeros(shape, mx.cpu(), dtype=dtype)
            wait_to_write(array)
            self._wires[key] = array, host_view(array, dtype, math.prod(shape))
        return self._wires[key]

    def _make_packs(self, keys: List[Key]) -> None:
        """Pack the small dense keys among ``keys`` (see packs.py): the servers' current
        values become the packs' first values, and the servers learn the layouts.

        A pack lives on the server its members live on unpacked (MXNet puts a small key on
        server ``key * 9973 % servers``), so the optimizer states a server already holds for
        a member, and those a checkpoint saved there, are where its pack is updated."""
        groups: Dict[Tuple[int, np.dtype], list] = {}   # (home server, dtype) -> candidates
        for key in keys:
            if key not in self._shapes or key in self._bounds:
                continue
            shape, dtype = self._shapes[key]
            if np.dtype(dtype).kind == "f":
                kid = self._ids[key]
                groups.setdefault((kid * 9973 % self.num_servers, np.dtype(dtype)), []).append(
                    (key, kid, math.prod(shape)))
        new = []
        for (server, dtype), candidates in groups.items():   # first-seen order: every master's
            for members in packs.plan(candidates, packs.big_array_bound()):
                pack_key = self._free_pack_key(server)
                if pack_key is None:
                    log.warning("kvhybrid: no ps-lite key left for more packs of small keys on "
                                "server %d: the rest travel one by one", server)
                    break
                new.append(packs.Pack(pack_key, dtype, members))
        if not new:
            return
        with self._waiting(f"the other client groups' masters to pack {len(new)} groups of "
                           "small keys on the parameter servers"):
            # A restarted master finds its packs on the servers, live: it only learns the
            # layouts (the same calls make the same packs) and pulls them with its first push.
            if not self.rejoin:
                self._kv._barrier()   # every master's earlier pushes have landed
            for pack in new if not self.rejoin else []:
                for m in pack.members:   # straight into the pack, through a view
                    self._kv.pull(m.kid, out=pack.array[m.start:m.end].reshape(
                        self._shapes[m.key][0]))
                    self._requests += 1
                pack.array.wait_to_read()
                self._kv.init(pack.pack_key, pack.array)
            self._kv.set_optimizer(PackCommand({p.pack_key: p.layout() for p in new}))
        self._packs += new
        self._packed.update(packs.by_key(new))
        log.debug("packed %d small keys into %d ps-lite keys",
                  sum(len(p.members) for p in new), len(new))

    def _free_pack_key(self, server: int) -> Optional[int]:
        """The next free pack key that MXNet places on ``server``, or None."""
        for pack_key in range(PACK_KEY_BASE, PACK_KEY_END):
            if pack_key * 9973 % self.num_servers == server and pack_key not in self._claimed:
                self._claimed.add(pack_key)
                return pack_key
        return None

    @_in_order
    def pull_many(self, items: List[Tuple[Key, NDArray]]) -> None:
        """The servers' current values of several keys, into their ``out`` arrays; each
        pack is pulled once."""
        waits, pulled = [], {}
        keys = ", ".join(repr(k) for k, _ in items[:8]) + (" ..." if len(items) > 8 else "")
        with self._waiting(lambda: f"the parameter servers to return keys {keys} "
                                   f"(scheduler at {scheduler_address()})"):
            for key, out in items:
                hit = self._packed.get(key)
                if hit is None:
                    self._kv.pull(self._ids[key], out=out)
                    waits.append(out)
                    self._requests += 1
                elif hit[0].pack_key not in pulled:
                    pulled[hit[0].pack_key] = hit[0]
                    self._kv.pull(hit[0].pack_key, out=hit[0].array)
                    waits.append(hit[0].array)
                    self._requests += 1
            for array in waits:
                array.wait_to_read()
        for key, out in items:
            hit = self._packed.get(key)
            if hit is not None:
                out[:] = hit[0].region(hit[1]).reshape(out.shape)

    @_in_order
    def pull(self, key: Key, out: NDArray) -> None:
        """The servers' current value of ``key``, into ``out``."""
        self.pull_many([(key, out)])

    @_in_order
    def set_optimizer(self, optimizer, pieces: int = 1) -> bool:
        """Send the optimizer to the servers; False if they run without it.

        A server that cannot unpickle the optimizer (its module is not importable there)
        only prints "Exception ignored on calling ctypes callback" and then overwrites
        values with the pushed sums instead of updating, silently. So every master pushes
        1, twice, onto a fresh probe key holding 0. Servers without an optimizer hold the
        sum of one round's pushes after each round (sync: the number of masters; async:
        each push replaces the value, so 1); servers with one add each round's pushes to
        the probe (``ServerOptimizer.probe_key``: the optimizer never sees it, so its
        update counts and schedules are the model's alone), so it moves from round to
        round. In async mode a pull may come before other masters' pushes land: pull until
        the value moves (5 s at most).
        """
        kid = None if self.rejoin else PROBE_KEY_TOP - self._probes - 1
        self._optimizer = optimizer
        with self._waiting("the parameter servers to take the optimizer"):
            self._kv.set_optimizer(ServerOptimizer(self._for_servers(optimizer, pieces), kid))
        if kid is None:   # the first start probed these servers; they keep their states
            self.packing = self.pack_keys
            return True
        self._probes += 1
        probe = mx.nd.zeros((1,))
        without = float(self.num_masters) if self.mode == "dist_sync" else 1.0
        seen = []
        with self._waiting("the parameter servers to answer the optimizer probe"):
            self._kv.init(kid, probe)
            last = 0.0
            tries = 1 if self.mode == "dist_sync" else 500   # sync: a round ends with its update
            for _ in range(2):
                self._kv.push(kid, mx.nd.ones((1,)))
                for _ in range(tries):
                    self._kv.pull(kid, out=probe)
                    if float(probe.asscalar()) != last:
                        break
                    time.sleep(0.01)
                last = float(probe.asscalar())
                seen.append(last)
        took = seen != [without, without]
        self.packing = took and self.pack_keys
        return took

    def _for_servers(self, optimizer, pieces: int = 1):
        """A copy whose multipliers are keyed by ps-lite key. MXNet drops ``param_dict``
        when it pickles an optimizer, so the servers of plain ``dist_sync`` ignore each
        Parameter's ``lr_mult`` and ``wd_mult``; the copy carries them by index, for the
        dense key and for every piece of a table, and those of the keys already on the
        servers (``_send_multipliers`` sends those of later ones)."""
        clone = copy.copy(optimizer)
        clone.lr_mult, clone.wd_mult = dict(optimizer.lr_mult), dict(optimizer.wd_mult)
        for index, param in optimizer.param_dict.items():
            for kid in [index] + [piece_key(index, i) for i in range(pieces)
                                  if piece_key(index, i) is not None]:
                clone.lr_mult[kid] = param.lr_mult
                clone.wd_mult[kid] = param.wd_mult
        for key in self._ids:
            lr_mult, wd_mult = multipliers(optimizer, key)
            for kid in self.ps_keys(key):
                clone.lr_mult[kid], clone.wd_mult[kid] = lr_mult, wd_mult
        return clone

    def _send_multipliers(self, key: Key) -> None:
        """After ``key`` took its ps-lite keys: the multipliers the optimizer gives ``key``
        (found by its name or the store's key, as the workers' updater finds them), under
        those keys, where they are not the default."""
        if self._optimizer is None:
            return
        mults = multipliers(self._optimizer, key)
        if mults == (1.0, 1.0):
            return
        with self._waiting(f"the parameter servers to take the multipliers of key {key!r}"):
            self._kv.set_optimizer(MultipliersCommand({kid: mults for kid in self.ps_keys(key)}))

    @_in_order
    def command(self, action: str, directory: str, token: str, keys=()) -> None:
        """Have every server save or load its optimizer states in ``directory``
        (``server.command``); returns when every server has run it."""
        if action != "save":
            self._tables.clear()   # (a load may set values)
        with self._waiting(f"the parameter servers to {action} their optimizer states in "
                           f"{directory}"):
            self._kv.set_optimizer(Command(action, directory, token, keys))

    def ps_keys(self, key: Key) -> List[int]:
        """The ps-lite keys that hold ``key`` on the servers: itself, or its table's pieces."""
        index = self._ids[key]
        if key in self._bounds:
            return [piece_key(index, i) for i in range(len(self._bounds[key]) - 1)]
        return [index]

    @_in_order
    def set_gradient_compression(self, params: Dict[str, object]) -> None:
        """Compress this master's dense pushes with MXNet's own 2bit compressor (ps-lite rank
        0 tells the servers to decode them; the barrier keeps every push after that)."""
        self.packing = self.pack_keys = False   # a pack's mask must not be quantized
        with self._waiting("the other client groups' masters to set gradient compression"):
            self._kv.set_gradient_compression(params)
            self._kv._barrier()

    @_in_order
    def barrier(self) -> None:
        """Wait for this master's pushes to be answered, then for every master."""
        with self._waiting("the other client groups' masters at a barrier"):
            mx.nd.waitall()
            self._kv._barrier()

    def close(self) -> None:
        """Leave ps-lite (it waits for every node); the handle must not live into teardown."""
        if self._kv is not None:
            kv, self._kv = self._kv, None
            del kv  # waits for every node; at exit the watchdog is gone, the launcher times it


def _read_rows(outs: List[Tuple[NDArray, int]], shape, dtype) -> np.ndarray:
    """The rows ``ServerLink._ask_rows`` asked for, once they came, read in place (``data``
    would copy through the engine once more): MXNet sizes a row_sparse pull's out to one
    row per id asked for, ids sorted and unique."""
    row_shape = tuple(shape[1:])
    width = math.prod(row_shape)
    parts = []
    for out, count in outs:
        out.wait_to_read()
        parts.append(host_view(out, dtype, count * width).reshape((count,) + row_shape))
    return np.concatenate(parts) if len(parts) > 1 else parts[0]


class _Kept:
    """A pull of every row of a key that its master keeps: the arrays the rows came into,
    and the rows as one read-only numpy array once read."""

    def __init__(self, outs: List[Tuple[NDArray, int]], shape, dtype):
        self.outs, self._shape, self._dtype = outs, shape, dtype
        self._rows: Optional[np.ndarray] = None

    def rows(self) -> np.ndarray:
        if self._rows is None:
            self._rows = _read_rows(self.outs, self._shape, self._dtype)
            self._rows.flags.writeable = False
            if len(self.outs) > 1:   # the rows were copied out of the pieces' arrays
                self.outs = []
        return self._rows


class RoundTrips:
    """Pushes of dense keys and the pulls of their answers, handed to MXNet's engine in one
    C call each, their C arguments laid out once (MXNet's Python ``push`` and ``pull`` build
    them on every call, per key). MXNet sends a key once the engine has written its pushed
    arrays (summing several devices' arrays into a buffer of its own first), and its pull
    writes the answer into every array listed for that key once the servers have sent it:
    nothing waits here, and the engine orders a key's round trips by its arrays.

    These calls pass no fence (``ServerLink.defer``): dense keys never share a ps-lite key
    with the rows the deferred work pushes, so their order against that work does not
    matter; ``kv_lock`` keeps the two threads out of MXNet's store at once."""

    def __init__(self, link: ServerLink, pushes: List[Tuple[int, List[NDArray]]],
                 pulls: List[Tuple[int, List[NDArray]]]):
        self._link = link
        self._calls = []
        for arrays_of in (pushes, pulls):
            kids = [kid for kid, arrays in arrays_of for _ in arrays]
            arrays = [a for _, arrays in arrays_of for a in arrays]
            self._calls.append((mx_uint(len(kids)), (ctypes.c_int * len(kids))(*kids),
                                (NDArrayHandle * len(arrays))(*[a.handle for a in arrays])))
        self._held = [a for arrays_of in (pushes, pulls) for _, arrays in arrays_of
                      for a in arrays]   # (their handles must outlive the C arrays)
        self._requests = len({kid for kid, _ in pushes}) + len({kid for kid, _ in pulls})

    def __call__(self, priority: int = 0) -> None:
        """Push every key and ask for every answer."""
        link = self._link
        (n_push, push_keys, push_vals), (n_pull, pull_keys, pull_vals) = self._calls
        with link.kv_lock:
            handle = link._kv.handle
            check_call(_LIB.MXKVStorePush(handle, n_push, push_keys, push_vals,
                                          ctypes.c_int(priority)))
            check_call(_LIB.MXKVStorePullWithSparse(handle, n_pull, pull_keys, pull_vals,
                                                    ctypes.c_int(priority), ctypes.c_bool(True)))
            link._requests += self._requests
