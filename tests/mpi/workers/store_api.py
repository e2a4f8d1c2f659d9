"""The store's classic API and its Gluon integration, checked call by call.

argv: OUT_DIR. Rank 0 writes OUT_DIR/api.json: {check: [ok, detail]}; every rank
asserts the same things, and the job fails if any rank disagrees.
"""
import json
import os
import sys

import numpy as np
import mxnet as mx
from mxnet import autograd, gluon

import kvhybrid
from kvhybrid import KVHybridError

out_dir = sys.argv[1]
kv = mx.kv.create("hybrid-mpi")
rank, size = kv.rank, kv.num_workers
checks = {}


def check(name, ok, detail=""):
    checks[name] = [bool(ok), str(detail)]


def val(arr):
    return arr.asnumpy().tolist()


# identity
check("type_is_distributed_sync", kv.type == "dist_sync_hybrid-mpi", kv.type)
check("rank_and_num_workers", kv.num_workers == size and 0 <= kv.rank < size, (kv.rank, size))
check("is_native_kvstore_subclass", isinstance(kv, mx.kv.KVStore), type(kv).__mro__)
check("capable_of_optimizer", kv.is_capable("optimizer"))
check("is_capable_is_static", type(kv).is_capable("optimizer") is True)   # (as MXNet's)
check("create_by_type_round_trips", isinstance(mx.kv.create(kv.type), kvhybrid.HybridMPIStore))

# init takes rank 0's value; pull copies it into any number of device arrays
kv.init("a", mx.nd.full((2, 3), rank + 5))
outs = [mx.nd.zeros((2, 3)), mx.nd.zeros((2, 3), ctx=mx.cpu(1))]
kv.pull("a", out=outs)
check("init_value_is_rank0s", all(val(o) == [[5.0] * 3] * 2 for o in outs), val(outs[1]))

# push without an optimizer stores the sum over devices and ranks (dist_sync semantics)
kv.push("a", [mx.nd.ones((2, 3)), mx.nd.ones((2, 3), ctx=mx.cpu(1)) * 2])
kv.pull("a", out=outs[0])
check("push_stores_sum", val(outs[0]) == [[3.0 * size] * 3] * 2, val(outs[0]))

# pushpull into out leaves value alone; in place overwrites value
kv.init("b", mx.nd.zeros((4,)))
value, out = mx.nd.full((4,), rank + 1), mx.nd.zeros((4,))
kv.pushpull("b", value, out=out)
total = size * (size + 1) / 2
check("pushpull_out_sums", val(out) == [total] * 4, val(out))
check("pushpull_out_keeps_value", val(value) == [rank + 1.0] * 4, val(value))
kv.pushpull("b", value)
check("pushpull_in_place_sums", val(value) == [total] * 4, val(value))

# key lists, as MXNet's classic API takes them (str keys throughout: a store takes one type)
kv.init(["k10", "k11"], [mx.nd.zeros((2,)), mx.nd.zeros((3,))])
vals = [mx.nd.ones((2,)), mx.nd.ones((3,)) * 2]
kv.pushpull(["k10", "k11"], vals)
check("key_lists", val(vals[0]) == [size] * 2 and val(vals[1]) == [2.0 * size] * 3,
      [val(v) for v in vals])

# broadcast can refresh an existing key (e.g. after loading a checkpoint on rank 0)
w = mx.nd.full((3,), rank + 7)
kv.broadcast("w", w, out=w)
check("broadcast_gives_rank0s", val(w) == [7.0] * 3, val(w))
w2 = [mx.nd.full((3,), rank + 9), mx.nd.zeros((3,), ctx=mx.cpu(1))]
kv.broadcast("w", w2[0], out=w2)
check("broadcast_again_overwrites", all(val(x) == [9.0] * 3 for x in w2), [val(x) for x in w2])

# MXNet's local stores' calls: a pull without ignore_sparse gives row_sparse outs every row
# of the value (one key, and keys sharing the same outs); outs of another dtype are cast into
devices = [mx.cpu(0), mx.cpu(1)]
kv.init("rs", mx.nd.zeros((6, 2)).tostype("row_sparse"))
kv.push("rs", [mx.nd.sparse.row_sparse_array((mx.nd.ones((1, 2)) * (d + 1), [d + rank]),
                                              shape=(6, 2), ctx=dev)
               for d, dev in enumerate(devices)])
expected = np.zeros((6, 2))
for r in range(size):
    expected[r] += 1
    expected[r + 1] += 2
rsp_outs = [mx.nd.sparse.zeros("row_sparse", (6, 2), ctx=dev) for dev in devices]
kv.pull("rs", out=rsp_outs, ignore_sparse=False)
check("pull_without_ignore_sparse_gives_every_row",
      all(o.stype == "row_sparse" and np.array_equal(o.asnumpy(), expected) for o in rsp_outs),
      [val(o.tostype("default")) for o in rsp_outs])
