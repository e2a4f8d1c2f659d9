"""The allreduce algorithms behind ``allreduce``, and the selector that picks one.

==============  ===========================================================
``mpi``         the MPI library's ``Allreduce`` (what it picks; the launcher
                tunes Open MPI, see ``kvhybrid.launch.mpirun``)
``ring``        reduce-scatter + allgather between neighbours, each segment
                passed on as soon as it is added (``ring.py``)
``shm``         one host's ranks through a shared-memory window
                (``shared_memory.py``)
``hierarchical``  shared memory on each host, a ring across hosts among the
                ranks with the same place on their host, shared memory again
==============  ===========================================================

Which one is fastest depends on more than the bytes and ranks: huge pages, the MPI
library's own tuning, how many processes share the cores. So ``auto`` measures: the
first calls of each size class (a power of two) try every candidate in turn, ``TRIALS``
times each; then the ranks agree, in one small allreduce of their times, on the one
whose slowest rank was fastest, and use it from then on (Horovod's autotuning, per
size). A patient group (the engine path's) sums while MXNet computes on the same cores,
so what its waits burn is taken from compute: it settles on the candidate that cost its
costliest rank the least CPU among those within ``TIE`` of the fastest (``pick``: across
emulated hosts MPI's call spins on the link, and a step with the nearly as fast
``hierarchical`` is shorter). Calls
below ``SMALL_BYTES`` are bound by latency and go to the MPI library, on one host; across
hosts only those below ``CROSS_HOST_BYTES`` do (a slow link makes a smaller sum
bound by bandwidth, and ``ring`` and ``hierarchical`` send a
half to three quarters of what MPI's recursive doubling sends over it).
Every rank makes the same calls in the same order, so the schedule is the same
everywhere without talking. ``KVHYBRID_ALLREDUCE`` forces one algorithm.

A patient group (the engine path's) whose ranks share a host and meet in its host barrier
makes a sum of up to 1 MB (``meeting_sum.capacity``) in that meeting instead (``meeting_sum.py``;
counted as ``meeting`` in ``calls``): its waits sleep, where MPI's and the ``shm`` algorithm's
barriers spin while the ranks they wait for may not be running.
"""
from __future__ import annotations

import logging
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from .meeting_sum import MeetingSum, capacity, sum_digest
from .ring import ring_allreduce, workspace_elements
from .shared_memory import SharedMemoryAllreduce
from . import windows
from .topology import Topology

log = logging.getLogger("kvhybrid")

ALGORITHMS = ("mpi", "ring", "shm", "hierarchical")

#: below this many bytes a call is bound by latency, and one MPI call has the least
SMALL_BYTES = 256 * 2**10

#: across hosts, calls below this many bytes go to the MPI library (see the module docstring)
CROSS_HOST_BYTES = 16 * 2**10

#: timed calls of each candidate before a size class settles on one
TRIALS = 3

#: a patient group counts candidates within this factor of the fastest as fast, and takes
#: the one of them that burns the least CPU (``pick``)
TIE = 1.1


