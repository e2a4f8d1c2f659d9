"""The sparse path: row_sparse keys, where their rows live and which route they take
(Parallax §3.1). ``row_exchange.py`` moves the rows.

Two kinds of key carry rows:

- a **sparse weight** (``contrib.nn.SparseEmbedding``): Gluon calls ``init`` with the
  table, ``row_sparse_pull`` with the batch's ids before each forward pass, and
  ``push`` with row_sparse gradients;
- a **dense weight with a sparse gradient** (``nn.Embedding(sparse_grad=True)``):
  Gluon calls ``broadcast``, then ``push`` of row_sparse gradients and ``pull`` of
  the whole weight (every worker holds all of it).

Where the rows live:

- **in the group** (no servers; or one client group and a dense weight, which every
  worker holds anyway): rows are summed with ``Allgatherv`` and every rank applies
  the same lazy update to its own copy, so nothing touches a server;
- **on the servers** (sparse weights whenever there are servers; dense weights with
  several client groups): the master gathers its group's rows, sums them, and
  pushes them once (local aggregation); pulls go through the master, which asks
  the servers for the union of its group's rows and hands each rank its own.
  With ``KVHYBRID_ROW_MASTERS=host`` the placement's row group is this rank's host:
  every host's first rank aggregates, pushes and pulls its host's rows (Parallax),
  so no one master's link carries the whole group's rows.

A key's route is decided at its first push (``routing.py``): its rows (in the group or on
the servers), or 'dense' (every rank holds the whole table and its gradient is summed like
a dense key's). ``prefetch_rows`` hands over the next batch's ids, so that the next pull's
rows come back while the step goes on (with host masters too: each host's master hands its
host's rows out over a host communicator of the communication thread).
"""
from __future__ import annotations

import collections
import functools
import logging
from dataclasses import dataclass
from typing import Deque, Dict, List, Optional, Tuple

import numpy as np
import mxnet as mx

from ..config import StoreConfig
from ..errors import KeyValueError, KVHybridError
from ..tensor_collectives import broadcast_array
from ..tensor_collectives.engine import EngineComm
from ..tensor_collectives.ndarray_view import (copy_if_ids_equal, ids_equal, is_host,
                                                    reads_row_ids_in_place)
from ..tensor_collectives.operators import copy
from ..tensor_collectives.ops import allreduce_patiently
from ..tensor_collectives.rows import ids_in_table, local_ids
from . import routing
from . import row_exchange as rx
from .calls import Calls, keys_text
from .dense import DensePath
from .keys import Key, KeySlot, check_pull_out, is_key, lookup, pairs, zeros
from .modes import SyncMode
from .placement import Placement

log = logging.getLogger("kvhybrid")


@dataclass
class SparsePush:
    """A push call's row_sparse keys, as ``SparsePath.push`` takes them: ``(key, arrays)``
    each (arrays None where this rank's call failed its checks), whether each key's row ids
    can be read in place, and the call the ranks agree on in the rows' gather (``(local
    error, signature)``), or None where they agreed already."""
    items: List[Tuple[Key, Optional[list]]]
    in_place: List[bool]
    call: Optional[Tuple[Optional[str], Optional[str]]]


