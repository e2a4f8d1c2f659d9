"""Engine-scheduled collectives (kvhybrid/tensor_collectives/engine.py and the store's
engine path), each rank writing what it saw to OUT/rank<r>.json.

- order: op "slow" waits for a long chain of engine work, op "fast" for nothing; they must
  run in submission order (slow first) on every rank, and both sums be right;
- returns_early: submit returns while its inputs are still being computed;
- failure: a collective that raises still completes its engine operation (waitall
  returns) and the error reaches the caller's thread, naming the operation;
- pushpull_early: a store pushpull after backward returns before the engine has run its
  buckets, and the weights it updates are right once the engine is done.
"""
import json
import os
import sys
import time

import numpy as np
import mxnet as mx
from mxnet import autograd, gluon

import kvhybrid
from kvhybrid.errors import KVHybridError
from kvhybrid.tensor_collectives import Group
from kvhybrid.tensor_collectives.engine import EngineComm
from kvhybrid.tensor_collectives.ndarray_view import host_view

out_dir = sys.argv[1]
kv = mx.kv.create("hybrid-mpi")
rank, size = kv.rank, kv.num_workers
group = Group(kv.group.MPI, kv.group.comm, kv.config, "test-engine")
comm = EngineComm(group)
seen = {}


def slow_array() -> mx.nd.NDArray:
    """Ones that the engine needs a while to compute (about a second on 2 cores)."""
    a = mx.nd.ones((600, 600))
    for _ in range(60):
        a = mx.nd.dot(a, a)
        a = a / a.max()
    return a


order = []
# views of allocated memory (MXNet allocates an op's output when the engine runs it)
slow, fast = mx.nd.zeros((600,)), mx.nd.zeros((5,))
mx.nd.waitall()
slow_view, fast_view = host_view(slow), host_view(fast)
(slow_array()[0:1].reshape((600,)) * (rank + 1)).copyto(slow)   # rank + 1, eventually
(mx.nd.ones((5,)) * (rank + 1)).copyto(fast)
fast.wait_to_read()


def allreduce(name, view):
    def work():
        order.append(name)
        group.comm.Allreduce(group.MPI.IN_PLACE, view, op=group.MPI.SUM)
    return work


comm.submit("slow", [slow], allreduce("slow", slow_view))
comm.submit("fast", [fast], allreduce("fast", fast_view))
seen["returns_early"] = comm.pending == 2 and order == []
mx.nd.waitall()
want = size * (size + 1) / 2
seen["order"] = order
seen["sums_right"] = bool(np.allclose(slow.asnumpy(), want, rtol=1e-3)
                          and np.allclose(fast.asnumpy(), want))


def fails():
    raise RuntimeError("injected failure")


broken = mx.nd.zeros((3,))
comm.submit("broken-bucket", [broken], fails)
start = time.monotonic()
mx.nd.waitall()   # must not hang: the operation completes although its work raised
seen["waitall_returned_s"] = time.monotonic() - start
try:
    comm.check()
    seen["error"] = None
except KVHybridError as exc:
    seen["error"] = str(exc)
comm.close()

# the store: pushpull of a slow backward returns before its buckets ran
net = gluon.nn.Dense(400, in_units=400)
net.initialize(mx.init.Constant(0.001))   # the bias starts at 0 (its own initialiser)
kvhybrid.broadcast_parameters(net.collect_params(), kv)
trainer = kvhybrid.DistributedTrainer(net.collect_params(), "sgd", {"learning_rate": 0.1},
                                      kvstore=kv)
x = mx.nd.ones((8, 400)) * (rank + 1)
wide, back = mx.nd.ones((400, 2000)) / 400, mx.nd.ones((2000, 400)) / 2000
with autograd.record():   # a backward pass of a few GFLOP whose extra terms add nothing
    y = net(x)
    for _ in range(40):
        y = y * 1.0001 + mx.nd.dot(mx.nd.dot(y, wide), back) * 0.0
    loss = y.sum()
loss.backward()
trainer.step(1)
seen["pushpull_early"] = kv.engine is not None and kv.engine.pending > 0
mx.nd.waitall()
# the gradient of sum(y) w.r.t. the bias is 8 * 1.0001**40 per rank; summed over ranks
bias = net.bias.data().asnumpy()
seen["bias_right"] = bool(np.allclose(bias, -0.1 * size * 8 * 1.0001 ** 40, rtol=1e-4))
with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
    json.dump(seen, f)
kv.close()
