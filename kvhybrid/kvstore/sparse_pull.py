"""The pull of a row_sparse key's rows: ``row_sparse_pull`` (Gluon's before each forward
pass, Module's in ``prepare``), and a ``pull`` of every row for eval and checkpoints.

One path for every client: the call's checks (once per repeated call: ``Calls.recall``),
its ids, then the rows from where they live:

- **in the group** (every rank holds the table): its own copy (``pull_rows_local``);
- **on the servers**: through the row group's master, who pulls the union of the group's
  ids once and hands each rank its rows (``fetch_rows_from_servers``). A push of the key
  leaves a *hint* (``Prefetch``): the rows ``kvhybrid.prefetch`` asked for,
  on their way, or none. A pull that the hint covers takes those rows and goes on; any
  other has the communication thread serve it (``PullCheck``; a group of one rank, MXNet's
  engine), so no caller's thread waits for another rank's pull. Before a key's first push
  there is no hint: the pull is agreed and served on the caller's thread (``_agreed_pull``,
  ``_pull_rows``).
"""
from __future__ import annotations

import collections
import contextlib
import functools
import logging
import math
from typing import Deque, Dict, List, Optional, Tuple

import numpy as np
import mxnet as mx
from mxnet.ndarray import NDArray

from ..errors import KeyValueError, KVHybridError
from ..tensor_collectives import Group
from ..tensor_collectives.engine import EngineComm, Flag, when_ready
from ..tensor_collectives.ndarray_view import (copy_if_ids_equal, empty_row_sparse, host_array,
                                                    host_row_sparse, host_view, ids_address,
                                                    ids_equal,
                                                    ids_in_table_of, is_host, make_rows,
                                                    new_host_row_sparse, rows_made_later,
                                                    takes_rows_in_place, wait_to_write)
from ..tensor_collectives.operators import copy
from ..tensor_collectives.ops import broadcast_view
from ..tensor_collectives.rows import (by_rank, gather_patiently, ids_in_table, scatter_bytes,
                                       take_rows, union_ids, unique_ids)
from .calls import Calls, agree, check_pulled_rows, keys_text, pull_tag
from .keys import Key, KeySlot, check_pull_out, is_key, lookup, pairs
from .placement import Placement
from .ps.link import ServerLink

log = logging.getLogger("kvhybrid")


class Prefetch:
    """A push's *hint* for the next pull: the rows a ``row_sparse_pull`` of the next step
    will ask for, on their way. ``sparse_push.py`` makes it; an engine operation (the
    hand-out, or MXNet's pull) writes it; the caller's thread reads it once ``ready`` is
    set, or MXNet's engine copies it behind that operation."""

    def __init__(self, key: Key, ids: Optional[np.ndarray], handed: Optional[np.ndarray],
                 array: Optional[NDArray], rows: Optional[np.ndarray] = None):
        #: this rank's sorted unique ids (None until MXNet's pull sorted them: pure PS)
        self.key, self.ids = key, ids
        #: the ids as ``prefetch_rows`` was handed them (one array, unsorted), if it was,
        #: and where they lie for the C++ helper's compare (``ids_address``)
        self.handed = handed
        self.handed_at = ids_address(handed) if handed is not None else None
        #: the rows as a host row_sparse array, made at the push and written by an engine
        #: operation: a pull of exactly ``ids`` queues an engine copy of it into its out,
        #: which waits in MXNet's engine for that operation, so nothing waits on the
        #: caller's thread (``RowPulls._pull_as_before``); None where no rows were asked
        #: for; ``rows``: a view of its rows (None until that operation gave the array its
        #: rows, where it does: ``make_rows``)
        self.array, self.rows = array, rows
        self.ready = Flag()
        #: why the rows could not be handed over (set with ``ready``; the reader raises it)
        self.error: Optional[str] = None
        #: whether its hand-out waits for nothing (the gradient's rows read in place): a
        #: later step's backward may then be queued before it runs
        self.waits_for_nothing = False

    def holds(self, ids: List[np.ndarray]) -> bool:
        """Whether the rows came for every one of ``ids`` (each out's, sorted unique)."""
        if not len(self.ids):   # (a push that asked for no rows: a plain Trainer's)
            return not any(len(i) for i in ids)
        return all(self._same_ids(i)   # (the usual case, and cheaper)
                   or not len(np.setdiff1d(i, self.ids, assume_unique=True)) for i in ids)

    def write_rows(self, outs: List[NDArray], ids: List[np.ndarray], slot: KeySlot) -> None:
        """The rows into ``outs`` (``ids``: each out's sorted unique ids, which it must
        hold: ``holds``)."""
        for o, i in zip(outs, ids):
            if self.array is not None and self._same_ids(i):
                copy(self.array, o)   # (the engine copies it; nothing writes it again)
                continue
            part = self.rows[np.searchsorted(self.ids, i)]
            host_row_sparse(part, i, slot.shape, slot.dtype).copyto(o)

    def _same_ids(self, ids: np.ndarray) -> bool:
        """Whether ``ids`` are the rows' ids: the very array when the pull's ids were the
        ones handed over (``checked_row_ids`` returns it then), else compared."""
        return ids is self.ids or np.array_equal(ids, self.ids)


