"""A training loop's pull of prefetched rows waits for nothing on the caller's thread: its
copy of the rows waits in MXNet's engine for the hand-out that brings them, as
``dist_sync``'s pull does. The master (rank 0) holds its push until rank 1's pull has
returned (rank 1 says so in a file): a pull that waited for the hand-out, which needs the
master, would never return first. The rows rank 1 then reads are the servers' update of
both pushes. Then rank 1's push is wrong, the master held the same way: rank 1's pull
returns, its rows read as zeros, and every rank raises at its next call.

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

HOLD = 30.0   # the longest the master waits for rank 1's word (on the old code: all of it)
out_dir = sys.argv[1]
os.makedirs(out_dir, exist_ok=True)
kv, grad = small_table_store()
rank = kv.rank
full_path = full_path_pulls(kv)   # the pulls that went through the full checks
out = mx.nd.sparse.zeros("row_sparse", shape)
ids = mx.nd.array([0, 1, 2])


#: per held step: whether rank 1's word had come when the master pushed (rank 0)
held_first = {}


def step(held: str = "", gradient=None) -> bool:
    """prefetch_rows, a push, the pull into the loop's out. ``held``: the master pushes only
    once rank 1 has written that file after its pull; returns whether it had (rank 0; also
    kept in ``held_first``, for a step whose pull raises)."""
    kv.prefetch_rows("w", ids)
    signal = os.path.join(out_dir, held)
    first = False
    if held and rank == 0:
        deadline = time.monotonic() + HOLD
        while not os.path.exists(signal) and time.monotonic() < deadline:
            time.sleep(0.02)
        first = held_first[held] = os.path.exists(signal)
    kv.push("w", grad() if gradient is None else gradient)   # rows 0 and 1 go down by 1
    kv.row_sparse_pull("w", out=out, row_ids=ids)
    if held and rank == 1:
        with open(signal, "w"):
            pass
    return first


kv.push("w", grad())                       # the first push decides the route; rows at 0
step()                                     # the full path, once: rows at -1
step()                                     # the short one from now on: rows at -2
result = {"pull_returned_first": step(held="pulled")}   # rows at -3
result["pulled"] = out.tostype("default").asnumpy()[[0, 1, 2], 0].tolist()
result["full_path"] = len(full_path)
try:
    step(held="pulled-wrong", gradient=mx.nd.ones(shape) if rank == 1 else None)
    result["wrong_pulled"] = out.tostype("default").asnumpy()[[0, 1, 2], 0].tolist()
    kv.push("w", grad())                   # every rank raises here, if not at the pull
    result["raised"] = None
except mx.base.MXNetError as exc:   # (the master's pull may raise: the verdict came first)
    result.update(raised=type(exc).__name__, message=str(exc))
result["wrong_pull_returned_first"] = held_first.get("pulled-wrong", False)
with open(os.path.join(out_dir, f"no-wait-rank{rank}.json"), "w") as f:
    json.dump(result, f)
