"""Small dense keys packed on the servers (kvstore/ps/packs.py), against a plain replay.

argv: OUT_DIR. Every rank pushes 40 small keys (and one big key, which stays unpacked)
with SGD (momentum, wd) on the servers: three steps of the whole list, one of a subset
(the pack's mask must leave the others alone), one of a single packed key, then pulls.
Rank r's gradient of key k at step s is (r + 1) * (k + 1) * (s + 1) / 100; the replay
sums them and runs the same optimizer locally. Each master prints the ps-lite requests
of its last whole-list step; rank 0 writes the largest relative error to OUT_DIR.
"""
import json
import os
import sys

import numpy as np
import mxnet as mx

import kvhybrid  # noqa: F401

out_dir = sys.argv[1]
kv = mx.kv.create("hybrid-mpi")
rng = np.random.RandomState(0)
shapes = {k: tuple(rng.randint(1, 40, size=rng.randint(1, 3))) for k in range(40)}
shapes[40] = (1_100_000,)   # above MXNet's big-array bound: split over the servers, unpacked
keys = list(shapes)
init = {k: mx.nd.array(rng.uniform(-1, 1, shapes[k])) for k in keys}


def optimizer():
    return mx.optimizer.create("sgd", learning_rate=0.1, momentum=0.9, wd=0.01)


kv.set_optimizer(optimizer())
kv.init(keys, [init[k] for k in keys])
weights = {k: mx.nd.zeros(shapes[k]) for k in keys}


def grad(k, step, rank):
    return mx.nd.full(shapes[k], (rank + 1) * (k + 1) * (step + 1) / 100.0)


# the same steps in one process: the sum over ranks, the same optimizer
replay = {k: init[k].copy() for k in keys}
updater = mx.optimizer.get_updater(optimizer())


def both(step, step_keys):
    kv.pushpull(step_keys, [grad(k, step, kv.rank) for k in step_keys],
                out=[weights[k] for k in step_keys])
    for k in step_keys:
        total = sum(grad(k, step, r) for r in range(kv.num_workers))
        updater(k, total, replay[k])


for step in range(3):
    before = kv.placement.servers.requests if kv.placement.servers is not None else 0
    both(step, keys)
    if kv.placement.servers is not None:
        print(f"rank {kv.rank}: {kv.placement.servers.requests - before} ps-lite requests in step {step}",
              flush=True)
both(3, keys[5:12])     # a subset of a pack
both(4, [7])            # one packed key on its own
for k in keys:
    kv.pull(k, out=weights[k])

worst = max(float(np.abs(weights[k].asnumpy() - replay[k].asnumpy()).max()
                  / max(1e-12, np.abs(replay[k].asnumpy()).max())) for k in keys)
print(f"rank {kv.rank}: largest relative error {worst:.3g}", flush=True)
if kv.rank == 0:
    with open(os.path.join(out_dir, "result.json"), "w") as f:
        json.dump({"worst": worst}, f)
kv.close()