class RowPulls:
    """The row_sparse pulls of one store (see the module docstring), and the hints its
    pushes leave for them (``hints``)."""

    def __init__(self, placement: Placement, slots: Dict[Key, KeySlot], calls: Calls,
                 engine: Optional[EngineComm]):
        self.placement, self.slots, self.calls, self.engine = placement, slots, calls, engine
        #: per key, the rows its last push asked for, on their way (``Prefetch``)
        self.hints: Dict[Key, Prefetch] = {}
        self._unsettled: Deque[PullCheck] = collections.deque()   # see settle
        #: where the communication thread hands rows out (a push's hand-out, a served pull):
        #: the engine's group, or with host masters a duplicate of this rank's host group
        #: (its own communicator: the caller's thread meets the host on the other at the
        #: same time)
        self.hand_out_group = None
        if engine is not None:
            row_group = placement.row_group
            self.hand_out_group = (engine.group if row_group is placement.group else
                                   row_group.derived(row_group.comm, f"{row_group.name}-engine"))
            self.hand_out_group.algorithms.patient = True

    def pull(self, key, out, row_ids) -> None:
        """Write the rows ``row_ids`` of ``key`` into the row_sparse arrays ``out``. A loop's
        repeated pull of the ids it handed over replays its last pull's checks
        (``_pull_as_before``); a pull of a key whose next rows were fetched ahead takes them,
        or has them served on the communication thread (``_pull_prefetched``); any other
        pull is agreed, then served by where its rows live (``_pull_rows``)."""
        prefetch = self.hints.get(key) if is_key(key) else None
        if prefetch is not None and self._pull_as_before(key, prefetch, out, row_ids):
            return
        build = functools.partial(self._checked_pull, key, out, row_ids, prefetch)
        # (one key's one array of ids: what a pull through MXNet's engine hands it)
        one = row_ids if isinstance(row_ids, mx.nd.NDArray) else None
        if prefetch is not None:
            self._pull_prefetched(key, build, one)
        else:
            self._pull_rows(self._agreed_pull(key, build), one)

    def _checked_pull(self, key, out, row_ids, prefetch: Optional[Prefetch],
                      sort: bool = True) -> tuple:
        """A ``row_sparse_pull``'s local checks: ``([(key, slot, outs, each out's sorted
        unique ids)], signature)``, or KeyValueError; with ``sort`` False each out's ids as
        they came, checked to lie in the table. The outs' checks run once per repeated call
        (the memo); ids equal to those ``prefetch`` was handed are not sorted again (they
        are known once its rows came: this runs after that)."""
        known = (prefetch.handed, prefetch.ids) if prefetch is not None \
            and prefetch.handed is not None and prefetch.ids is not None else None
        if out is None or row_ids is None:
            raise KeyValueError(f"row_sparse_pull of key {key!r} needs out= (row_sparse "
                                "arrays) and row_ids= (the rows to fetch)")
        checked = self.calls.recall("row_sparse_pull", key, out) or self.calls.remember(
            "row_sparse_pull", key, out, self._checked_outs(key, out))
        outs, slots, signature, _ = checked
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
            work.append((k, slot, o, checked_row_ids(k, slot, o, ids, known, sort)))
        return work, signature

    def _checked_outs(self, key, out) -> tuple:
        """(outs by key, their slots, the call's signature, whether one key pulls into one
        row_sparse out, which a repeated pull may replay: ``_pull_as_before``): the same on
        every call with these outs."""
        outs = pairs(key, out, "out", sparse_ok=True)
        slots = []
        for k, o in outs:
            slots.append(lookup(self.slots, k))
            check_pull_out(k, slots[-1], o)
        replayable = len(outs) == 1 and len(outs[0][1]) == 1 \
            and outs[0][1][0].stype == "row_sparse"
        return outs, slots, f"row_sparse_pull {keys_text(outs)}", replayable

    def _pull_as_before(self, key, prefetch: Prefetch, out, row_ids) -> bool:
        """A training loop's pull, replayed: the ids ``prefetch_rows`` was handed, in their
        order, into one row_sparse out whose checks passed at an earlier pull (the call's
        memo: ``Calls.recall``). Returns False, having done nothing, for any other pull
        (the full path checks it).

        It waits for nothing, as ``dist_sync``'s pull: the rows' engine copy waits in MXNet's
        engine for the operation that writes them (``Prefetch.array``), so a loop that never
        calls ``waitall`` runs ahead. If the hand-out fails, the rows read as zeros and every
        rank raises at its next call."""
        if prefetch.handed is None or prefetch.error is not None:
            # (no ids handed: no rows, nor an array, to replay; a failed pure-PS hand-over:
            # the full path raises it)
            return False
        checked = self.calls.recall("row_sparse_pull", key, out)
        if isinstance(row_ids, (list, tuple)):
            row_ids = row_ids[0] if len(row_ids) == 1 else None
        if checked is None or not isinstance(row_ids, mx.nd.NDArray):
            return False
        outs, slots, signature, replayable = checked
        if not replayable:
            return False
        out, slot = outs[0][1][0], slots[0]
        if self.slots.get(key) is not slot:   # (the key was set up again since)
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
        self._forget_settled()
        check = PullCheck(key, [(key, slot, [out], [prefetch.ids])], signature, None, True)
        check.start(self.engine, self.hand_out_group, self.placement.servers)
        self._unsettled.append(check)
        return True

    def pull_table(self, key: Key, slot: KeySlot, into: NDArray) -> None:
        """The whole table of a key whose rows live on the servers, on every rank (a dense
        weight's ``pull``, a checkpoint's, or its first push on the 'dense' route)."""
        group, servers = self.placement.row_group, self.placement.servers
        if into.stype == "default" and is_host(into) and np.dtype(into.dtype) == slot.dtype:
            wait_to_write(into)   # (then broadcast into its memory)
            fetch_rows_from_servers(key, slot, None, group, servers,
                                    into=host_view(into).reshape(slot.shape))
            return
        _, table = fetch_rows_from_servers(key, slot, None, group, servers)
        into[:] = table.reshape(into.shape)

    def pull_every_row(self, key, out) -> None:
        """A ``pull``'s row_sparse outs (``ignore_sparse=False``; its dense outs were pulled
        and the call checked): the whole value, a ``row_sparse_pull`` of every row."""
        for k, outs in pairs(key, out, "out", sparse_ok=True):
            rows = [o for o in outs if o.stype == "row_sparse"]
            if rows:
                every_row = mx.nd.arange(self.slots[k].shape[0], dtype="int64")
                self.pull(k, rows, [every_row] * len(rows))

    def _agreed_pull(self, key, build) -> list:
        """A pull's checked work (``build``: ``_checked_pull``), agreed by the group where
        its rows come through the master; every rank holding every row has nothing to agree
        on."""
        if not self.placement.config.num_servers:
            try:
                return build()[0]
            except KeyValueError as exc:
                raise KeyValueError(f"row_sparse_pull failed: {exc}") from None
        return self.calls.check("row_sparse_pull", build, f" of key {key!r}")

    def _pull_rows(self, work, row_ids: Optional[mx.nd.NDArray],
                   sorted_ids: bool = True) -> None:
        """A checked and agreed pull, each key by where its rows live: every rank's own copy
        (``pull_rows_local``), or through the row group's master, who pulls the union of
        the group's ids once and hands each rank its rows (``fetch_rows_from_servers``). A
        row group of one rank (pure PS) whose table is in one piece on dist_sync servers
        pulls through MXNet's engine, as ``dist_sync`` does (``pull_rows_alone``), where a
        communication thread runs (without one the store keeps off MXNet's engine).
        ``row_ids``: the call's one array of ids, if it had one; ``sorted_ids``: whether
        ``work``'s are sorted and unique (else checked only: MXNet's pull takes them so)."""
        row_group, servers = self.placement.row_group, self.placement.servers
        for k, slot, outs, ids in work:
            if (slot.rows_on_servers and row_group.size == 1 and len(outs) == 1
                    and self.engine is not None and servers is not None
                    and servers.rows_alone(k)):
                pull_rows_alone(k, outs[0], ids[0], row_ids, servers, row_group)
                continue
            if not sorted_ids:
                ids = [unique_ids(i, slot.shape[0]) for i in ids]
            if not slot.rows_on_servers:
                pull_rows_local(slot, outs, ids)
            else:   # (the master pulls the union of the group's ids once)
                mine, rows = fetch_rows_from_servers(k, slot, ids, row_group, servers)
                write_rows(slot, outs, ids, mine, rows)

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
        prefetch = self.hints[key]
        alone, unasked = self.engine.group.size == 1, _asked_for_none(prefetch)
        if unasked and (alone or prefetch.waits_for_nothing):
            # no rows to wait for: a group's check queues behind the push, whose differing
            # calls raise here or at a later call; a rank alone raises a failed hand-over
            # at its next push
            self.engine.check()
        else:   # the rows first: a push whose calls differed raises here, on every rank,
            self._wait_for_prefetch(prefetch)   # before any meeting (its verdict comes with them)
        # rows asked for none: only a pull of no rows is covered, so the ids are sorted
        # where they are served (a group's served pull, MXNet's pull of a rank alone)
        sort = not unasked
        try:
            work, signature = build(sort=sort)
            error, covered = None, all(prefetch.holds(ids) for *_, ids in work)
        except KeyValueError as exc:
            work, signature, error, covered = None, None, str(exc), False
        if not covered and self.engine.group.size == 1:   # no one to check with or to wait for
            # (a failed call raises as a plain pull's does)
            if error is not None:   # (raises as a plain pull does)
                work, sort = self._agreed_pull(key, build), True
            self._pull_rows(work, row_ids, sorted_ids=sort)
            return
        check = PullCheck(key, work, signature, error, covered, sorted_ids=sort)
        check.start(self.engine, self.hand_out_group, self.placement.servers)
        self._unsettled.append(check)
        if covered:
            for k, slot, outs, ids in work:
                prefetch.write_rows(outs, ids, slot)
            return
        if check.targets is not None:   # (the served rows come through the engine)
            check.copy_out()
            return
        self._wait_for_check(check)   # (raises the job's error: a bad argument somewhere)
        check.write_rows()

    def settle(self) -> None:
        """Wait for the checks of the prefetched pulls made so far (``_pull_prefetched``),
        and the plain pulls they served: before a meeting on the caller's thread, so that
        whatever it sends the servers comes after them. Raises the error of a check that
        failed (a rank's bad argument)."""
        while self._unsettled:
            self._wait_for_check(self._unsettled[0])
            self._unsettled.popleft()

    def _wait_for_check(self, check: PullCheck) -> None:
        """Until the check's job is done (it may serve a plain pull)."""
        if check.done.is_set():   # (the usual case: made while the step went on)
            return
        with self.placement.group.watchdog.waiting_behind(
                lambda: f"the communication thread's check of the prefetched rows of key "
                        f"{check.key!r} (and the plain pull it serves)"):
            while not check.done.wait(0.05):
                self.engine.check()   # its thread failed: the check will not be made

    def _forget_settled(self) -> None:
        """Drop the checks made already (a loop of prefetched pulls that never meets)."""
        while self._unsettled and self._unsettled[0].done.is_set():
            self._unsettled.popleft()

    def _wait_for_prefetch(self, prefetch: Prefetch) -> None:
        if prefetch.ready.is_set() and prefetch.error is None:   # (the usual case)
            self.engine.check()
            return
        with self.placement.group.watchdog.waiting_behind(
                lambda: f"the prefetched rows of key {prefetch.key!r}"):
            while not prefetch.ready.wait(0.05):
                self.engine.check()   # its thread failed: the rows will not come
        self.engine.check()
        if prefetch.error is not None:
            raise KVHybridError(prefetch.error)

    def leave_hint(self, key: Key, hint: Prefetch) -> None:
        """A push's rows for the next pull of ``key``, on their way."""
        self.hints[key] = hint

    def take_hint(self, key: Key) -> Optional[Prefetch]:
        """Drop ``key``'s hint (a push replaces the rows it holds); returns it, if any."""
        return self.hints.pop(key, None)

    def forget(self) -> None:
        """Drop rows fetched ahead (their values are about to be replaced)."""
        self.hints.clear()

    def wait_for_hints(self) -> None:
        """Until every push's hand-out ran (it counts the rows it pushed)."""
        for hint in list(self.hints.values()):
            self._wait_for_prefetch(hint)

    def close(self) -> None:
        """Forget what is pending (after the communication thread stopped)."""
        if self.hand_out_group is not None and self.hand_out_group is not self.engine.group:
            self.hand_out_group.close()
        self._unsettled.clear()
        self.hints.clear()


