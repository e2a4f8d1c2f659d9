"""Global rank 0 arrives 2 s late at a barrier; every rank prints how long it waited there."""
import time

import mxnet as mx

import kvhybrid  # noqa: F401

kv = mx.kv.create("hybrid-mpi")
kv.barrier()                      # everyone connected
if kv.rank == 0:
    time.sleep(2)
start = time.monotonic()
kv.barrier()
print(f"rank {kv.rank} waited {time.monotonic() - start:.2f} s", flush=True)
kv.close()
