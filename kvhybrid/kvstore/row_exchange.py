"""How rows travel between ranks and the parameter servers (Parallax §3.1): the mechanics
under the sparse path (``sparse.py`` says where rows live and when each of these runs).

- ``push_in_group``: rows summed with ``Allgatherv``; every rank applies the same lazy
  update to its own copy;
- ``push_to_servers``: the master gathers its group's rows, sums them and pushes them once
  (local aggregation); ``push_and_prefetch`` does the same and asks for the next step's
  rows in the same meeting;
- ``pull_rows_from_servers`` / ``pull_whole_table``: the master asks the servers for the
  union of its group's rows (or the whole table) and hands each rank its own.

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
import mxnet as mx
from mxnet.ndarray import NDArray

from ..errors import KeyValueError, explain
from ..tensor_collectives import Group, broadcast_array
from ..tensor_collectives.engine import EngineComm, when_ready
from ..tensor_collectives.ndarray_view import (empty_row_sparse, host_array, host_row_sparse,
                                                    host_view, ids_address, is_host, make_rows,
                                                    new_host_row_sparse, reads_row_ids_in_place,
                                                    row_sparse_ids, rows_made_later)
from ..tensor_collectives.rows import (allreduce_rows, by_rank, gather_patiently, ids_in_table,
                                       local_rows, scatter_bytes, sum_rows, take_rows,
                                       union_ids, unique_ids)
from ..tensor_collectives.watchdog import current_step, steps_differ
from ..tensor_collectives.operators import copy
from .calls import agree, check_pulled_rows, digest, pull_tag
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
        #: caller's thread (``SparsePath._pull_as_before``); ``rows``: a view of its rows
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
    raises it (``SparsePath``), instead of leaving it to wait for rows that never come."""
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


