"""A group of ranks that reduce tensors together: an MPI communicator plus its watchdog."""
from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass
from typing import Dict, NoReturn, Optional, Tuple

import numpy as np
import mxnet as mx

from ..errors import KeyValueError, explain
from .algorithms import Algorithms
from .host_barrier import HostBarrier
from .meeting_rows import MeetingRows
from .mpi_env import load_mpi
from .watchdog import Watchdog, current_step, install_abort_on_uncaught_exception, steps_differ

log = logging.getLogger("kvhybrid")

#: groups made by this process so far: every rank makes its groups in the same order
#: (each is a collective Dup), so the count names a group alike on all of them
_MADE = itertools.count()


@dataclass(frozen=True)
class GroupSettings:
    """The job's settings a group acts on (plain values: the collectives read no StoreConfig;
    the store hands them over from ``KVHYBRID_*``)."""
    #: seconds a blocking wait may take before the job is aborted with the wait named
    timeout: float = 300.0
    #: seconds after which a wait logs the ranks not yet there
    stall_warning: float = 60.0
    #: the dense allreduce algorithm: "auto" (measured per size) or one of ``ALGORITHMS``
    allreduce: str = "auto"
    #: count every k consecutive ranks of a host as one host (0: real hosts)
    emulate_node_size: int = 0


