"""How a push's rows travel between ranks and the parameter servers (Parallax §3.1): the
mechanics under the sparse path (``sparse.py`` says where rows live and when each of these
runs; ``sparse_pull.py`` pulls rows).

- ``push_in_group``: rows summed with ``Allgatherv``; every rank applies the same lazy
  update to its own copy;
- ``push_to_servers``: the master gathers its group's rows, sums them and pushes them once
  (local aggregation); ``push_and_prefetch`` does the same and asks for the next step's
  rows in the same meeting, the pull's hint (``Prefetch``);
- ``pull_whole_table``: the servers' whole table on every rank (a dense weight whose rows
  live there).

Only the rows touched travel, so traffic scales with α, not with the table.
"""
from __future__ import annotations

import contextlib
import functools
import math
import threading
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import numpy as np
from mxnet.ndarray import NDArray

from ..errors import KeyValueError, explain
from ..tensor_collectives import Group, broadcast_array
from ..tensor_collectives.engine import EngineComm, when_ready
from ..tensor_collectives.ndarray_view import (empty_row_sparse, host_array, host_view,
                                                    ids_address, is_host, make_rows,
                                                    new_host_row_sparse, reads_row_ids_in_place,
                                                    row_sparse_ids, rows_made_later)
from ..tensor_collectives.rows import (allreduce_rows, gather_patiently, local_rows,
                                       scatter_bytes, sum_rows, take_rows, union_ids,
                                       unique_ids)
from ..tensor_collectives.watchdog import current_step, steps_differ
from ..tensor_collectives.operators import copy
from .calls import agree, digest
from .keys import Key, KeySlot
from .ps.link import ServerLink


def rows_live_on_servers(slot: KeySlot, num_servers: int, across_groups: bool) -> bool:
    """Where rows live (``sparse.py``): on the servers for sparse weights whenever there are
    servers, and for dense weights with sparse gradients when several client groups share
    them; otherwise in the group."""
    if num_servers == 0:
        return False
    return slot.sparse_weight or across_groups


def count_rows(slot: KeySlot, ids: np.ndarray, arrays: int) -> None:
    """Add this push's α (distinct rows this worker touched ÷ rows) to the key's tally;
    ``ids`` come from ``arrays`` row_sparse arrays (one array's are distinct already)."""
    slot.alpha_sum += (len(ids) if arrays == 1 else len(np.unique(ids))) / slot.shape[0]
    slot.alpha_steps += 1


# -- push --------------------------------------------------------------------------------
def push_in_group(key: Key, slot: KeySlot, arrays: Sequence[NDArray], ids: np.ndarray,
                  group: Group, updater) -> None:
    """Sum the rows over devices and the group; update (or overwrite) the local copy.
    ``ids``: the arrays' row ids, concatenated (``local_ids``)."""
    grad = allreduce_rows(arrays, group, name=f"key {key!r}", ids=ids)
    if updater is not None:
        updater(key, grad, slot.value)
    else:
        grad.copyto(slot.value)


def push_to_servers(key: Key, slot: KeySlot, arrays: Sequence[NDArray], ids: np.ndarray,
                    group: Group, servers: Optional[ServerLink]) -> None:
    """Local aggregation: the master gathers the group's rows, sums them and pushes the
    sum (an empty one too: in sync mode the servers wait for every group's push).
    ``ids``: the arrays' row ids, concatenated (``local_ids``)."""
    gathered = gather_patiently(local_rows(arrays, ids), group, root=0, name=f"key {key!r}")
    if servers is None:   # (the master holds the link)
        return
    (all_ids, counts), (all_rows, _) = gathered
    ids, rows = sum_rows(all_ids, all_rows, counts)
    group.bytes_sent["servers"] += ids.nbytes + rows.nbytes
    servers.push_rows(key, ids, rows, slot.shape, slot.dtype)


#: what a waiting ``Flag`` waits on (every flag's set wakes it)
_FLAG_SET = threading.Condition()


