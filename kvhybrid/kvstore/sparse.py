"""The sparse path: row_sparse keys, where their rows live and which route they take
(Parallax §3.1): the push of their gradients. ``row_exchange.py`` moves the rows;
``sparse_pull.py`` pulls them.

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

import logging
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import numpy as np
import mxnet as mx

from ..config import StoreConfig
from ..errors import KeyValueError, KVHybridError
from ..tensor_collectives import broadcast_array
from ..tensor_collectives.engine import EngineComm
from ..tensor_collectives.ndarray_view import is_host, reads_row_ids_in_place
from ..tensor_collectives.ops import allreduce_patiently
from ..tensor_collectives.rows import local_ids
from . import routing
from . import row_exchange as rx
from .calls import Calls
from .dense import DensePath
from .keys import Key, KeySlot, is_key, zeros
from .modes import SyncMode
from .placement import Placement
from .sparse_pull import RowPulls, table_ids

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
                 engine: Optional[EngineComm], pulls: RowPulls):
        self.config, self.mode, self.placement, self.slots = config, mode, placement, slots
        self.dense, self.calls, self.engine = dense, calls, engine
        #: the pulls, which take the rows each push asks for (``RowPulls.leave_hint``)
        self.pulls = pulls
        #: Gluon's key index -> Parameter name (set_optimizer), for KVHYBRID_ROUTES and stats
        self.param_names: Dict[Key, str] = {}
        #: asked for, sent with the next push: (sorted unique ids, or None where the
        #: communication thread works them out; the ids as handed over, if in one array)
        self._prefetch_ids: Dict[Key, Tuple[np.ndarray, Optional[np.ndarray]]] = {}

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
        thread (``RowPulls._pull_prefetched``). Every rank answers the same: a table's route is
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
                self.pulls.take_hint(key)
                target = slot.grad_buffer() if updater is not None else slot.value
                self.dense.sum_and_update(key, slot, [a.tostype("default") for a in arrays],
                                          target, updater, compress=False)   # as in MXNet
                continue
            if not slot.rows_on_servers and self.placement.rows_on_servers(slot):
                self._move_rows_to_servers(key, slot)
            if slot.rows_on_servers:   # (a key's first push may ask for rows once routed)
                to_servers.append((push, hands_out or self.asks_prefetch(key)))
                continue
            self.pulls.take_hint(key)   # (this push updates the rows it holds)
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
            self.pulls.take_hint(p.key)
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
            retired.append(self.pulls.take_hint(p.key))
            p.next_ids, p.handed = self._next_ids(p.key)
        for prefetch in retired:   # (a pull that did not wait for them did not see it)
            if prefetch is not None and prefetch.error is not None:
                raise KVHybridError(prefetch.error)
        across = not agreed and self.row_group is not self.group
        if not across and self._alone(pushes, call):
            prefetches = rx.push_and_prefetch_alone(pushes, self.servers, self.row_group)
        else:
            prefetches = rx.push_and_prefetch(pushes, self.row_group, self.servers,
                                              self.engine, self.pulls.hand_out_group, call,
                                              agree_in=self.engine.group if across else None,
                                              retired=retired)
        for p, prefetch in zip(pushes, prefetches):
            self.pulls.leave_hint(p.key, prefetch)

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

    # -- pull (row_sparse pulls: sparse_pull.py) ----------------------------------------------
    def pull_table(self, key: Key, slot: KeySlot, into: mx.nd.NDArray) -> None:
        """The whole table of a key whose rows live on the servers, on every rank."""
        rx.pull_whole_table(key, slot, into, self.row_group, self.servers)

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

    # -- what it saw ---------------------------------------------------------------------------
    def key_stats(self) -> Dict[Key, Dict[str, object]]:
        """Per row_sparse key pushed so far: rows, pushes, α as this rank saw it (rows
        touched ÷ rows, averaged over its pushes), and the route its gradients take. A
        prefetching push counts its rows in its hand-out: those on their way are waited for."""
        self.pulls.wait_for_hints()
        return {k: {"name": self.param_names.get(k, str(k)), "rows": s.shape[0],
                    "pushes": s.alpha_steps, "alpha": s.alpha, "route": s.route}
                for k, s in self.slots.items() if s.alpha_steps}

    def close(self) -> None:
        """Forget what is pending (after the communication thread stopped)."""
        self._prefetch_ids.clear()


def _ids_of_table(key: Key, ids, rows: int) -> np.ndarray:
    """``prefetch_rows``'s ids of one array (an NDArray, numpy or a list), copied flat as
    int64, each checked to lie in [0, ``rows``)."""
    values = ids.asnumpy() if isinstance(ids, mx.nd.NDArray) else np.asarray(ids)
    return table_ids(values, rows, lambda bad: KeyValueError(
        f"prefetch_rows of key {key!r} got row id {bad}, outside the table's {rows} rows: "
        f"pass ids in [0, {rows})"))