class SparsePath:
    """row_sparse keys of one store (see the module docstring)."""

    def __init__(self, config: StoreConfig, mode: SyncMode, placement: Placement,
                 slots: Dict[Key, KeySlot], dense: DensePath, calls: Calls,
                 engine: Optional[EngineComm]):
        self.config, self.mode, self.placement, self.slots = config, mode, placement, slots
        self.dense, self.calls, self.engine = dense, calls, engine
        #: Gluon's key index -> Parameter name (set_optimizer), for KVHYBRID_ROUTES and stats
        self.param_names: Dict[Key, str] = {}
        #: asked for, sent with the next push: (sorted unique ids, or None where the communication
    #: thread works them out; the ids as handed over, if in one array)
        self._prefetch_ids: Dict[Key, Tuple[np.ndarray, Optional[np.ndarray]]] = {}
        self._prefetched: Dict[Key, rx.Prefetch] = {}        # on their way, for the next pull
        self._unsettled: Deque[rx.PullCheck] = collections.deque()   # see settle_pulls
        #: per key, (out, slot, signature) of its last covered pull (``_pull_as_before``)
        self._last_pull: Dict[Key, Optional[tuple]] = {}
        #: where the communication thread hands prefetched rows out: the engine's group, or
        #: with host masters a duplicate of this rank's host group (its own communicator:
        #: the caller's thread meets the host on the other at the same time)
        self.hand_out_group = None
        if engine is not None:
            self.hand_out_group = (engine.group if self.row_group is self.group else
                                   self.row_group.derived(self.row_group.comm,
                                                          f"{self.row_group.name}-engine"))
            self.hand_out_group.algorithms.patient = True

    @property
    def group(self):
        return self.placement.group

    @property
    def row_group(self):
        return self.placement.row_group

    @property
    def servers(self):
        return self.placement.servers

    # -- tables --------------------------------------------------------------------------------
    def check_new_table(self, key: Key, value: mx.nd.NDArray) -> None:
        if self.mode.tables_in_groups:   # its center goes on the servers, as a dense key
            self.placement.check_new_on_servers(key)
            return
        self.check_table_rows(key, value.shape[0])
        if self.servers is not None:
            self.servers.check_new(key)

    def check_table_rows(self, key: Key, rows: int) -> None:
        """Every piece of a table on the servers is split across every server, so each
        needs a row per server at least."""
        servers, pieces = max(1, self.config.num_servers), self.config.partitions
        if rows // pieces < servers:
            fix = (f"set KVHYBRID_PARTITIONS to at most {rows // servers}" if rows >= servers
                   else "give the table more rows, or use a dense parameter")
            raise KeyValueError(f"row_sparse key {key!r} has {rows} rows: split into "
                                f"{pieces} piece(s) over {self.config.num_servers} server(s), "
                                f"some server would get none of a piece's rows; {fix}")

    def init_table(self, key: Key, value: mx.nd.NDArray) -> None:
        """A sparse weight: rank 0's table, kept on the servers or by every rank."""
        placement = self.placement
        slot = KeySlot(tuple(value.shape), np.dtype(value.dtype), None, sparse_weight=True)
        slot.rows_on_servers = placement.rows_on_servers(slot)
        if not slot.rows_on_servers:
            slot.value = zeros(value.shape, value.context, value.dtype)
            if self.group.rank == 0:
                value.copyto(slot.value)
                if placement.dense_on_servers and self.servers is not None:
                    self.servers.init(key, slot.value, slot.value)   # as a dense key
            broadcast_array(slot.value, 0, self.group, name=f"key {key!r}")
        else:
            table = value.tostype("default")
            if self.row_group is not self.group:   # rank 0's table, whichever master inits
                broadcast_array(table, 0, self.group, name=f"key {key!r}")
            if self.servers is not None:
                self.servers.init_rows(key, table, self.config.partitions)
        self.slots[key] = slot
        placement.note_rows(self.slots)

    # -- push --------------------------------------------------------------------------------
    def check_push(self, key: Key, slot: KeySlot, has_updater: bool) -> None:
        """Refuses a push of row_sparse gradients that cannot work (KeyValueError)."""
        to_servers = slot.rows_on_servers or self.placement.rows_on_servers(slot)
        if to_servers:
            self.dense.check_rows_uncompressed(key, "push of row_sparse gradients")
        if to_servers and not has_updater:
            raise KeyValueError(
                f"push of row_sparse gradients of key {key!r} to the parameter servers "
                "needs an optimizer there (without one they overwrite rows instead of "
                "summing them): call set_optimizer first, as gluon.Trainer does with "
                "update_on_kvstore=True")

    def asks_prefetch(self, key: Key) -> bool:
        """Whether the next push of ``key`` carries the next step's row ids."""
        return key in self._prefetch_ids or self._hands_out_unasked(key)

    def _hands_out_unasked(self, key: Key) -> bool:
        """Whether a push of ``key`` that no ``prefetch_rows`` preceded still takes the
        prefetching push's hand-out, asking for no rows: a table on the servers whose route
        is known, with a communication thread. A plain ``gluon.Trainer`` step then pushes
        as a prefetching one does (its caller's thread hands the rows over and goes on,
        instead of meeting the group), and the next pull is served on the communication
        thread (``_pull_prefetched``). Every rank answers the same: a table's route is
        decided at its first push, on every rank."""
        slot = self.slots.get(key) if is_key(key) else None
        return (self.engine is not None and slot is not None and slot.sparse_weight
                and slot.rows_on_servers and slot.route == "servers")

    def _next_ids(self, key: Key) -> Tuple[Optional[np.ndarray], Optional[np.ndarray]]:
        """(next ids, ids as handed) a push of ``key`` carries: those ``prefetch_rows`` was
        handed, else none (``_hands_out_unasked``)."""
        return self._prefetch_ids.pop(key, None) or (np.zeros(0, np.int64), None)

    def _hands_out(self, key: Key, slot: KeySlot) -> bool:
        """Whether a push of ``key`` goes to the servers in the communication thread's
        hand-out, which asks for the next step's rows: its route is known, its rows live on
        the servers, and it asks for them (``asks_prefetch``)."""
        return slot.route == "servers" and slot.rows_on_servers and self.asks_prefetch(key)

    def agrees_with_rows(self, key) -> bool:
        """Whether a push of ``key`` (one key or a list) is agreed in the hand-out's gather,
        with its rows, instead of on the caller's thread first: every key's push is handed
        out (``_hands_out``), none twice. The master compares the ranks' calls before it
        pushes anything; calls that differ reach every rank through the communication
        thread, and every rank raises at a later store call. With host masters a host's
        master sees its host's calls only: the group agrees on the communication thread
        first, in the same job (``rx.push_and_prefetch``'s ``agree_in``), where on the
        caller's thread a step across hosts waited for the other host."""
        keys = list(key) if isinstance(key, (list, tuple)) else [key]
        return bool(keys) and all(is_key(k) and k in self.slots
                                  and self._hands_out(k, self.slots[k]) for k in keys) \
            and len(set(keys)) == len(keys)   # (the checked path names a repeated key)

    def plan_push(self, work, signature: Optional[str]) -> SparsePush:
        """A push call's row_sparse keys, as ``push`` takes them (``work``: its checked
        ``(key, arrays, _)``; ``signature``: the call's, where the ranks are to agree on it
        in the rows' gather, else None: agreed already). The memo keeps it for a repeated
        call (``Calls.checked``): whether each key's row ids are read in place is asked of
        MXNet once."""
        items = [(k, arrays) for k, arrays, _ in work]
        return SparsePush(items, [len(a) == 1 and reads_row_ids_in_place(a[0])
                                  for _, a in items],
                          None if signature is None else (None, signature))

    def failed_push(self, key, error: str) -> SparsePush:
        """The push of a rank whose call failed its local checks, where the ranks agree in
        the rows' gather (``agrees_with_rows``): its keys with no rows, and the error, which
        every rank raises once the master compared the calls. Nothing is pushed."""
        keys = list(key) if isinstance(key, (list, tuple)) else [key]
        return SparsePush([(k, None) for k in keys], [False] * len(keys),
                          (error, None))

    def push(self, plan: SparsePush, updater=None) -> None:
        """A push of row_sparse gradients, each key by its route, chosen at its first push:
        'dense' sums the whole gradient as a dense key; rows in the group are summed with
        ``Allgatherv`` and every rank updates its copy (``rx.push_in_group``); rows on the
        servers go through the master, every such key of the call in one go
        (``_push_to_servers``)."""
        to_servers = []
        for (key, arrays), in_place in zip(plan.items, plan.in_place):
            slot = self.slots[key]
            if arrays is None:   # (this rank's call failed: the gather carries its error)
                to_servers.append((rx.PushOfRows(key, slot, None, None, None), True))
                continue
            # (a call agreed with its rows hands every key out: agrees_with_rows asked)
            hands_out = plan.call is not None or self._hands_out(key, slot)
            push = self._read_rows(key, slot, arrays, hands_out and in_place)
            if slot.route is None:   # (α of this push, counted by _read_rows: never in place)
                slot.route = self._choose_route(key, slot)
            if slot.route == "dense":  # the whole gradient, summed like a dense key's
                self._prefetched.pop(key, None)
                target = slot.grad_buffer() if updater is not None else slot.value
                self.dense.sum_and_update(key, slot, [a.tostype("default") for a in arrays],
                                          target, updater, compress=False)   # as in MXNet
                continue
            if not slot.rows_on_servers and self.placement.rows_on_servers(slot):
                self._move_rows_to_servers(key, slot)
            if slot.rows_on_servers:   # (a key's first push may ask for rows once routed)
                to_servers.append((push, hands_out or self.asks_prefetch(key)))
                continue
            self._prefetched.pop(key, None)   # (this push updates the rows it holds)
            rx.push_in_group(key, slot, arrays, push.ids, self.group, updater)
            self.mode.after_update(key, slot)
        if to_servers:
            self._push_to_servers(to_servers, plan.call)

    def _read_rows(self, key: Key, slot: KeySlot, arrays, in_place: bool) -> rx.PushOfRows:
        """This rank's push of ``key``: its gradient's row ids, read once here (for α and
        for the push), or, ``in_place``, left to the hand-out, which reads the ids of one
        host array where it lies once backward wrote them, so that the caller's thread
        waits for nothing (``rx.push_and_prefetch``)."""
        if in_place:
            return rx.PushOfRows(key, slot, arrays, None, None)
        ids = local_ids(arrays)
        rx.count_rows(slot, ids, len(arrays))
        return rx.PushOfRows(key, slot, arrays, ids, None)

    def _move_rows_to_servers(self, key: Key, slot: KeySlot) -> None:
        """A dense weight's first row_sparse gradient with several client groups: its rows
        move to the servers, as a row_sparse table (every group holds the same weight at
        this point)."""
        self.check_table_rows(key, slot.shape[0])
        if self.servers is not None:
            self.servers.init_rows(key, slot.value, self.config.partitions)
        slot.rows_on_servers = True
        self.placement.note_rows(self.slots)
        self.calls.forget()   # checked pushpull calls of this key no longer hold

    def _push_to_servers(self, pushes, call) -> None:
        """The servers route: each key's rows through its row group's master, who sums them
        and pushes the sum once (local aggregation). ``pushes``: (push, whether it asks for
        the next step's rows: ``asks_prefetch``). Those that ask go in one hand-out of the
        communication thread (``_push_and_prefetch``), with the ranks' agreement where
        ``call`` is not None; the others (no communication thread, or a dense weight, whose
        pull is of the whole table) go from the caller's thread, the call agreed already."""
        handed = []
        for p, asks in pushes:
            if asks:
                handed.append(p)
                continue
            self._prefetched.pop(p.key, None)
            self._prefetch_ids.pop(p.key, None)
            rx.push_to_servers(p.key, p.slot, p.arrays, p.ids, self.row_group, self.servers)
        if handed:
            self._push_and_prefetch(handed, call or (None, "agreed"), agreed=call is None)
        for p, _ in pushes:
            self.mode.after_update(p.key, p.slot)

    def _push_and_prefetch(self, pushes, call, agreed: bool = False) -> None:
        """``rx.push_and_prefetch`` of ``pushes``, each with the next ids its key was handed;
        their rows, on their way, replace the ones fetched for this step. ``agreed``: the
        group agreed on the call already (else the hand-out's gather carries the agreement,
        and with host masters an agreement of the group comes first on the communication
        thread)."""
        retired = []   # this step's rows: dropped on the communication thread (see below)
        for p in pushes:
            retired.append(self._prefetched.pop(p.key, None))
            p.next_ids, p.handed = self._next_ids(p.key)
        for prefetch in retired:   # (a pull that did not wait for them did not see it)
            if prefetch is not None and prefetch.error is not None:
                raise KVHybridError(prefetch.error)
        across = not agreed and self.row_group is not self.group
        if not across and self._alone(pushes, call):
            prefetches = rx.push_and_prefetch_alone(pushes, self.servers, self.row_group)
        else:
            prefetches = rx.push_and_prefetch(pushes, self.row_group, self.servers,
                                              self.engine, self.hand_out_group, call,
                                              agree_in=self.engine.group if across else None,
                                              retired=retired)
        for p, prefetch in zip(pushes, prefetches):
            self._prefetched[p.key] = prefetch

    def _alone(self, pushes, call) -> bool:
        """Whether a push that prefetches goes through MXNet's engine alone
        (``rx.push_and_prefetch_alone``): a row group of one rank, its local checks passed,
        each key's table in one piece on dist_sync servers and its gradient one host
        array."""
        return (self.row_group.size == 1 and call[0] is None and self.servers is not None
                and all(p.arrays is not None and len(p.arrays) == 1 and is_host(p.arrays[0])
                        and self.servers.rows_alone(p.key) for p in pushes))

    # -- routes (Parallax §3.1; routing.py) ------------------------------------------------------
    def _choose_route(self, key: Key, slot: KeySlot) -> str:
        """A row_sparse key's route, at its first push (before any optimizer state exists):
        forced by KVHYBRID_ROUTES, else by the group's α at this push and Table 3. With
        several client groups the groups cannot agree on a measured α, so only a forced
        route changes the default there."""
        across = self.placement.sum_across_groups
        default = "servers" if self.placement.rows_on_servers(slot) else "rows"
        self._check_forced_routes()
        forced = self._forced_route(key)
        if forced is not None:
            if forced not in (default, "dense"):
                raise KeyValueError(f"KVHYBRID_ROUTES sends key {key!r} to {forced!r}, which this "
                                    f"job cannot: its routes are {default!r} and 'dense'")
            if forced == "dense" and across:
                raise KeyValueError(f"KVHYBRID_ROUTES sends row_sparse key {key!r} dense, which "
                                    "needs one client group: drop it or run one group")
            route, text = forced, f"key {key!r}: {forced} (forced by KVHYBRID_ROUTES)"
        elif across:
            route, text = default, (f"key {key!r}: {default} (α={slot.alpha:.3f} on this rank; "
                                    "several client groups: set KVHYBRID_ROUTES to change it)")
        else:
            alphas = np.array([slot.alpha], dtype=np.float64)
            # a buffer allreduce: mpi4py's pickled one holds the GIL while it waits
            allreduce_patiently(alphas, "sum", self.group,
                                f"the ranks to measure α of key {key!r}")
            alpha = float(alphas[0]) / self.group.size
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
            rx.pull_whole_table(key, slot, slot.value, self.row_group, self.servers)
            slot.rows_on_servers = False
            self.placement.note_rows(self.slots)
        self.calls.forget()

    def _forced_route(self, key: Key) -> Optional[str]:
        routes = self.config.routes
        return routes.get(str(key), routes.get(self.param_names.get(key, "")))

    def _check_forced_routes(self) -> None:
        known = {str(k) for k in self.slots} | set(self.param_names.values())
        unknown = sorted(set(self.config.routes) - known)
        if unknown:
            keys = ", ".join(sorted(map(str, self.slots)))
            raise KeyValueError(f"KVHYBRID_ROUTES names {', '.join(map(repr, unknown))}, which "
                                f"this store does not hold: use its keys ({keys}) or Parameter "
                                "names")

    # -- pull ----------------------------------------------------------------------------------
    def pull_table(self, key: Key, slot: KeySlot, into: mx.nd.NDArray) -> None:
        """The whole table of a key whose rows live on the servers, on every rank."""
        rx.pull_whole_table(key, slot, into, self.row_group, self.servers)

    def row_sparse_pull(self, key, out, row_ids) -> None:
        """Write the rows ``row_ids`` of ``key`` into the row_sparse arrays ``out``. A loop's
        repeated pull of the ids it handed over replays its last pull's checks
        (``_pull_as_before``); a pull of a key whose next rows were fetched ahead takes them,
        or has them served on the communication thread (``_pull_prefetched``); any other
        pull is agreed, then served by where its rows live (``_pull_rows``)."""
        prefetch = self._prefetched.get(key) if is_key(key) else None
        if prefetch is not None and self._pull_as_before(key, prefetch, out, row_ids):
            return
        build = functools.partial(self._checked_pull, key, out, row_ids, prefetch)
        # (one key's one array of ids: what a pull through MXNet's engine hands it)
        one = row_ids if isinstance(row_ids, mx.nd.NDArray) else None
        if prefetch is not None:
            self._pull_prefetched(key, build, one)
        else:
            self._pull_rows(self._agreed_pull(key, build), one)

    def _checked_pull(self, key, out, row_ids, prefetch: Optional[rx.Prefetch],
                      sort: bool = True) -> tuple:
        """A ``row_sparse_pull``'s local checks: ``([(key, slot, outs, each out's sorted
        unique ids)], signature)``, or KeyValueError. The outs' checks run once per repeated
        call (the memo); ids equal to those ``prefetch`` was handed are not sorted again
        (they are known once its rows came: this runs after that)."""
        known = (prefetch.handed, prefetch.ids) if prefetch is not None \
            and prefetch.handed is not None and prefetch.ids is not None else None
        if out is None or row_ids is None:
            raise KeyValueError(f"row_sparse_pull of key {key!r} needs out= (row_sparse "
                                "arrays) and row_ids= (the rows to fetch)")
        outs, slots, signature = self.calls.checked("row_sparse_pull", key, out,
                                                    lambda: self._checked_outs(key, out))
        if isinstance(key, (list, tuple)):
            if not isinstance(row_ids, (list, tuple)) or len(row_ids) != len(outs):
                raise KeyValueError(f"a list of {len(outs)} keys needs a list of "
                                    f"{len(outs)} row_ids")
            ids_per_key = list(row_ids)
        else:
            ids_per_key = [row_ids]
        work = []
        for (k, o), slot, ids in zip(outs, slots, ids_per_key):
            ids = [ids] * len(o) if isinstance(ids, mx.nd.NDArray) else list(ids)
            work.append((k, slot, o, rx.checked_row_ids(k, slot, o, ids, known, sort)))
        return work, signature

    def _checked_outs(self, key, out) -> tuple:
        """(outs by key, their slots, the call's signature): the same on every call with
        these outs."""
        outs = pairs(key, out, "out", sparse_ok=True)
        slots = []
        for k, o in outs:
            slots.append(lookup(self.slots, k))
            check_pull_out(k, slots[-1], o)
        return outs, slots, f"row_sparse_pull {keys_text(outs)}"

    def _pull_as_before(self, key, prefetch: rx.Prefetch, out, row_ids) -> bool:
        """A training loop's pull, in a few calls: the ids ``prefetch_rows`` was handed, in
        their order, into the one out that passed ``_pull_prefetched``'s checks at this
        key's last pull. Returns False, having done nothing, for any other pull (the full
        path checks it): the full path's checks every pull cost the caller's thread more
        than ``dist_sync``'s pull (``benchmarks.caller_cpu``).

        It waits for nothing: the rows' engine copy waits in MXNet's engine for the
        operation that writes them (``rx.Prefetch.array``), as ``dist_sync``'s pull does.
        Waiting here for the hand-out held a loop that never calls ``waitall`` at every
        forward pass, where ``dist_sync``'s pull waits for nothing. If the
        hand-out fails, the rows read as zeros and every rank raises at its next call."""
        last = self._last_pull.get(key)
        if isinstance(out, (list, tuple)):
            out = out[0] if len(out) == 1 else None
        if isinstance(row_ids, (list, tuple)):
            row_ids = row_ids[0] if len(row_ids) == 1 else None
        if (last is None or out is not last[0] or self.slots.get(key) is not last[1]
                or prefetch.handed is None or not isinstance(row_ids, mx.nd.NDArray)):
            return False
        if prefetch.error is not None:   # (a pure-PS hand-over failed: the full path raises it)
            return False
        self.engine.check()   # (the hand-out failed already: raise that, not copy zeros)
        # the rows to the out (the engine copies them; nothing writes them again) if the
        # ids are those handed: in one call of the C++ helper where it can
        copied = copy_if_ids_equal(row_ids, prefetch.handed, prefetch.handed_at,
                                   prefetch.array, out)
        if copied is None:   # (the helper could not: compare, then copy, apart)
            copied = _holds(row_ids, prefetch.handed)
            if copied:
                copy(prefetch.array, out)
        if not copied:
            return False
        slot, signature = last[1], last[2]
        self._forget_settled()
        check = rx.PullCheck(key, [(key, slot, [out], [prefetch.ids])], signature, None, True)
        check.start(self.engine, self.hand_out_group, self.servers)
        self._unsettled.append(check)
        return True

    def pull_every_row(self, key, out) -> None:
        """A ``pull``'s row_sparse outs (``ignore_sparse=False``; its dense outs were pulled
        and the call checked): the whole value, a ``row_sparse_pull`` of every row."""
        for k, outs in pairs(key, out, "out", sparse_ok=True):
            rows = [o for o in outs if o.stype == "row_sparse"]
            if rows:
                every_row = mx.nd.arange(self.slots[k].shape[0], dtype="int64")
                self.row_sparse_pull(k, rows, [every_row] * len(rows))

    def _agreed_pull(self, key, build) -> list:
        """A pull's checked work (``build``: ``_checked_pull``), agreed by the group where
        its rows come through the master; every rank holding every row has nothing to agree
        on."""
        if not self.config.num_servers:
            try:
                return build()[0]
            except KeyValueError as exc:
                raise KeyValueError(f"row_sparse_pull failed: {exc}") from None
        return self.calls.check("row_sparse_pull", build, f" of key {key!r}")

    def _pull_rows(self, work, row_ids: Optional[mx.nd.NDArray]) -> None:
        """A checked and agreed pull, each key by where its rows live: every rank's own copy
        (``rx.pull_rows_local``), or through the row group's master, who pulls the union of
        the group's ids once and hands each rank its rows (``rx.pull_rows_from_servers``). A
        row group of one rank (pure PS) whose table is in one piece on dist_sync servers
        pulls through MXNet's engine, as ``dist_sync`` does (``rx.pull_rows_alone``), where a
        communication thread runs (without one the store keeps off MXNet's engine).
        ``row_ids``: the call's one array of ids, if it had one."""
        for k, slot, outs, ids in work:
            if not slot.rows_on_servers:
                rx.pull_rows_local(slot, outs, ids)
            elif (self.row_group.size == 1 and len(outs) == 1 and self.engine is not None
                    and self.servers is not None and self.servers.rows_alone(k)):
                rx.pull_rows_alone(k, outs[0], ids[0], row_ids, self.servers, self.row_group)
            else:
                rx.pull_rows_from_servers(k, slot, outs, ids, self.row_group, self.servers)

    def _pull_prefetched(self, key, build, row_ids: Optional[mx.nd.NDArray]) -> None:
        """A pull of a key whose next rows were fetched ahead (``prefetch_rows``). If this
        rank's rows are among them it takes them and goes on, meeting no one: the ranks'
        communication threads check that every rank had its rows (``PullCheck``). A rank
        whose rows are not there (an evaluation batch, or a plain Trainer's step, whose
        push asked for none: ``_hands_out_unasked``) has that job serve it a plain pull,
        every rank's communication thread taking part as soon as every rank has made its
        pull: into arrays of its own, which MXNet's engine then copies into the outs, so
        the caller's thread goes on at once (it waits for the job where a key has several
        outs). A rank whose arguments are bad raises here, and every other rank at its next
        call of the store, before anything is pushed."""
        self._forget_settled()
        prefetch = self._prefetched[key]
        alone, unasked = self.engine.group.size == 1, _asked_for_none(prefetch)
        if unasked and (alone or prefetch.waits_for_nothing):
            # no rows to wait for: a group's check queues behind the push, whose differing
            # calls raise here or at a later call; a rank alone raises a failed hand-over
            # at its next push
            self.engine.check()
        else:   # the rows first: a push whose calls differed raises here, on every rank,
            self._wait_for_prefetch(prefetch)   # before any meeting (its verdict comes with them)
        # rows asked for none: no pull is covered, and a group's served pull sorts the ids
        sort = alone or not unasked
        try:
            work, signature = build(sort=sort)
            error, covered = None, all(rx.prefetch_holds(prefetch, ids) for *_, ids in work)
        except KeyValueError as exc:
            work, signature, error, covered = None, None, str(exc), False
        if not covered and self.engine.group.size == 1:   # no one to check with or to wait for
            # (a failed call raises as a plain pull's does)
            self._pull_rows(work if error is None else self._agreed_pull(key, build), row_ids)
            return
        check = rx.PullCheck(key, work, signature, error, covered, sorted_ids=sort)
        check.start(self.engine, self.hand_out_group, self.servers)
        self._unsettled.append(check)
        if covered:
            for k, slot, outs, ids in work:
                rx.rows_from_prefetch(prefetch, outs, ids, slot)
            _, slot, outs, _ = work[0]   # (one key: a list of keys is never prefetched)
            self._last_pull[key] = (outs[0], slot, signature) if len(outs) == 1 else None
            return
        if check.targets is not None:   # (the served rows come through the engine)
            check.copy_out()
            return
        self._wait_for_check(check)   # (raises the job's error: a bad argument somewhere)
        check.write_rows()

    def settle_pulls(self) -> None:
        """Wait for the checks of the prefetched pulls made so far (``_pull_prefetched``),
        and the plain pulls they served: before a meeting on the caller's thread, so that
        whatever it sends the servers comes after them. Raises the error of a check that
        failed (a rank's bad argument)."""
        while self._unsettled:
            self._wait_for_check(self._unsettled[0])
            self._unsettled.popleft()

    def _wait_for_check(self, check: rx.PullCheck) -> None:
        """Until the check's job is done (it may serve a plain pull)."""
        if check.done.is_set():   # (the usual case: made while the step went on)
            return
        with self.group.watchdog.waiting_behind(
                lambda: f"the communication thread's check of the prefetched rows of key "
                        f"{check.key!r} (and the plain pull it serves)"):
            while not check.done.wait(0.05):
                self.engine.check()   # its thread failed: the check will not be made

    def _forget_settled(self) -> None:
        """Drop the checks made already (a loop of prefetched pulls that never meets)."""
        while self._unsettled and self._unsettled[0].done.is_set():
            self._unsettled.popleft()

    def prefetch_rows(self, key, row_ids) -> None:
        """Hand over the row ids the next forward pass will pull of ``key`` (see
        ``HybridMPIStore.prefetch_rows``); does nothing where prefetching cannot run."""
        slot = self.slots.get(key)
        if not (slot is not None and slot.sparse_weight and slot.rows_on_servers
                and self.engine is not None):
            return
        arrays = row_ids if isinstance(row_ids, (list, tuple)) else [row_ids]
        parts = [_ids_of_table(key, ids, slot.shape[0]) for ids in arrays]   # (copies: theirs)
        # one array's sorted unique ids are worked out by the communication thread
        self._prefetch_ids[key] = (None, parts[0]) if len(parts) == 1 else \
            (np.unique(np.concatenate(parts)) if parts else np.zeros(0, np.int64), None)

    def _wait_for_prefetch(self, prefetch: rx.Prefetch) -> None:
        if prefetch.ready.is_set() and prefetch.error is None:   # (the usual case)
            self.engine.check()
            return
        with self.group.watchdog.waiting_behind(
                lambda: f"the prefetched rows of key {prefetch.key!r}"):
            while not prefetch.ready.wait(0.05):
                self.engine.check()   # its thread failed: the rows will not come
        self.engine.check()
        if prefetch.error is not None:
            raise KVHybridError(prefetch.error)

    def forget_prefetched(self) -> None:
        """Drop rows fetched ahead (their values are about to be replaced)."""
        self._prefetched.clear()

    # -- what it saw ---------------------------------------------------------------------------
    def key_stats(self) -> Dict[Key, Dict[str, object]]:
        """Per row_sparse key pushed so far: rows, pushes, α as this rank saw it (rows
        touched ÷ rows, averaged over its pushes), and the route its gradients take. A
        prefetching push counts its rows in its hand-out: those on their way are waited for."""
        for prefetch in list(self._prefetched.values()):
            self._wait_for_prefetch(prefetch)
        return {k: {"name": self.param_names.get(k, str(k)), "rows": s.shape[0],
                    "pushes": s.alpha_steps, "alpha": s.alpha, "route": s.route}
                for k, s in self.slots.items() if s.alpha_steps}

    def close(self) -> None:
        """Forget what is pending (after the communication thread stopped)."""
        if self.hand_out_group is not None and self.hand_out_group is not self.engine.group:
            self.hand_out_group.close()
        self._unsettled.clear()
        self._prefetch_ids.clear()
        self._prefetched.clear()
        self._last_pull.clear()