class Flag:
    """``threading.Event``'s ``set``, ``is_set`` and ``wait`` for a flag made every step and
    set once (a prefetch's rows, a pull's check): making an Event makes a Condition and its
    lock, many times this one's cost on the caller's thread, for a flag that is nearly
    always set before anyone looks. The rare waiter waits on one Condition shared by every
    flag."""

    __slots__ = ("_set",)

    def __init__(self):
        self._set = False

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        with _FLAG_SET:
            self._set = True
            _FLAG_SET.notify_all()

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Whether the flag is set, waiting up to ``timeout`` seconds for it (callers loop,
        so waking for another flag's set only returns early)."""
        with _FLAG_SET:
            if not self._set:
                _FLAG_SET.wait(timeout)
            return self._set


class Prefetch:
    """The rows a ``row_sparse_pull`` of the next step will ask for, on their way: written
    by an engine operation (the hand-out, or MXNet's pull), read by the caller's thread once
    ``ready`` is set, or copied by MXNet's engine behind that operation."""

    def __init__(self, key: Key, ids: Optional[np.ndarray], handed: Optional[np.ndarray],
                 array: NDArray, rows: Optional[np.ndarray] = None):
        #: this rank's sorted unique ids (None until MXNet's pull sorted them: pure PS)
        self.key, self.ids = key, ids
        #: the ids as ``prefetch_rows`` was handed them (one array, unsorted), if it was,
        #: and where they lie for the C++ helper's compare (``ids_address``)
        self.handed = handed
        self.handed_at = ids_address(handed) if handed is not None else None
        #: the rows as a host row_sparse array, made at the push and written by an engine
        #: operation: a pull of exactly ``ids`` queues an engine copy of it into its out,
        #: which waits in MXNet's engine for that operation, so nothing waits on the
        #: caller's thread (``RowPulls._pull_as_before``); ``rows``: a view of its rows
        #: (None until that operation gave the array its rows, where it does: ``make_rows``)
        self.array, self.rows = array, rows
        self.ready = Flag()
        #: why the rows could not be handed over (set with ``ready``; the reader raises it)
        self.error: Optional[str] = None
        #: whether its hand-out waits for nothing (the gradient's rows read in place): a
        #: later step's backward may then be queued before it runs
        self.waits_for_nothing = False


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


def push_and_prefetch(pushes: Sequence[PushOfRows], group: Group,
                      servers: Optional[ServerLink], comm: EngineComm, hand_out_group: Group,
                      call: Tuple[Optional[str], Optional[str]],
                      agree_in: Optional[Group] = None,
                      retired: Optional[list] = None) -> List[Prefetch]:
    """``push_to_servers`` of one or more keys, their agreement and the pull of the next
    step's rows in one meeting, all of it on the communication thread (``comm``) while every
    caller's thread goes on: every rank's rows and next ids of every key, and its call
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
    the gather has packed them. On the caller's thread the gather made a master wait there
    for the slowest rank's backward pass."""
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
    done = servers.defer() if servers is not None and group.rank == 0 else None

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
            with servers.deferred(hand_out_group.watchdog) if servers is not None \
                    else contextlib.nullcontext():
                served = serve(gathered)
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
        comm.submit(f"the prefetched rows of key(s) {keys}", [f.array for f in prefetches],
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
    costlier on the caller's thread than the empty array (``empty_row_sparse``)."""
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


# -- pull --------------------------------------------------------------------------------
def pull_whole_table(key: Key, slot: KeySlot, into: NDArray, group: Group,
                     servers: Optional[ServerLink]) -> None:
    """The servers' whole table into ``into`` on every rank (``pull`` of a dense weight
    whose rows live on the servers: Gluon pulls all of it, as with MXNet's own stores)."""
    if servers is not None:
        into[:] = servers.pull_rows(key, np.arange(slot.shape[0], dtype=np.int64), slot.shape,
                                    slot.dtype).reshape(into.shape)
    broadcast_array(into, 0, group, name=f"key {key!r} from the servers", patient=True)
