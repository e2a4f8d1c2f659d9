"""A training loop's pulls into one out (Gluon pulls into the same row_sparse array every
step): a pull of the ids ``prefetch_rows`` was handed takes the prefetched rows without
its full checks; a pull of other ids into that out (the handed array written in place
after ``prefetch_rows``), and a pull into another out, take the full path. In one step
rank 0 takes the short way while rank 1 takes the full one, covered and then not: the
ranks' checks must still match and rank 1 be served. Every pull must see the values of
the plain pull.

argv: OUT_DIR. Every rank writes OUT_DIR/same-out-rank{r}.json.
"""
import json
import os
import sys

import mxnet as mx

sys.path.insert(0, os.path.dirname(__file__))
from sparse_models import (SMALL_TABLE as shape, full_path_pulls,  # noqa: E402
                           small_table_store)

out_dir = sys.argv[1]
kv, grad = small_table_store()
rank = kv.rank

full_path = full_path_pulls(kv)   # the pulls that went through the full checks
out = mx.nd.sparse.zeros("row_sparse", shape)


def step(ids, pulled_ids=None, into=None):
    """prefetch_rows of ``ids``, a push, then a pull of ``pulled_ids`` (default: the
    handed array itself) into ``into`` (default: the loop's out); the pulled rows' first
    column."""
    into = out if into is None else into
    kv.prefetch_rows("w", ids)
    kv.push("w", grad())                   # rows 0, 1, 10, 11 go down by 1
    kv.row_sparse_pull("w", out=into, row_ids=ids if pulled_ids is None else pulled_ids)
    wanted = (ids if pulled_ids is None else pulled_ids).asnumpy().astype(int).tolist()
    return into.tostype("default").asnumpy()[wanted, 0].tolist()


kv.push("w", grad())                       # the first push decides the route; rows at 0
ids = mx.nd.array([0, 1, 2])
result = {"loop": [step(ids) for _ in range(3)]}      # rows at -1, -2, -3
result["full_path_in_loop"] = len(full_path)

kv.prefetch_rows("w", ids)
kv.push("w", grad())                       # rows at -4
ids[:] = mx.nd.array([10, 11, 5])          # the handed array, written in place
kv.row_sparse_pull("w", out=out, row_ids=ids)
result["rewritten"] = out.tostype("default").asnumpy()[[10, 11, 5], 0].tolist()

ids = mx.nd.array([0, 1, 2])
step(ids)                                  # rows at -5; the loop's out holds rows 0, 1, 2
before = len(full_path)
# rank 1 pulls into another out, covered: rows at -6
result["other_out"] = step(ids, into=None if rank == 0 else
                           mx.nd.sparse.zeros("row_sparse", shape))
# rank 1 pulls rows that were not prefetched into another out: rows at -7
result["uncovered"] = step(ids, mx.nd.array([0, 11, 5]) if rank == 1 else None,
                           None if rank == 0 else mx.nd.sparse.zeros("row_sparse", shape))
result["full_path_mixed"] = len(full_path) - before
kv.barrier()
os.makedirs(out_dir, exist_ok=True)
with open(os.path.join(out_dir, f"same-out-rank{rank}.json"), "w") as f:
    json.dump(result, f)
