"""A client group of one rank whose push goes to the communication thread (its gradient in
two arrays: MXNet's own push takes one host array) and whose pull goes through MXNet's
engine: the pull comes after the push, so it reads the rows that push updated, also while
the push waits on that thread (behind a job that holds it until a timer lets it go).

argv: OUT_DIR. Every rank writes OUT_DIR/held-rank{r}.json.
"""
import json
import os
import sys
import threading

import mxnet as mx

sys.path.insert(0, os.path.dirname(__file__))
from sparse_models import SMALL_TABLE as shape, small_table_store  # noqa: E402

out_dir = sys.argv[1]
kv, grad = small_table_store()
rank = kv.rank
kv.push("w", grad())   # the first push decides the route
out = mx.nd.sparse.zeros("row_sparse", shape)
kv.row_sparse_pull("w", out=out, row_ids=mx.nd.array([rank], dtype="int64"))
out.wait_to_read()
released = threading.Event()
kv.engine.enqueue("a job that holds the thread", lambda: released.wait(30.0))
threading.Timer(1.0, released.set).start()
halves = [grad() * 0.5, grad() * 0.5]
kv.push("w", halves)   # (its hand-out waits behind that job)
kv.row_sparse_pull("w", out=out, row_ids=mx.nd.array([10 + rank, rank], dtype="int64"))
result = {"ids": out.indices.asnumpy().tolist(), "rows": out.data.asnumpy()[:, 0].tolist(),
          "released_before_the_rows": released.is_set()}
os.makedirs(out_dir, exist_ok=True)
with open(os.path.join(out_dir, f"held-rank{rank}.json"), "w") as f:
    json.dump(result, f)
