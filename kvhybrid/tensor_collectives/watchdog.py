"""Guarding blocking waits so that no rank hangs forever.

MPI collectives have no timeout, and a rank that died or raised leaves its
peers blocked inside one. Every blocking wait in kvhybrid runs inside
``Watchdog.waiting(what)``; a background thread then

* aborts the job when a peer process on this host has exited (naming it),
* logs a warning after ``stall_warning`` seconds naming the ranks that have
  not arrived yet (read from a shared-memory board, no MPI call needed), and
* aborts the job after ``timeout`` seconds, naming what was waited for.

Aborting uses ``MPI_Abort`` on the world communicator, which ends every rank,
as ``python -m mpi4py`` does for an uncaught exception.
"""
from __future__ import annotations

import contextlib
import logging
import os
import socket
import sys
import threading
import time
from typing import Callable, List, Optional, Union

import numpy as np

log = logging.getLogger("kvhybrid")

#: What a wait is for: a text, or a function making it (called only when reported).
Description = Union[str, Callable[[], str]]

_POLL_SECONDS = 0.25
_ABORT_GRACE_SECONDS = 5.0


def abort_job(MPI, message: str, exit_code: int = 1) -> None:
    """Log ``message`` and end every rank of the MPI job."""
    log.error(message)
    for handler in logging.getLogger().handlers + log.handlers:
        handler.flush()
    sys.stderr.flush()
    # If MPI_Abort cannot complete (a broken transport), leave on our own.
    threading.Timer(_ABORT_GRACE_SECONDS, os._exit, args=(exit_code,)).start()
    MPI.COMM_WORLD.Abort(exit_code)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has exited
    except OSError:
        return True


