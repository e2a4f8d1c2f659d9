"""Train the main job's MLP on a fixed budget of samples; rank 0 writes its final loss.

argv: STORE OUT_JSON, STORE being hybrid-mpi or hybrid-mpi-async.
"""
import json
import os
import sys

import mxnet as mx
from mxnet import autograd, gluon
from mxnet.gluon import nn

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples"))
import kvhybrid  # noqa: E402
from train_mlp import synthetic_data  # noqa: E402

store, out = sys.argv[1], sys.argv[2]
kv = mx.kv.create(store)
rank, size = kv.rank, kv.num_workers
x, y = synthetic_data(8192, 64, 10)
mx.random.seed(1)
net = nn.HybridSequential()
net.add(nn.Dense(128, activation="relu"), nn.Dense(10))
net.initialize(mx.init.Xavier())
net(mx.nd.zeros((1, 64)))
kvhybrid.broadcast_parameters(net.collect_params(), kv)
trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.05},
                        kvstore=kv)
loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
data = gluon.data.DataLoader(gluon.data.ArrayDataset(x[rank::size], y[rank::size]),
                             batch_size=32, shuffle=False, last_batch="discard")
for epoch in range(int(os.environ.get("EPOCHS", "3"))):
    for xb, yb in data:
        with autograd.record():
            loss = loss_fn(net(xb), yb)
        loss.backward()
        trainer.step(32)
# The final model is the servers' (in async mode newer than any group's last pull).
kv.barrier()
for index, param in enumerate(trainer._params):
    kv.pull(index, out=param.list_data())
final = float(loss_fn(net(mx.nd.array(x)), mx.nd.array(y)).mean().asscalar())
assert trainer._update_on_kvstore, "Gluon updates on the store in async mode"
print(f"rank {rank} {kv.type} final loss {final:.4f}", flush=True)
if rank == 0:
    with open(out, "w") as f:
        json.dump({"loss": final, "type": kv.type}, f)
kv.close()
