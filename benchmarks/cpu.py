"""CPU time, where a step's milliseconds go on a host with more busy threads than cores.

On 2 cores with 4 workers and a server, every system's step is bound by the CPU all its
processes use: the caller's Python thread, the communication thread, MXNet's own threads
(compute, OpenMP, ps-lite) and the servers. Read before and after the timed steps.
"""
from __future__ import annotations

import os
import threading
import time
from typing import Dict

_TICK = os.sysconf("SC_CLK_TCK")

#: how kvhybrid's communication threads' names begin (``tensor_collectives/engine.py``)
COMMUNICATION_THREAD = "kvhybrid-comm"


def thread_seconds() -> Dict[str, float]:
    """CPU seconds used so far by this process's threads, by role: 'caller' (the main
    thread), 'communication' (kvhybrid's communication threads), 'native' (every thread
    Python did not start: MXNet's engine, OpenMP, ps-lite, MPI). Each to the nanosecond
    (the scheduler's own count, ``/proc/<pid>/task/<tid>/schedstat``), where the kernel
    keeps it; else to its tick (10 ms: over 50 steps, 0.2 ms a step, a tenth of the
    communication thread's figure)."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    main = threading.main_thread().native_id
    on_main = threading.get_native_id() == main
    out = {"caller": 0.0, "communication": 0.0, "native": 0.0, "other": 0.0}
    for tid in os.listdir("/proc/self/task"):
        seconds = _thread_run_seconds(tid)
        if seconds is None:
            continue
        if on_main and int(tid) == main:
            seconds = time.thread_time()
        name = names.get(int(tid))
        role = ("caller" if int(tid) == main else "native" if name is None
                else "communication" if name.startswith(COMMUNICATION_THREAD) else "other")
        out[role] += seconds
    return out


def _thread_run_seconds(tid: str):
    """A thread's CPU seconds so far (see ``thread_seconds``), or None if it ended."""
    try:
        with open(f"/proc/self/task/{tid}/schedstat") as f:
            return int(f.read().split()[0]) / 1e9   # time on a CPU, ns
    except (OSError, ValueError, IndexError):
        pass
    try:
        with open(f"/proc/self/task/{tid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:   # the thread ended meanwhile
        return None
    return (int(fields[11]) + int(fields[12])) / _TICK   # utime + stime


def machine_seconds() -> float:
    """CPU seconds every process of this machine used so far (``/proc/stat``: all but idle
    and iowait)."""
    with open("/proc/stat") as f:
        ticks = [int(v) for v in f.readline().split()[1:]]
    return (sum(ticks) - ticks[3] - ticks[4]) / _TICK


def per_step_ms(before: Dict[str, float], after: Dict[str, float], steps: int) -> Dict[str, float]:
    return {k: (after[k] - before.get(k, 0.0)) * 1e3 / steps for k in after}
