"""A Trainer with a sparse weight (contrib.nn.SparseEmbedding): not supported yet, must say so."""
import mxnet as mx
from mxnet import autograd, gluon

import kvhybrid

kv = mx.kv.create("hybrid-mpi")
net = mx.gluon.contrib.nn.SparseEmbedding(100, 4)
net.initialize()
trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1}, kvstore=kv)
try:
    with autograd.record():
        loss = net(mx.nd.array([[1, 2], [3, 4]])).sum()
    loss.backward()
    trainer.step(2)
except kvhybrid.KeyValueError as exc:
    print(f"rank {kv.rank} raised: {exc}", flush=True)
    raise SystemExit(3)
