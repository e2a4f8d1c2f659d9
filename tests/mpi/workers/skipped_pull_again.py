"""A pull that reads nothing (row_sparse outs, ``ignore_sparse``: Module's pull of a
row_sparse weight after each push) repeated with the same out is still a call of the whole
group, agreed on the communication thread: rank 0 makes it a third time and rank 1 does not,
and every rank raises at a later call.

argv: OUT_DIR. Every rank writes OUT_DIR/again-rank{r}.json.
"""
import json
import os
import sys

import mxnet as mx

sys.path.insert(0, os.path.dirname(__file__))
from sparse_models import SMALL_TABLE as shape, small_table_store  # noqa: E402

out_dir = sys.argv[1]
kv, grad = small_table_store()
out = mx.nd.sparse.zeros("row_sparse", shape)
result = {"raised": None, "at_step": None}
try:
    for step in range(4):
        kv.push("w", grad())
        if step < 2 or kv.rank == 0:
            kv.pull("w", out=out)   # (skipped, as MXNet's stores skip it)
        kv.row_sparse_pull("w", out=out, row_ids=mx.nd.array([0, 1], dtype="int64"))
        out.wait_to_read()
except mx.base.MXNetError as exc:
    result.update(raised=type(exc).__name__, message=str(exc), at_step=step)
with open(os.path.join(out_dir, f"again-rank{kv.rank}.json"), "w") as f:
    json.dump(result, f)
