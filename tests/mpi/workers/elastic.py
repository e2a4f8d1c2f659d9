"""Elastic averaging through hybrid-mpi-elastic on real servers, with the store API as
gluon.Trainer calls it (update_on_kvstore: pushpull(key, grad, out=weight)).

Each client group pulls its weights toward its own target: client c's gradient is
w − t_c with t_c = (+1, ..., +1) for c even, (−1, ..., −1) for c odd (split over the
group's ranks). argv: OUT_DIR STEPS LR. The group's master writes client<c>.json with
the weights after every step and the last exchange's distances.
"""
import json
import os
import sys

import numpy as np
import mxnet as mx

import kvhybrid  # noqa: F401

DIM = 5
out_dir, steps, lr = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
kv = mx.kv.create("hybrid-mpi-elastic")
client, size = kv.placement.client_rank, kv.group.size
target = mx.nd.ones((DIM,)) * (1.0 if client % 2 == 0 else -1.0)
kv.init(0, mx.nd.zeros((DIM,)))
kv.set_optimizer(mx.optimizer.SGD(learning_rate=lr))
w = mx.nd.zeros((DIM,))
history = []
for step in range(steps):
    grad = (w - target) / size
    kv.pushpull(0, grad, out=w)
    history.append(w.asnumpy().tolist())
    # lockstep: the groups run concurrently, as on separate machines (on 2 shared cores one
    # could otherwise finish before the other starts, and they would never meet)
    if kv.placement.servers is not None:
        kv.placement.servers.barrier()
    kv.group.comm.Barrier()
if kv.group.rank == 0:
    with open(os.path.join(out_dir, f"client{client}.json"), "w") as f:
        json.dump({"weights": history, "alpha": kv.alpha, "interval": kv.interval,
                   "exchanges": kv.exchanges.get(0, 0), "distances": kv.distances.get(0)}, f)
print(f"client {client} rank {kv.group.rank}: final {np.round(w.asnumpy(), 4).tolist()}",
      flush=True)
kv.close()
