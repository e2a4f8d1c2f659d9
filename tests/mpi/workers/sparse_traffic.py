"""Push row_sparse gradients of a 1M-row table touching a given fraction of rows; count bytes.

argv: OUT_DIR FRACTION. Every rank writes what it sent (to MPI collectives and, on a
group's master, to the servers); rank 0 also writes what the store then holds.
"""
import json
import os
import sys

import numpy as np
import mxnet as mx

import kvhybrid  # noqa: F401

out, fraction = sys.argv[1], float(sys.argv[2])
ROWS, DIM = 1_000_000, 8
kv = mx.kv.create("hybrid-mpi")
kv.set_optimizer(mx.optimizer.SGD(learning_rate=-1.0))   # weight = 0 + the summed gradient
kv.init(0, mx.nd.zeros((ROWS, DIM)))
rng = np.random.RandomState(kv.rank)
ids = np.sort(rng.choice(ROWS, int(ROWS * fraction), replace=False))
grad = mx.nd.sparse.row_sparse_array((np.ones((len(ids), DIM), np.float32), ids), shape=(ROWS, DIM))
kv.push(0, grad)   # the first push moves a dense weight's rows to the servers, if any: not counted
before = dict(kv.group.bytes_sent)
kv.push(0, grad)
sent = {k: v - before[k] for k, v in kv.group.bytes_sent.items()}
stored = mx.nd.zeros((ROWS, DIM))
kv.pull(0, out=stored)
with open(os.path.join(out, f"rank{kv.rank}.json"), "w") as f:
    json.dump({"sent": sent, "table_bytes": ROWS * DIM * 4, "ids": ids.tolist(),
               "stored_rows_nonzero": int((stored.asnumpy() != 0).any(axis=1).sum()),
               "stored_max": float(stored.max().asscalar())}, f)
kv.close()
