"""What a store measured: its step clock and the stats file the tuners read."""
from __future__ import annotations

import collections
import json
import logging
import os
import time
from typing import Callable, Deque, Dict, List, Optional

from ..tensor_collectives.watchdog import post_step

log = logging.getLogger("kvhybrid")

#: step times kept for KVHYBRID_STATS_FILE (the tuner reads them): a bounded clock
MAX_TICKS = 10_001


class StepClock:
    """The step clock: a training loop pushes the same first key once per step. ``report``
    is called once, as step ``report_at`` begins (0: never), so that a tuner's trial can
    stop there."""

    def __init__(self, report_at: int = 0, report: Optional[Callable[[], None]] = None):
        self.first_key = None   # the first key pushed: one push per step
        self.steps = 0          # steps begun: pushes of the first key, this one included
        self._ticks: Deque[float] = collections.deque(maxlen=MAX_TICKS)
        self.report_at = report_at if report else 0
        self.report = report

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
            if self.steps == self.report_at:
                self.report()

    def step_seconds(self) -> List[float]:
        """Seconds between consecutive steps: the last ``MAX_TICKS - 1`` steps, so that a long
        job's clock does not grow."""
        ticks = list(self._ticks)
        return [b - a for a, b in zip(ticks, ticks[1:])]

    def __len__(self) -> int:
        return len(self._ticks)


def write_stats(config, placement, clock: StepClock, key_stats: Dict) -> None:
    """KVHYBRID_STATS_FILE: step times, the job's shape and the row_sparse keys' stats, for
    the tuners (``launch/tune.py``, ``launch/shape_tune.py``). Written whole under another
    name, then renamed: a tuner polling the file never reads half of it."""
    servers = placement.servers
    stats = {"step_seconds": clock.step_seconds(), "steps": clock.steps,
             "partitions": config.partitions, "workers": placement.num_workers,
             "clients": placement.num_clients, "servers": config.num_servers,
             "ps_requests": servers.requests if servers else 0,
             "keys": {str(k): v for k, v in key_stats.items()}}
    part = f"{config.stats_file}.{os.getpid()}.part"
    with open(part, "w") as f:
        json.dump(stats, f)
    os.replace(part, config.stats_file)


def log_key_stats(key_stats: Dict) -> None:
    """The row_sparse keys' stats, one line in the log (rank 0's, at close)."""
    if key_stats:
        log.info("row_sparse keys (α as rank 0 saw it): %s", "; ".join(
            f"{k!r} ({v['name']}): {v['rows']} rows, α {v['alpha']:.4f} over "
            f"{v['pushes']} pushes, route {v['route']}" for k, v in key_stats.items()))