class PullCheck:
    """One pull of prefetched rows, checked in the host barrier's meeting or a small
    allreduce (``needs_plain_pull``): did every rank find its rows among them, and did
    every rank pull the same key? The communication thread makes
    it in its turn (collectives start in one order on every rank), waiting without
    spinning, and the ranks that had their rows go on at once. If some rank did not (an
    evaluation batch) or its arguments were bad, the same job serves a plain pull there,
    on every rank's communication thread: the ranks agree on the call (a bad argument
    raises on every rank, nothing pushed), the master fetches the rows asked for and hands
    them out, into arrays this rank made for them (``targets``, which the engine copies
    into the outs once the job wrote them), or into ``rows`` for the caller's thread to
    write (a key pulled into several outs). No caller's thread
    waits for another rank's pull: an NMT step's push waited for the check in most steps
    when the plain pull was served on the caller's threads, at their next meeting."""

    def __init__(self, key: Key, work, signature: Optional[str], error: Optional[str],
                 covered: bool, sorted_ids: bool = True):
        #: the pull's checked work (None after a local error, whose text is ``error``)
        self.key, self.work, self.signature, self.error = key, work, signature, error
        self.covered = covered
        #: whether each out's ids in ``work`` are sorted and unique; else the checked ids as
        #: they came, which the served pull sorts on the communication thread (``_serve``)
        self.sorted_ids = sorted_ids
        #: the call's tag: ranks that bring the same one made the same call, so a served
        #: pull needs no agreement of its own
        self.tag = pull_tag(key, signature)
        #: whether the check found every rank's call the same and none failed (``_serve``)
        self.agreed = False
        self.done = Flag()   # the job completed (and served a plain pull if needed)
        #: per item of ``work``: (this rank's sorted unique ids, their rows) of a served pull
        self.rows: List[Tuple[np.ndarray, np.ndarray]] = []
        #: per item of ``work``, where a pull this rank needs served has one out and some
        #: ids per item: (a host row_sparse array for those ids, a view of its rows, None
        #: until the served pull gives it its rows: ``make_rows``), which the served pull
        #: fills (``copy_out``); else None
        self.targets: Optional[List[Tuple[NDArray, Optional[np.ndarray]]]] = None
        if not covered and error is None and work is not None \
                and all(len(o) == 1 and len(i[0]) for _, _, o, i in work):
            if rows_made_later():   # (the job makes their rows: their count is known there)
                self.targets = [(empty_row_sparse(s.shape, s.dtype), None) for _, s, _, _ in work]
            else:
                self._sort_ids()
                self.targets = [new_host_row_sparse(i[0], s.shape, s.dtype)
                                for _, s, _, i in self.work]

    def _sort_ids(self) -> None:
        """Each out's ids in ``work`` sorted and unique, if they came as checked only."""
        if not self.sorted_ids:
            self.work = [(k, slot, outs, [unique_ids(i, slot.shape[0]) for i in ids])
                         for k, slot, outs, ids in self.work]
            self.sorted_ids = True

    def start(self, comm: EngineComm, rows_group: Group, servers: Optional[ServerLink]) -> None:
        """Queue the check and, where some rank needs it, the plain pull on the
        communication thread: the rows travel over ``rows_group`` (a communicator of that
        thread), through its master's ``servers``. A covered pull on a group of one rank
        has its verdict already (its own flags); an uncovered one there takes the plain path
        on its caller's thread instead (``SparsePath._pull_prefetched``)."""
        group = comm.group
        if group.size == 1:
            self.done.set()
            return

        def check() -> None:
            if self.needs_plain_pull(group):
                with servers.deferred(rows_group.watchdog) if servers is not None \
                        else contextlib.nullcontext():
                    self._serve(group, rows_group, servers)
            self.done.set()

        name = f"the check of the prefetched rows of key {self.key!r}"
        if self.targets is None:
            comm.enqueue(name, check)
            return
        # an engine operation that writes the targets: copies out of them wait for it
        comm.submit(name, [a for a, _ in self.targets], check, cleanup=self._zero_unserved)

    def _serve(self, group: Group, rows_group: Group, servers: Optional[ServerLink]) -> None:
        """The plain pull, on the communication thread: agreement unless the check found the
        calls the same (raises on every rank if a rank's arguments were bad or the ranks'
        calls differ), then each key's rows through the master; a covered rank asks for
        none."""
        if not self.agreed:
            agree(group, "row_sparse_pull", self.signature, self.error,
                  f" of key {self.key!r}", patient=True)
        if not self.covered and self.work is not None:
            self._sort_ids()   # (here, off the caller's thread)
        for n, (k, slot, _, ids) in enumerate(self.work):
            into = None
            if self.targets is not None:
                array, into = self.targets[n]
                if into is None:   # (this job writes the target: it may give it its rows)
                    into = make_rows(array, ids[0])
                    self.targets[n] = (array, into)
            self.rows.append(fetch_rows_from_servers(k, slot, [] if self.covered else ids,
                                                     rows_group, servers, into=into))

    def needs_plain_pull(self, group: Group) -> bool:
        """Whether some rank of ``group`` needs the plain pull (``calls.check_pulled_rows``),
        noting whether the ranks' calls were the same and none failed (``agreed``)."""
        needs, self.agreed = check_pulled_rows(group, self.key, self.tag, self.covered,
                                               self.error, self.signature)
        return needs

    def copy_out(self) -> None:
        """Engine copies of the targets into the outs: each waits for the served pull that
        fills its target (``start``), the caller's thread for nothing. A pull whose calls
        differed leaves zeros there, and every rank raises at its next store call."""
        for (array, _), (_, _, outs, _) in zip(self.targets, self.work):
            copy(array, outs[0])

    def _zero_unserved(self) -> None:
        """After the served pull's job, on the communication thread: targets it did not
        fill (it failed) hold zeros, not whatever their memory held."""
        if not self.done.is_set():
            for _, rows in self.targets:   # (an array given no rows reads as zeros)
                if rows is not None:
                    rows.fill(0)

    def write_rows(self) -> None:
        """A served pull's rows into its outs (on the caller's thread, once ``done``)."""
        for (_, slot, outs, ids), (mine, rows) in zip(self.work, self.rows):
            write_rows(slot, outs, ids, mine, rows)


