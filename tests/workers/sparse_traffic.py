"""Push row_sparse gradients of a 1M-row table touching a given fraction of rows; count bytes.

argv: OUT_JSON FRACTION. Rank 0 writes what it sent, the table's size, and checks the store.
"""
import json
import sys

import numpy as np
import mxnet as mx

import kvhybrid  # noqa: F401

out, fraction = sys.argv[1], float(sys.argv[2])
ROWS, DIM = 1_000_000, 8
kv = mx.kv.create("hybrid-mpi")
kv.init("table", mx.nd.zeros((ROWS, DIM)))
rng = np.random.RandomState(kv.rank)
ids = np.sort(rng.choice(ROWS, int(ROWS * fraction), replace=False))
grad = mx.nd.sparse.row_sparse_array((np.ones((len(ids), DIM), np.float32), ids), shape=(ROWS, DIM))
before = kv.group.bytes_sent["rows"]
kv.push("table", grad)
sent = kv.group.bytes_sent["rows"] - before
union = len(set().union(*kv.group.comm.allgather(set(ids.tolist()))))
stored = mx.nd.zeros((ROWS, DIM))
kv.pull("table", out=stored)
nonzero = int((stored.asnumpy() != 0).any(axis=1).sum())
if kv.rank == 0:
    with open(out, "w") as f:
        json.dump({"bytes_sent": sent, "table_bytes": ROWS * DIM * 4, "union_rows": union,
                   "stored_rows_nonzero": nonzero}, f)
kv.close()
