"""What kvhybrid runs inside MXNet's parameter servers: the optimizer, and checkpoints.

A server (``ps.node``) runs the object a worker's signed command (``auth``) pickles to
it. kvhybrid sends the Trainer's optimizer wrapped in ``ServerOptimizer``, which updates exactly as the
optimizer does and also keeps what a checkpoint needs: a reference to every optimizer
state the server created. ps-lite offers no other way into a server, so checkpoint
commands travel the same road (``command``): a pickled object whose unpickling, on
every server, saves or loads that server's states and hands back the installed
optimizer (the server then installs it again; its states survive, see
``create_state_multi_precision``).

Small dense keys travel packed (``servers.Pack``): one ps-lite key holds a presence mask
(one element per member) and then the members' values. ps-lite spends memory on every
request for good (``Customer::NewRequest`` keeps 8 bytes each), so a step of 5,000 small
keys would grow a master by 80 kB; packed, it sends a few requests. A pack's update runs
the optimizer on each member that the mask says was pushed, as a view into the pack and
under the member's own key, so states, counts and multipliers are those of the member.

A server's weights are not read here: workers pull them. To restore them, ``load``
marks the keys whose next update *sets* the weight to the pushed value (and the state
to the saved one) instead of applying the optimizer; workers then push the saved values.

A server unpickles this module inside its command handler: it imports nothing from
kvhybrid's store (a server has no MPI).
"""
from __future__ import annotations

import gc
import logging
import os
import pickle
from typing import Dict, Iterable, List, Optional, Tuple

log = logging.getLogger("kvhybrid.server")

#: the optimizer this server process runs (the last one a worker sent)
_INSTALLED: Optional["ServerOptimizer"] = None


def state_file(directory: str, server_rank: int) -> str:
    return os.path.join(directory, f"server-{server_rank}.states")


def ack_file(directory: str, server_rank: int, token: str) -> str:
    return os.path.join(directory, f".server-{server_rank}.loaded-{token}")


def _install(inner, probe_key: Optional[int] = None) -> "ServerOptimizer":
    """Unpickled on a server: the optimizer it will run. The same optimizer sent again (a
    restarted client group sends it as it starts) keeps the states of the keys."""
    global _INSTALLED
    previous = _INSTALLED
    _INSTALLED = ServerOptimizer(inner, probe_key)
    if previous is not None:
        _INSTALLED._packs = previous._packs
        # keys the new optimizer's copy was sent without (made after it left the worker)
        _INSTALLED.add_multipliers({kid: m for kid, m in previous._multipliers.items()
                                    if kid not in inner.lr_mult and kid not in inner.wd_mult})
        if type(previous.inner) is type(inner):
            _INSTALLED._states = previous._states
            _INSTALLED._dense = previous._dense
    return _INSTALLED