def rows_from_prefetch(prefetch: Prefetch, outs: List[NDArray], ids: List[np.ndarray],
                       slot: KeySlot) -> None:
    """Write the prefetched rows into ``outs`` (``ids``: each out's sorted unique ids, which
    the prefetch must hold: ``prefetch_holds``)."""
    for o, i in zip(outs, ids):
        if _same_ids(i, prefetch.ids):
            copy(prefetch.array, o)   # (the engine copies it; nothing writes it again)
            continue
        part = prefetch.rows[np.searchsorted(prefetch.ids, i)]
        host_row_sparse(part, i, slot.shape, slot.dtype).copyto(o)


def prefetch_holds(prefetch: Prefetch, ids: List[np.ndarray]) -> bool:
    """Whether the prefetched rows include every one of ``ids`` (sorted unique)."""
    if not len(prefetch.ids):   # (a push that asked for no rows: a plain Trainer's)
        return not any(len(i) for i in ids)
    return all(_same_ids(i, prefetch.ids)   # (the usual case, and cheaper)
               or not len(np.setdiff1d(i, prefetch.ids, assume_unique=True)) for i in ids)


def _same_ids(ids: np.ndarray, prefetched: np.ndarray) -> bool:
    """Whether ``ids`` are the prefetched ids: the very array when the pull's ids were the
    ones handed over (``checked_row_ids`` returns it then), else compared."""
    return ids is prefetched or np.array_equal(ids, prefetched)


# -- pull --------------------------------------------------------------------------------
def pull_whole_table(key: Key, slot: KeySlot, into: NDArray, group: Group,
                     servers: Optional[ServerLink]) -> None:
    """The servers' whole table into ``into`` on every rank (``pull`` of a dense weight
    whose rows live on the servers: Gluon pulls all of it, as with MXNet's own stores)."""
    if servers is not None:
        into[:] = servers.pull_rows(key, np.arange(slot.shape[0], dtype=np.int64), slot.shape,
                                    slot.dtype).reshape(into.shape)
    broadcast_array(into, 0, group, name=f"key {key!r} from the servers", patient=True)


def _unique_ids(row_ids: NDArray, rows: int, key: Key, known=None) -> np.ndarray:
    """``row_ids``' sorted unique ids, checked to lie in the table (a new array, never a
    view of ``row_ids``); int64 host ids are read in place, a pull of every row's too."""
    if np.dtype(row_ids.dtype) == np.int64 and row_ids.stype == "default" and is_host(row_ids):
        row_ids.wait_to_read()
        ids = host_view(row_ids, np.int64, row_ids.size)
    else:
        ids = row_ids.asnumpy().astype(np.int64).reshape(-1)
    if known is not None and np.array_equal(ids, known[0]):   # checked when handed over
        return known[1]
    ids = unique_ids(ids, rows)   # (in the C++ helper where it runs; numpy's sort else)
    if len(ids) and (ids[0] < 0 or ids[-1] >= rows):
        raise KeyValueError(f"row_ids of key {key!r} hold {ids[0] if ids[0] < 0 else ids[-1]}, "
                            f"outside the table's {rows} rows: pass ids in [0, {rows})")
    return ids


#: id dtypes the C++ helper checks in place
_IDS_READ_IN_PLACE = tuple(np.dtype(t) for t in (np.int64, np.int32, np.float32, np.float64))


def _ids_in_table(row_ids: NDArray, rows: int, key: Key) -> np.ndarray:
    """``row_ids`` as they came, copied flat as int64 and checked to lie in the table: one
    pass of the C++ helper over host ids read in place, else numpy, which names a bad id."""
    dtype = np.dtype(row_ids.dtype)
    if dtype in _IDS_READ_IN_PLACE and row_ids.stype == "default" and is_host(row_ids):
        row_ids.wait_to_read()
        values = host_view(row_ids, dtype, row_ids.size)
    else:
        values = row_ids.asnumpy().reshape(-1)
    ids = ids_in_table(values, rows)
    if ids is not None:
        return ids
    ids = values.astype(np.int64).reshape(-1)
    if len(ids) and int(ids.view(np.uint64).max()) >= rows:   # (a negative id too)
        bad = ids.min() if ids.min() < 0 else ids.max()
        raise KeyValueError(f"row_ids of key {key!r} hold {bad}, outside the table's {rows} "
                            f"rows: pass ids in [0, {rows})")
    return ids


