"""Prefetched pulls with rank 1 pulling HOLD seconds late: rank 0's next push, which
prefetches, returns without waiting for rank 1's pull (the check that every rank had its
rows runs on the communication threads, and nothing on rank 0's caller's thread waits for
it), and the rows both ranks pull afterwards are the servers' update of every push.

argv: OUT_DIR. Every rank writes OUT_DIR/late-pull-rank{r}.json.
"""
import json
import os
import sys
import time

import mxnet as mx

sys.path.insert(0, os.path.dirname(__file__))
from sparse_models import SMALL_TABLE as shape, small_table_store  # noqa: E402

HOLD = 3.0
out_dir = sys.argv[1]
kv, grad = small_table_store()
rank = kv.rank
ids = mx.nd.array([0, 1, 10, 11])


def pull():
    out = mx.nd.sparse.zeros("row_sparse", shape)
    kv.row_sparse_pull("w", out=out, row_ids=ids)
    return out.tostype("default").asnumpy()[[0, 1, 10, 11], 0].tolist()


kv.push("w", grad())                       # the first push decides the route
kv.prefetch_rows("w", ids)
kv.push("w", grad())                       # rows 0, 1, 10, 11 are -1 now
if rank == 1:
    time.sleep(HOLD)
result = {"pull_started": time.monotonic()}   # (one machine: the ranks' clocks compare)
result["pulled"] = pull()                  # covered on both ranks
kv.prefetch_rows("w", ids)
result["push_started"] = time.monotonic()
kv.push("w", grad())                       # -2 now
result["push_returned"] = time.monotonic()
result["pulled_after"] = pull()
os.makedirs(out_dir, exist_ok=True)
with open(os.path.join(out_dir, f"late-pull-rank{rank}.json"), "w") as f:
    json.dump(result, f)
kv.close()