def _asked_for_none(prefetch: Prefetch) -> bool:
    """Whether ``prefetch`` is a push's that asked for no rows (a plain Trainer's or
    Module's step: ``_hands_out_unasked``). In a group a pull need not wait for it where it
    reads its gradient in place (``waits_for_nothing``: one that reads it through MXNet
    would wait for the next backward, which waits for the pull's check behind it)."""
    return prefetch.handed is None and prefetch.ids is not None and not len(prefetch.ids)


def _holds(row_ids: mx.nd.NDArray, ids: np.ndarray) -> bool:
    """Whether ``row_ids`` hold ``ids``, in their order (``checked_row_ids`` would find
    them equal; ids that are not whole numbers are left to it): read in place where the C++
    helper can."""
    same = ids_equal(row_ids, ids)
    if same is not None:
        return same
    values = row_ids.asnumpy().reshape(-1)
    return values.shape == ids.shape and bool((values == ids).all())


class PullCheck:
    """One pull of a key with a hint, checked in the host barrier's meeting or a small
    allreduce (``needs_plain_pull``): did every rank find its rows in its hint, and did
    every rank pull the same key? The communication thread makes it in its turn
    (collectives start in one order on every rank), waiting without spinning, and the
    ranks that had their rows go on at once. If some rank did not (an evaluation batch, a
    push that asked for no rows) or its arguments were bad, the same job serves a plain
    pull there, on every rank's communication thread: the ranks agree on the call (a bad
    argument raises on every rank, nothing pushed), the master fetches the rows asked for
    and hands them out, into arrays this rank made for them (``targets``, which the engine
    copies into the outs once the job wrote them), or into ``rows`` for the caller's
    thread to write (a key pulled into several outs). No caller's thread waits for
    another rank's pull."""

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
        #: fills: the out itself where it can take them so, else an array the engine copies
        #: into the out (``copy_out``); else None
        self.targets: Optional[List[Tuple[NDArray, Optional[np.ndarray]]]] = None
        if not covered and error is None and work is not None \
                and all(len(o) == 1 and len(i[0]) for _, _, o, i in work):
            if rows_made_later():   # (the job makes their rows: their count is known there)
                distinct = len({id(o[0]) for _, _, o, _ in work}) == len(work)
                self.targets = [
                    (o[0] if distinct and takes_rows_in_place(o[0], s.shape, s.dtype)
                     else empty_row_sparse(s.shape, s.dtype), None) for _, s, o, _ in work]
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
        on its caller's thread instead (``RowPulls._pull_prefetched``)."""
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
        """Engine copies of the targets into the outs that are not their own targets: each
        waits for the served pull that fills its target (``start``), the caller's thread for
        nothing. A pull whose calls differed leaves zeros there, and every rank raises at its
        next store call."""
        for (array, _), (_, _, outs, _) in zip(self.targets, self.work):
            if array is not outs[0]:
                copy(array, outs[0])

    def _zero_unserved(self) -> None:
        """After the served pull's job, on the communication thread: targets it did not
        fill (it failed) hold zeros, not whatever their memory held (an out its last rows)."""
        if not self.done.is_set():
            for array, rows in self.targets:
                if rows is not None:
                    rows.fill(0)
                elif rows_made_later():   # (an array given no rows reads as zeros)
                    try:
                        make_rows(array, _NO_IDS)
                    except RuntimeError:   # (the job's error is raised at the next call)
                        log.exception("kvhybrid: the failed pull of key %r left its out's "
                                      "last rows", self.key)

    def write_rows(self) -> None:
        """A served pull's rows into its outs (on the caller's thread, once ``done``)."""
        for (_, slot, outs, ids), (mine, rows) in zip(self.work, self.rows):
            write_rows(slot, outs, ids, mine, rows)


