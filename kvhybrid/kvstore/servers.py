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
import time
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


def server_link(watchdog: Watchdog, connect_timeout: float, mode: str) -> "ServerLink":
    """The process's link (ps-lite starts once per process; every store of the process
    shares it), now timed by ``watchdog``."""
    global _LINK
    if _LINK is None:
        _LINK = ServerLink(watchdog, connect_timeout, mode)
        atexit.register(_LINK.close)
    if _LINK.mode != mode:
        raise KeyValueError(f"this process already talks to the servers in {_LINK.mode} mode: "
                            f"one process cannot mix {_LINK.mode} and {mode} stores")
    _LINK._dog = watchdog
    return _LINK


class ServerLink:
    """A group master's ps-lite connection; keys are mapped to ints in call order."""

    def __init__(self, watchdog: Watchdog, connect_timeout: float, mode: str = "dist_sync"):
        self._dog = watchdog
        self.mode = mode
        address = scheduler_address()
        with watchdog.waiting(f"the scheduler at {address}, the parameter servers and the other "
                              "client groups' masters to connect", collective=False,
                              timeout=connect_timeout,
                              hint=f"check that the scheduler runs at {address} and that this "
                                   "host reaches it, that DMLC_NUM_SERVER and DMLC_NUM_WORKER "
                                   "match the servers and client groups started, or raise "
                                   "KVHYBRID_CONNECT_TIMEOUT"):
            self._kv = mx.kv.create(mode)
        self._ids: Dict[Key, int] = {}
        self._probes = 0  # probe keys count down from STR_KEY_BASE - 1

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

    def pull(self, key: Key, out: NDArray) -> None:
        """The servers' current value of ``key``, into ``out``."""
        self._kv.pull(self._ids[key], out=out)
        with self._dog.waiting(lambda: f"the parameter servers to return key {key!r} "
                                       f"(scheduler at {scheduler_address()})", collective=False):
            out.wait_to_read()

    def set_optimizer(self, optimizer) -> bool:
        """Send the optimizer to the servers; False if they run without it.

        A server that cannot unpickle the optimizer (its module is not importable there)
        only prints "Exception ignored on calling ctypes callback" and then sums instead of
        updating, silently. So every master pushes 1 onto a fresh probe key holding 0: servers
        without an optimizer return the sum of the pushes (sync: the number of masters; async:
        each push replaces the value, so 1), servers with one an updated weight. In async
        mode a pull may come before the push is applied: pull until the value moves.
        """
        with self._dog.waiting("the parameter servers to take the optimizer", collective=False):
            self._kv.set_optimizer(optimizer)
        self._probes += 1
        kid = STR_KEY_BASE - self._probes
        probe = mx.nd.zeros((1,))
        without = float(self.num_masters) if self.mode == "dist_sync" else 1.0
        with self._dog.waiting("the parameter servers to answer the optimizer probe",
                               collective=False):
            self._kv.init(kid, probe)
            self._kv.push(kid, mx.nd.ones((1,)))
            for _ in range(500):
                self._kv.pull(kid, out=probe)
                if float(probe.asscalar()) != 0.0:
                    break
                time.sleep(0.01)
            return float(probe.asscalar()) != without

    def barrier(self) -> None:
        """Wait for this master's pushes to be answered, then for every master."""
        with self._dog.waiting("the other client groups' masters at a barrier",
                               collective=False):
            mx.nd.waitall()
            self._kv._barrier()

    def close(self) -> None:
        """Leave ps-lite (it waits for every node); the handle must not live into teardown."""
        if self._kv is not None:
            kv, self._kv = self._kv, None
            del kv  # waits for every node; at exit the watchdog is gone, the launcher times it