def _ids_of_table(key: Key, ids, rows: int) -> np.ndarray:
    """``prefetch_rows``'s ids of one array (an NDArray, numpy or a list), copied flat as
    int64, each checked to lie in [0, ``rows``): in one pass of the C++ helper where it
    can, else with numpy, which names a bad id."""
    values = ids.asnumpy() if isinstance(ids, mx.nd.NDArray) else np.asarray(ids)
    got = ids_in_table(values, rows)
    if got is not None:
        return got
    got = np.array(values, dtype=np.int64).reshape(-1)
    # one pass: a negative id read as unsigned is past any table's rows
    if len(got) and int(got.view(np.uint64).max()) >= rows:
        bad = got.min() if got.min() < 0 else got.max()
        raise KeyValueError(f"prefetch_rows of key {key!r} got row id {int(bad)}, outside "
                            f"the table's {rows} rows: pass ids in [0, {rows})")
    return got


def _asked_for_none(prefetch: rx.Prefetch) -> bool:
    """Whether ``prefetch`` is a push's that asked for no rows (a plain Trainer's or
    Module's step: ``_hands_out_unasked``). In a group a pull need not wait for it where it
    reads its gradient in place (``waits_for_nothing``: one that reads it through MXNet
    would wait for the next backward, which waits for the pull's check behind it)."""
    return prefetch.handed is None and prefetch.ids is not None and not len(prefetch.ids)


def _holds(row_ids: mx.nd.NDArray, ids: np.ndarray) -> bool:
    """Whether ``row_ids`` hold ``ids``, in their order (``rx.checked_row_ids`` would find
    them equal; ids that are not whole numbers are left to it): read in place where the C++
    helper can."""
    same = ids_equal(row_ids, ids)
    if same is not None:
        return same
    values = row_ids.asnumpy().reshape(-1)
    return values.shape == ids.shape and bool((values == ids).all())
