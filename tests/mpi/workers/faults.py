"""A training loop in which rank VICTIM misbehaves at step 3.

argv: MODE VICTIM, MODE one of
  kill  - the victim is killed by SIGKILL (a crash)
  raise - the victim raises an uncaught exception
  stall - the victim stops making calls (sleeps, e.g. a deadlock in user code)
  exit  - the victim leaves the loop early and exits 0 (a different number of steps)
"""
import os
import signal
import sys
import time

import mxnet as mx

import kvhybrid  # noqa: F401

mode, victim = sys.argv[1], int(sys.argv[2])
kv = mx.kv.create("hybrid-mpi")
grad = mx.nd.ones((256, 256))
kv.init(0, grad)
for step in range(1000):
    if step == 3 and kv.rank == victim:
        print(f"rank {kv.rank}: misbehaving ({mode}) at step {step}", flush=True)
        if mode == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif mode == "raise":
            raise RuntimeError("user code failed on purpose")
        elif mode == "stall":
            time.sleep(600)
        elif mode == "exit":
            kv.close()
            sys.exit(0)
    kv.pushpull(0, grad)
    grad[:] = 1
    time.sleep(0.01)
print(f"rank {kv.rank}: finished all steps", flush=True)
