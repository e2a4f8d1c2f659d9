"""Create a hybrid-mpi store (argv[1]: another of kvhybrid's store names) and print its
identity. argv[2], if given: a folder where each rank writes the error that refused the
store (``refused-rank<r>.txt``) before all ranks exit 1, so a test reads every rank's
message from a file instead of from mpirun's interleaved output."""
import os
import sys
import time

import mxnet as mx

import kvhybrid  # noqa: F401

name = sys.argv[1] if len(sys.argv) > 1 else "hybrid-mpi"
try:
    kv = mx.kv.create(name)
except Exception as exc:
    if len(sys.argv) <= 2:
        raise
    from mpi4py import MPI   # every rank writes what refused it, then all exit together
    with open(os.path.join(sys.argv[2], f"refused-rank{MPI.COMM_WORLD.rank}.txt"), "w") as f:
        f.write(f"{type(exc).__name__}: {exc}\n")
    done, deadline = MPI.COMM_WORLD.Ibarrier(), time.monotonic() + 30
    while not done.Test() and time.monotonic() < deadline:
        time.sleep(0.01)
    sys.exit(1)
print(f"store rank={kv.rank} num_workers={kv.num_workers} type={kv.type}", flush=True)
kv.close()