def checked_row_ids(key: Key, slot: KeySlot, outs: List[NDArray], row_ids: List[NDArray],
                    known: Optional[Tuple[np.ndarray, np.ndarray]] = None,
                    sort: bool = True) -> List[np.ndarray]:
    """Each out's sorted unique ids (``sort``; else its ids as they came, checked to lie in
    the table, for a pull served on the communication thread, which sorts them there);
    raises KeyValueError on bad arguments. ``known``: (ids, their sorted unique ids),
    checked already: row_ids equal to those (in their order: the ids of the batch
    ``prefetch_rows`` was handed) are not sorted again."""
    if len(row_ids) != len(outs):
        raise KeyValueError(f"row_sparse_pull of key {key!r} got {len(outs)} out array(s) and "
                            f"{len(row_ids)} row_ids: pass one row_ids array per out array")
    for o in outs:
        if o.stype != "row_sparse":
            raise KeyValueError(f"out of row_sparse_pull of key {key!r} is {o.stype}: pass "
                                "row_sparse arrays (or use pull for dense ones)")
    for r in row_ids:
        if not isinstance(r, NDArray):
            raise KeyValueError(f"row_ids of key {key!r} must be NDArrays, got "
                                f"{type(r).__name__}")
    if not sort:
        return [_ids_in_table(r, slot.shape[0], key) for r in row_ids]
    return [_unique_ids(r, slot.shape[0], key, known) for r in row_ids]


def pull_rows_local(slot: KeySlot, outs: List[NDArray], ids: List[np.ndarray]) -> None:
    """Rows of the local copy (every rank holds the same one)."""
    for o, i in zip(outs, ids):
        if len(i):
            rows = mx.nd.take(slot.value, mx.nd.array(i, ctx=slot.value.context, dtype="int64"))
        else:  # MXNet's operators reject empty arrays
            rows = np.zeros((0,) + slot.shape[1:], slot.dtype)
        mx.nd.sparse.row_sparse_array((rows, i), shape=slot.shape, ctx=o.context,
                                      dtype=slot.dtype).copyto(o)


def fetch_rows_from_servers(key: Key, slot: KeySlot, ids: List[np.ndarray], group: Group,
                            servers: Optional[ServerLink],
                            into: Optional[np.ndarray] = None) -> Tuple[np.ndarray, np.ndarray]:
    """(this rank's sorted unique ids, their rows): the master pulls the union of the
    group's ids once and hands each rank its rows (``ids``: each out's, none for a rank
    that only takes part; ``into``: where this rank's rows go, else a new array). A rank
    that wants every row (an eval's or a checkpoint's pull) sends a marker, not the table's
    length of ids."""
    mine = (ids[0] if len(ids) == 1 else np.unique(np.concatenate(ids))) if ids \
        else np.zeros(0, np.int64)   # (one out's ids are sorted and unique already)
    rows = slot.shape[0]
    sent = _EVERY_ROW if len(mine) == rows else mine   # (sorted unique ids in [0, rows))
    gathered = gather_patiently([sent], group, root=0, name=f"the row ids of key {key!r}")
    packed = None
    if group.rank == 0:
        (whole, counts), = gathered
        packed = _rows_for_each_rank(key, slot, whole, counts.astype(np.int64), servers)
    got = into if into is not None else np.empty((len(mine),) + slot.shape[1:], slot.dtype)
    scatter_bytes(packed, got, group, name=f"the rows of key {key!r}")
    return mine, got


#: what a rank that wants every row of a table sends in place of its ids
_EVERY_ROW = np.array([-1], np.int64)
_EVERY_ROW.flags.writeable = False


