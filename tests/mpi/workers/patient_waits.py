"""The store's patient waits (``ops.wait_patiently``, ``ops.wait_all_patiently``) on a real
job, the last rank late each time: through the C++ helper where it was built, and through
Python with the helper switched off, a wait long enough to hand back to Python between
the helper's calls, and several requests at once.

argv: OUT. Rank r writes ``OUT/rank<r>.json``: per case, what the collective computed, whether
its requests were null afterwards (complete, as mpi4py's own Test leaves them), and how many
times the helper and Python's loop waited.
"""
import json
import sys
import time
from pathlib import Path

import numpy as np
from mpi4py import MPI

from kvhybrid.tensor_collectives import ops

out = Path(sys.argv[1])
comm = MPI.COMM_WORLD
rank, size = comm.rank, comm.size
record = {}
counts = {"helper": 0, "python": 0}


class CountingHelper:
    """The helper's library, counting its waits."""

    def __init__(self, library):
        self.library = library

    def kvhybrid_wait_requests(self, *args):
        counts["helper"] += 1
        return self.library.kvhybrid_wait_requests(*args)


python_loop = ops._sleep_until


def counting_python_loop(done):
    counts["python"] += 1
    python_loop(done)


ops._sleep_until = counting_python_loop
built = ops._WAIT.library()


def late(seconds=0.2):
    """Every rank starts together, the last one ``seconds`` late; the counts start at 0."""
    comm.Barrier()
    counts.update(helper=0, python=0)
    if rank == size - 1:
        time.sleep(seconds)


for case in ("helper", "python", "long"):
    # (None: as where it was not built, or is switched off)
    ops._WAIT.loaded[:] = [None if case == "python" or built is None else CountingHelper(built)]
    budget = ops._WAIT_BUDGET
    if case == "long":
        ops._WAIT_BUDGET = 0.0     # (back in Python after each round of tests)
    summed = np.full(5, rank + 1.0)
    late()
    request = comm.Iallreduce(MPI.IN_PLACE, summed)
    ops.wait_patiently(request)
    ops._WAIT_BUDGET = budget
    record[case] = {"sum": summed.tolist(), "done": request == MPI.REQUEST_NULL, **counts}

# several requests at once: the root of a broadcast late, then a barrier
data = np.arange(4.0) if rank == size - 1 else np.zeros(4)
late()
requests = [comm.Ibcast(data, root=size - 1), comm.Ibarrier()]
ops.wait_all_patiently(requests)
record["several"] = {"data": data.tolist(), "done": all(r == MPI.REQUEST_NULL for r in requests),
                     **counts}
record["built"] = built is not None
(out / f"rank{rank}.json").write_text(json.dumps(record))
