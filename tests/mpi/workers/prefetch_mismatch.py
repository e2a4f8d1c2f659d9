"""A push that carries prefetched ids, where rank 1's call is wrong (a dense gradient for a
sparse weight): its agreement travels in the rows' gather, so every rank must raise the
same error at its next call, and nothing may reach the servers.

argv: OUT_DIR. Every rank writes OUT_DIR/mismatch-rank{r}.json.
"""
import json
import os
import sys

import numpy as np
import mxnet as mx

import kvhybrid  # noqa: F401

out_dir = sys.argv[1]
kv = mx.kv.create("hybrid-mpi")
rank = kv.rank
shape = (20, 4)
kv.init("w", mx.nd.ones(shape).tostype("row_sparse"))
kv.set_optimizer(mx.optimizer.SGD(learning_rate=1.0))


def grad():
    return mx.nd.sparse.row_sparse_array((np.ones((2, 4), np.float32), [rank, 10 + rank]),
                                         shape=shape)


kv.push("w", grad())                          # the first push decides the route
kv.prefetch_rows("w", mx.nd.array([0, 1, 2]))
requests = kv.placement.servers.requests if kv.placement.servers is not None else 0   # the master's
kv.push("w", mx.nd.ones(shape) if rank == 1 else grad())
result = {"push_returned": True,
          "requests_sent": (kv.placement.servers.requests if kv.placement.servers is not None else 0) - requests}
try:
    out = mx.nd.sparse.zeros("row_sparse", shape)
    kv.row_sparse_pull("w", out=out, row_ids=mx.nd.array([0, 1, 2]))
    result["raised"] = None
except mx.base.MXNetError as exc:
    result.update(raised=type(exc).__name__, message=str(exc))
os.makedirs(out_dir, exist_ok=True)
with open(os.path.join(out_dir, f"mismatch-rank{rank}.json"), "w") as f:
    json.dump(result, f)
