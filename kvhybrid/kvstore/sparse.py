"""row_sparse keys' tables (Parallax §3.1): where their rows live and which route their
gradients take. ``sparse_push.py`` pushes them; ``sparse_pull.py`` pulls them.

Two kinds of key carry rows:

- a **sparse weight** (``contrib.nn.SparseEmbedding``): Gluon calls ``init`` with the
  table, ``row_sparse_pull`` with the batch's ids before each forward pass, and
  ``push`` with row_sparse gradients;
- a **dense weight with a sparse gradient** (``nn.Embedding(sparse_grad=True)``):
  Gluon calls ``broadcast``, then ``push`` of row_sparse gradients and ``pull`` of
  the whole weight (every worker holds all of it).

Where the rows live (``placement.rows_live_on_servers``):

- **in the group** (no servers; or one client group and a dense weight, which every
  worker holds anyway): every rank holds the table;
- **on the servers** (sparse weights whenever there are servers; dense weights with
  several client groups): the row group's master exchanges its group's rows with them.
  With ``KVHYBRID_ROW_MASTERS=host`` the placement's row group is this rank's host:
  every host's first rank aggregates, pushes and pulls its host's rows (Parallax), so
  no one master's link carries the whole group's rows.

A key's route is decided at its first push (``routing.py``): its rows (in the group or on
the servers), or 'dense' (every rank holds the whole table and its gradient is summed like
a dense key's).
"""
from __future__ import annotations

import logging
from typing import Dict, Optional

import numpy as np
import mxnet as mx

from ..errors import KeyValueError
from ..tensor_collectives import broadcast_array
from ..tensor_collectives.ops import allreduce_patiently
from . import routing
from .calls import Calls
from .keys import Key, KeySlot, zeros
from .placement import Placement
from .sparse_pull import RowPulls

log = logging.getLogger("kvhybrid")


class RowTables:
    """row_sparse keys' tables of one store (see the module docstring)."""

    def __init__(self, placement: Placement, slots: Dict[Key, KeySlot], calls: Calls,
                 pulls: RowPulls):
        self.config, self.mode = placement.config, placement.mode
        self.placement, self.slots = placement, slots
        self.calls, self.pulls = calls, pulls
        #: Gluon's key index -> Parameter name (set_optimizer), for KVHYBRID_ROUTES and stats
        self.param_names: Dict[Key, str] = {}

    # -- tables --------------------------------------------------------------------------------
    def check_new_table(self, key: Key, value: mx.nd.NDArray) -> None:
        if self.mode.tables_in_groups:   # its center goes on the servers, as a dense key
            self.placement.check_new_on_servers(key)
            return
        self.check_table_rows(key, value.shape[0])
        if self.placement.servers is not None:
            self.placement.servers.check_new(key)

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
            if placement.group.rank == 0:
                value.copyto(slot.value)
                if placement.dense_on_servers and placement.servers is not None:
                    placement.servers.init(key, slot.value, slot.value)   # as a dense key
            broadcast_array(slot.value, 0, placement.group, name=f"key {key!r}")
        else:
            table = value.tostype("default")
            if placement.row_group is not placement.group:   # (rank 0's, whichever master inits)
                broadcast_array(table, 0, placement.group, name=f"key {key!r}")
            if placement.servers is not None:
                placement.servers.init_rows(key, table, self.config.partitions)
        self.slots[key] = slot
        placement.note_rows(self.slots)

    def place_table(self, key: Key, slot: KeySlot, route: str) -> None:
        """Put ``key``'s table where ``route`` reads it, once, as the route is chosen: a dense
        weight's rows onto the servers for 'servers' (several client groups; every group
        holds the same weight now), the whole table on every rank for 'dense'."""
        if route == "servers" and not slot.rows_on_servers:
            self.check_table_rows(key, slot.shape[0])
            if self.placement.servers is not None:
                self.placement.servers.init_rows(key, slot.value, self.config.partitions)
            slot.rows_on_servers = True
        elif route == "dense":
            if slot.rows_on_servers:
                if slot.value is None:
                    slot.value = zeros(slot.shape, mx.cpu(), slot.dtype)
                self.pulls.pull_table(key, slot, slot.value)
                slot.rows_on_servers = False
                if self.placement.servers is not None:
                    self.placement.servers.forget(key)
        else:
            return
        self.placement.note_rows(self.slots)
        self.calls.forget()   # checked pushpull calls of this key no longer hold

    # -- routes (Parallax §3.1; routing.py) ------------------------------------------------------
    def choose_route(self, key: Key, slot: KeySlot) -> str:
        """A row_sparse key's route, at its first push (before any optimizer state exists):
        forced by KVHYBRID_ROUTES, else by the group's α at this push and Table 3. With
        several client groups the groups cannot agree on a measured α, so only a forced
        route changes the default there."""
        group, across = self.placement.group, self.placement.sum_across_groups
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
            allreduce_patiently(alphas, "sum", group,
                                f"the ranks to measure α of key {key!r}")
            alpha = float(alphas[0]) / group.size
            decision = routing.decide(alpha, slot.count * slot.dtype.itemsize, group.size,
                                      servers=default == "servers",
                                      ar_efficiency=self.config.ar_efficiency)
            route, text = decision.route, decision.describe(key)
        if group.rank == 0:
            log.info("route of row_sparse %s", text)
        return route

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

    # -- what it saw ---------------------------------------------------------------------------
    def key_stats(self) -> Dict[Key, Dict[str, object]]:
        """Per row_sparse key pushed so far: rows, pushes, α as this rank saw it (rows
        touched ÷ rows, averaged over its pushes), and the route its gradients take. A
        prefetching push counts its rows in its hand-out: those on their way are waited for."""
        self.pulls.wait_for_hints()
        return {k: {"name": self.param_names.get(k, str(k)), "rows": s.shape[0],
                    "pushes": s.alpha_steps, "alpha": s.alpha, "route": s.route}
                for k, s in self.slots.items() if s.alpha_steps}
