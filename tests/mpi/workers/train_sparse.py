"""Train a model with a sparse embedding through hybrid-mpi; dump the weights.

argv: OUT_DIR DEVICES_PER_RANK STEPS PER_DEVICE_BATCH [KIND]
KIND "grad" (nn.Embedding(sparse_grad=True), the default), "weight"
(contrib.nn.SparseEmbedding) or "tables" (two of them); the dense layers go through the
dense path. KVHYBRID_TEST_PREFETCH=1: the next batch's rows are prefetched;
KVHYBRID_TEST_FUSED=1: kvhybrid.DistributedTrainer instead of gluon.Trainer.
"""
import json
import os
import sys

import numpy as np
import mxnet as mx

sys.path.insert(0, os.path.dirname(__file__))
import kvhybrid  # noqa: E402
from kvhybrid.kvstore import sparse_push  # noqa: E402
from sparse_models import (local_weights, make_sparse_net, make_trainer,  # noqa: E402
                           sparse_train_steps, trained_weights)

out_dir, ndev, steps, per_device = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
kind = sys.argv[5] if len(sys.argv) > 5 else "grad"
ctxs = [mx.cpu(i) for i in range(ndev)]
kv = mx.kv.create(os.environ.get("KVHYBRID_TEST_STORE", "hybrid-mpi"))
rank, size = kv.rank, kv.num_workers
mx.random.seed(300 + rank)
net = make_sparse_net(kind)
net.initialize(mx.init.Xavier(), ctx=ctxs)
kvhybrid.broadcast_parameters(net.collect_params(), kv)   # dense ones; the store inits the table
if rank == 0:
    np.savez(os.path.join(out_dir, f"{kind}-init.npz"), **local_weights(net))
meetings = []   # the collectives so far, after each step (kv.collectives())
# the pushes of rows that prefetch, so far: each is one gather of its keys' rows (on the
# communication thread), counted as the caller makes them
pushes_of_rows = []
push_and_prefetch = sparse_push.push_and_prefetch


def counted_push_and_prefetch(*args, **kwargs):
    pushes_of_rows.append(1)
    return push_and_prefetch(*args, **kwargs)


sparse_push.push_and_prefetch = counted_push_and_prefetch
trainer, step_arg = make_trainer(net, kind, kv, ndev * per_device,
                                 fused=os.environ.get("KVHYBRID_TEST_FUSED") == "1")
sparse_train_steps(net, trainer, step_arg, steps, per_device, ctxs,
                   offset=rank * ndev * per_device, total=size * ndev * per_device,
                   prefetch=os.environ.get("KVHYBRID_TEST_PREFETCH") == "1",
                   after_step=lambda: meetings.append({**kv.collectives(),
                                                       "gathers": len(pushes_of_rows)}))
assert trainer._update_on_kvstore, "Gluon updates on the store for distributed sparse models"
np.savez(os.path.join(out_dir, f"{kind}-rank{rank}.npz"), **trained_weights(net))
print(f"rank {rank}: bytes sent {kv.group.bytes_sent}", flush=True)
print(f"rank {rank}: key stats {kv.key_stats()}", flush=True)
with open(os.path.join(out_dir, f"{kind}-stats-rank{rank}.json"), "w") as f:
    # bytes sent, the group's meetings on the caller's thread and the gathers of rows, in
    # a file: mpirun may join ranks' output lines
    json.dump({"bytes_sent": kv.group.bytes_sent, "collectives": kv.collectives(),
               "meetings_after_step": [m["group"] for m in meetings],
               "gathers_after_step": [m["gathers"] for m in meetings]}, f)
kv.close()
