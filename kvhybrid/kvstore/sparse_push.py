"""The push of a row_sparse key's gradients (Parallax §3.1), every key by its route, chosen at
its first push (``sparse.py``):

- **dense**: the whole gradient summed as a dense key's (``DensePath.sum_and_update``);
- **rows** (in the group): rows summed with ``Allgatherv``; every rank applies the same
  lazy update to its own copy (``push_in_group``);
- **servers**: the row group's master gathers the group's rows, sums them and pushes the
  sum once (local aggregation: ``push_and_prefetch``). On the communication thread the
  push also asks for the next step's rows in the same meeting and leaves them as the next
  pull's hint (``sparse_pull.Prefetch``): the ids ``kvhybrid.prefetch`` handed over, or none.
  Without that thread, or for a dense weight whose pull is of its whole table, the same
  job runs in place on the caller's thread, asking for no rows. A group of one rank
  pushes through MXNet's engine instead, as ``dist_sync`` does (``push_and_prefetch_alone``).

Only the rows touched travel, so traffic scales with α, not with the table.
"""
from __future__ import annotations

import contextlib
import functools
import math
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import mxnet as mx
from mxnet.ndarray import NDArray

from ..errors import KeyValueError, KVHybridError, explain
from ..tensor_collectives import Group
from ..tensor_collectives.engine import IN_PLACE, EngineComm, InPlace, when_ready
from ..tensor_collectives.ndarray_view import (empty_row_sparse, host_array, host_view,
                                                    ids_in_table_of, is_host,
                                                    make_rows, new_host_row_sparse,
                                                    reads_row_ids_in_place, row_sparse_ids,
                                                    rows_made_later)
from ..tensor_collectives.operators import copy
from ..tensor_collectives.rows import (allreduce_rows, gather_patiently, local_ids, local_rows,
                                       scatter_bytes, sum_rows, take_rows, union_ids,
                                       unique_ids)
from ..tensor_collectives.watchdog import current_step, steps_differ
from .calls import agree, digest
from .dense import DensePath
from .keys import Key, KeySlot, is_key
from .placement import Placement
from .ps.link import ServerLink
from .sparse import RowTables
from .sparse_pull import Prefetch, RowPulls, table_ids


@dataclass
class SparsePush:
    """A push call's row_sparse keys, as ``RowPushes.push`` takes them: ``(key, arrays)``
    each (arrays None where this rank's call failed its checks), whether each key's row ids
    can be read in place, and the call the ranks agree on in the rows' gather (``(local
    error, signature)``; a push summed in the group agrees on it before: ``summed_in_group``),
    or None where they agreed already."""
    items: List[Tuple[Key, Optional[list]]]
    in_place: List[bool]
    call: Optional[Tuple[Optional[str], Optional[str]]]


@dataclass
class PushOfRows:
    """One key of a ``push_and_prefetch``: its gradient's arrays (None after a local error)
    and their row ids (None: read in place by the hand-out, which also counts them for α),
    and the ids the next step will pull (sorted unique, None where the hand-out works them
    out; and as handed to ``prefetch_rows``, when they came in one array)."""
    key: Key
    slot: KeySlot
    arrays: Optional[Sequence[NDArray]]
    ids: Optional[np.ndarray]
    next_ids: Optional[np.ndarray]
    handed: Optional[np.ndarray] = None


