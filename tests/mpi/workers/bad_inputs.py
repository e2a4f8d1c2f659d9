"""Make bad calls on purpose; record what each rank raised; prove the store still works after.

argv: OUT_DIR. Writes OUT_DIR/rank<r>.json: {scenario: message or null, ...}.
"""
import json
import os
import sys

import mxnet as mx

import kvhybrid

out_dir = sys.argv[1]
kv = mx.kv.create("hybrid-mpi")
rank, size = kv.rank, kv.num_workers
results = {}


def attempt(name, fn):
    try:
        fn()
        results[name] = None
    except kvhybrid.KeyValueError as exc:
        results[name] = str(exc)


ones = lambda shape=(4, 4), dtype="float32": mx.nd.ones(shape, dtype=dtype)  # noqa: E731
kv.init(0, ones() * 10)
other = 99 if rank == 1 else 0

attempt("unknown_key_all_ranks", lambda: kv.pushpull(99, ones()))
attempt("unknown_key_one_rank", lambda: kv.pushpull(other, ones()))
attempt("push_never_initialised", lambda: kv.push(98, ones()))
attempt("pull_never_initialised", lambda: kv.pull(97, out=ones()))
mine = (4, 5) if rank == 1 else (4, 4)
attempt("broadcast_shape_differs", lambda: kv.broadcast(7, ones(mine), out=ones(mine)))
attempt("init_dtype_differs", lambda: kv.init(8, ones(dtype="float64" if rank == 1 else "float32")))
attempt("value_shape_one_rank", lambda: kv.push(0, ones((2, 8)) if rank == size - 1 else ones()))
attempt("out_length_differs", lambda: kv.pushpull(0, [ones(), ones()], out=[ones()]))
attempt("out_shape_differs", lambda: kv.pushpull(0, ones(), out=ones((4, 3)) if rank == 0 else ones()))
attempt("bad_key_type", lambda: kv.pushpull(1.5, ones()))
attempt("unhashable_key_push", lambda: kv.push({"a": 1}, ones()))
attempt("unhashable_key_row_sparse_pull", lambda: kv.row_sparse_pull(
    [[0]], out=[mx.nd.sparse.zeros("row_sparse", (4, 4))], row_ids=[mx.nd.array([0])]))
attempt("init_twice", lambda: kv.init(0, ones()))
# a store of int keys refuses str keys, and one of str keys int keys, as MXNet's stores do
# (its test_invalid_pull)
attempt("str_key_init_in_int_store", lambda: kv.init("a", ones()))
attempt("str_key_push_in_int_store", lambda: kv.push("a", ones()))
attempt("str_key_pull_in_int_store", lambda: kv.pull("a", out=ones()))
attempt("keys_mix_types", lambda: kv.pushpull([0, "a"], [ones(), ones()]))
named = mx.kv.create("hybrid-mpi")
attempt("new_keys_mix_types", lambda: named.init(["b", 3], [ones(), ones()]))
named.init("a", ones())
attempt("int_key_init_in_str_store", lambda: named.init(3, ones()))
attempt("int_key_pushpull_in_str_store", lambda: named.pushpull(3, ones()))
attempt("int_key_row_sparse_pull_in_str_store", lambda: named.row_sparse_pull(
    3, out=mx.nd.sparse.zeros("row_sparse", (4, 4)), row_ids=mx.nd.array([0])))
named.close()
attempt("optimizer_differs",
        lambda: kv.set_optimizer(mx.optimizer.SGD(learning_rate=0.1 if rank == 0 else 0.2)))

# Nothing above may have changed the store: key 0 still holds rank 0's init value ...
pulled = mx.nd.zeros((4, 4))
kv.pull(0, out=pulled)
results["value_after_errors"] = float(pulled.asnumpy().mean())
# ... and the ranks are still in step: a collective works and sums correctly.
grad = ones() * (rank + 1)
kv.pushpull(0, grad)
results["sum_after_errors"] = float(grad.asnumpy().mean())

# A sparse weight summed in the group (pure MPI's route 'rows'): once its route is chosen,
# its pushes are agreed in the rows' count exchange, and a bad one still raises on every rank.
kv.init(20, mx.nd.sparse.zeros("row_sparse", (1000, 4)))
kv.init(21, mx.nd.sparse.zeros("row_sparse", (1000, 4)))
rows = lambda width=4, by=1.0: mx.nd.sparse.row_sparse_array(  # noqa: E731
    (mx.nd.ones((2, width)) * by, [1, 5]), shape=(1000, width))
for _ in range(3):
    kv.push(20, rows())
    kv.push(21, rows())
attempt("sparse_push_shape_one_rank", lambda: kv.push(20, rows(3) if rank == 1 else rows()))
attempt("sparse_push_keys_differ", lambda: kv.push(21 if rank == 1 else 20, rows()))
# a rank that makes another call meets the others' repeated push in its agreement
attempt("sparse_push_unknown_key_one_rank", lambda: kv.push(99 if rank == 1 else 20, rows()))
attempt("sparse_push_against_pushpull",
        lambda: kv.pushpull(0, ones()) if rank == 1 else kv.push(20, rows()))
sparse_out = mx.nd.sparse.zeros("row_sparse", (1000, 4))
kv.row_sparse_pull(20, out=sparse_out, row_ids=mx.nd.array([1, 5], dtype="int64"))
results["sparse_after_errors"] = float(sparse_out.data.asnumpy().mean())
kv.push(20, rows(by=rank + 1))   # (no optimizer: the sum overwrites the rows)
kv.row_sparse_pull(20, out=sparse_out, row_ids=mx.nd.array([1, 5], dtype="int64"))
results["sparse_sum_after_errors"] = float(sparse_out.data.asnumpy().mean())

# Optimizer states loaded from files that differ between ranks.
kv.set_optimizer(mx.optimizer.SGD(learning_rate=0.1, momentum=0.9))
kv.pushpull(0, ones(), out=ones())
states = os.path.join(out_dir, f"states-{rank}")
kv.save_optimizer_states(states)
if rank == 1:
    with open(states, "wb") as f:
        f.write(open(states, "rb").read() + b"tampered")
attempt("optimizer_states_differ", lambda: kv.load_optimizer_states(states))

with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
    json.dump(results, f)
kv.close()
