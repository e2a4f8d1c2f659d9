"""Shared-memory windows of the allreduces, freed before MPI_Finalize in one order on
every rank.

MPI_Finalize frees the windows a process left open in the order that process created
them, each with a barrier among the window's ranks. The allreduces create theirs lazily,
in whichever thread first needs one (the engine's thread for its group, the caller's for
another), so two ranks of a host may hold them in different orders; their barriers then
wait on different windows forever (seen: an LM whose table was densified finished its
steps and hung in MPI_Finalize). At exit this module frees them first, sorted by the key
each was registered under, which every rank gives alike (its group's, see
``Group.key``). Peers that do not come within ``EXIT_TIMEOUT`` seconds (a rank died: the
job is ending anyway) leave the rest to MPI.
"""
from __future__ import annotations

import atexit
import logging
import threading
import time
from typing import Dict, Tuple

log = logging.getLogger("kvhybrid")

#: seconds the ranks sharing a window may take to reach exit
EXIT_TIMEOUT = 30.0

_lock = threading.Lock()
_open: Dict[str, Tuple[object, object]] = {}


def register(key: str, win, comm) -> None:
    """Free ``win`` (allocated on ``comm``, which stays valid) at exit, in ``key``'s place."""
    with _lock:
        if key in _open:
            raise ValueError(f"a shared-memory window under key {key!r} is already open")
        _open[key] = (win, comm)


def free_all(timeout: float = EXIT_TIMEOUT) -> int:
    """Free every registered window, in key order; return how many were freed."""
    with _lock:
        windows = sorted(_open.items())
        _open.clear()
    if not windows:
        return 0
    from mpi4py import MPI
    if MPI.Is_finalized():
        return 0
    freed = 0
    for key, (win, comm) in windows:
        request = comm.Ibarrier()
        deadline = time.monotonic() + timeout
        while not request.Test():
            if time.monotonic() > deadline:
                log.warning("at exit, not every rank sharing the window of %s came within %.0f "
                            "s; MPI_Finalize frees the rest", key, timeout)
                return freed
            time.sleep(0.001)
        win.Free()
        freed += 1
    return freed


# registered on import, before any store: atexit runs it after the stores' own closing
atexit.register(free_all)