def _rows_for_each_rank(key: Key, slot: KeySlot, whole: np.ndarray, counts: np.ndarray,
                        servers: Optional[ServerLink]) -> Tuple[np.ndarray, np.ndarray]:
    """The master's part of ``fetch_rows_from_servers``: the union of the ranks' ids (each
    rank's ``counts[r]`` of ``whole``, sorted unique, or the marker of every row) pulled
    once, each rank's rows cut from it straight into the send buffer, packed for
    ``scatter_bytes``."""
    starts = np.concatenate(([0], np.cumsum(counts)[:-1])).astype(np.int64)
    every = np.array([n == 1 and whole[at] == -1 for at, n in zip(starts.tolist(),
                                                                  counts.tolist())], bool)
    some = ~every
    if every.any():   # (the others' ids apart from the markers; the union is every row)
        part = np.concatenate([ids for ids, e in zip(by_rank(whole, counts), every) if not e]
                              + [np.zeros(0, np.int64)])
        union = np.arange(slot.shape[0], dtype=np.int64)
    else:
        part, union = whole, union_ids(whole, counts)
    table = (servers.pull_rows(key, union, slot.shape, slot.dtype) if len(union)
             else np.zeros((0,) + slot.shape[1:], slot.dtype))
    table = np.ascontiguousarray(table)
    row_bytes = slot.dtype.itemsize * math.prod(slot.shape[1:])
    sizes = np.where(every, slot.shape[0], counts).astype(np.int64) * row_bytes
    offsets = np.concatenate(([0], np.cumsum(sizes)[:-1])).astype(np.int64)
    send = np.empty(int(sizes.sum()), np.uint8)
    if some.any():
        take_rows(union, table, part, counts[some], send, offsets[some])
    for at in offsets[every].tolist():   # (every row: the table as it came)
        send[at:at + table.nbytes] = table.reshape(-1).view(np.uint8)
    return send, sizes


#: row ids MXNet's pull takes as a user hands them: int64 as documented, float32 as Gluon
#: hands a batch's ids to ``dist_sync`` (others go as the checked int64 ids)
_IDS_AS_HANDED = (np.dtype(np.int64), np.dtype(np.float32))


def pull_rows_alone(key: Key, out: NDArray, ids: np.ndarray, row_ids: Optional[NDArray],
                    servers: ServerLink, group: Group) -> None:
    """A plain pull of a client group of one rank (``SparsePath._pull_rows``): the rows
    ``ids`` (sorted unique, checked) into ``out`` through MXNet's engine, as ``dist_sync``
    pulls them, with nothing waiting on any thread of ours; the group's watchdog times the
    servers' answer. ``row_ids``: the call's array of those ids, if it had one, handed to
    MXNet as it came (its engine sorts them, as for ``dist_sync``)."""
    if not len(ids):   # (MXNet's pull rejects no ids: an out with no rows)
        new_host_row_sparse(ids, out.shape, out.dtype)[0].copyto(out)
        return
    as_handed = row_ids is not None and np.dtype(row_ids.dtype) in _IDS_AS_HANDED
    servers.pull_rows_in_engine(key, row_ids if as_handed else host_array(ids, np.int64), out)
    done = group.watchdog.watch(lambda: f"the parameter servers' rows of key {key!r}",
                                outward=True)
    when_ready(f"rows of key {key!r}", [out], done)


def write_rows(slot: KeySlot, outs: List[NDArray], ids: List[np.ndarray], mine: np.ndarray,
               rows: np.ndarray) -> None:
    """``fetch_rows_from_servers``'s rows into the outs (``ids``: each out's)."""
    for o, i in zip(outs, ids):
        part = rows if i is mine else rows[np.searchsorted(mine, i)]
        host_row_sparse(part, i, slot.shape, slot.dtype).copyto(o)


def pull_rows_from_servers(key: Key, slot: KeySlot, outs: List[NDArray], ids: List[np.ndarray],
                           group: Group, servers: Optional[ServerLink]) -> None:
    """The master pulls the union of the group's ids once and hands each rank its rows."""
    mine, rows = fetch_rows_from_servers(key, slot, ids, group, servers)
    write_rows(slot, outs, ids, mine, rows)
