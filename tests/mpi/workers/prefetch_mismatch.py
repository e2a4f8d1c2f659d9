"""A push that carries prefetched ids, where one rank's call is wrong (a dense gradient for
a sparse weight): its agreement travels in the rows' gather (with host masters, in an
agreement of the group on the communication thread), so every rank must raise the same
error at its next call, and nothing may reach the servers. Before it, row ids outside the
table raise at prefetch_rows.

argv: OUT_DIR [BAD_RANK, default 1]. Every rank writes OUT_DIR/mismatch-rank{r}.json.
"""
import json
import os
import sys

import mxnet as mx

sys.path.insert(0, os.path.dirname(__file__))
from sparse_models import SMALL_TABLE as shape, small_table_store  # noqa: E402

out_dir = sys.argv[1]
bad_rank = int(sys.argv[2]) if len(sys.argv) > 2 else 1
kv, grad = small_table_store()
rank = kv.rank

kv.push("w", grad())                          # the first push decides the route
bad_ids = {}   # row ids outside the table raise at prefetch_rows, naming the id
for ids in ([0, -1, 2], [0, shape[0], 2]):
    try:
        kv.prefetch_rows("w", mx.nd.array(ids))
    except mx.base.MXNetError as exc:
        bad_ids[str(ids)] = str(exc)
kv.prefetch_rows("w", mx.nd.array([0, 1, 2]))
requests = kv.placement.servers.requests if kv.placement.servers is not None else 0   # the master's
kv.push("w", mx.nd.ones(shape) if rank == bad_rank else grad())
result = {"push_returned": True, "bad_ids": bad_ids,
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
