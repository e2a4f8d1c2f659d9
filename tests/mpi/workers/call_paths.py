"""Which of the store's files a row_sparse call passes through before it reaches the
executor (any function of ``tensor_collectives``: the communication thread's queue, MXNet's
engine, a collective, a meeting), traced on the caller's thread at a training loop's
repeated calls: a push with and without ``prefetch_rows``, a pull replayed, covered,
served, and a pull of every row.

argv: OUT. Every rank writes OUT/paths-rank<r>.json: per call, the files of
``kvhybrid/kvstore`` on the stack at each call from them into ``tensor_collectives``, and
every file of ``kvhybrid/kvstore`` the call entered.
"""
import json
import os
import sys

import mxnet as mx

sys.path.insert(0, os.path.dirname(__file__))
from sparse_models import SMALL_TABLE as shape, small_table_store  # noqa: E402

import kvhybrid  # noqa: E402

STORE = os.path.join(os.path.dirname(kvhybrid.__file__), "kvstore") + os.sep
EXECUTOR = os.path.join(os.path.dirname(kvhybrid.__file__), "tensor_collectives") + os.sep

kv, grad = small_table_store()
grad = grad()   # (a loop pushes the same gradient arrays every step)
paths = {}


def traced(name, call):
    entered, chains = [], []

    def profile(frame, event, arg):
        if event != "call":
            return
        path = frame.f_code.co_filename
        if path.startswith(STORE) and path[len(STORE):] not in entered:
            entered.append(path[len(STORE):])
        if path.startswith(EXECUTOR) and frame.f_back is not None \
                and frame.f_back.f_code.co_filename.startswith(STORE):
            chain, f = [], frame.f_back
            while f is not None:
                name_ = f.f_code.co_filename
                if name_.startswith(STORE) and name_[len(STORE):] not in chain:
                    chain.append(name_[len(STORE):])
                f = f.f_back
            chains.append(chain[::-1])
    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
    paths[name] = {"stacks": chains, "entered": entered}


out = mx.nd.sparse.zeros("row_sparse", shape)
other = mx.nd.sparse.zeros("row_sparse", shape)
ids, some = mx.nd.array([0, 1, 2], dtype="int64"), mx.nd.array([2, 0], dtype="int64")
kv.push("w", grad)   # (the first push picks the route)
for _ in range(3):   # a loop with prefetch: the calls' memos are made
    kv.prefetch_rows("w", ids)
    kv.push("w", grad)
    kv.row_sparse_pull("w", out=out, row_ids=ids)
    kv.prefetch_rows("w", ids)
    kv.push("w", grad)
    kv.row_sparse_pull("w", out=other, row_ids=some)
mx.nd.waitall()
kv.prefetch_rows("w", ids)
traced("push, prefetched", lambda: kv.push("w", grad))
traced("row_sparse_pull, replayed", lambda: kv.row_sparse_pull("w", out=out, row_ids=ids))
kv.prefetch_rows("w", ids)
kv.push("w", grad)
traced("row_sparse_pull, covered", lambda: kv.row_sparse_pull("w", out=other, row_ids=some))
unsorted = mx.nd.array([5, 1, 5, 0], dtype="int64")   # (Module's: unsorted, duplicated)
for _ in range(3):   # a loop without prefetch
    kv.push("w", grad)
    kv.row_sparse_pull("w", out=out, row_ids=unsorted)
mx.nd.waitall()
traced("push", lambda: kv.push("w", grad))
traced("row_sparse_pull, served", lambda: kv.row_sparse_pull("w", out=out, row_ids=unsorted))
every = mx.nd.sparse.zeros("row_sparse", shape)
kv.pull("w", out=every, ignore_sparse=False)
mx.nd.waitall()
traced("pull of every row", lambda: kv.pull("w", out=every, ignore_sparse=False))
mx.nd.waitall()
with open(os.path.join(sys.argv[1], f"paths-rank{kv.rank}.json"), "w") as f:
    json.dump(paths, f)
kv.close()