def _unique_ids(row_ids: NDArray, rows: int, key: Key, known=None) -> np.ndarray:
    """``row_ids``' sorted unique ids, checked to lie in the table (a new array, never a
    view of ``row_ids``)."""
    ids = _ids_in_table(row_ids, rows, key)
    if known is not None and np.array_equal(ids, known[0]):   # checked when handed over
        return known[1]
    return unique_ids(ids, rows)   # (in the C++ helper where it runs; numpy's sort else)


def _ids_in_table(row_ids: NDArray, rows: int, key: Key) -> np.ndarray:
    """``row_ids`` as they came, copied flat as int64 and checked to lie in the table: in
    one call of the C++ helper where they are host ids, else through numpy."""
    got = ids_in_table_of(row_ids, rows)
    if got is not None:
        return got
    return table_ids(row_ids.asnumpy().reshape(-1), rows, lambda bad: KeyValueError(
        f"row_ids of key {key!r} hold {bad}, outside the table's {rows} rows: pass ids in "
        f"[0, {rows})"))


def table_ids(values: np.ndarray, rows: int, error) -> np.ndarray:
    """``values`` (a batch's row ids, any shape) copied flat as int64, each checked to lie
    in [0, ``rows``): one pass of the C++ helper where it can, else numpy, which finds the
    bad id for ``error(id)``, the KeyValueError raised."""
    got = ids_in_table(values, rows)
    if got is not None:
        return got
    got = np.array(values, dtype=np.int64).reshape(-1)
    # one pass: a negative id read as unsigned is past any table's rows
    if len(got) and int(got.view(np.uint64).max()) >= rows:
        raise error(int(got.min() if got.min() < 0 else got.max()))
    return got


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
    """Rows of the local copy (every rank holds the same one). A host table's are read from
    its memory once the last push's update is written: into the out itself where it can take
    them (that push waited for the group on this thread already: so did the reads of the out
    before it), else into a new array that MXNet's engine copies there. Elsewhere MXNet's
    ``take`` makes them. (The ids were checked to lie in the table: ``clip`` writes in place.)"""
    table = slot.value
    if table.stype == "default" and is_host(table) and np.dtype(table.dtype) == slot.dtype:
        table.wait_to_read()
        whole = host_view(table, slot.dtype, math.prod(slot.shape)).reshape(slot.shape)
        for o, i in zip(outs, ids):
            if takes_rows_in_place(o, slot.shape, slot.dtype):   # (into the out itself)
                wait_to_write(o)
                np.take(whole, i, axis=0, out=make_rows(o, i), mode="clip")
                continue
            arr, rows = new_host_row_sparse(i, slot.shape, slot.dtype)
            np.take(whole, i, axis=0, out=rows, mode="clip")
            arr.copyto(o)
        return
    for o, i in zip(outs, ids):
        if len(i):
            rows = mx.nd.take(slot.value, mx.nd.array(i, ctx=slot.value.context, dtype="int64"))
        else:  # MXNet's operators reject empty arrays
            rows = np.zeros((0,) + slot.shape[1:], slot.dtype)
        mx.nd.sparse.row_sparse_array((rows, i), shape=slot.shape, ctx=o.context,
                                      dtype=slot.dtype).copyto(o)


