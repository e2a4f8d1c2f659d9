"""Engine-scheduled collectives (kvhybrid/tensor_collectives/engine.py and the store's
engine path), each rank writing what it saw to OUT/rank<r>.json.

- order: op "slow" waits for an engine operation the worker holds until it lets it go, op
  "fast" for nothing; they must run in submission order (slow first) on every rank, also
  once "fast" has been started by the engine, and both sums be right;
- returns_early: submit returns while its inputs are still being computed;
- failure: a collective that raises still completes its engine operation (waitall
  returns) and the error reaches the caller's thread, naming the operation;
- lone_*: a one-key pushpull with no out, or its value as its out, is summed in the key's
  own array (in place); with another out the value stays, and an array named for two keys of one call is copied;
- copies_* / apart_right / into_next_right: gradients in shared buffers with outs given are
  copied by their bucket's allreduce (no copy operator) and stay; a bucket whose gradients
  an out of the call lies in (an earlier bucket's, or its own) is copied first;
- pushpull_early: a store pushpull after backward returns before the engine has run its
  buckets, and the weights it updates are right once the engine is done;
- shared_key_right: two pushpull calls that share a key, alternating, with the store's
  optimizer (each call's bucket moves its keys' weights into one buffer of its own, which
  one SGD update, here the C++ helper's, makes in the bucket's allreduce: flat_update.py):
  every step updates the key's current weight, in the outs and in the store;
- repeated_call_collectives: a repeated lone pushpull is one collective where the ranks
  share a host (its agreement in its bucket's meeting), two elsewhere;
- out_of_order_error: repeated calls made in different orders raise on every rank.

"Still being computed" is made certain, not hoped for: the inputs wait behind a gate (an
engine operation on a second communication thread that holds them until released), so
nothing here depends on how fast the machine is.
"""
import json
import os
import sys
import threading
import time

import numpy as np
import mxnet as mx
from mxnet import autograd, gluon

import kvhybrid
from kvhybrid.errors import KVHybridError
from kvhybrid.kvstore.flat_update import FlatSGD
from kvhybrid.tensor_collectives.engine import EngineComm
from kvhybrid.tensor_collectives.ndarray_view import host_view
from kvhybrid.tensor_collectives.operators import Operator

out_dir = sys.argv[1]
kv = mx.kv.create("hybrid-mpi")
rank, size = kv.rank, kv.num_workers
group = kv.group.derived(kv.group.comm, "test-engine")
comm = EngineComm(group)
seen = {}


class Gate:
    """Holds arrays as "being computed" until ``open()``: an engine operation that mutates
    them and whose work waits for an event (on a communication thread of its own; opens
    by itself after SAFETY seconds, so a wrong store cannot hang the test)."""
    SAFETY = 30.0

    def __init__(self, name: str):
        self.comm = EngineComm(group)
        self.released = threading.Event()
        self.name = name

    def hold(self, arrays) -> None:
        self.comm.submit(self.name, arrays, lambda: self.released.wait(self.SAFETY))

    def open(self) -> None:
        self.released.set()

    def close(self) -> None:
        self.open()
        mx.nd.waitall()
        self.comm.close()


order = []
# views of allocated memory (MXNet allocates an op's output when the engine runs it)
slow, fast = mx.nd.zeros((600,)), mx.nd.zeros((5,))
mx.nd.waitall()
slow_view, fast_view = host_view(slow), host_view(fast)
(mx.nd.ones((600,)) * (rank + 1)).copyto(slow)
(mx.nd.ones((5,)) * (rank + 1)).copyto(fast)
fast.wait_to_read()
gate = Gate("gate")
gate.hold([slow])   # "slow" is being computed until the gate opens


def allreduce(name, view):
    def work():
        order.append(name)
        group.comm.Allreduce(group.MPI.IN_PLACE, view, op=group.MPI.SUM)
    return work


comm.submit("slow", [slow], allreduce("slow", slow_view))
comm.submit("fast", [fast], allreduce("fast", fast_view))
seen["returns_early"] = comm.pending == 2 and order == []
time.sleep(0.5)   # the engine starts "fast" (its input is ready); MPI must not see it yet
seen["fast_held_back"] = order == []
gate.open()
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
gate.close()

