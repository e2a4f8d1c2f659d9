"""The master's gathers and scatters of rows made in the host barrier's meeting, without an
MPI call.

A group master's row exchange (``rows.gather_patiently`` / ``rows.scatter_bytes``) moves
each rank's message to the master and back every step. Where the group's ranks share a host
they went as MPI's ``Igather`` + ``Igatherv`` and ``Iscatterv``, waited for by polling
after a host barrier's meeting. Here the meeting is all the synchronisation they need:

- **gather**: every rank copies its arrays' lengths and bytes into its own slot of a
  shared-memory window *before* it arrives at the meeting; once the barrier opens, the
  root copies every rank's part out;
- **scatter**: the root copies each rank's message into that rank's slot and wakes the
  others (``Group.from_root``); each copies its own out.

Why no rank overwrites what another still reads:

- two sets of gather slots alternate by the call's parity: a rank writes a set again two
  gathers later, after the meeting of the gather between, which the root reaches only
  once it has copied this one's parts out;
- one set of scatter slots: the root writes them only where the group met since the last
  scatter (``may_scatter``, the same answer on every rank). Every rank copies its message
  out before it leaves the scatter, so it has done so before it arrives at any later
  meeting.

The window is made at the group's first gather, once its meeting found every rank there
(that gather goes by MPI). A rank whose message does not fit its slot (``capacity``) brings
that to the meeting, and then every rank's part goes by MPI as before; the root tells the
others in a word of the window whether a scatter lies in the slots or follows by MPI. A rank
that meets for another collective raises, and so does every other rank (``Group.meet``'s
rule).
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import numpy as np

from . import windows

#: the largest slot, in bytes (a rank's message for the master, or the master's for it)
CAPACITY = 2**20

#: the shared memory one group's slots may take: three sets of one slot per rank
WINDOW_BYTES = 12 * 2**20

#: what a gather brings to its meeting: this bit, with ``FITS`` where the rank's message
#: lies in its slot (distinct from a plain meeting's 0, an agreement's digest with bit 62
#: set, a sum's bit 61 and a pull check's negative number: ``kvstore/calls.py``,
#: ``meeting_sum.py``)
GATHER_MEETING, FITS = 1 << 60, 1


def capacity(ranks: int) -> int:
    """Bytes of one rank's slot in a group of ``ranks``: ``CAPACITY`` where three sets fit
    ``WINDOW_BYTES``, else less, down to 64 KB."""
    fits = WINDOW_BYTES // (3 * ranks) // 4096 * 4096
    return max(64 * 2**10, min(CAPACITY, fits))


def by_position(arrays: Sequence[np.ndarray], table: np.ndarray, units: np.ndarray,
                messages: Sequence[np.ndarray]) -> List[Tuple[np.ndarray, np.ndarray]]:
    """The root's result of a gather (``rows.gather_patiently``, in the slots or by MPI) from
    each rank's message (``messages[r]``: its arrays' bytes back to back; ``table[r]``: their
    lengths): for each position, the ranks' arrays concatenated in rank order (a new array)
    and their lengths."""
    out, offsets = [], [0] * len(messages)
    for i, a in enumerate(arrays):   # each position's parts, rank after rank
        lengths = (table[:, i] * units[i]).tolist()
        whole = np.concatenate([m[o:o + n] for m, o, n in zip(messages, offsets, lengths)])
        out.append((whole.view(a.dtype).reshape((-1,) + a.shape[1:]), table[:, i]))
        offsets = [o + n for o, n in zip(offsets, lengths)]
    return out


class MeetingRows:
    """The slots of one group's ranks (see module), for a group with a host barrier."""

    def __init__(self, group):
        self._group, self._rank, self._size = group, group.rank, group.size
        self.capacity = capacity(group.size)
        #: [parity][rank]: what each rank leaves for the root's gather of that parity; [rank]:
        #: what the root leaves for each rank's scatter; a word: 1 where the root left the
        #: scatter in the slots, 0 where MPI brings it (None until the first gather: ``_make``)
        self._gather = self._scatter = self._scatter_word = None
        self._gathers = 0
        #: the group's meeting count at the last scatter (``may_scatter``)
        self._scattered_at: Optional[int] = None
        #: calls made in the slots and by MPI (tests and benchmarks)
        self.in_slots = {"gather": 0, "scatter": 0}
        self.by_mpi = {"gather": 0, "scatter": 0}

    def _make(self) -> None:
        """The window, at the first gather's meeting: every rank is in it (had one met for
        another collective, all would have raised), so the collective allocation cannot
        wait for a rank that never comes. A group that never gathers takes no memory."""
        group, size = self._group, self._size
        total = 3 * size * self.capacity + 64
        win = group.MPI.Win.Allocate_shared(total if self._rank == 0 else 0, 1, comm=group.comm)
        buf, _ = win.Shared_query(0)
        memory = np.frombuffer(buf, dtype=np.uint8, count=total)
        slots = memory[:-64].reshape(3, size, self.capacity)
        self._gather, self._scatter = slots[:2], slots[2]
        self._scatter_word = memory[-64:-56].view(np.int64)
        self.win = win   # (keeps the memory mapped)
        windows.register(f"{group.key}/meeting-rows", win, group.comm)

    def gather(self, arrays: Sequence[np.ndarray], counts: np.ndarray, units: np.ndarray,
               root: int) -> Tuple[bool, Optional[List[Tuple[np.ndarray, np.ndarray]]]]:
        """``rows.gather_patiently`` in the meeting: (whether it was made here, the root's
        result or None). False: some rank's message did not fit its slot; every rank has
        met, and the caller gathers by MPI. ``counts``: each array's length; ``units``: the
        bytes of one of its rows."""
        parity = self._gathers & 1
        self._gathers += 1
        header = 8 * len(arrays)
        sizes = counts * units
        made = self._gather is not None   # (the first gather makes the slots: by MPI)
        fits = made and header + int(sizes.sum()) <= self.capacity
        if fits:   # (the lengths, then the arrays' bytes back to back, as MPI's message)
            slot = self._gather[parity, self._rank]
            slot[:header].view(np.int64)[:] = counts
            at = header
            for a, nbytes in zip(arrays, sizes.tolist()):
                slot[at:at + nbytes] = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
                at += nbytes
        group = self._group
        brought = group.meet_bringing(GATHER_MEETING | (FITS if fits else 0))
        if ((brought & ~FITS) != GATHER_MEETING).any():   # a rank met for another collective
            group.raise_calls_differ(None, None, group.watchdog.current or "a gather of rows")
        if not made:
            self._make()
        if not (brought & FITS).all():
            self.by_mpi["gather"] += 1
            return False, None
        self.in_slots["gather"] += 1
        if self._rank != root:
            return True, None
        parts = self._gather[parity]
        table = np.stack([parts[r, :header].view(np.int64) for r in range(self._size)])
        return True, by_position(arrays, table, units,
                                 [parts[r, header:] for r in range(self._size)])

    def may_scatter(self) -> bool:
        """Whether the next scatter may use the slots: the group met since the last one (the
        same answer on every rank, who each call this once per scatter)."""
        met = self._group.meetings
        free = self._scatter is not None and self._scattered_at != met
        self._scattered_at = met
        if not free:
            self.by_mpi["scatter"] += 1
        return free

    def put(self, send: np.ndarray, sizes: np.ndarray, received: np.ndarray,
            root: int) -> bool:
        """The root's scatter: each rank's message (``send``'s bytes, ``sizes`` a rank) into
        its slot, the root's own into ``received``, and whether they fit (else nothing is
        written and MPI brings them). Call before ``Group.from_root``."""
        fits = bool((sizes <= self.capacity).all())
        self._scatter_word[0] = int(fits)
        if not fits:
            self.by_mpi["scatter"] += 1
            return False
        start = 0
        for r, nbytes in enumerate(sizes.tolist()):
            into = received if r == root else self._scatter[r, :nbytes]
            into[:] = send[start:start + nbytes]
            start += nbytes
        self.in_slots["scatter"] += 1
        return True

    def take(self, received: np.ndarray) -> bool:
        """A rank's scatter, once the root woke it: its message into ``received``, or False
        where MPI brings it."""
        if not self._scatter_word[0]:
            self.by_mpi["scatter"] += 1
            return False
        received[:] = self._scatter[self._rank, :received.nbytes]
        self.in_slots["scatter"] += 1
        return True