def fetch_rows_from_servers(key: Key, slot: KeySlot, ids: Optional[List[np.ndarray]],
                            group: Group, servers: Optional[ServerLink],
                            into: Optional[np.ndarray] = None
                            ) -> Tuple[Optional[np.ndarray], np.ndarray]:
    """(this rank's sorted unique ids, their rows): the master pulls the union of the
    group's ids once and hands each rank its rows (``ids``: each out's, none for a rank
    that only takes part; ``into``: where this rank's rows go, else a new array). A rank
    that wants every row (an eval's pull, Gluon's ``save_parameters``) sends a marker, not
    the table's length of ids. ``ids`` None: every rank of the group asks for the whole
    table (a dense weight's pull, kvhybrid's checkpoint), which the master pulls and
    broadcasts (no ids come back then)."""
    rows = slot.shape[0]
    if ids is None:
        got = into if into is not None else np.empty(slot.shape, slot.dtype)
        if servers is not None:   # (the master holds the link)
            got[...] = servers.pull_rows(key, np.arange(rows, dtype=np.int64), slot.shape,
                                         slot.dtype).reshape(slot.shape)
        broadcast_view(got, 0, group, name=f"key {key!r} from the servers", patient=True)
        return None, got
    mine = (ids[0] if len(ids) == 1 else np.unique(np.concatenate(ids))) if ids \
        else np.zeros(0, np.int64)   # (one out's ids are sorted and unique already)
    sent = _EVERY_ROW if len(mine) == rows else mine   # (sorted unique ids in [0, rows))
    gathered = gather_patiently([sent], group, root=0, name=f"the row ids of key {key!r}")
    packed = None
    if group.rank == 0:
        (whole, counts), = gathered
        packed = _rows_for_each_rank(key, slot, whole, counts.astype(np.int64), servers)
    got = into if into is not None else np.empty((len(mine),) + slot.shape[1:], slot.dtype)
    scatter_bytes(packed, got, group, name=f"the rows of key {key!r}")
    return mine, got


