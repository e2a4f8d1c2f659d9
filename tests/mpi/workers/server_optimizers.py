"""Every optimizer MXNet 1.9.1 registers, set with ``set_optimizer`` on a row_sparse weight:
the weights after a few pushes of row_sparse gradients, against the optimizer applied in
this process to the summed gradients as MXNet's own parameter server applies it.

MXNet's server hands its updater the stored row_sparse weight. An optimizer that cannot
update one (its states are dense, or it raises half-way, like MXNet's ``test``) is updated
on a dense weight instead (kvstore/ps/server.py): the reference does the same, so it is
the one MXNet's updater computes, or the dense one where MXNet's would fail.

argv: OUT_DIR. Every rank writes OUT_DIR/optimizers-rank{r}.json:
{optimizer: [ok, detail]}.
"""
import json
import os
import sys

import numpy as np
import mxnet as mx

import kvhybrid  # noqa: F401  (registers hybrid-mpi)

out_dir = sys.argv[1]
SHAPE, STEPS = (6, 4), 3
#: left out, with the reason: SGLD adds noise from each process's own random generator
SKIP = {"sgld"}


def make(name: str) -> mx.optimizer.Optimizer:
    """``name`` as registered; ``sgd+lr_scheduler``: SGD whose rate halves every update
    (its schedule reads the optimizer's update count, which only the model's keys move)."""
    if name == "sgd+lr_scheduler":
        return mx.optimizer.create("sgd", learning_rate=0.1, lr_scheduler=mx.lr_scheduler
                                   .FactorScheduler(step=1, factor=0.5, base_lr=0.1))
    return mx.optimizer.create(name, learning_rate=0.1)


NAMES = sorted(set(mx.optimizer.Optimizer.opt_registry) - SKIP) + ["sgd+lr_scheduler"]

kv = mx.kv.create("hybrid-mpi")
rank, n = kv.rank, kv.num_workers
init = np.random.RandomState(0).uniform(0.5, 1.5, SHAPE).astype(np.float32)


def grad_of(r: int, step: int) -> np.ndarray:
    """Rank ``r``'s gradient at ``step``: two rows (shared by some ranks), the rest zero."""
    g = np.zeros(SHAPE, np.float32)
    rows = [r % SHAPE[0], (r + 2 * step) % SHAPE[0]]
    g[rows] = np.random.RandomState(100 * step + r).uniform(-1, 1, (2, SHAPE[1]))
    return g


def reference(name: str) -> np.ndarray:
    """The optimizer on the summed gradients, as MXNet's server updates a row_sparse weight
    (the stored weight handed to the updater); on a dense weight where that fails."""
    sums = [sum(grad_of(r, step) for r in range(n)) for step in range(STEPS)]
    for stype in ("row_sparse", "default"):
        update = mx.optimizer.get_updater(make(name))
        weight = mx.nd.array(init).tostype(stype)
        try:
            for g in sums:
                update(0, mx.nd.array(g).tostype("row_sparse"), weight)
            return weight.asnumpy()
        except Exception:   # noqa: BLE001  (MXNet's server swallows it and trains on)
            continue
    raise AssertionError(f"{name} updates neither a row_sparse nor a dense weight")


results = {}
for index, name in enumerate(NAMES):
    key = 500 + index
    kv.init(key, mx.nd.array(init).tostype("row_sparse"))
    kv.set_optimizer(make(name))
    for step in range(STEPS):
        kv.push(key, mx.nd.array(grad_of(rank, step)).tostype("row_sparse"))
    got = mx.nd.sparse.zeros("row_sparse", SHAPE)
    kv.row_sparse_pull(key, out=got, row_ids=mx.nd.arange(SHAPE[0]))
    want = reference(name)
    ok = np.allclose(got.asnumpy(), want, rtol=1e-5, atol=1e-6, equal_nan=True)
    results[name] = [bool(ok), "" if ok else
                     f"max |got - want| {np.abs(got.asnumpy() - want).max():.3g}"]

os.makedirs(out_dir, exist_ok=True)
with open(os.path.join(out_dir, f"optimizers-rank{rank}.json"), "w") as f:
    json.dump(results, f)
print(f"rank {rank}: {sum(ok for ok, _ in results.values())}/{len(results)} optimizers "
      "matched", flush=True)
kv.close()
