"""What a store measured: its step clock and the stats file the partition tuner reads."""
from __future__ import annotations

import collections
import json
import time
from typing import Deque, Dict, List

from ..tensor_collectives.watchdog import post_step

#: step times kept for KVHYBRID_STATS_FILE (the tuner reads them): a bounded clock
MAX_TICKS = 10_001


class StepClock:
    """The step clock: a training loop pushes the same first key once per step."""

    def __init__(self):
        self.first_key = None   # the first key pushed: one push per step
        self.steps = 0          # steps begun: pushes of the first key, this one included
        self._ticks: Deque[float] = collections.deque(maxlen=MAX_TICKS)

    @property
    def started(self) -> bool:
        """Whether anything was pushed yet."""
        return self.first_key is not None

    def tick(self, ident) -> None:
        """A push or pushpull of ``ident`` (a key, or a tuple of keys)."""
        if self.first_key is None:
            self.first_key = ident
        if ident == self.first_key:
            self._ticks.append(time.perf_counter())
            self.steps += 1
            post_step(self.steps)

    def step_seconds(self) -> List[float]:
        """Seconds between consecutive steps: the last ``MAX_TICKS - 1`` steps, so that a long
        job's clock does not grow."""
        ticks = list(self._ticks)
        return [b - a for a, b in zip(ticks, ticks[1:])]

    def __len__(self) -> int:
        return len(self._ticks)


def write_stats(path: str, clock: StepClock, key_stats: Dict, **job: object) -> None:
    """KVHYBRID_STATS_FILE: step times, the job's shape (``job``) and the row_sparse keys'
    stats, for the partition tuner (``launch/tune.py``)."""
    stats = {"step_seconds": clock.step_seconds(), **job,
             "keys": {str(k): v for k, v in key_stats.items()}}
    with open(path, "w") as f:
        json.dump(stats, f)