kv.init(["rs2", "rs3"], [mx.nd.zeros((6, 2)).tostype("row_sparse")] * 2)
kv.push(["rs2", "rs3"], [[mx.nd.ones((6, 2), ctx=dev).tostype("row_sparse") for dev in devices]]
        * 2)
kv.pull(["rs2", "rs3"], out=[rsp_outs] * 2, ignore_sparse=False)
check("pull_without_ignore_sparse_of_key_lists",
      all(np.array_equal(o.asnumpy(), np.full((6, 2), 2.0 * size)) for o in rsp_outs),
      [val(o.tostype("default")) for o in rsp_outs])
kv.init("k20", mx.nd.zeros((3,)))
half = mx.nd.zeros((3,), dtype="float16")
kv.pushpull("k20", mx.nd.full((3,), rank + 1), out=half)
check("pushpull_out_of_another_dtype_is_cast",
      half.dtype == np.float16 and val(half) == [total] * 3, (half.dtype, val(half)))
wide = mx.nd.zeros((3,), dtype="float64")
kv.broadcast("k21", mx.nd.full((3,), rank + 7), out=wide)
check("broadcast_out_of_another_dtype_is_cast", wide.dtype == np.float64 and val(wide) == [7.0] * 3,
      (wide.dtype, val(wide)))

# with an optimizer, push applies the update to the store's weights
kv.set_optimizer(mx.optimizer.SGD(learning_rate=0.5))
kv.init("p", mx.nd.ones((2,)))
kv.push("p", mx.nd.ones((2,)))
p = mx.nd.zeros((2,))
kv.pull("p", out=p)
check("push_with_optimizer_updates", np.allclose(val(p), [1 - 0.5 * size] * 2), val(p))

# errors a user can act on
try:
    kv.set_gradient_compression({"type": "2bit"})
    check("gradient_compression_after_push_refused", False, "no error")
except KVHybridError as exc:
    check("gradient_compression_after_push_refused", "before training" in str(exc), exc)
try:
    kv.row_sparse_pull("a", out=mx.nd.zeros((2, 3)), row_ids=mx.nd.array([0]))
    check("row_sparse_pull_needs_row_sparse_out", False, "no error")
except kvhybrid.KeyValueError as exc:
    check("row_sparse_pull_needs_row_sparse_out", "pass row_sparse arrays" in str(exc), exc)
whole = mx.nd.zeros((2, 3))
kv.pull("a", out=whole)
rows = mx.nd.sparse.zeros("row_sparse", (2, 3))
kv.row_sparse_pull("a", out=rows, row_ids=mx.nd.array([1, 1]))   # any key's rows, ids repeated
check("row_sparse_pull_of_a_dense_key", rows.indices.asnumpy().tolist() == [1]
      and np.array_equal(rows.data.asnumpy(), whole.asnumpy()[1:]), rows)

# Gluon: the store type as a string works for one device; trainer states save and load
net = gluon.nn.Dense(3, in_units=4)
net.initialize(mx.init.Constant(0.5))
trainer = gluon.Trainer(net.collect_params(), "adam", {"learning_rate": 0.01},
                        kvstore="dist_sync_hybrid-mpi")
for step in range(2):
    with autograd.record():
        loss = net(mx.nd.ones((2, 4)) * (rank + 1)).sum()
    loss.backward()
    trainer.step(2)
check("trainer_by_type_string", isinstance(trainer._kvstore, kvhybrid.HybridMPIStore),
      type(trainer._kvstore))
states = os.path.join(out_dir, f"trainer-{rank}.states")
trainer.save_states(states)
before = net.weight.data().asnumpy().copy()
with autograd.record():
    loss = net(mx.nd.ones((2, 4))).sum()
loss.backward()
trainer.step(2)
trainer.load_states(states)
check("trainer_states_round_trip", trainer._optimizer is trainer._kvstore._updater.optimizer
      and len(trainer._kvstore._updater.states) == 2, len(trainer._kvstore._updater.states))
check("trainer_weights_equal_on_ranks", True, float(before.sum()))

gathered = kv.group.comm.allgather((checks, float(before.sum())))
for r, (their, wsum) in enumerate(gathered):
    for name, (ok, _) in their.items():
        if not ok:
            checks[name] = [False, f"rank {r}: {their[name][1]}"]
    if abs(wsum - gathered[0][1]) > 1e-6:
        checks["trainer_weights_equal_on_ranks"] = [False, f"rank {r} differs"]
if rank == 0:
    with open(os.path.join(out_dir, "api.json"), "w") as f:
        json.dump(checks, f)
kv.close()
