"""Small dense keys packed into one ps-lite key: a master's half (the server's half is
``server.ServerOptimizer._update_pack``).

ps-lite keeps 8 bytes for every request a worker ever sends (``Customer::NewRequest``
appends to a tracker that is never trimmed), so a master that pushes and pulls 5,000
small keys a step grows by 80 kB a step, without bound. A pack sends them as one array:

    [presence mask: one element per member][member 0][member 1]...

The mask says which members a push carries (a call may push a subset); the servers'
optimizer updates exactly those, each as a view under its own key. Packs are made
from the keys of a multi-key ``pushpull`` the first time it reaches the servers (on the
engine path, when the call is planned, on the caller's thread), only
when the servers run kvhybrid's optimizer (with none, they would store the pushed sums,
zeros and all), and stay below MXNet's big-array bound, so one server holds each.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Dict, List, Sequence, Tuple

import numpy as np
import mxnet as mx

from ...tensor_collectives.ndarray_view import host_view, wait_to_write
from ..keys import Key


def big_array_bound() -> int:
    """Elements from which MXNet splits a dense key over every server."""
    return int(os.environ.get("MXNET_KVSTORE_BIGARRAY_BOUND", 1000 * 1000))


@dataclass
class Member:
    key: Key
    kid: int            # its own ps-lite key: the servers' optimizer updates it under this
    start: int
    end: int


@dataclass
class Pack:
    pack_key: int       # the pack's ps-lite key
    dtype: np.dtype
    members: List[Member]
    array: mx.nd.NDArray = field(init=False)   # pushed from and pulled into
    view: np.ndarray = field(init=False)       # the same memory, for numpy

    def __post_init__(self):
        size = self.members[-1].end
        self.array = mx.nd.zeros((size,), mx.cpu(), dtype=self.dtype)
        wait_to_write(self.array)   # the engine's zero fill must not land after our writes
        self.view = host_view(self.array, self.dtype, size)

    @property
    def mask(self) -> np.ndarray:
        return self.view[:len(self.members)]

    def region(self, i: int) -> np.ndarray:
        m = self.members[i]
        return self.view[m.start:m.end]

    def layout(self):
        """What the servers need: (mask length, [(member key, first element, end)])."""
        return len(self.members), [(m.kid, m.start, m.end) for m in self.members]


def plan(candidates: Sequence[Tuple[Key, int, int]], limit: int) -> List[List[Member]]:
    """Members of new packs from ``(key, kid, elements)`` in call order: greedy runs
    whose mask and values stay below ``limit`` elements; runs of one key stay unpacked."""
    runs: List[List[Member]] = []
    run: List[Tuple[Key, int, int]] = []

    def close():
        if len(run) >= 2:
            start, members = len(run), []
            for key, kid, count in run:
                members.append(Member(key, kid, start, start + count))
                start += count
            runs.append(members)
        run.clear()

    total = 0
    for item in candidates:
        count = item[2]
        if count + 1 >= limit:   # too big to share a server: stays a key of its own
            close()
            total = 0
            continue
        if run and total + count + len(run) + 1 >= limit:
            close()
            total = 0
        run.append(item)
        total += count
    close()
    return runs


def by_key(packs: Sequence[Pack]) -> Dict[Key, Tuple[Pack, int]]:
    return {m.key: (p, i) for p in packs for i, m in enumerate(p.members)}