class RowPushes:
    """The row_sparse pushes of one store (see the module docstring), and the ids
    ``prefetch_rows`` hands over for the next push to ask for."""

    def __init__(self, placement: Placement, slots: Dict[Key, KeySlot], tables: RowTables,
                 dense: DensePath, engine: Optional[EngineComm], pulls: RowPulls):
        self.placement, self.mode, self.slots = placement, placement.mode, slots
        self.tables = tables
        self.dense, self.engine = dense, engine
        #: the pulls, which take the rows each push asks for (``RowPulls.leave_hint``)
        self.pulls = pulls
        #: asked for, sent with the next push: (sorted unique ids, or None where the
        #: communication thread works them out; the ids as handed over, if in one array)
        self._prefetch_ids: Dict[Key, Tuple[np.ndarray, Optional[np.ndarray]]] = {}

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
        first, in the same job (``push_and_prefetch``'s ``agree_in``), where on the
        caller's thread a step across hosts waited for the other host. A push of sparse
        weights summed in the group (``summed_in_group``) is remembered the same way."""
        keys = list(key) if isinstance(key, (list, tuple)) else [key]
        if not keys or not all(is_key(k) and k in self.slots for k in keys) \
                or len(set(keys)) != len(keys):
            return False   # (the checked path names an unknown or repeated key)
        slots = [self.slots[k] for k in keys]
        return all(self._hands_out(k, slot) for k, slot in zip(keys, slots)) \
            or self.summed_in_group(key)

    def summed_in_group(self, key) -> bool:
        """Whether every key of a push (known keys: ``agrees_with_rows`` asked) is a sparse
        weight summed in the group (route 'rows', chosen on every rank at its first push):
        its checks are remembered, and the call is agreed on the caller's thread by the
        group's agreement (``Calls.check_known``), as a checked call is, before its rows'
        exchange."""
        keys = list(key) if isinstance(key, (list, tuple)) else [key]
        return all(self.slots[k].route == "rows" and self.slots[k].sparse_weight
                   for k in keys)

    def plan_push(self, work, signature: Optional[str]) -> SparsePush:
        """A push call's row_sparse keys, as ``push`` takes them (``work``: its checked
        ``(key, arrays, _)``; ``signature``: the call's, where the ranks are to agree on it
        in the rows' gather, else None: agreed already). The memo keeps it for a repeated
        call (``Calls.recall``): whether each key's row ids are read in place is asked of
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
        """A push of row_sparse gradients, each key by its route (the module docstring):
        'dense' and 'rows' key by key, 'servers' every such key of the call in one go
        (``_push_to_servers``)."""
        to_servers = []
        for (key, arrays), in_place in zip(plan.items, plan.in_place):
            slot = self.slots[key]
            if arrays is None:   # (this rank's call failed: the gather carries its error)
                to_servers.append((PushOfRows(key, slot, None, None, None), True))
                continue
            # (a call agreed with its rows hands every key out: agrees_with_rows asked)
            hands_out = slot.route == "servers" and (plan.call is not None
                                                     or self._hands_out(key, slot))
            push = self._read_rows(key, slot, arrays, hands_out and in_place)
            route = self._route(key, slot)
            if route == "dense":   # the whole gradient, summed like a dense key's
                self.pulls.take_hint(key)
                target = slot.grad_buffer() if updater is not None else slot.value
                self.dense.sum_and_update(key, slot, [a.tostype("default") for a in arrays],
                                          target, updater, compress=False)   # as in MXNet
            elif route == "rows":
                self.pulls.take_hint(key)   # (this push updates the rows it holds)
                push_in_group(key, slot, arrays, push.ids, self.placement.group, updater)
                self.mode.after_update(key, slot)
            elif route == "servers":   # (a key's first push may ask for rows once routed)
                to_servers.append((push, hands_out or self.asks_prefetch(key)))
            else:
                raise KVHybridError(f"key {key!r} has route {route!r}, which no push takes: "
                                    "report it")
        if to_servers:
            self._push_to_servers(to_servers, plan.call)

    def _route(self, key: Key, slot: KeySlot) -> str:
        """``key``'s route, chosen at its first push (α of that push, counted by
        ``_read_rows``: never in place), its table then put where the route reads it."""
        if slot.route is None:
            route = self.tables.choose_route(key, slot)
            self.tables.place_table(key, slot, route)
            slot.route = route   # (only once placed: a failed move is tried again)
        return slot.route

    def _read_rows(self, key: Key, slot: KeySlot, arrays, in_place: bool) -> PushOfRows:
        """This rank's push of ``key``: its gradient's row ids, read once here (for α and
        for the push), or, ``in_place``, left to the hand-out, which reads the ids of one
        host array where it lies once backward wrote them, so that the caller's thread
        waits for nothing (``push_and_prefetch``)."""
        if in_place:
            return PushOfRows(key, slot, arrays, None, None)
        ids = local_ids(arrays)
        count_rows(slot, ids, len(arrays))
        return PushOfRows(key, slot, arrays, ids, None)

    def _push_to_servers(self, pushes, call) -> None:
        """The servers route: each key's rows through its row group's master, who sums them
        and pushes the sum once (local aggregation), in one hand-out (``push_and_prefetch``).
        ``pushes``: (push, whether it asks for the next step's rows: ``asks_prefetch``).
        Those that ask go on the communication thread, with the ranks' agreement where
        ``call`` is not None; the others (no communication thread, or a dense weight, whose
        pull is of the whole table) ask for no rows and run in place, the call agreed
        already."""
        in_place = [p for p, asks in pushes if not asks]
        for p in in_place:
            self.pulls.take_hint(p.key)
            self._prefetch_ids.pop(p.key, None)
            p.next_ids, p.handed = np.zeros(0, np.int64), None
        if in_place:
            row_group = self.placement.row_group
            push_and_prefetch(in_place, row_group, self.placement.servers, IN_PLACE, row_group,
                              (None, "agreed"))
        handed = [p for p, asks in pushes if asks]
        if handed:
            self._push_and_prefetch(handed, call or (None, "agreed"), agreed=call is None)
        for p, _ in pushes:
            self.mode.after_update(p.key, p.slot)

    def _push_and_prefetch(self, pushes, call, agreed: bool = False) -> None:
        """``push_and_prefetch`` of ``pushes``, each with the next ids its key was handed;
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
        row_group, servers = self.placement.row_group, self.placement.servers
        across = not agreed and row_group is not self.placement.group
        if not across and self._alone(pushes, call):
            prefetches = push_and_prefetch_alone(pushes, servers, row_group)
        else:
            prefetches = push_and_prefetch(pushes, row_group, servers, self.engine,
                                           self.pulls.hand_out_group, call,
                                           agree_in=self.engine.group if across else None,
                                           retired=retired)
        for p, prefetch in zip(pushes, prefetches):
            self.pulls.leave_hint(p.key, prefetch)

    def _alone(self, pushes, call) -> bool:
        """Whether a push that prefetches goes through MXNet's engine alone
        (``push_and_prefetch_alone``): a row group of one rank, its local checks passed,
        each key's table in one piece on dist_sync servers and its gradient one host
        array."""
        servers = self.placement.servers
        return (self.placement.row_group.size == 1 and call[0] is None and servers is not None
                and all(p.arrays is not None and len(p.arrays) == 1 and is_host(p.arrays[0])
                        and servers.rows_alone(p.key) for p in pushes))

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

    def close(self) -> None:
        """Forget what is pending (after the communication thread stopped)."""
        self._prefetch_ids.clear()


def _ids_of_table(key: Key, ids, rows: int) -> np.ndarray:
    """``prefetch_rows``'s ids of one array (an NDArray, numpy or a list), copied flat as
    int64, each checked to lie in [0, ``rows``): an NDArray's in one call of the C++ helper
    where it can."""
    if isinstance(ids, mx.nd.NDArray):
        got = ids_in_table_of(ids, rows)
        if got is not None:
            return got
    values = ids.asnumpy() if isinstance(ids, mx.nd.NDArray) else np.asarray(ids)
    return table_ids(values, rows, lambda bad: KeyValueError(
        f"prefetch_rows of key {key!r} got row id {bad}, outside the table's {rows} rows: "
        f"pass ids in [0, {rows})"))


# -- the routes' work ------------------------------------------------------------------------
def count_rows(slot: KeySlot, ids: np.ndarray, arrays: int) -> None:
    """Add this push's α (distinct rows this worker touched ÷ rows) to the key's tally;
    ``ids`` come from ``arrays`` row_sparse arrays (one array's are distinct already)."""
    slot.alpha_sum += (len(ids) if arrays == 1 else len(np.unique(ids))) / slot.shape[0]
    slot.alpha_steps += 1


def push_in_group(key: Key, slot: KeySlot, arrays: Sequence[NDArray], ids: np.ndarray,
                  group: Group, updater) -> None:
    """Sum the rows over devices and the group; update (or overwrite) the local copy.
    ``ids``: the arrays' row ids, concatenated (``local_ids``)."""
    grad = allreduce_rows(arrays, group, name=f"key {key!r}", ids=ids)
    if updater is not None:
        updater(key, grad, slot.value)
    else:
        grad.copyto(slot.value)


def push_and_prefetch(pushes: Sequence[PushOfRows], group: Group,
                      servers: Optional[ServerLink], comm: Union[EngineComm, InPlace],
                      hand_out_group: Group,
                      call: Tuple[Optional[str], Optional[str]],
                      agree_in: Optional[Group] = None,
                      retired: Optional[list] = None) -> List[Prefetch]:
    """Local aggregation of one or more keys (the master sums the group's rows and pushes
    the sum once: an empty one too, as in sync mode the servers wait for every group's
    push), their agreement and the pull of the next step's rows in one meeting, all of it
    on the communication thread (``comm``) while every caller's thread goes on: every
    rank's rows and next ids of every key, and its call
    (``call``: its local error, or its signature), go to the master in one gather over
    ``hand_out_group`` (``group``'s ranks on a communicator of that thread). The master
    then compares the calls and, if they match, pushes each key's sum and at once asks the
    servers for the union of its next ids (ps-lite sends them after the push, so they come
    back updated), waits for them and hands each rank its own (the master's next calls to
    the servers wait for that thread's: ``ServerLink.defer``): one message to each rank
    carries the verdict and every key's rows. If the calls differ, nothing is pushed: the
    message carries the verdict only (and room for the rows), and every rank raises it at
    its next call. ``agree_in``: where ``group`` is a host's ranks (host masters), the whole
    group, which agrees on the call first, in this job: a patient allreduce of the ranks'
    digests that raises the same error on every rank before any gather. ``retired``: the
    rows this push replaces (``Prefetch``es), dropped by the job: freeing their arrays pushes
    work into MXNet's engine, which the caller's thread would otherwise do every step.

    The rows are read where the gradient lies (``local_rows``): the job is an engine
    operation that reads the gradients, so the next backward pass cannot write them before
    the gather has packed them (on the caller's thread the gather would make a master wait
    there for the slowest rank's backward pass).

    ``comm`` ``IN_PLACE`` (no communication thread, or a dense weight's push): the call was
    agreed and asks for no rows, so the gather and the master's push run on the caller's
    thread, in order with its other calls of the servers, and nothing is handed back."""
    error, signature = call
    step = current_step()   # (the caller's: its thread may be a step ahead when this runs)
    agreement, keys, row_bytes = _facts_of_push(pushes, error, signature)
    prefetches = [_prefetch_into_new_array(p) for p in pushes]
    for p, prefetch in zip(pushes, prefetches):
        prefetch.waits_for_nothing = p.arrays is None or (len(p.arrays) == 1
                                                          and is_host(p.arrays[0]))

    def serve(gathered) -> Tuple[bool, list]:
        """The master's part: the verdict (whether the calls differ), and each key's sum
        pushed and its next rows asked for ((union, wanted, fetch) per key): off the
        caller's thread (sums, ps-lite calls, the union of ids)."""
        calls = gathered[-1][0].reshape(-1, 2)   # (error flag, digest) per rank
        failed = bool(calls[:, 0].any()) or len(set(calls[:, 1].tolist())) > 1
        fetches = []   # (union, every rank's next ids, how many each, fetch) per key
        for n, p in enumerate(pushes):
            (all_ids, id_counts), (all_rows, _), (nexts, counts) = gathered[3 * n:3 * n + 3]
            union, fetch = union_ids(nexts, counts), None
            if servers is not None and not failed:
                summed_ids, summed = sum_rows(all_ids, all_rows, id_counts)
                group.bytes_sent["servers"] += summed_ids.nbytes + summed.nbytes
                servers.push_rows(p.key, summed_ids, summed, p.slot.shape, p.slot.dtype)
                if len(union):
                    fetch = servers.start_pull_rows(p.key, union, p.slot.shape, p.slot.dtype)
            fetches.append((union, nexts, counts, fetch))
        return failed, fetches

    # the master's calls of the link wait for serve (ServerLink.defer): ps-lite must see
    # this push before any later request of this process
    in_place = comm is IN_PLACE
    done = servers.defer() if servers is not None and group.rank == 0 and not in_place \
        else None

    def hand_out() -> None:   # on the communication thread, every rank of the group
        if retired:
            retired.clear()
        if agree_in is not None:
            agree(agree_in, "push", signature, error, f" of key(s) {keys}", patient=True)
        arrays = []
        for p, prefetch in zip(pushes, prefetches):
            arrays += [*_rows_of(p), p.next_ids]
            prefetch.ids = p.next_ids
        gathered = gather_patiently(
            arrays + [agreement], hand_out_group, root=0,
            name=f"the push of key(s) {keys} (their rows, the ranks' calls and the next "
                 "step's row ids)")
        served = None
        if hand_out_group.rank == 0:
            with servers.deferred(hand_out_group.watchdog) if done is not None \
                    else contextlib.nullcontext():
                served = serve(gathered)
        if in_place:   # (agreed, no rows asked for: nothing to hand back)
            for prefetch in prefetches:
                prefetch.ready.set()
            return
        # the rows' memory next (where the push left it to this job), while the master
        # waits for the servers, not after
        for p, prefetch in zip(pushes, prefetches):
            if prefetch.rows is None:
                prefetch.rows = make_rows(prefetch.array, p.next_ids)
        packed = None if served is None else \
            _hand_out_packed(pushes, served[1], row_bytes, served[0], hand_out_group)
        got = scatter_bytes(packed, np.empty(8 + sum(len(p.next_ids) * b for p, b
                                                       in zip(pushes, row_bytes)), np.uint8),
                            hand_out_group, name=f"the verdict on the push of key(s) {keys} "
                                                 "and the prefetched rows")
        if got[:8].view(np.int64)[0]:   # rare: the calls' texts; the thread stops, all raise
            details = hand_out_group.comm.gather((call, step), root=0)
            text = explain("push", [c for c, _ in details], steps_differ(
                {r: s for r, (_, s) in enumerate(details)})) if hand_out_group.rank == 0 else None
            raise KeyValueError(hand_out_group.comm.bcast(text, root=0))
        start = 8
        for p, prefetch, size in zip(pushes, prefetches, row_bytes):
            end = start + len(p.next_ids) * size
            prefetch.rows.reshape(-1).view(np.uint8)[:] = got[start:end]
            start = end
            prefetch.ready.set()   # (on failure the reader sees the thread's error instead)

    def finish() -> None:   # after the job, whatever happened
        for prefetch in prefetches:   # rows that never came read as zeros, not stale memory
            if not prefetch.ready.is_set() and prefetch.rows is not None:
                prefetch.rows.fill(0)   # (an array given no rows reads as zeros too)
        if done is not None:
            done()

    reads = [a for p in pushes if p.arrays is not None for a in p.arrays]
    try:   # (it writes the rows' arrays: engine copies of them wait for it)
        comm.submit(f"the prefetched rows of key(s) {keys}",
                    [f.array for f in prefetches if f.array is not None],
                    hand_out, reads=reads, cleanup=finish)
    except BaseException:   # (the thread failed before: nothing was queued)
        if done is not None:
            done()
        raise
    return prefetches


def _facts_of_push(pushes: Sequence[PushOfRows], error: Optional[str],
                   signature: Optional[str]) -> Tuple[np.ndarray, str, List[int]]:
    """``push_and_prefetch``'s (agreement, the keys' text, each key's row bytes), worked
    out once per call a loop repeats (its keys and signature, which names their shapes
    and dtypes), not again every step on the caller's thread. The agreement is this
    rank's (error flag, digest of its signature) that the master compares; read only."""
    ident = (tuple(p.key for p in pushes), signature)
    facts = _PUSH_FACTS.get(ident) if error is None else None
    if facts is None:
        agreement = np.array([1 if error else 0, 0 if error else digest(signature)], np.int64)
        agreement.flags.writeable = False
        facts = (agreement, ", ".join(repr(p.key) for p in pushes),
                 [p.slot.dtype.itemsize * math.prod(p.slot.shape[1:]) for p in pushes])
        if error is None:
            if len(_PUSH_FACTS) >= 1024:
                _PUSH_FACTS.clear()
            _PUSH_FACTS[ident] = facts
    return facts


#: ``_facts_of_push``'s, by (keys, signature)
_PUSH_FACTS: dict = {}


def _prefetch_into_new_array(p: PushOfRows) -> Prefetch:
    """``push_and_prefetch``'s rows of one key, on the caller's thread: a new host row_sparse
    array, which the hand-out gives its rows (``make_rows``: their count is known there).
    Without the C++ helper, which can, the array is made here with room for the rows, their
    sorted unique ids worked out first (where ``prefetch_rows`` was handed one array), far
    costlier on the caller's thread than the empty array (``empty_row_sparse``). A push that
    asks for no rows (a plain Trainer's or Module's step) gets no array: nothing copies it."""
    if p.handed is None and p.next_ids is not None and not len(p.next_ids):
        return Prefetch(p.key, p.next_ids, None, None,
                        np.zeros((0,) + tuple(p.slot.shape[1:]), p.slot.dtype))
    if rows_made_later():
        return Prefetch(p.key, p.next_ids, p.handed, empty_row_sparse(p.slot.shape, p.slot.dtype))
    if p.next_ids is None:
        p.next_ids = unique_ids(p.handed, p.slot.shape[0])
    array, rows = new_host_row_sparse(p.next_ids, p.slot.shape, p.slot.dtype)
    return Prefetch(p.key, p.next_ids, p.handed, array, rows)


def push_and_prefetch_alone(pushes: Sequence[PushOfRows], servers: ServerLink,
                            group: Group) -> List[Prefetch]:
    """``push_and_prefetch`` for a client group of one rank (pure PS), whose gradient is
    its group's sum and whose call is its group's verdict: there is no one to meet, so
    each key's gradient goes to the servers and the next step's rows come back through
    MXNet's engine, as with ``dist_sync`` (``ServerLink.push_rows_in_engine``): nothing
    waits, on any thread of ours. The gradient is copied first (MXNet writes the rows it
    pulls into the array it pushed); an engine operation that reads the gradient and the
    rows hands the rows over once they came (``when_ready``), and counts the gradient's
    rows for α where the caller left that, and its bytes in ``group``'s counters; a pull's
    engine copy of the rows waits for MXNet's pull that writes them. The group's watchdog
    times the servers' answer. Keys must pass ``ServerLink.rows_alone``,
    each with one host array."""
    prefetches = []
    for p in pushes:
        slot, grad = p.slot, p.arrays[0]
        wanted = p.next_ids if p.next_ids is not None else p.handed
        wire = servers.rows_wire(p.key, slot.shape, slot.dtype)
        copy(grad, wire)
        if len(wanted):   # (MXNet sorts and dedupes them in its engine, as for dist_sync)
            out = empty_row_sparse(slot.shape, slot.dtype)
            servers.push_rows_in_engine(p.key, wire, host_array(wanted, np.int64), out)
        else:
            out = new_host_row_sparse(np.zeros(0, np.int64), slot.shape, slot.dtype)[0]
            servers.push_rows_in_engine(p.key, wire, None, None)
        prefetch = Prefetch(p.key, p.next_ids, p.handed, out)
        done = group.watchdog.watch(lambda key=p.key: f"the parameter servers' rows of key "
                                                       f"{key!r} for the next step", outward=True)
        when_ready(f"prefetched rows of key {p.key!r}", [grad, out],
                   functools.partial(_hand_over, p, prefetch, out, group, done))
        prefetches.append(prefetch)
    return prefetches


def _hand_over(p: PushOfRows, prefetch: Prefetch, out: NDArray, group: Group, done) -> None:
    """``push_and_prefetch_alone``'s rows, once the engine has written them (on an engine
    thread: only reads in place here). A failure is kept for the reader of the rows, who
    raises it (``RowPulls``, or the next push), instead of leaving it to wait for rows
    that never come."""
    try:
        _take_rows(p, prefetch, out, group)
    except Exception as exc:   # noqa: B902 (nothing may escape into MXNet's engine thread)
        prefetch.error = (f"the rows prefetched for key {p.key!r} could not be handed over "
                          f"({type(exc).__name__}: {exc}); train without kvhybrid.prefetch "
                          "for this table, or set KVHYBRID_CPP_HELPER=0, and report it")
    finally:
        prefetch.ready.set()
        done()


def _take_rows(p: PushOfRows, prefetch: Prefetch, out: NDArray, group: Group) -> None:
    """``_hand_over``'s work: α, the bytes, and the rows where the reader finds them."""
    if p.ids is None:   # (its gradient is written: the engine ran this after backward)
        p.ids = row_sparse_ids(p.arrays[0], wait=False)
        count_rows(p.slot, p.ids, 1)
    if p.next_ids is not None:
        ids = p.next_ids
    elif reads_row_ids_in_place(out):   # (MXNet's pull sorted and deduplicated them)
        ids = row_sparse_ids(out, wait=False)
    else:
        ids = unique_ids(p.handed, p.slot.shape[0])
    width = math.prod(p.slot.shape[1:])
    group.bytes_sent["servers"] += p.ids.nbytes + len(p.ids) * width * p.slot.dtype.itemsize
    prefetch.ids = ids
    prefetch.rows = host_view(out, p.slot.dtype, len(ids) * width).reshape(
        (len(ids),) + tuple(p.slot.shape[1:])) if len(ids) else \
        np.zeros((0,) + tuple(p.slot.shape[1:]), p.slot.dtype)


def _rows_of(p: PushOfRows) -> Tuple[np.ndarray, np.ndarray]:
    """``push_and_prefetch``'s hand-out: (ids, rows) of this rank's gradient of one key (none
    after a local error). Runs in the engine operation that reads the gradient: it is
    written, and its ids are read in place (waiting for it here would wait behind the next
    backward pass, which waits for this operation). Works out the next ids where the
    caller left them to it."""
    if p.next_ids is None:
        p.next_ids = unique_ids(p.handed, p.slot.shape[0])
    if p.arrays is None:
        return np.zeros(0, np.int64), np.zeros((0,) + tuple(p.slot.shape[1:]), p.slot.dtype)
    if p.ids is None:
        p.ids = row_sparse_ids(p.arrays[0], wait=False)
        count_rows(p.slot, p.ids, 1)
    return local_rows(p.arrays, p.ids)


def _hand_out_packed(pushes: Sequence[PushOfRows], fetches, row_bytes: List[int],
                     failed: bool, group: Group) -> Tuple[np.ndarray, np.ndarray]:
    """The master's messages of ``push_and_prefetch``'s hand-out, packed for
    ``scatter_bytes``: to each rank the verdict (an int64), then each key's rows it asked
    for (zero bytes if the calls differed: nothing was fetched). Each rank's rows are
    taken from the servers' table straight into the send buffer, copied once. Waits for
    the servers' rows."""
    tables = []
    for p, (union, _, _, fetch) in zip(pushes, fetches):
        with group.watchdog.waiting(lambda: f"the parameter servers to return {len(union)} "
                                            f"prefetched rows of key {p.key!r}",
                                    collective=False, outward=True):
            tables.append(fetch() if fetch is not None else None)
    # each rank's message: the verdict, then each key's rows (keys × ranks bytes)
    key_bytes = np.array([counts * size for (_, _, counts, _), size in zip(fetches, row_bytes)],
                         np.int64).reshape(len(fetches), group.size)
    sizes = 8 + key_bytes.sum(axis=0)
    # (not zeroed page by page: every byte is written below)
    send = np.empty(int(sizes.sum()), np.uint8)
    if failed or any(table is None for table in tables):   # (no rows asked for, or calls differed)
        send[:] = 0
    starts = np.concatenate(([0], np.cumsum(sizes)[:-1]))
    for at in starts.tolist():
        send[at:at + 8].view(np.int64)[0] = failed
    offsets = starts + 8 + np.cumsum(key_bytes, axis=0) - key_bytes   # (each key's, per rank)
    for (union, nexts, counts, _), table, at in zip(fetches, tables, offsets):
        if not (failed or table is None):
            take_rows(union, table, nexts, counts, send, at)
    return send, sizes