class Watchdog:
    """Times every blocking wait of one communicator; one thread per group."""

    def __init__(self, MPI, comm, timeout: float, stall_warning: float, name: str):
        self._MPI = MPI
        self.comm = comm
        self.timeout = timeout
        self.stall_warning = stall_warning
        self.name = name
        self.rank = comm.Get_rank()
        host, pid = socket.gethostname(), os.getpid()
        self.peers = comm.allgather((host, pid))  # [(host, pid)] by rank
        self._local: List[int] = [r for r, (h, _) in enumerate(self.peers) if h == host]
        self._board, self._board_window = self._make_board()
        self._seq = 0
        self._what: Optional[Description] = None
        self._limit = timeout
        self._hint: Optional[str] = None
        self._since = 0.0
        self._warned = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"kvhybrid-watchdog-{name}",
                                        daemon=True)
        self._thread.start()

    # -- the shared-memory progress board --------------------------------------------
    def _make_board(self):
        """One int64 slot per rank on this host: the number of the wait it has entered,
        or ``-(that number) - 1`` once it has closed its store and left."""
        MPI = self._MPI
        try:
            node = self.comm.Split_type(MPI.COMM_TYPE_SHARED)
            win = MPI.Win.Allocate_shared(8, 8, comm=node)
            ranks = node.allgather(self.rank)
            board = {}
            for node_rank, rank in enumerate(ranks):
                buf, _ = win.Shared_query(node_rank)
                board[rank] = np.frombuffer(buf, dtype=np.int64, count=1)
            board[self.rank][0] = 0
            node.Free()
            return board, win
        except Exception as exc:  # no shared memory: laggards are then reported as unknown
            log.debug("no shared-memory progress board: %s", exc)
            return {}, None

    # -- the public part ---------------------------------------------------------------
    @contextlib.contextmanager
    def waiting(self, what: Description, collective: bool = True,
                timeout: Optional[float] = None, hint: Optional[str] = None):
        """Run a blocking wait described by ``what`` under the timeout.

        Collective waits are numbered (the same numbers on every rank, since
        every rank makes the same calls) and posted on the board; local waits
        (the MXNet engine) are timed but not numbered. ``timeout`` replaces the
        group's for this wait, and ``hint`` the advice given when it expires.
        """
        if self._what is not None:  # inside another wait: its guard already covers this one
            yield
            return
        if collective:
            self._seq += 1
            if self._board:
                self._board[self.rank][0] = self._seq
        self._since = time.monotonic()
        self._warned = False
        self._limit = timeout or self.timeout
        self._hint = hint
        self._what = what
        try:
            yield
        finally:
            self._what = None

    def close(self) -> None:
        self._stop.set()
        if self._board:
            self._board[self.rank][0] = -self._seq - 1
        if self._board_window is not None:
            self._board = {}
            self._board_window = None  # freed with MPI; Win.Free is collective

    def describe(self, rank: int) -> str:
        host, pid = self.peers[rank]
        return f"rank {rank} (pid {pid} on {host})"

    # -- the thread ----------------------------------------------------------------------
    def _laggards(self, seq: int) -> str:
        behind, unknown = [], []
        for rank in range(len(self.peers)):
            if rank == self.rank:
                continue
            slot = self._board.get(rank)
            if slot is None:
                unknown.append(rank)
            elif int(slot[0]) < 0:
                behind.append(f"{self.describe(rank)} has closed its store after wait "
                              f"#{-int(slot[0]) - 1}")
            elif int(slot[0]) < seq:
                behind.append(f"{self.describe(rank)} is still before it (at wait #{int(slot[0])})")
        parts = behind or ["every rank on this host has arrived"]
        if unknown:
            parts.append(f"ranks {unknown} are on other hosts (state unknown)")
        return "; ".join(parts)

    def _gone_peer(self, seq: int) -> Optional[str]:
        """A peer on this host that will never reach wait ``seq``, described, or None."""
        for rank in self._local:
            if rank == self.rank:
                continue
            if not _pid_alive(self.peers[rank][1]):
                return f"{self.describe(rank)} has exited"
            slot = self._board.get(rank)
            if slot is not None and int(slot[0]) < 0 and -int(slot[0]) - 1 < seq:
                return f"{self.describe(rank)} has closed its store after wait #{-int(slot[0]) - 1}"
        return None

    def _run(self) -> None:
        while not self._stop.wait(_POLL_SECONDS):
            current, seq = self._what, self._seq
            if current is None:
                continue
            what = current() if callable(current) else current
            elapsed = time.monotonic() - self._since
            gone = self._gone_peer(seq)
            if gone:
                abort_job(self._MPI, f"kvhybrid: {gone} while rank {self.rank} waited for {what} "
                                     f"(wait #{seq}); aborting the job. Every rank must make the "
                                     "same calls; look at that rank's output for the cause.")
                return
            if elapsed > self._limit and self._what is current:
                advice = self._hint or (f"{self._laggards(seq)}. A rank is stuck or ran a different "
                                        "sequence of calls; if this wait is legitimately longer, "
                                        "raise KVHYBRID_TIMEOUT.")
                abort_job(self._MPI, f"kvhybrid: rank {self.rank} timed out after "
                                     f"{self._limit:.0f} s waiting for {what} (wait #{seq}): {advice}")
                return
            if elapsed > self.stall_warning and not self._warned:
                self._warned = True
                log.warning("kvhybrid: rank %d has waited %.0f s for %s (wait #%d): %s",
                            self.rank, elapsed, what, seq, self._laggards(seq))


def install_abort_on_uncaught_exception(MPI) -> None:
    """Make an uncaught exception on this rank end the whole job, not hang it."""
    previous = sys.excepthook
    if getattr(previous, "_kvhybrid", False):
        return

    def hook(exc_type, exc, tb):
        previous(exc_type, exc, tb)
        if MPI.Is_initialized() and not MPI.Is_finalized() and MPI.COMM_WORLD.Get_size() > 1:
            abort_job(MPI, f"kvhybrid: rank {MPI.COMM_WORLD.Get_rank()} raised {exc_type.__name__}; "
                           "aborting the MPI job so that the other ranks do not wait forever "
                           "(KVHYBRID_ABORT_ON_ERROR=0 turns this off)")

    hook._kvhybrid = True
    sys.excepthook = hook