#: no row ids
_NO_IDS = np.zeros(0, np.int64)
_NO_IDS.flags.writeable = False

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
    """A plain pull of a client group of one rank (``RowPulls._pull_rows``): the rows
    ``ids`` (checked, sorted or as they came) into ``out`` through MXNet's engine, as
    ``dist_sync`` pulls them, with nothing waiting on any thread of ours; the group's
    watchdog times the servers' answer. ``row_ids``: the call's array of those ids, if it
    had one, handed to MXNet as it came (its engine sorts them, as for ``dist_sync``)."""
    if not len(ids):   # (MXNet's pull rejects no ids: an out with no rows)
        new_host_row_sparse(ids, out.shape, out.dtype)[0].copyto(out)
        return
    if _every_row(ids, out.shape[0]):   # (an eval's or a checkpoint's: the link may keep it)
        servers.pull_every_row_in_engine(key, out)
    elif servers.holds_table(key):      # (a pull after that, before the next push)
        ids = unique_ids(ids, out.shape[0])
        host_row_sparse(servers.pull_rows(key, ids, out.shape, out.dtype), ids, out.shape,
                        out.dtype).copyto(out)
        return
    else:
        as_handed = row_ids is not None and np.dtype(row_ids.dtype) in _IDS_AS_HANDED
        servers.pull_rows_in_engine(key, row_ids if as_handed else host_array(ids, np.int64),
                                    out)
    done = group.watchdog.watch(lambda: f"the parameter servers' rows of key {key!r}",
                                outward=True)
    when_ready(f"rows of key {key!r}", [out], done)


def _every_row(ids: np.ndarray, rows: int) -> bool:
    """Whether the checked ``ids`` (sorted or as they came) are every row, in order."""
    return len(ids) == rows and ids[0] == 0 and ids[-1] == rows - 1 \
        and bool((ids[1:] > ids[:-1]).all())


def write_rows(slot: KeySlot, outs: List[NDArray], ids: List[np.ndarray], mine: np.ndarray,
               rows: np.ndarray) -> None:
    """``fetch_rows_from_servers``'s rows into the outs (``ids``: each out's)."""
    for o, i in zip(outs, ids):
        part = rows if i is mine else rows[np.searchsorted(mine, i)]
        host_row_sparse(part, i, slot.shape, slot.dtype).copyto(o)