# a lone key's pushpull with no out, or with its value as its out, is summed in its own
# array (no copy in or out); with another out, or when the call names one array for two
# keys, the value stays as it is
total = size * (size + 1) / 2   # the ranks' (rank + 1) summed
big = (600, 500)   # 1.2 MB: past the first bucket's bound, so two such keys are two buckets
for k in (300, 301):
    kv.init(k, mx.nd.zeros(big))
lone = mx.nd.ones(big) * (rank + 1)
before = kv.engine.group.fused_in_place
kv.pushpull(300, lone)
kv.pushpull(300, lone)   # the second call sums the first's sums
kv.pushpull(300, lone, out=lone)   # its value as its out: in place as well
mx.nd.waitall()
seen["lone_in_place"] = kv.engine.group.fused_in_place - before
seen["lone_sums_right"] = bool(np.allclose(lone.asnumpy(), total * size * size))
kept, dst = mx.nd.ones(big) * (rank + 1), mx.nd.zeros(big)
kv.pushpull(300, kept, out=dst)
twice = mx.nd.ones(big) * (rank + 1)
kv.pushpull([300, 301], [twice, twice])
mx.nd.waitall()
seen["lone_out_and_shared_right"] = bool(
    np.allclose(kept.asnumpy(), rank + 1) and np.allclose(dst.asnumpy(), total)
    and np.allclose(twice.asnumpy(), total))

# gradients that lie in shared buffers, one per bucket, with outs given (update_on_kvstore):
# each bucket's allreduce copies its buffer itself and the gradients stay as they are; where
# an out of an earlier bucket of the call lies in a later bucket's gradients, that bucket's
# gradients are copied first (a copy operator), so it sums what they held at the call
for k in (310, 311, 312, 313):
    kv.init(k, mx.nd.zeros(big))
grad_buffers = [mx.nd.ones((big[0] * big[1],)) * (rank + 1) * (n + 1) for n in range(4)]
grad_views = [b.reshape(big) for b in grad_buffers]
for b, v in zip(grad_buffers, grad_views):
    kv.share_gradient_buffer(b, [v])
copies, push = [], Operator.__call__
Operator.__call__ = lambda self, **kw: copies.append(self.name) or push(self, **kw)
apart = [mx.nd.zeros(big), mx.nd.zeros(big)]
kv.pushpull([310, 311], grad_views[:2], out=apart)
mx.nd.waitall()
seen["copies_apart"] = copies.count("_copyto")
seen["apart_right"] = bool(
    np.allclose(apart[0].asnumpy(), total) and np.allclose(apart[1].asnumpy(), 2 * total)
    and np.allclose(grad_views[0].asnumpy(), rank + 1)
    and np.allclose(grad_views[1].asnumpy(), 2 * (rank + 1)))
copies.clear()
into_next = [grad_views[3], mx.nd.zeros(big)]   # key 312's out is key 313's gradient
kv.pushpull([312, 313], grad_views[2:], out=into_next)
mx.nd.waitall()
seen["copies_into_next"] = copies.count("_copyto")
seen["into_next_right"] = bool(np.allclose(into_next[0].asnumpy(), 3 * total)
                               and np.allclose(into_next[1].asnumpy(), 4 * total))
copies.clear()   # one bucket of two small keys, whose first key's out is its second's gradient
for k in (320, 321):
    kv.init(k, mx.nd.zeros((4,)))
pair = mx.nd.array([1, 1, 1, 1, 2, 2, 2, 2]) * (rank + 1)
pair_views = [pair[:4], pair[4:]]
kv.share_gradient_buffer(pair, pair_views)
into_own = [pair_views[1], mx.nd.zeros((4,))]
kv.pushpull([320, 321], pair_views, out=into_own)
mx.nd.waitall()
Operator.__call__ = push
seen["copies_into_own"] = copies.count("_copyto")
seen["into_own_right"] = bool(np.allclose(into_own[0].asnumpy(), total)
                              and np.allclose(into_own[1].asnumpy(), 2 * total))

# the store: pushpull of a slow backward returns before its buckets ran
net = gluon.nn.Dense(400, in_units=400)
net.initialize(mx.init.Constant(0.001))   # the bias starts at 0 (its own initialiser)
kvhybrid.broadcast_parameters(net.collect_params(), kv)
trainer = kvhybrid.DistributedTrainer(net.collect_params(), "sgd", {"learning_rate": 0.1},
                                      kvstore=kv)
