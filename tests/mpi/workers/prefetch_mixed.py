"""Prefetched rows that cover one rank's pull and not the other's (an evaluation batch on
rank 1): rank 0 takes its rows without meeting anyone on its caller's thread, rank 1 waits
while the communication threads serve it a plain pull; both must see the values of the
plain pull. Then, in a loop of pulls that never meets the group, rank 0's communication
thread serves rank 1's missing rows. Then rank 1's pull has a bad argument while rank 0's
is covered: every rank must raise, rank 1 at its pull, rank 0 at a later call (its push or
its barrier), and nothing may reach the servers.

argv: OUT_DIR. Every rank writes OUT_DIR/mixed-rank{r}.json.
"""
import json
import os
import sys
import time

import mxnet as mx

sys.path.insert(0, os.path.dirname(__file__))
from sparse_models import SMALL_TABLE as shape, small_table_store  # noqa: E402

out_dir = sys.argv[1]
kv, grad = small_table_store()
rank = kv.rank


def pull(ids, out=None):
    out = mx.nd.sparse.zeros("row_sparse", shape) if out is None else out
    kv.row_sparse_pull("w", out=out, row_ids=mx.nd.array(ids))
    return out.tostype("default").asnumpy()[ids, 0].tolist()


def meetings():
    counts = kv.collectives()
    return counts["group"], counts["engine"]


result = {}
kv.push("w", grad())                       # the first push decides the route
kv.prefetch_rows("w", mx.nd.array([0, 1, 2]))
kv.push("w", grad())                       # rows 0, 1, 10, 11 are -1 now; the rest 1
mx.nd.waitall()                            # (the push's hand-out is done: not counted below)
before = meetings()
ids = [0, 1, 2] if rank == 0 else [1, 11, 5]     # rank 1's are not among the prefetched
result["pulled"] = pull(ids)
result["pull_meetings"] = [after - was for after, was in zip(meetings(), before)]
kv.push("w", grad())
result["after"] = pull(list(range(20)))    # rows 0, 1, 10, 11 are -2 now

# an evaluation loop that pulls and never meets the group: rank 1's first pull is not
# among the prefetched rows, so rank 0 must serve it at one of its own (covered) pulls;
# both ranks then make as many pulls (rank 0 says how many in a file)
os.makedirs(out_dir, exist_ok=True)
served, counted = (os.path.join(out_dir, name) for name in ("served", "pulls"))
kv.prefetch_rows("w", mx.nd.array([0, 1, 2]))
kv.push("w", grad())                       # rows 0, 1, 10, 11 are -3 now
if rank == 1:
    result["eval_pulled"] = pull([11, 5])
    open(served, "w").close()
    deadline = time.monotonic() + 60
    while not os.path.exists(counted):
        if time.monotonic() > deadline:
            sys.exit(f"rank 1: rank 0 did not write {counted} within 60 s (how many pulls it "
                     "made in the evaluation loop)")
        time.sleep(0.05)
    for _ in range(int(open(counted).read()) - 1):
        pull([0, 1])
else:
    pulls, deadline = 0, time.monotonic() + 30
    while not os.path.exists(served) and time.monotonic() < deadline:
        pull([0, 1])
        pulls += 1
        time.sleep(0.05)
    result["served_by_a_pull"] = os.path.exists(served)
    with open(counted + ".part", "w") as f:
        f.write(str(pulls))
    os.replace(counted + ".part", counted)

# rank 1's pull is wrong (a dense out); rank 0's is covered
kv.prefetch_rows("w", mx.nd.array([3, 4]))
kv.push("w", grad())
requests = kv.placement.servers.requests if kv.placement.servers is not None else 0
try:
    if rank == 1:
        kv.row_sparse_pull("w", out=mx.nd.zeros(shape), row_ids=mx.nd.array([3, 4]))
    else:
        pull([3, 4])
    kv.push("w", grad())
    kv.barrier()   # (waits for the pulls' checks: raises the one that failed)
    result["raised"] = None
except mx.base.MXNetError as exc:
    result.update(raised=type(exc).__name__, message=str(exc))
result["requests_sent"] = (kv.placement.servers.requests
                           if kv.placement.servers is not None else 0) - requests
os.makedirs(out_dir, exist_ok=True)
with open(os.path.join(out_dir, f"mixed-rank{rank}.json"), "w") as f:
    json.dump(result, f)