class Algorithms:
    """A group's algorithms and the state they keep (windows, node communicators,
    scratch), built on first use. Building is collective: it happens at the same call
    on every rank because the choice is a function of what every rank agrees on."""

    def __init__(self, group, forced: str = "auto", emulate_node_size: int = 0):
        self.group = group
        self.forced = forced
        self.emulate_node_size = emulate_node_size
        self._topology = None
        self._shm = None
        self._windows_made = 0
        self._scratch: Dict[str, np.ndarray] = {}
        #: calls per algorithm, for tests and benchmarks
        self.calls: Dict[str, int] = {name: 0 for name in ALGORITHMS + ("meeting",)}
        self._meeting_sum: Optional[MeetingSum] = None
        #: size class (bytes.bit_length()) -> the algorithm auto settled on
        self.chosen: Dict[int, str] = {}
        #: size class -> candidate -> [(seconds, this thread's CPU seconds)] of its trials
        self._trials: Dict[int, Dict[str, List[Tuple[float, float]]]] = {}
        #: MPI's call waits without spinning (``ops.allreduce_patiently``): for a thread that
        #: waits while MXNet's engine computes on the same cores (the engine path's)
        self.patient = False

    @property
    def topology(self) -> Topology:
        if self._topology is None:
            group = self.group
            with group.watchdog.waiting(f"the ranks of group {group.name} to map which of them "
                                        "share a host (first large allreduce)"):
                self._topology = Topology.of(group.MPI, group.comm, self.emulate_node_size)
        return self._topology

    def candidates(self) -> List[str]:
        """What auto tries on this group's hosts."""
        topo = self.topology
        if topo.nodes == 1:
            return ["mpi", "ring", "shm"]
        return ["mpi", "ring"] + (["hierarchical"] if topo.uniform else [])

    def select(self, nbytes: int, op: str = "sum") -> str:
        """The algorithm the next sum of ``nbytes`` on this group uses (the same on every
        rank; ``allreduce`` does the bookkeeping). Collective on its first sum of 16 KB or
        more, which maps the hosts: call it on every rank, as a sum is."""
        if op != "sum" or self.group.size == 1:
            return "mpi"
        if self.forced != "auto":
            return self.forced
        if self.sums_in_meetings(nbytes):
            return "meeting"
        if not self.measured(nbytes):
            return "mpi"
        size_class = nbytes.bit_length()
        chosen = self.chosen.get(size_class)
        if chosen is not None:
            return chosen
        done = sum(map(len, self._trials.get(size_class, {}).values()))
        candidates = self.candidates()
        return candidates[done % len(candidates)]

    def sums_in_meetings(self, nbytes: int) -> bool:
        """Whether auto makes a sum of ``nbytes`` in the host barrier's meeting
        (``meeting_sum.py``): a patient group on one host, up to the slots' capacity."""
        return (self.patient and nbytes <= capacity(self.group.size)
                and self.group.meets_on_host)

    def measured(self, nbytes: int) -> bool:
        """Whether auto times the candidates for sums of ``nbytes`` (else MPI's call sums
        them): from SMALL_BYTES on one host, from CROSS_HOST_BYTES across hosts (the first
        such call maps the hosts: the same call on every rank)."""
        if nbytes < CROSS_HOST_BYTES:
            return False
        return nbytes >= SMALL_BYTES or self.topology.nodes > 1

    def allreduce(self, view: np.ndarray, meet: Optional[Callable[[], bool]] = None) -> str:
        """Sum ``view`` over the group in place with the selected algorithm; return its name.
        ``meet``: the meeting in the host barrier that the caller's agreement holds first
        (True: every rank met there; ``run``)."""
        name = self.select(view.nbytes)
        size_class = view.nbytes.bit_length()
        if self.forced != "auto" or self.group.size == 1 or size_class in self.chosen \
                or name == "meeting" or not self.measured(view.nbytes):
            self.run(name, view, meet)
            return name
        start, cpu = time.perf_counter(), time.thread_time()
        self.run(name, view, meet)
        trials = self._trials.setdefault(size_class, {})
        trials.setdefault(name, []).append((time.perf_counter() - start,
                                            time.thread_time() - cpu))
        candidates = self.candidates()
        if all(len(trials.get(c, ())) >= TRIALS for c in candidates):
            self._settle(size_class, candidates, trials)
        return name

    def _settle(self, size_class: int, candidates: List[str], trials) -> None:
        """Every rank's fastest trial of each candidate and the least CPU one cost it, the
        worst over the ranks (one allreduce), then ``pick``."""
        mine = np.array([min(t for t, _ in trials[c]) for c in candidates]
                        + [min(cpu for _, cpu in trials[c]) for c in candidates])
        worst = np.empty_like(mine)
        self.group.comm.Allreduce(mine, worst, op=self.group.MPI.MAX)
        slowest, costliest = worst[:len(candidates)], worst[len(candidates):]
        best = pick(candidates, slowest, costliest, self.patient)
        self.chosen[size_class] = best
        del self._trials[size_class]
        log.info("allreduce of %s-%s bytes on group %s: %s (ms, slowest rank: %s; CPU ms, "
                 "costliest rank: %s)", f"{2 ** (size_class - 1):,}", f"{2 ** size_class - 1:,}",
                 self.group.name, best,
                 ", ".join(f"{c} {t * 1e3:.2f}" for c, t in zip(candidates, slowest)),
                 ", ".join(f"{c} {t * 1e3:.2f}" for c, t in zip(candidates, costliest)))

    def run(self, name: str, view: np.ndarray,
            meet: Optional[Callable[[], bool]] = None) -> None:
        """Sum ``view`` over the group in place with algorithm ``name``; ``meet``: the
        caller's meeting in the host barrier (its agreement's), held first (True: every
        rank met there, so none meets again); for ``meeting``, once this rank's part is in
        place."""
        group = self.group
        self.calls[name] += 1
        if name == "meeting":
            if self._meeting_sum is None:
                self._meeting_sum = MeetingSum(group, group.MPI)
            self._meeting_sum.allreduce(view, meet or (
                lambda: group.meet(sum_digest(view.nbytes, view.dtype))))
            return
        met = meet is not None and meet()
        # a patient group's ranks sleep until all are here (where they share a host), so the
        # algorithm's own waits, which spin, find them there
        met = met or (self.patient and group.meet())
        if name == "mpi":
            from .ops import _mpi_buffer, _mpi_op, wait_patiently
            MPI = group.MPI
            buf, op = _mpi_buffer(MPI, view), _mpi_op(MPI, "sum", view.dtype)
            if self.patient and view.nbytes < SMALL_BYTES:
                wait_patiently(group.comm.Iallreduce(MPI.IN_PLACE, buf, op=op))
            elif self.patient:
                # every rank there first, waited for without spinning; then the blocking
                # call, whose tuned algorithms the non-blocking one lacks (Open MPI's
                # libnbc, several times slower at large sizes). Every rank makes the same
                # choice.
                if not met:
                    wait_patiently(group.comm.Ibarrier())
                group.comm.Allreduce(MPI.IN_PLACE, buf, op=op)
            else:
                group.comm.Allreduce(MPI.IN_PLACE, buf, op=op)
        elif name == "ring":
            ring_allreduce(view, group.comm, group.MPI, self._workspace(view, group.size),
                           wait_all=self._wait_all())
        elif name == "shm":
            if self.topology.nodes > 1:
                raise ValueError("KVHYBRID_ALLREDUCE=shm needs every rank of the group on one "
                                 "host; use hierarchical or auto")
            self._shared().allreduce(view)
        elif name == "hierarchical":
            topo = self.topology
            if not topo.uniform:
                raise ValueError("KVHYBRID_ALLREDUCE=hierarchical needs the same number of ranks "
                                 "on every host; use auto")
            cross, MPI = topo.cross, group.MPI
            nodes = topo.nodes

            def across_hosts(part: np.ndarray) -> None:
                ring_allreduce(part, cross, MPI, self._workspace(part, nodes),
                               wait_all=self._wait_all())

            self._shared().allreduce(view, between=across_hosts if nodes > 1 else None,
                                     settle=self._settle_on_node())
        else:
            raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {name!r}")

    def _wait_all(self):
        """How the ring waits for its segments: patiently where ``patient`` asks."""
        if not self.patient:
            return None
        from .ops import wait_all_patiently
        return wait_all_patiently

    def _settle_on_node(self) -> Optional[Callable[[], None]]:
        """The host's barrier after the sums across hosts: patiently where ``patient`` asks
        (a rank whose sum came first waits for the others' over the link)."""
        if not self.patient:
            return None
        from .ops import wait_patiently
        node = self.topology.node
        return lambda: wait_patiently(node.Ibarrier())

    def _shared(self) -> SharedMemoryAllreduce:
        if self._shm is None:
            self._shm = SharedMemoryAllreduce(self.topology.node, self.group.MPI)
            # keyed by the group, the host split (benchmarks.allreduce emulates hosts on a
            # second selector of the same group) and how many this selector made before
            self._windows_made += 1
            windows.register(f"{self.group.key}/{self.emulate_node_size}/"
                             f"{self._windows_made:03d}", self._shm.win, self.topology.node)
        return self._shm

    def _workspace(self, view: np.ndarray, parts: int) -> np.ndarray:
        need = workspace_elements(view.size, view.itemsize, parts)
        buf = self._scratch.get(view.dtype.str)
        if buf is None or buf.size < need:
            buf = self._scratch[view.dtype.str] = np.empty(need, dtype=view.dtype)
        return buf


def pick(candidates: Sequence[str], slowest: Sequence[float], costliest: Sequence[float],
         patient: bool) -> str:
    """The candidate a size class settles on, from each one's time on its slowest rank and
    CPU on its costliest: the fastest; for a ``patient`` group, of those within ``TIE`` of
    the fastest, the one that burns the least CPU (its ranks' waits share the cores with
    MXNet's compute: the time an algorithm spins there is taken from backward)."""
    fastest = min(slowest)
    if not patient:
        return candidates[int(np.argmin(slowest))]
    near = [i for i, t in enumerate(slowest) if t <= TIE * fastest]
    return candidates[min(near, key=lambda i: (costliest[i], slowest[i]))]
