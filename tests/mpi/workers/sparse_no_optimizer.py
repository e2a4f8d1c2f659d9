"""A sparse weight on the servers, pushed to before any optimizer is set: must be refused."""
import numpy as np
import mxnet as mx

import kvhybrid

kv = mx.kv.create("hybrid-mpi")
table = mx.nd.sparse.row_sparse_array((np.ones((10, 4), np.float32), np.arange(10)), shape=(10, 4))
kv.init("table", table)
grad = mx.nd.sparse.row_sparse_array((np.ones((1, 4), np.float32), [kv.rank]), shape=(10, 4))
try:
    kv.push("table", grad)
except kvhybrid.KeyValueError as exc:
    print(f"rank {kv.rank} raised: {exc}", flush=True)
    raise SystemExit(3)
