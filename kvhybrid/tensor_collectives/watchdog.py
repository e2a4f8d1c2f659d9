"""Guarding blocking waits so that no rank hangs forever.

MPI collectives have no timeout, and a rank that died or raised leaves its
peers blocked inside one. Every blocking wait in kvhybrid runs inside
``Watchdog.waiting(what)``; a background thread then

* aborts the job when a peer process on this host has exited (naming it),
* logs a warning after ``stall_warning`` seconds naming the ranks that have
  not arrived yet (read from a shared-memory board, no MPI call needed), and
* aborts the job after ``timeout`` seconds, naming what was waited for.

Waits form chains: a group's ranks wait for their master, the master waits for the
parameter servers, the servers wait for the other groups. The rank at the end of a chain
knows the culprit, so it must report first: an *outward* wait (on the servers, hence on
every other group) gets ``OUTWARD_FACTOR`` x the timeout, and a rank whose laggards on
this host are all inside an outward wait defers its own report to ``DEFERRED_FACTOR`` x.

Aborting uses ``MPI_Abort`` on the world communicator, which ends every rank,
as ``python -m mpi4py`` does for an uncaught exception.
"""
from __future__ import annotations

import faulthandler
import functools
import itertools
import logging
import os
import socket
import sys
import threading
import time
import weakref
from typing import Callable, Dict, List, Optional, Tuple, Union

import numpy as np

log = logging.getLogger("kvhybrid")

#: What a wait is for: a text, or a function making it (called only when reported).
Description = Union[str, Callable[[], str]]

_POLL_SECONDS = 0.25
_ABORT_GRACE_SECONDS = 5.0
OUTWARD_FACTOR = 1.5
DEFERRED_FACTOR = 2.0
_SEQ, _OUTWARD, _STEP = 0, 1, 2   # the three int64 slots each rank posts on the board


def abort_job(MPI, message: str, exit_code: int = 1) -> None:
    """Log ``message`` and end every rank of the MPI job."""
    log.error(message)
    for handler in logging.getLogger().handlers + log.handlers:
        handler.flush()
    sys.stderr.flush()
    # If MPI_Abort cannot complete (a broken transport, or Open MPI stuck serving two ranks
    # aborting at once), leave on our own. mpi4py's Abort holds the GIL, so a Python timer
    # could never run; faulthandler's C thread needs no GIL and calls _exit(1).
    # (Its traceback dump goes to /dev/null: the message above already says why we stop.)
    faulthandler.dump_traceback_later(_ABORT_GRACE_SECONDS, exit=True, file=open(os.devnull, "w"))
    MPI.COMM_WORLD.Abort(exit_code)


def _pid_state(pid: int) -> str:
    """The process's state letter from /proc (R, S, T for stopped, Z...), or "" if unknown."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return _pid_state(pid) != "Z"  # a zombie has exited


#: every watchdog of this process (``post_step`` posts the step on all their boards)
_ALL: "weakref.WeakSet[Watchdog]" = weakref.WeakSet()
#: this rank's slot on each open watchdog's board: an outward wait is posted on all of them,
#: since the ranks waiting on this one may watch another communicator (a host group's
#: board). A tuple swapped whole under ``_SLOTS_LOCK``, so a walk sees one version and needs
#: no lock (twice a wait on the servers)
_SLOTS: Tuple[np.ndarray, ...] = ()
_SLOTS_LOCK = threading.Lock()


def _post_outward(flag: int) -> None:
    for mine in _SLOTS:
        mine[_OUTWARD] = flag


def _add_slot(mine: np.ndarray) -> None:
    global _SLOTS
    with _SLOTS_LOCK:
        _SLOTS = _SLOTS + (mine,)


def _drop_slot(mine: np.ndarray) -> None:
    """A watchdog's slot leaves ``_SLOTS`` (at its close, or once it is collected)."""
    global _SLOTS
    with _SLOTS_LOCK:
        _SLOTS = tuple(slot for slot in _SLOTS if slot is not mine)


#: the training step this process is in (``post_step``), for messages about ranks that ran
#: different numbers of batches
_step = 0
#: whether this process said that a peer is at a later step than it (``close``)
_said_ahead = False


def post_step(step: int) -> None:
    """Say which training step this process is in (the store's count of its steps), on every
    board: a rank whose peers wait for it can tell the user when the ranks' steps differ."""
    global _step
    _step = step
    for dog in list(_ALL):
        mine = dog._board.get(dog.rank)
        if mine is not None:
            mine[_STEP] = step