x = mx.nd.ones((8, 400)) * (rank + 1)
x.wait_to_read()


def backward() -> None:
    with autograd.record():
        y = net(x)
        for _ in range(40):
            y = y * 1.0001
        loss = y.sum()
    loss.backward()


# The first step plans the buckets and lays the gradients out in them, which waits for
# the gradients; the overlap is every step after it.
backward()
trainer.step(1)
mx.nd.waitall()
gate = Gate("gate-input")
gate.hold([x])   # forward and backward wait for the gate: backward is still running
backward()
trainer.step(1)
seen["pushpull_early"] = (kv.engine is not None and kv.engine.pending > 0
                          and not gate.released.is_set())
gate.close()
# the gradient of sum(y) w.r.t. the bias is 8 * 1.0001**40 per rank, at every step; summed
# over ranks, two steps
bias = net.bias.data().asnumpy()
seen["bias_right"] = bool(np.allclose(bias, -2 * 0.1 * size * 8 * 1.0001 ** 40, rtol=1e-4))

# two calls sharing key 101: each call's bucket takes its keys' weights into its own buffer
kv.set_optimizer(mx.optimizer.SGD(learning_rate=0.5, rescale_grad=1.0))
shapes = {100: (3, 4), 101: (5,), 102: (2, 2)}
for k, shape in shapes.items():
    kv.init(k, mx.nd.ones(shape))
grads = {k: mx.nd.ones(shape) * (rank + 1) for k, shape in shapes.items()}
outs = {k: mx.nd.zeros(shape) for k, shape in shapes.items()}
steps = {k: 0 for k in shapes}
ops = []   # the SGD operators the store's optimizer runs (flat_update.py: one per bucket)
push, prepare = Operator.__call__, FlatSGD.prepare
Operator.__call__ = lambda self, **kw: ops.append(self.name) or push(self, **kw)
FlatSGD.prepare = lambda self: ops.append("cpp") or prepare(self)   # (made by the allreduce)
for step in range(4):
    keys = [100, 101] if step % 2 == 0 else [101, 102]
    kv.pushpull(keys, [grads[k] for k in keys], out=[outs[k] for k in keys])
    for k in keys:
        steps[k] += 1
Operator.__call__, FlatSGD.prepare = push, prepare
seen["flat_update_ops"] = ops.count("sgd_update")
seen["flat_update_cpp"] = ops.count("cpp")
total = size * (size + 1) / 2   # the gradients' sum over ranks
pulled = {k: mx.nd.zeros(shape) for k, shape in shapes.items()}
for k in shapes:
    kv.pull(k, out=pulled[k])
seen["shared_key_right"] = all(
    np.allclose(arr.asnumpy(), 1 - 0.5 * total * steps[k])
    for k in shapes for arr in (outs[k], pulled[k]))
seen["shared_key_steps"] = {str(k): v for k, v in steps.items()}

# two calls made by every rank in one order, then in different orders: the agreement on the
# communication thread (in the host barrier, here on one host) finds it before either
# call's collective, and the store's next call raises the same error on every rank
for k, shape in ((200, (3,)), (201, (5,))):
    kv.init(k, mx.nd.zeros(shape))
calls = {200: mx.nd.ones((3,)), 201: mx.nd.ones((5,))}
for k in (200, 201):
    kv.pushpull(k, calls[k])
mx.nd.waitall()
# a repeated call's agreement travels in its bucket's meeting where the ranks share a host
dog = kv.engine.group.watchdog
before = dog.collectives
for _ in range(3):
    kv.pushpull(200, calls[200])
mx.nd.waitall()
seen["repeated_call_collectives"] = dog.collectives - before
seen["meets_on_host"] = kv.engine.group.meets_on_host
try:
    for k in ((200, 201) if rank == 0 else (201, 200)):
        kv.pushpull(k, calls[k])
    mx.nd.waitall()
    kv.pushpull(200, calls[200])
    seen["out_of_order_error"] = None
except KVHybridError as exc:
    seen["out_of_order_error"] = str(exc)
with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
    json.dump(seen, f)
kv.close()
