"""Cross-rank agreement before a collective: the guard against hangs on bad input.

If one rank's call is wrong (unknown key, another shape) and only that rank
raised, its peers would enter the collective alone and wait forever. So every
collective call first runs ``agree()``: one tiny allreduce tells every rank
whether all calls match and none failed its local checks. If not, the ranks
exchange details and all raise the same :class:`KeyValueError`, before any
state has changed.
"""
from __future__ import annotations

import functools
import hashlib
from typing import Optional

import numpy as np

from ..errors import KeyValueError, explain
from ..tensor_collectives.group import Group
from ..tensor_collectives.ops import allreduce_patiently

_MASK = (1 << 62) - 1
#: What a rank brings to the host barrier's meeting (``Group.meet``, ``meet_agreeing``,
#: ``meet_bringing``), by kind: 0 for a plain meeting; a call's digest with ``_MEETING`` set
#: for its agreement (``agree_in_meeting``); a negative number for a check of prefetched
#: rows (``row_exchange.PullCheck``): ``PULL_CHECK``, ``UNCOVERED`` where this rank needs
#: the plain pull, ``PULL_ERROR`` where its call failed its checks, and the call's tag
#: (``TAG`` bits); a sum made in a meeting of its own
#: brings ``tensor_collectives.meeting_sum.SUM_MEETING`` (bit 61) with its dtype and size. A
#: rank that finds another kind beside its own is in another collective: the ranks' calls
#: differ.
_MEETING = 1 << 62
PULL_CHECK, UNCOVERED, PULL_ERROR, TAG = -(1 << 63), 1 << 62, 1 << 61, (1 << 61) - 1


def digest(signature) -> int:
    """A 62-bit hash of a call's signature: what ranks compare. A training loop repeats
    its calls, so the hashes of hashable signatures are remembered."""
    try:
        return _remembered_digest(signature)
    except TypeError:   # (unhashable)
        return _digest(signature)


def _digest(signature) -> int:
    return int.from_bytes(hashlib.blake2b(repr(signature).encode(), digest_size=8).digest(),
                          "little") & _MASK


_remembered_digest = functools.lru_cache(maxsize=4096, typed=True)(_digest)


def agree(group: Group, what: str, signature, local_error: Optional[str], about: str = "",
          patient: bool = False) -> None:
    """Raise the same KeyValueError on every rank unless all signatures match and no rank failed.

    ``what`` names the call in the error (the same on every rank); ``about``
    adds this rank's detail (e.g. the key) to what the watchdog reports. ``patient``: wait
    without spinning (``wait_patiently``), for jobs whose ranks wait on each other's
    round trips to the parameter servers.
    """
    if group.size == 1:   # nobody to differ from: the verdict is this rank's own
        if local_error is not None:
            raise KeyValueError(explain(what, [(local_error, None)]))
        return
    MPI = group.MPI
    sig = digest(signature) if local_error is None else 0
    flags = np.array([sig, -sig, 1 if local_error else 0], dtype=np.int64)
    if patient:
        allreduce_patiently(flags, "max", group, lambda: f"the ranks to agree on {what}{about}")
    else:
        with group.watchdog.waiting(lambda: f"the ranks to agree on {what}{about}"):
            group.comm.Allreduce(MPI.IN_PLACE, flags, op=MPI.MAX)
    if flags[0] == -flags[1] and flags[2] == 0:
        return
    group.raise_calls_differ(what, local_error, None if local_error else str(signature), about)


def agree_in_meeting(group: Group, what: str, signature, about: str = "") -> bool:
    """``agree`` on a call every rank checked already (a repeated one), in the host barrier
    of the collective that follows (``Group.meet_agreeing``: each rank brings the call's
    digest) instead of a collective of its own: True, having met (the collective need not
    meet again), or the same KeyValueError on every rank; False at once where the group has
    no host barrier (``agree`` it then). Inside the watchdog's wait for that collective."""
    same = group.meet_agreeing(_MEETING | digest(signature))
    if same is None:
        return False
    if not same:
        group.raise_calls_differ(what, None, str(signature), about)
    return True
