"""A barrier whose waiting ranks sleep in the kernel, for a group whose ranks share a host.

The store's patient collectives (agreements, the engine path's small sums, the rows'
gathers and scatters: the last two made in the meeting itself, ``meeting_sum.py`` and
``meeting_rows.py``) wait for ranks that are still computing. MPI's own waits spin, and
``ops.wait_patiently`` polls between short sleeps: a wait of a few milliseconds wakes some
twenty times, and on a host with fewer cores than busy threads each wake takes CPU from the
rank being waited for. ``HostBarrier.wait`` sleeps on a futex until the last rank arrives
(``host_barrier.cc``); the collective posted after it then finds every rank there.

It is used where every rank of the group is on one host (MPI's shared-memory split) and the
helper was built on every rank, the ranks agreeing on both when it is made; elsewhere
``Group.meet`` does nothing and the collectives wait as before. ``KVHYBRID_HOST_BARRIER=0``
turns it off. Where the job spans hosts (a host's group under host masters) a waiting rank
wakes between naps to make MPI progress (``LONGEST_NAP_US``).

A rank may bring a digest of the call it makes, and every rank reads all of them when the
barrier opens: the agreement of a repeated pushpull then travels in its first bucket's
meeting instead of a collective of its own (``agreement.agree_in_meeting``).
"""
from __future__ import annotations

import ctypes
import logging
from typing import Callable, Optional

import numpy as np

from . import windows
from .mpi_env import job_spans_hosts
from .native import Helper

log = logging.getLogger("kvhybrid")

#: microseconds a waiting rank spins before it sleeps (a rank that arrives within them
#: costs neither a sleep nor a wake). Short: most waits are for a rank still computing,
#: whose core a spin takes (longer spins cost the NMT's communication threads more CPU:
#: docs/performance.md)
SPIN_US = 5
#: microseconds of one sleep: the wait loops in Python between them (cheap: a few a second)
SLEEP_US = 200_000
#: where the job spans hosts, a waiting rank wakes to make MPI progress: the data its last
#: collective left in flight to a rank on another host goes only while it calls MPI, and
#: that rank may be what this one waits for. Naps from the first to the longest, doubling;
#: the first outlasts most waits, which then cost no wake
FIRST_NAP_US, LONGEST_NAP_US = 1000, 10_000

#: the words a rank sleeps on (``host_barrier.cc``; word 0 counts the ranks arrived): the
#: generation, and the roots' announcements
_GENERATION, _ANNOUNCED = 1, 2
#: 32-bit words before the rows of digests (``host_barrier.cc``)
HEADER_WORDS = 4

_HELPER = Helper("_host_barrier", "KVHYBRID_HOST_BARRIER", "patient collectives poll", {
    "kvhybrid_host_barrier_arrive": (ctypes.c_uint32, [ctypes.c_void_p, ctypes.c_uint32,
                                                       ctypes.c_uint32, ctypes.c_int64]),
    "kvhybrid_host_barrier_sleep": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32,
                                                   ctypes.c_int64, ctypes.c_int64]),
    "kvhybrid_host_barrier_announce": (None, [ctypes.c_void_p])})


def _functions():
    """``(arrive, sleep, announce)`` from the built helper, or None where it was not built
    or is off."""
    lib = _HELPER.library()
    if lib is None:
        return None
    return (lib.kvhybrid_host_barrier_arrive, lib.kvhybrid_host_barrier_sleep,
            lib.kvhybrid_host_barrier_announce)


def window_bytes(parties: int) -> int:
    """The shared memory a barrier of ``parties`` ranks needs: its words, two rows of digests."""
    return 4 * HEADER_WORDS + 2 * 8 * parties


