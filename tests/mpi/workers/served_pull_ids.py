"""A pull after a push that asked for no rows (a loop without kvhybrid.prefetch): the ids
as users hand them (float32 or int64, unsorted, repeated) get the rows the servers hold;
a rank whose ids lie outside the table raises at its pull, naming the id, and in a group
every other rank at a later call, before anything more reaches the servers (a group per
worker goes on).

argv: OUT_DIR. Every rank writes OUT_DIR/served-rank{r}.json.
"""
import json
import os
import sys

import mxnet as mx
import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from sparse_models import SMALL_TABLE as shape, small_table_store  # noqa: E402

out_dir = sys.argv[1]
kv, grad = small_table_store()
rank, size = kv.rank, kv.num_workers
result = {"rows": {}}
kv.push("w", grad())   # (no prefetch_rows: the push asks for no rows)
for dtype in ("float32", "int64"):
    ids = [12, 0, 12, 10, 1, 0]
    out = mx.nd.sparse.zeros("row_sparse", shape)
    kv.row_sparse_pull("w", out=out, row_ids=mx.nd.array(ids, dtype=dtype))
    result["rows"][dtype] = {"ids": out.indices.asnumpy().tolist(),
                             "rows": out.data.asnumpy()[:, 0].tolist()}
kv.push("w", grad())
requests = kv.placement.servers.requests if kv.placement.servers is not None else 0
out = mx.nd.sparse.zeros("row_sparse", shape)
bad = [0, shape[0] + 5] if rank == size - 1 else [0, 1]
alone = kv.group.size == 1   # (a group per worker: a bad call stops no one else)
try:
    kv.row_sparse_pull("w", out=out, row_ids=mx.nd.array(bad, dtype="int64"))
    result["pull"] = None
except mx.base.MXNetError as exc:
    result["pull"] = str(exc)
try:
    if result["pull"] is None or alone:
        for step in range(4):   # (in a group the other ranks go on until a call raises)
            kv.push("w", grad())
            kv.row_sparse_pull("w", out=out, row_ids=mx.nd.array([1, 0, 1], dtype="int64"))
            out.wait_to_read()
    result["next"] = None
    result["last"] = out.data.asnumpy()[:, 0].tolist()
except mx.base.MXNetError as exc:
    result["next"] = str(exc)
result["requests_sent"] = (kv.placement.servers.requests
                           if kv.placement.servers is not None else 0) - requests
os.makedirs(out_dir, exist_ok=True)
with open(os.path.join(out_dir, f"served-rank{rank}.json"), "w") as f:
    json.dump(result, f)