class Group:
    """Ranks that run collectives together (the paper's client group).

    Owns a private duplicate of the communicator it is built from, so kvhybrid's
    traffic never mixes with the user's own MPI calls, and a :class:`Watchdog`
    that times every blocking wait on it.
    """

    def __init__(self, MPI, comm, settings: GroupSettings, name: str):
        self.MPI = MPI
        self.comm = comm.Dup()
        self.name = name
        #: this group's place among the process's groups, the same on every rank of it:
        #: the key its shared-memory window is freed under at exit (``windows.py``)
        self.key = f"{next(_MADE):06d}-{name}"
        self.rank = self.comm.Get_rank()
        self.size = self.comm.Get_size()
        self.settings = settings
        self.watchdog = Watchdog(MPI, self.comm, settings.timeout, settings.stall_warning, name)
        #: the allreduce algorithms and the selector between them
        self.algorithms = Algorithms(self, settings.allreduce, settings.emulate_node_size)
        self._staging: Dict[Tuple[int, str], mx.nd.NDArray] = {}
        #: bytes this rank has sent, by kind: "dense" and "rows" handed to MPI collectives,
        #: "servers" pushed to the parameter servers (a master's row_sparse pushes; those of a
        #: prefetching push when its communication thread makes them, before the next pull
        #: of the rows returns)
        self.bytes_sent: Dict[str, int] = {"dense": 0, "rows": 0, "servers": 0}
        #: fused allreduces run (one per bucket of small keys)
        self.fused_calls = 0
        #: of those, the ones reduced where the gradients lie (no copies)
        self.fused_in_place = 0
        #: made here, on the thread that makes the communicator: made at a group's first
        #: meeting instead, an elastic client's MPI_Comm_split_type failed (MPI_ERR_INTERN,
        #: Open MPI 4) while its other threads ran collectives
        self._barrier = HostBarrier.make(self) if self.size > 1 else None
        #: the slots of the rows' gathers and scatters made in the meeting (``meeting_rows``)
        self._meeting_rows = MeetingRows(self) if self._barrier is not None else None

    def meet(self, digest: int = 0) -> bool:
        """Sleep until every rank of the group is here, where they all share a host
        (``host_barrier.py``), and return True; elsewhere return False at once (the same on
        every rank). Every rank calls it before the same patient collective, inside the
        watchdog's wait for it. ``digest``: what this collective brings (0, or a sum made
        in the meeting: ``meeting_sum.sum_digest``); a rank that brought something else is
        in another collective: every rank raises."""
        if self._barrier is None:
            return False
        if not self._barrier.wait(digest):   # e.g. a rank agrees on a call here
            # (``meet_agreeing``) while this rank makes another collective: the ranks' calls
            # differ. It waits for why: tell it, and raise what it raises
            self.raise_calls_differ(None, None, self.watchdog.current or "another collective")
        return True

    def meet_agreeing(self, digest: int) -> Optional[bool]:
        """``meet``, each rank bringing ``digest`` (a nonzero signed 64-bit number: a digest
        of the call it makes): whether every rank brought the same (the same answer on every
        rank), or None at once where the group has no host barrier (agree by a collective
        then)."""
        if self._barrier is None:
            return None
        return self._barrier.wait(digest)

    def meet_bringing(self, digest: int) -> Optional[np.ndarray]:
        """``meet``, each rank bringing ``digest`` (a nonzero signed 64-bit number): what
        every rank brought, by rank (the same on every rank), for a verdict that needs more
        than whether all are equal (``sparse_pull.PullCheck``); None at once where the
        group has no host barrier."""
        if self._barrier is None:
            return None
        return self._barrier.wait_reading(digest)

    def raise_calls_differ(self, what: Optional[str], local_error: Optional[str],
                           call: Optional[str], about: str = "") -> NoReturn:
        """The ranks found their calls differ, or one failed its checks: every rank hands
        over what it was doing (``what``: the call agreed on, e.g. "pushpull of key 0", None
        on a rank that met for another collective; its local error, or its call's text) and
        raises the same KeyValueError, which names each rank's call."""
        with self.watchdog.waiting(
                lambda: f"the ranks to exchange why {what or 'their calls'}{about} failed"):
            details = self.comm.allgather((what, local_error, call, current_step()))
        agreed = next((w for w, _, _, _ in details if w), "a collective")
        raise KeyValueError(explain(agreed, [(e, c) for _, e, c, _ in details],
                                    steps_differ({r: d[3] for r, d in enumerate(details)})))

    def meeting_rows(self) -> Optional[MeetingRows]:
        """The slots of the rows' gathers and scatters made in the host barrier's meeting
        (``meeting_rows.py``), or None where the group has no host barrier."""
        return self._meeting_rows

    @property
    def meetings(self) -> int:
        """The host barrier's meetings so far (the same count on every rank; 0 without one)."""
        return self._barrier.meetings if self._barrier is not None else 0

    @property
    def meets_on_host(self) -> bool:
        """Whether ``meet`` and ``meet_agreeing`` use a host barrier (the same on every rank)."""
        return self._barrier is not None

    def from_root(self, root: int) -> bool:
        """A one-to-many collective from ``root``: the root calls this after posting its
        part, and wakes the others, who call it before posting theirs and sleep until then
        (``host_barrier.py``); True where the group has a host barrier, else False at once.
        Every rank calls it for the same collective, inside the watchdog's wait for it."""
        if self._barrier is None:
            return False
        self._barrier.from_root(self.rank == root)
        return True

    @classmethod
    def world(cls, settings: GroupSettings, allow_singleton: bool = False,
              abort_on_error: bool = True) -> "Group":
        """All ranks of the MPI job; raises NotInMPIJobError outside one (unless
        ``allow_singleton``). ``abort_on_error``: an uncaught exception on a rank aborts the
        whole MPI job instead of leaving the others waiting."""
        MPI = load_mpi(allow_singleton)
        if abort_on_error:
            install_abort_on_uncaught_exception(MPI)
        return cls(MPI, MPI.COMM_WORLD, settings, "world")

    def derived(self, comm, name: str) -> "Group":
        """A group on (a duplicate of) ``comm`` with this group's settings, counting its bytes
        in this group's tally (one tally per process)."""
        group = Group(self.MPI, comm, self.settings, name)
        group.bytes_sent = self.bytes_sent
        return group

    def staging(self, size: int, dtype) -> mx.nd.NDArray:
        """A pinned host buffer for arrays that live on an accelerator (reused per size)."""
        key = (size, np.dtype(dtype).str)
        buf = self._staging.get(key)
        if buf is None:
            buf = mx.nd.empty((size,), ctx=mx.cpu_pinned(0), dtype=dtype)
            self._staging[key] = buf
        return buf

    def close(self) -> None:
        self.watchdog.close()
        self._staging.clear()
        # The communicator is not freed here: MPI_Comm_free is collective, and a
        # close() that only some ranks reach must not block; MPI_Finalize frees it.

    def __repr__(self) -> str:
        return f"Group({self.name!r}, rank={self.rank}, size={self.size})"