class HostBarrier:
    """Words in a shared-memory window of the group's ranks (``host_barrier.cc``)."""

    def __init__(self, win, memory, rank: int, parties: int, functions,
                 progress: Optional[Callable[[], object]] = None):
        self._win = win   # the window keeps the memory mapped
        #: an MPI call that makes progress, where a waiting rank must (see LONGEST_NAP_US):
        #: a probe on the group's communicator, which progresses every one of the process
        #: where MPI's progress is global (Open MPI's, MPICH's with one VCI)
        self._progress = progress
        words = np.frombuffer(memory, dtype=np.uint32, count=HEADER_WORDS)
        #: the digests the ranks brought, one row per parity of the generation
        self._digests = np.frombuffer(memory, dtype=np.int64, count=2 * parties,
                                      offset=4 * HEADER_WORDS).reshape(2, parties)
        self._address = ctypes.c_void_p(words.ctypes.data)
        self._rank, self._parties = ctypes.c_uint32(rank), ctypes.c_uint32(parties)
        self._arrive, self._sleep, self._announce = functions
        #: one-to-many collectives so far (every rank counts the same)
        self._heard = 0
        #: meetings so far (every rank counts the same)
        self.meetings = 0

    @classmethod
    def make(cls, group) -> Optional["HostBarrier"]:
        """The group's barrier, or None where it cannot be used (see module). Collective on
        ``group``: every rank calls it at the same point."""
        MPI, comm = group.MPI, group.comm
        functions = _functions()
        node = comm.Split_type(MPI.COMM_TYPE_SHARED)
        # MIN: usable only where usable on every rank; naps with progress where any rank's
        # job spans hosts
        usable = np.array([functions is not None and node.Get_size() == comm.Get_size()
                           and not group.settings.emulate_node_size, not job_spans_hosts()],
                          dtype=np.int32)
        comm.Allreduce(MPI.IN_PLACE, usable, op=MPI.MIN)
        if not usable[0]:
            node.Free()
            return None
        size = window_bytes(comm.Get_size())
        win = MPI.Win.Allocate_shared(size if node.Get_rank() == 0 else 0, 4, comm=node)
        buf, _ = win.Shared_query(0)
        memory = memoryview(buf)[:size]
        if node.Get_rank() == 0:
            np.frombuffer(memory, dtype=np.uint8)[:] = 0
        node.Barrier()   # (the words are zero before any rank arrives)
        windows.register(f"{group.key}/barrier", win, node)
        return cls(win, memory, comm.Get_rank(), comm.Get_size(), functions,
                   None if usable[1] else comm.Iprobe)

    def wait(self, digest: int = 0) -> bool:
        """Return once every rank of the group has called this (the caller sleeps meanwhile):
        whether every rank brought the same ``digest`` (a signed 64-bit number). Untimed
        here: the caller wraps it in its group's watchdog, which names the wait."""
        return bool((self._meet(digest) == digest).all())

    def wait_reading(self, digest: int) -> np.ndarray:
        """``wait``, returning what every rank brought (a copy, by rank)."""
        return self._meet(digest).copy()

    def _meet(self, digest: int) -> np.ndarray:
        """Arrive with ``digest``, sleep until every rank has: the row of what each brought
        (a view, valid until the generation after next, which needs this rank to arrive)."""
        seen = self._arrive(self._address, self._parties, self._rank, digest)
        self._sleep_until(_GENERATION, seen + 1)
        self.meetings += 1
        return self._digests[seen & 1]

    def from_root(self, is_root: bool) -> None:
        """A one-to-many collective: its root, having posted its part, wakes the others;
        each of them sleeps until it has (then posts its own part, which finds the root's)."""
        self._heard += 1
        if is_root:
            self._announce(self._address)
            return
        self._sleep_until(_ANNOUNCED, self._heard)

    def _sleep_until(self, index: int, count: int) -> None:
        count = ctypes.c_uint32(count & 0xFFFFFFFF)
        if self._progress is None:
            while self._sleep(self._address, index, count, SPIN_US, SLEEP_US):
                pass
            return
        nap = FIRST_NAP_US
        while self._sleep(self._address, index, count, SPIN_US, nap):
            self._progress()
            nap = min(2 * nap, LONGEST_NAP_US)
