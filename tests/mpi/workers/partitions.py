"""A table split into pieces on real servers answers like an unsplit one.

Run by kvhybrid-launch with one client group of one rank and 2 servers. Two copies of
the same random table go to the servers, one whole and one in PIECES row ranges; the
same random row sets (piece boundaries always among them) are pushed to both through
SGD(learning_rate=1) on the servers, and rows are pulled back from both. argv: OUT_JSON.
"""
import json
import sys

import numpy as np
import mxnet as mx

import kvhybrid  # noqa: F401
from kvhybrid.kvstore.ps.link import piece_bounds

PIECES, ROWS, DIM, STEPS = 5, 23, 3, 4   # ROWS//PIECES >= 2 servers
kv = mx.kv.create("hybrid-mpi")
link = kv.placement.servers
opt = mx.optimizer.SGD(learning_rate=1.0, rescale_grad=1.0)
assert link.set_optimizer(opt, pieces=PIECES)
rng = np.random.RandomState(5)
table = rng.standard_normal((ROWS, DIM)).astype(np.float32)
link.init_rows("whole", mx.nd.array(table), pieces=1)
link.init_rows("split", mx.nd.array(table), pieces=PIECES)
bounds = piece_bounds(ROWS, PIECES)
# the first and the last row of every piece
edges = sorted({int(b) for b in bounds[:-1]} | {int(b) - 1 for b in bounds[1:]})
expected = table.copy()
results = {"bounds": bounds.tolist(), "steps": []}
for step in range(STEPS):
    ids = np.unique(np.concatenate([rng.choice(ROWS, 4, replace=False), edges if step % 2 else []]))
    ids = ids.astype(np.int64)
    grads = rng.standard_normal((len(ids), DIM)).astype(np.float32)
    for key in ("whole", "split"):
        link.push_rows(key, ids, grads.copy(), (ROWS, DIM), np.float32)
    expected[ids] -= grads
    want = np.unique(np.concatenate([rng.choice(ROWS, 6, replace=False), edges])).astype(np.int64)
    whole = link.pull_rows("whole", want, (ROWS, DIM), np.float32)
    split = link.pull_rows("split", want, (ROWS, DIM), np.float32)
    results["steps"].append({
        "pushed": ids.tolist(), "pulled": want.tolist(),
        "split_vs_whole": float(np.max(np.abs(split - whole))),
        "split_vs_numpy": float(np.max(np.abs(split - expected[want])))})
every = np.arange(ROWS, dtype=np.int64)
results["all_rows_vs_numpy"] = float(np.max(np.abs(
    link.pull_rows("split", every, (ROWS, DIM), np.float32) - expected)))
with open(sys.argv[1], "w") as f:
    json.dump(results, f)
kv.close()