def current_step() -> int:
    """The step this process posted last (0 before its first)."""
    return _step


def steps_differ(steps: Dict[int, int]) -> str:
    """The sentence that says the ranks are at different training steps (``steps``: the
    ranks' whose step is known, by rank), or "" where they are at the same one."""
    if len(set(steps.values())) < 2:
        return ""
    by_step: Dict[int, List[int]] = {}
    for rank, step in sorted(steps.items()):
        by_step.setdefault(step, []).append(rank)
    at = "; ".join(f"{'rank' if len(r) == 1 else 'ranks'} {', '.join(map(str, r))} at step {s}"
                   for s, r in sorted(by_step.items(), reverse=True))
    return (f"The ranks are at different training steps ({at}; a step is one push of the "
            "first key): they ran different numbers of batches. Give every rank the same "
            "number of batches: split the data into equal parts (each rank's own share, "
            "mx.io.NDArrayIter(..., last_batch_handle='discard')), or stop every rank after "
            "the count of the rank with the fewest")


class Watchdog:
    """Times every blocking wait of one communicator; one thread per group."""

    #: takes this rank's slot out of ``_SLOTS`` (at ``close``, or once collected)
    _unpost: Optional[weakref.finalize] = None

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
        self._hint: Optional[Description] = None
        self._since = 0.0
        self._warned = False
        #: waits no thread of this process blocks in (``watch``): id -> (since, what, limit)
        self._watched: Dict[int, Tuple[float, Description, float]] = {}
        self._watch_ids = itertools.count(1)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"kvhybrid-watchdog-{name}",
                                        daemon=True)
        self._thread.start()
        _ALL.add(self)
        mine = self._board.get(self.rank)
        if mine is not None:
            _add_slot(mine)
            self._unpost = weakref.finalize(self, _drop_slot, mine)

    # -- the shared-memory progress board --------------------------------------------
    def _make_board(self):
        """Three int64 slots per rank on this host: the number of the wait it has entered
        (or ``-(that number) - 1`` once it has closed its store and left), 1 while it is
        inside an outward wait, and its training step (``post_step``)."""
        MPI = self._MPI
        try:
            node = self.comm.Split_type(MPI.COMM_TYPE_SHARED)
            win = MPI.Win.Allocate_shared(24, 8, comm=node)
            ranks = node.allgather(self.rank)
            board = {}
            for node_rank, rank in enumerate(ranks):
                buf, _ = win.Shared_query(node_rank)
                board[rank] = np.frombuffer(buf, dtype=np.int64, count=3)
            board[self.rank][:] = 0
            board[self.rank][_STEP] = current_step()
            node.Free()
            return board, win
        except Exception as exc:  # no shared memory: laggards are then reported as unknown
            log.debug("no shared-memory progress board: %s", exc)
            return {}, None

    # -- the public part ---------------------------------------------------------------
    def waiting(self, what: Description, collective: bool = True,
                timeout: Optional[float] = None, hint: Optional[Description] = None,
                outward: bool = False) -> "_Wait":
        """Run a blocking wait described by ``what`` under the timeout (``with``).

        Collective waits are numbered (the same numbers on every rank, since
        every rank makes the same calls) and posted on the board; local waits
        (the MXNet engine) are timed but not numbered. ``timeout`` replaces the
        group's for this wait, and ``hint`` (text, or a function that makes it) the advice
        given when it expires.
        ``outward`` marks a wait on processes outside the group (the parameter
        servers): it gets ``OUTWARD_FACTOR`` x the timeout and is posted on the board.
        A wait inside another is covered by the outer one's guard.
        """
        return _Wait(self, what, collective, timeout, hint, outward)

    def waiting_behind(self, what: Description, hint: Optional[Description] = None):
        """``waiting`` for work another thread of this process does, whose own waits are
        timed (by this watchdog or its group's: the communication thread's collectives, a
        master's wait for the servers, a rank's deferred wait behind it). A backstop: its
        limit, ``DEFERRED_FACTOR`` x the timeout and outward, is past each of theirs, so
        that they, which name the servers or the late rank, run out first; a limit of
        their own length raced them and could name only the other thread's job."""
        return self.waiting(what, collective=False, outward=True,
                            timeout=self.timeout * DEFERRED_FACTOR, hint=hint)

    def watch(self, what: Description, outward: bool = False) -> Callable[[], None]:
        """Time a wait that MXNet's engine does for this rank, with no thread of ours
        blocked in it (a pull of the parameter servers' answers, which the next forward
        pass waits for inside MXNet): the job aborts, naming ``what``, unless the returned
        function is called within the limit (``waiting``'s, ``outward`` included). That
        function may be called from any thread, once."""
        ident = next(self._watch_ids)
        limit = self.timeout * (OUTWARD_FACTOR if outward else 1.0)
        self._watched[ident] = (time.monotonic(), what, limit)
        return functools.partial(self._watched.pop, ident, None)

    @property
    def current(self) -> Optional[str]:
        """What the wait in progress waits for, or None outside a wait."""
        what = self._what
        return what() if callable(what) else what

    @property
    def watched(self) -> int:
        """Watched waits not over yet."""
        return len(self._watched)

    @property
    def collectives(self) -> int:
        """Collective waits this rank has entered on the group (its meetings)."""
        return self._seq

    def close(self) -> None:
        self._stop.set()
        if self._board:
            self._say_if_peers_are_ahead()
            self._board[self.rank][_SEQ] = -self._seq - 1
        if self._unpost is not None:
            self._unpost()
        if self._board_window is not None:
            self._board = {}
            self._board_window = None  # freed with MPI; Win.Free is collective

    def _steps(self) -> Dict[int, int]:
        """The steps of this host's ranks, from the board (this rank's its own)."""
        steps = {rank: int(slot[_STEP]) for rank, slot in self._board.items()}
        steps[self.rank] = current_step()
        return steps

    def _say_if_peers_are_ahead(self) -> None:
        """Closing while a peer on this host, still in, is at a later step: this rank ran
        fewer batches, and that peer will wait for it in vain. Say so here too (once per
        process), since that peer's message is all the user would see."""
        global _said_ahead
        steps = self._steps()
        ahead = any(steps[rank] > steps[self.rank] for rank, slot in self._board.items()
                    if int(slot[_SEQ]) >= 0)
        if ahead and not _said_ahead:
            _said_ahead = True
            log.error("kvhybrid: rank %d closes its store at step %d. %s", self.rank,
                      steps[self.rank], steps_differ(steps))

    def describe(self, rank: int) -> str:
        host, pid = self.peers[rank]
        return f"rank {rank} (pid {pid} on {host})"

    # -- the thread ----------------------------------------------------------------------
    def _behind(self, seq: int) -> List[int]:
        """The ranks on this host that have not reached wait ``seq`` and are still in."""
        return [rank for rank, slot in self._board.items()
                if rank != self.rank and 0 <= int(slot[_SEQ]) < seq]

    def _laggards(self, seq: int) -> str:
        behind, unknown = [], []
        for rank in range(len(self.peers)):
            if rank == self.rank:
                continue
            slot = self._board.get(rank)
            if slot is None:
                unknown.append(rank)
            elif int(slot[_SEQ]) < 0:
                behind.append(f"{self.describe(rank)} has closed its store after wait "
                              f"#{-int(slot[_SEQ]) - 1}")
            elif int(slot[_SEQ]) < seq:
                outside = ", waiting for the parameter servers" if slot[_OUTWARD] else ""
                behind.append(f"{self.describe(rank)} is still before it "
                              f"(at wait #{int(slot[_SEQ])}, step {int(slot[_STEP])}{outside}"
                              f"{self._stopped(rank)})")
            elif self._stopped(rank):   # it arrived, then stopped inside the wait
                behind.append(f"{self.describe(rank)} is stopped (SIGSTOP, or a debugger) "
                              f"inside wait #{int(slot[_SEQ])}")
        parts = behind or ["every rank on this host has arrived"]
        if unknown:
            parts.append(f"ranks {unknown} are on other hosts (state unknown)")
        return "; ".join(parts)

    def _stopped(self, rank: int) -> str:
        return ", stopped" if _pid_state(self.peers[rank][1]) in ("T", "t") else ""

    def _gone_peer(self, seq: int) -> Optional[Tuple[str, str]]:
        """A peer on this host that will never reach wait ``seq``, described, with the advice
        for the user; or None."""
        advice = "Every rank must make the same calls; look at that rank's output for the cause."
        for rank in self._local:
            if rank == self.rank:
                continue
            if not _pid_alive(self.peers[rank][1]):
                return f"{self.describe(rank)} has exited", advice
            slot = self._board.get(rank)
            if slot is not None and int(slot[_SEQ]) < 0 and -int(slot[_SEQ]) - 1 < seq:
                left, steps = -int(slot[_SEQ]) - 1, self._steps()
                uneven = steps_differ(steps)
                return (f"{self.describe(rank)} has closed its store after wait #{left} "
                        f"(at step {steps[rank]}; rank {self.rank} is at step "
                        f"{steps[self.rank]})", f"{uneven}." if uneven else advice)
        return None

    def _limit_now(self, seq: int) -> float:
        """This wait's limit, deferred while every laggard waits further down a chain. A
        laggard that is stopped (SIGSTOP, a debugger) waits for nothing, whatever its board
        says: it is the culprit, named at the plain limit (deferred, this wait raced a
        master of another group whose wait for the servers it held up, and that master,
        which can name only the servers, ran out first on a busy machine)."""
        behind = self._behind(seq)
        if behind and all(self._board[rank][_OUTWARD] and not self._stopped(rank)
                          for rank in behind):
            return max(self._limit, self.timeout * DEFERRED_FACTOR)
        return self._limit

    def _overdue(self) -> Optional[str]:
        """The first watched wait (``watch``) past its limit, described, or None."""
        now = time.monotonic()
        for since, what, limit in list(self._watched.values()):
            if now - since > limit:
                text = what() if callable(what) else what
                return (f"kvhybrid: rank {self.rank} timed out after {limit:.0f} s waiting for "
                        f"{text}: a parameter server or a worker of another client group is "
                        "stuck or unreachable (the launcher's summary and that group's output "
                        "name which), or another group ran fewer batches and has finished "
                        f"(every group must make the same number of steps; this rank is at "
                        f"step {current_step()}); if this wait is legitimately longer, raise "
                        "KVHYBRID_TIMEOUT")
        return None

    def _run(self) -> None:
        while not self._stop.wait(_POLL_SECONDS):
            overdue = self._overdue() if self._watched else None
            if overdue is not None:
                abort_job(self._MPI, overdue)
                return
            current, seq = self._what, self._seq
            if current is None:
                continue
            what = current() if callable(current) else current
            elapsed = time.monotonic() - self._since
            gone = self._gone_peer(seq)
            if gone:
                abort_job(self._MPI, f"kvhybrid: {gone[0]} while rank {self.rank} waited for "
                                     f"{what} (wait #{seq}); aborting the job. {gone[1]}")
                return
            limit = self._limit_now(seq)
            if elapsed > limit and self._what is current:
                hint = self._hint() if callable(self._hint) else self._hint
                advice = hint or (f"{self._laggards(seq)}. A rank is stuck or ran a different "
                                  "sequence of calls; if this wait is legitimately longer, "
                                  "raise KVHYBRID_TIMEOUT.")
                abort_job(self._MPI, f"kvhybrid: rank {self.rank} timed out after "
                                     f"{limit:.0f} s waiting for {what} (wait #{seq}): {advice}")
                return
            if elapsed > self.stall_warning and not self._warned:
                self._warned = True
                log.warning("kvhybrid: rank %d has waited %.0f s for %s (wait #%d): %s",
                            self.rank, elapsed, what, seq, self._laggards(seq))


class _Wait:
    """``Watchdog.waiting``'s guard: a class, not a generator, since it runs around every
    wait of every step."""
    __slots__ = ("_dog", "_what", "_collective", "_timeout", "_hint", "_outward", "_inner")

    def __init__(self, dog: Watchdog, what: Description, collective: bool,
                 timeout: Optional[float], hint: Optional[Description], outward: bool):
        self._dog, self._what, self._collective = dog, what, collective
        self._timeout, self._hint, self._outward = timeout, hint, outward
        self._inner = False

    def __enter__(self) -> None:
        dog = self._dog
        self._inner = dog._what is not None
        if self._inner:   # inside another wait: its guard already covers this one
            return
        if self._collective:
            dog._seq += 1
            if dog._board:
                dog._board[dog.rank][_SEQ] = dog._seq
        dog._since = time.monotonic()
        dog._warned = False
        dog._limit = (self._timeout or dog.timeout) * (OUTWARD_FACTOR if self._outward else 1.0)
        dog._hint = self._hint
        dog._what = self._what
        if self._outward:
            _post_outward(1)

    def __exit__(self, *exc) -> bool:
        if not self._inner:
            self._dog._what = None
            if self._outward:
                _post_outward(0)
        return False


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
