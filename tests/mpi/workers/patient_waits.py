"""The store's patient waits (``ops.wait_patiently``, ``ops.wait_all_patiently``) on a real
job, the last rank late each time: through the C++ helper where it was built, and through
Python with the helper switched off, a wait long enough to hand back to Python between
the helper's calls, and several requests at once.

argv: OUT. Rank r writes ``OUT/rank<r>.json``: per case, what the collective computed, whether
its requests were null afterwards (complete, as mpi4py's own Test leaves them), and whether
the helper waited.
"""
import json
import os
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


def late(seconds=0.2):
    """Every rank starts together, the last one ``seconds`` late."""
    comm.Barrier()
    if rank == size - 1:
        time.sleep(seconds)


def helper_waits(requests) -> bool:
    return ops._helped(requests) is not None


for case in ("helper", "python", "long"):
    if case == "python":
        ops._WAIT.loaded[:] = [None]   # (as where it was not built, or is switched off)
    budget = ops._WAIT_BUDGET
    if case == "long":
        ops._WAIT.loaded[:] = []   # (looked for again)
        ops._WAIT_BUDGET = 0.01    # (back in Python several times in the wait)
    summed = np.full(5, rank + 1.0)
    late()
    request = comm.Iallreduce(MPI.IN_PLACE, summed)
    used = helper_waits([request])
    ops.wait_patiently(request)
    ops._WAIT_BUDGET = budget
    record[case] = {"sum": summed.tolist(), "done": request == MPI.REQUEST_NULL,
                    "helper": used}

# several requests at once: the root of a broadcast late, then a barrier
data = np.arange(4.0) if rank == size - 1 else np.zeros(4)
late()
requests = [comm.Ibcast(data, root=size - 1), comm.Ibarrier()]
used = helper_waits(requests)
ops.wait_all_patiently(requests, MPI)
record["several"] = {"data": data.tolist(), "done": all(r == MPI.REQUEST_NULL for r in requests),
                     "helper": used}
(out / f"rank{rank}.json").write_text(json.dumps(record))
