"""A pull whose outs are all row_sparse does nothing (MXNet's stores skip them), and stays a
call of the whole group: where one rank pulls a dense key and another only row_sparse outs,
every rank raises the same error, and the store goes on.

argv: OUT_DIR. Every rank writes OUT_DIR/pull-rank{r}.json.
"""
import json
import os
import sys

import mxnet as mx

sys.path.insert(0, os.path.dirname(__file__))
from sparse_models import SMALL_TABLE as shape, small_table_store  # noqa: E402

out_dir = sys.argv[1]
kv, grad = small_table_store()
kv.init("d", mx.nd.ones((3,)) * 5)
rank = kv.rank
sparse_out = mx.nd.sparse.zeros("row_sparse", shape)
kv.push("w", grad())
kv.pull("w", out=sparse_out)                  # skipped on every rank: nothing written
result = {"skipped_rows": int(sparse_out.indices.shape[0])}
try:
    if rank == 0:
        kv.pull("d", out=mx.nd.zeros((3,)))
    else:
        kv.pull("w", out=mx.nd.sparse.zeros("row_sparse", shape))
    result["raised"] = None
except mx.base.MXNetError as exc:
    result.update(raised=type(exc).__name__, message=str(exc))
dense = mx.nd.zeros((3,))
kv.pull("d", out=dense)                        # the store goes on
rows = mx.nd.sparse.zeros("row_sparse", shape)
kv.row_sparse_pull("w", out=rows, row_ids=mx.nd.array([0, 1]))
result.update(dense_after=dense.asnumpy().tolist(), rows_after=rows.data.asnumpy().tolist())
kv.close()
with open(os.path.join(out_dir, f"pull-rank{rank}.json"), "w") as f:
    json.dump(result, f)