class ServerOptimizer:
    """The Trainer's optimizer as a server runs it; see the module docstring."""

    #: one key per update call: a server applies each push on its own anyway
    aggregate_num = 0

    def __init__(self, inner, probe_key: Optional[int] = None):
        self.inner = inner
        #: the key the workers push onto to see that this optimizer arrived (ps/link.py):
        #: summed, never handed to ``inner``, whose counts and schedules (``num_update``
        #: for an lr_scheduler, Nadam's ``m_schedule``) belong to the model's keys
        self.probe_key = probe_key
        self._states: Dict[int, object] = {}
        self._setting: set = set()                 # keys whose next update sets the weight
        self._saved_states: Dict[int, object] = {}
        #: row_sparse keys whose optimizer computes densely (create_state_multi_precision)
        self._dense: set = set()
        #: pack key -> (mask length, [(member key, first element, end)])
        self._packs: Dict[int, Tuple[int, List[Tuple[int, int, int]]]] = {}
        #: ps-lite key -> (lr_mult, wd_mult) the workers resolved for it (``MultipliersCommand``)
        self._multipliers: Dict[int, Tuple[float, float]] = {}

    def __reduce__(self):
        # the states stay where they are: only the optimizer travels
        return _install, (self.inner, self.probe_key)

    def __getattr__(self, name):
        if name == "inner":   # not yet set (copy, unpickling)
            raise AttributeError(name)
        return getattr(self.inner, name)

    def create_state_multi_precision(self, index, weight):
        """A state per key, kept here too: a server installs a fresh updater each time the
        optimizer arrives (a command, a second Trainer), and it must find the old states.

        A row_sparse weight whose optimizer makes states of another storage (MXNet's
        ``Test``, ``NAG``, a custom optimizer: dense zeros) is updated as a dense array
        (``_update``): such an optimizer computes densely, and handed the row_sparse weight
        it fails half-way (``state[:] = weight`` raises after the weight changed; MXNet's
        own server prints that and trains on). Its states are made from the dense weight."""
        if index in self._packs or index == self.probe_key:   # (packs: each member its own)
            return None
        if index not in self._states:
            state = self.inner.create_state_multi_precision(index, weight)
            if weight.stype != "default" and _other_storage(state, weight.stype):
                self._dense.add(index)
                state = self.inner.create_state_multi_precision(index,
                                                                weight.tostype("default"))
            self._states[index] = state
        return self._states[index]

    def create_state(self, index, weight):
        return self.create_state_multi_precision(index, weight)

    def update_multi_precision(self, index, weight, grad, state):
        try:
            self._update(index, weight, grad, state)
        except BaseException:   # MXNet would print it and go on with half-updated weights
            log.exception("the optimizer failed on key %s on this parameter server; ending "
                          "the server so that the job stops instead of training on",
                          index)
            logging.shutdown()
            os._exit(1)

    def _update(self, index, weight, grad, state):
        if index == self.probe_key:
            weight[:] += grad   # moves each round, as an optimizer's update would
            return
        if index in self._packs:
            self._update_pack(index, weight, grad)
            return
        if index in self._setting:
            self._setting.discard(index)
            grad.copyto(weight)
            saved = self._saved_states.pop(index, None)
            if saved is not None:
                _copy_state(saved, state)
            return
        if index in self._dense and weight.stype != "default":
            dense = weight.tostype("default")
            self.inner.update_multi_precision(index, dense, grad, state)
            dense.copyto(weight)   # back into the server's row_sparse storage
            return
        self.inner.update_multi_precision(index, weight, grad, state)

    def update(self, index, weight, grad, state):
        self.update_multi_precision(index, weight, grad, state)

    def _update_pack(self, index, weight, grad) -> None:
        """Update the members of pack ``index`` that were pushed (mask > 0), in place."""
        mask_len, members = self._packs[index]
        present = grad[0:mask_len].asnumpy()
        for i, (member, start, end) in enumerate(members):
            if present[i] == 0:
                continue
            # flat, as a server stores an unpacked key: states keep one shape either way
            w = weight[start:end]
            g = grad[start:end]
            self._update(member, w, g, self.create_state_multi_precision(member, w))

    def add_packs(self, packs) -> None:
        self._packs.update(packs)

    def add_multipliers(self, multipliers: Dict[int, Tuple[float, float]]) -> None:
        """Each key's multipliers under its ps-lite key, where the optimizer looks first."""
        self._multipliers.update(multipliers)
        for kid, (lr_mult, wd_mult) in multipliers.items():
            self.inner.lr_mult[kid], self.inner.wd_mult[kid] = lr_mult, wd_mult

    # -- checkpoints -----------------------------------------------------------------------
    def save(self, path: str, token: str) -> None:
        data = {"token": token, "states": self._states,
                "counts": self.inner._all_index_update_counts,
                "num_update": self.inner.num_update}
        tmp = path + ".tmp"
        with open(tmp, "wb") as f:
            pickle.dump(data, f)
        os.replace(tmp, path)

    def load(self, path: str, keys: Iterable[int]) -> None:
        with open(path, "rb") as f:
            data = pickle.load(f)
        self._saved_states = dict(data["states"])
        self._setting = set(keys)
        counts = data["counts"]
        self.inner._all_index_update_counts = counts
        self.inner._index_update_count = counts.setdefault(0, {})
        self.inner.num_update = data["num_update"]


