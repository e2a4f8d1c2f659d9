"""A push that carries prefetched ids, with the master (rank 0) arriving HOLD seconds late:
the other rank's push returns without waiting for it (its rows go in the background), and
the rows it pulls next are the ones the servers' update made. The rows (64 KB) are past
MPI's eager limit, so a send that waited would wait for the master.

argv: OUT_DIR. Every rank writes OUT_DIR/background-rank{r}.json.
"""
import json
import os
import sys
import time

import numpy as np
import mxnet as mx

import kvhybrid  # noqa: F401

HOLD = 3.0
shape = (20, 8192)
out_dir = sys.argv[1]
kv = mx.kv.create("hybrid-mpi")
kv.init("w", mx.nd.ones(shape).tostype("row_sparse"))
kv.set_optimizer(mx.optimizer.SGD(learning_rate=1.0))
rank = kv.rank


def grad():   # ones in rows rank and 10 + rank
    return mx.nd.sparse.row_sparse_array((np.ones((2, shape[1]), np.float32),
                                          [rank, 10 + rank]), shape=shape)


ids = mx.nd.array([0, 1, 10, 11])

kv.push("w", grad())                          # the first push decides the route
kv.prefetch_rows("w", ids)
if rank == 0:
    time.sleep(HOLD)
started = time.monotonic()   # (one machine, one system-wide clock: the ranks' times compare)
kv.push("w", grad())                          # two pushes: rows 0, 1, 10, 11 are now -1
returned = time.monotonic()
out = mx.nd.sparse.zeros("row_sparse", shape)
kv.row_sparse_pull("w", out=out, row_ids=ids)
result = {"push_started": started, "push_returned": returned,
          "pulled": out.data.asnumpy()[:, [0, -1]].tolist(), "indices": out.indices.asnumpy().tolist()}
os.makedirs(out_dir, exist_ok=True)
with open(os.path.join(out_dir, f"background-rank{rank}.json"), "w") as f:
    json.dump(result, f)
kv.close()
