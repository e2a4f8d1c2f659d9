"""Pulls of every row beside pulls of some rows and of none, in one call of the group: before
the table's first push (served on the caller's thread) and after it (served on the
communication thread), into every rank's out, each rank's rows the servers' values. Then
pulls after a pull of every row, before the next push (its kept table: no requests), and
after that push (the new values).

argv: OUT_DIR. Every rank writes OUT_DIR/every-rank{r}.json.
"""
import json
import os
import sys

import numpy as np
import mxnet as mx

sys.path.insert(0, os.path.dirname(__file__))
from sparse_models import SMALL_TABLE as shape, small_table_store  # noqa: E402

out_dir = sys.argv[1]
kv, grad = small_table_store()
rank = kv.rank
every = mx.nd.arange(0, shape[0], dtype="int64")
mine = {0: every, 1: mx.nd.array([3, 1, 3], dtype="int64"), 2: mx.nd.array([], dtype="int64")}


def pulled(ids):
    out = mx.nd.sparse.zeros("row_sparse", shape)
    kv.row_sparse_pull("w", out=out, row_ids=ids)
    return {"ids": out.indices.asnumpy().tolist(), "rows": out.data.asnumpy().tolist()}


result = {"before_push": pulled(mine[rank % 3])}
kv.push("w", grad())
result["after_push"] = pulled(mine[rank % 3])
result["all_every_row"] = pulled(every)
servers = kv.placement.servers
requests = servers.requests if servers is not None else 0
result["again_every_row"] = pulled(every)
result["again_some"] = pulled(mx.nd.array([7, 2, 7], dtype="int64"))
result["requests_sent"] = (servers.requests if servers is not None else 0) - requests
kv.push("w", grad())
result["pushed_again"] = pulled(every)
kv.close()
with open(os.path.join(out_dir, f"every-rank{rank}.json"), "w") as f:
    json.dump(result, f)