def _other_storage(state, stype: str) -> bool:
    """Whether an optimizer state (None, an NDArray, or tuples of them) holds an array of
    a storage other than ``stype``."""
    if isinstance(state, (list, tuple)):
        return any(_other_storage(s, stype) for s in state)
    return state is not None and hasattr(state, "stype") and state.stype != stype


def _copy_state(saved, state) -> None:
    """Copy a saved state (an NDArray, a tuple of them, or None) into a live one."""
    if saved is None or state is None:
        return
    if isinstance(saved, (list, tuple)):
        for s, t in zip(saved, state):
            _copy_state(s, t)
        return
    saved.copyto(state)


def _server_rank() -> int:
    """This server's ps-lite rank, read from MXNet's server object (ps-lite tells nothing
    else in a server process)."""
    from mxnet.kvstore.kvstore_server import KVStoreServer
    for obj in gc.get_objects():
        if isinstance(obj, KVStoreServer):
            return obj.kvstore.rank
    raise RuntimeError("kvhybrid: no MXNet KVStoreServer in this process")


def command(action: str, directory: str, token: str, keys) -> Optional[ServerOptimizer]:
    """Run a checkpoint command on this server (unpickled there, see ``Command``)."""
    rank = _server_rank()
    if _INSTALLED is None:
        raise RuntimeError(f"kvhybrid: server {rank} has no optimizer to {action} states of")
    if action == "save":
        _INSTALLED.save(state_file(directory, rank), token)
    elif action == "load":
        _INSTALLED.load(state_file(directory, rank), keys)
        with open(ack_file(directory, rank, token), "w") as f:
            f.write(token)
    else:
        raise RuntimeError(f"kvhybrid: unknown server command {action!r}")
    log.info("server %d: %s optimizer states (%s)", rank, action, directory)
    return _INSTALLED


class Command:
    """A checkpoint command as a worker sends it: unpickled on a server, it runs ``command``
    there (see the module docstring)."""

    def __init__(self, action: str, directory: str, token: str, keys=()):
        self.args = (action, directory, token, sorted(int(k) for k in keys))

    def __reduce__(self):
        return command, self.args

    # read on the worker before it sends the object (kSetMultiPrecision)
    multi_precision = False


def add_packs(packs) -> Optional[ServerOptimizer]:
    """Register pack layouts on this server (unpickled there, see ``PackCommand``)."""
    if _INSTALLED is None:
        raise RuntimeError("kvhybrid: a server got packed keys before an optimizer")
    _INSTALLED.add_packs(packs)
    return _INSTALLED


def add_multipliers(multipliers) -> Optional[ServerOptimizer]:
    """Set keys' multipliers on this server (unpickled there, see ``MultipliersCommand``)."""
    if _INSTALLED is None:
        raise RuntimeError("kvhybrid: a server got multipliers before an optimizer")
    _INSTALLED.add_multipliers(multipliers)
    return _INSTALLED


class MultipliersCommand:
    """Keys' (lr_mult, wd_mult) by ps-lite key, as a worker sends them (unpickled on a
    server, it runs ``add_multipliers`` there): a key whose multipliers the optimizer finds
    by its name or the store's key (``Module``'s str keys; ``idx2name``) is another number
    on the servers."""

    def __init__(self, multipliers):
        self.multipliers = multipliers

    def __reduce__(self):
        return add_multipliers, (self.multipliers,)

    multi_precision = False


class PackCommand:
    """Pack layouts as a worker sends them (unpickled on a server, it runs ``add_packs``
    there): {pack key: (mask length, [(member key, first element, end)])}."""

    def __init__(self, packs):
        self.packs = packs

    def __reduce__(self):
        return add_packs, (self.packs,)

    multi_precision = False
