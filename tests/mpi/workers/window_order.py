"""Two groups' shared-memory allreduces whose windows two ranks create in opposite orders
(as the engine's thread and the caller's can), then a normal exit.

argv: OUT. Each rank writes ``OUT/rank<r>.json``: the groups' keys in the order it made
their allreduce windows, every window's key open at exit (the groups' host barriers' too),
and how many ``windows.free_all`` (what kvhybrid runs at exit) freed.
Each window is made by its own thread, both at once; rank 1 starts its second group's
thread first, rank 0 its first group's, so each rank's first window is the one the other
made second. Creating a window is collective on its own communicator only, so the two
meet there whatever the order; the orders meet at exit.
"""
import json
import sys
import threading
import time
from pathlib import Path

import numpy as np
import mxnet as mx

import kvhybrid  # noqa: F401  registers hybrid-mpi
from kvhybrid.tensor_collectives import windows

kv = mx.kv.create("hybrid-mpi")
first = kv.group
second = first.derived(first.comm, "second")
for g in (first, second):   # map the hosts in the caller's thread: collective on the group
    g.algorithms.topology


def make_window(group) -> None:
    group.algorithms.run("shm", np.ones(4, dtype=np.float32))


order = [first, second] if kv.rank == 0 else [second, first]
threads = []
for group in order:
    threads.append(threading.Thread(target=make_window, args=(group,)))
    threads[-1].start()
    time.sleep(1.0)   # the first one's window is made (waiting for the other rank) first
for t in threads:
    t.join()
made = [g.key for g in order]
kv.close()
registered = sorted(windows._open)
freed = windows.free_all(timeout=30)
Path(sys.argv[1], f"rank{kv.rank}.json").write_text(
    json.dumps({"made": made, "registered": registered, "freed": freed}))
