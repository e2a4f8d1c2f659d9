"""A worker for launcher tests: trains a little through hybrid-mpi, then behaves as told.

argv: MODE [RANK], MODE one of
  ok     - train a few steps and finish
  raise  - global rank RANK raises after 2 steps
  train  - train until killed (for tests that kill a server or press Ctrl-C)
"""
import sys
import time

import mxnet as mx

import kvhybrid  # noqa: F401

mode = sys.argv[1]
victim = int(sys.argv[2]) if len(sys.argv) > 2 else -1
kv = mx.kv.create("hybrid-mpi")
grad = mx.nd.ones((64, 64))
kv.init(0, mx.nd.zeros((64, 64)))
print(f"worker rank {kv.rank} of {kv.num_workers} ready", flush=True)
steps = 3 if mode == "ok" else 10 ** 6
for step in range(steps):
    if mode == "raise" and step == 2 and kv.rank == victim:
        # the time lets a test measure how long the job takes to stop after the failure
        raise RuntimeError(f"worker {kv.rank} failed on purpose at {time.time():.3f}")
    grad[:] = 1
    kv.pushpull(0, grad)
    time.sleep(0.05)
print(f"worker rank {kv.rank} done, sum {grad.asnumpy()[0, 0]:.0f}", flush=True)
kv.close()
