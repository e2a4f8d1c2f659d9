"""The link from a client group's master to MXNet's parameter servers (MXNET-MPI Fig. 4/5).

Only the master (rank 0 of the group) holds one: a native ``dist_sync`` store,
i.e. a ps-lite worker. The number of ps-lite workers (``DMLC_NUM_WORKER``) is
therefore the number of client groups, not of MPI ranks.

Every ps-lite wait runs under the group's watchdog, because ps-lite waits
forever when a server or another master is gone.
"""
from __future__ import annotations

import atexit
import logging
import os
from typing import Dict, Optional

import mxnet as mx
from mxnet.ndarray import NDArray

from ..errors import KeyValueError
from ..tensor_collectives.watchdog import Watchdog
from .keys import Key

log = logging.getLogger("kvhybrid")

#: ps-lite keys for str keys start here (int keys are used as they are).
STR_KEY_BASE = 1 << 20


def scheduler_address() -> str:
    return f"{os.environ.get('DMLC_PS_ROOT_URI', '?')}:{os.environ.get('DMLC_PS_ROOT_PORT', '?')}"


_LINK: Optional["ServerLink"] = None


def server_link(watchdog: Watchdog) -> "ServerLink":
    """The process's link (ps-lite starts once per process; every store of the process
    shares it), now timed by ``watchdog``."""
    global _LINK
    if _LINK is None:
        _LINK = ServerLink(watchdog)
        atexit.register(_LINK.close)
    _LINK._dog = watchdog
    return _LINK


class ServerLink:
    """A group master's ps-lite connection; keys are mapped to ints in call order."""

    def __init__(self, watchdog: Watchdog, mode: str = "dist_sync"):
        self._dog = watchdog
        with watchdog.waiting(lambda: "the scheduler, the parameter servers and the other client "
                                      f"groups' masters to connect (scheduler at "
                                      f"{scheduler_address()})", collective=False):
            self._kv = mx.kv.create(mode)
        self._ids: Dict[Key, int] = {}

    @property
    def ps_rank(self) -> int:
        return self._kv.rank

    @property
    def num_masters(self) -> int:
        return self._kv.num_workers

    def _next_id(self, key: Key) -> int:
        """The ps-lite key: an int key is itself (the optimizer sent to the servers looks
        its multipliers up by the Trainer's index); a str key gets an int of its own, in
        call order (the same on every master) — ps-lite's own str ids collide with ints."""
        if isinstance(key, int):
            return key
        return STR_KEY_BASE + sum(1 for k in self._ids if not isinstance(k, int))

    def check_new(self, key: Key) -> None:
        """Raise KeyValueError unless ``key`` can be put on the servers."""
        if key in self._ids:
            raise KeyValueError(f"key {key!r} is already on the parameter servers: with servers, "
                                "each key is initialised once per process (one store per "
                                "process, one init or broadcast per key)")
        if self._next_id(key) in self._ids.values():
            raise KeyValueError(f"key {key!r} maps to ps-lite key {self._next_id(key)}, which is "
                                f"taken: use int keys below {STR_KEY_BASE} with str keys")

    def init(self, key: Key, value: NDArray, out: NDArray) -> None:
        """Register ``key`` on the servers (ps-lite rank 0's value wins); pull it into ``out``."""
        self.check_new(key)
        kid = self._ids[key] = self._next_id(key)
        with self._dog.waiting(lambda: f"the other client groups to init key {key!r} on the "
                                       "parameter servers", collective=False):
            self._kv.init(kid, value)
            self._kv.pull(kid, out=out)
            out.wait_to_read()

    def push_pull(self, key: Key, value: NDArray, out: NDArray) -> None:
        """Push this group's sum; pull the servers' value (the sum of all groups, or the
        weight the servers' optimizer updated) into ``out``."""
        kid = self._ids[key]
        self._kv.push(kid, value)
        self._kv.pull(kid, out=out)
        with self._dog.waiting(lambda: f"the parameter servers to return key {key!r} "
                                       f"(scheduler at {scheduler_address()})", collective=False):
            out.wait_to_read()

    def set_optimizer(self, optimizer) -> None:
        with self._dog.waiting("the parameter servers to take the optimizer", collective=False):
            self._kv.set_optimizer(optimizer)

    def close(self) -> None:
        """Leave ps-lite (it waits for every node); the handle must not live into teardown."""
        if self._kv is not None:
            kv, self._kv = self._kv, None
            del kv  # waits for every node; at exit the watchdog is gone, the launcher times it
