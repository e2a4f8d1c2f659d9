"""Train a model with a sparse-gradient embedding through hybrid-mpi (pure MPI); dump weights.

argv: OUT_DIR DEVICES_PER_RANK STEPS PER_DEVICE_BATCH
The embedding (nn.Embedding(sparse_grad=True)) pushes row_sparse gradients; the
dense layers go through the dense path.
"""
import os
import sys

import numpy as np
import mxnet as mx
from mxnet import gluon

sys.path.insert(0, os.path.dirname(__file__))
import kvhybrid  # noqa: E402,F401
from sparse_models import make_sparse_net, sparse_train_steps  # noqa: E402
from models import weights  # noqa: E402

out_dir, ndev, steps, per_device = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
ctxs = [mx.cpu(i) for i in range(ndev)]
kv = mx.kv.create("hybrid-mpi")
rank, size = kv.rank, kv.num_workers
mx.random.seed(300 + rank)
net = make_sparse_net()
net.initialize(mx.init.Xavier(), ctx=ctxs)
kvhybrid.broadcast_parameters(net.collect_params(), kv)
if rank == 0:
    net.save_parameters(os.path.join(out_dir, "init.params"))
trainer = gluon.Trainer(net.collect_params(), "sgd",
                        {"learning_rate": 0.5, "momentum": 0.9, "wd": 1e-3}, kvstore=kv)
sparse_train_steps(net, trainer, steps, per_device, ctxs, offset=rank * ndev * per_device,
                   total=size * ndev * per_device)
assert trainer._update_on_kvstore, "Gluon updates on the store for distributed sparse gradients"
np.savez(os.path.join(out_dir, f"rank{rank}.npz"), **weights(net))
kv.close()
