"""A training loop's pull of prefetched rows waits for nothing on the caller's thread: its
copy of the rows waits in MXNet's engine for the hand-out that brings them, as
``dist_sync``'s pull does. With the master (rank 0) HOLD seconds late, rank 1's push and
its pull both return before the master has even begun its push, and the rows rank 1 then
reads are the servers' update of both pushes. Then rank 1's push is wrong while the master
is late again: rank 1's pull returns, its rows read as zeros, and every rank raises at its
next call.

argv: OUT_DIR. Every rank writes OUT_DIR/no-wait-rank{r}.json.
"""
import json
import os
import sys
import time

import mxnet as mx

sys.path.insert(0, os.path.dirname(__file__))
from sparse_models import (SMALL_TABLE as shape, full_path_pulls,  # noqa: E402
                           small_table_store)

HOLD = 3.0
out_dir = sys.argv[1]
kv, grad = small_table_store()
rank = kv.rank

full_path = full_path_pulls(kv)   # the pulls that went through the full checks
out = mx.nd.sparse.zeros("row_sparse", shape)
ids = mx.nd.array([0, 1, 2])


def step(late: bool, gradient=None) -> dict:
    """prefetch_rows, a push (the master HOLD s late if ``late``), the pull into the loop's
    out; when each began and returned (one machine: one system-wide clock)."""
    times = {}
    kv.prefetch_rows("w", ids)
    if late and rank == 0:
        time.sleep(HOLD)
    times["push_started"] = time.monotonic()
    kv.push("w", grad() if gradient is None else gradient)   # rows 0 and 1 go down by 1
    kv.row_sparse_pull("w", out=out, row_ids=ids)
    times["pull_returned"] = time.monotonic()
    return times


kv.push("w", grad())                       # the first push decides the route; rows at 0
step(late=False)                           # the full path, once: rows at -1
step(late=False)                           # the short one from now on: rows at -2
result = step(late=True)                   # rows at -3, pulled while the master sleeps
result["pulled"] = out.tostype("default").asnumpy()[[0, 1, 2], 0].tolist()
result["full_path"] = len(full_path)
try:
    wrong = step(late=True, gradient=mx.nd.ones(shape) if rank == 1 else None)
    result["wrong_pull_returned"] = wrong["pull_returned"]
    result["wrong_push_started"] = wrong["push_started"]
    result["wrong_pulled"] = out.tostype("default").asnumpy()[[0, 1, 2], 0].tolist()
    kv.push("w", grad())                   # every rank raises here, if not at the pull
    result["raised"] = None
except mx.base.MXNetError as exc:
    result.update(raised=type(exc).__name__, message=str(exc))
os.makedirs(out_dir, exist_ok=True)
with open(os.path.join(out_dir, f"no-wait-rank{rank}.json"), "w") as f:
    json.dump(result, f)
