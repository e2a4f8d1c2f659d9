"""Train a model on a fixed budget of samples; rank 0 writes its final loss.

argv: STORE OUT_JSON [MODEL [EPOCHS [until-stopped]]], STORE being hybrid-mpi or
hybrid-mpi-async, MODEL "mlp" (the main job's MLP, the default) or "sparse" (a
SparseEmbedding and an nn.Embedding(sparse_grad=True) feeding dense layers), EPOCHS the
budget (default: the EPOCHS variable, else 3). "until-stopped": a --tune trial
(KVHYBRID_STATS_STEPS in its environment) trains until the tuner stops it, so that the stop
is what ends it.
"""
import json
import os
import sys

import numpy as np
import mxnet as mx
from mxnet import autograd, gluon
from mxnet.gluon import nn

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "examples"))
import kvhybrid  # noqa: E402
from train_mlp import synthetic_data  # noqa: E402

BATCH, CLASSES, VOCAB, USERS, WORDS = 32, 10, 200, 50, 6


class WordsAndUser(gluon.Block):
    """Class = the topic most of a sample's words belong to, nudged by its user."""

    def __init__(self):
        super().__init__()
        with self.name_scope():
            self.words = mx.gluon.contrib.nn.SparseEmbedding(VOCAB, 16)
            self.user = nn.Embedding(USERS, 16, sparse_grad=True)
            self.hidden = nn.Dense(32, activation="relu", in_units=32)
            self.out = nn.Dense(CLASSES, in_units=32)

    def forward(self, x):
        words = self.words(x[:, :WORDS]).mean(axis=1)
        return self.out(self.hidden(mx.nd.concat(words, self.user(x[:, WORDS]), dim=1)))


def sparse_data(n: int):
    rng = np.random.RandomState(0)
    topic = rng.randint(0, CLASSES, size=VOCAB)
    y = rng.randint(0, CLASSES, size=n)
    ids = rng.zipf(1.2, size=(n, WORDS)) % VOCAB
    on_topic = rng.rand(n, WORDS) < 0.6                      # most words come from the class's topic
    pool = [np.flatnonzero(topic == c) for c in range(CLASSES)]
    for i, j in zip(*np.nonzero(on_topic)):
        ids[i, j] = pool[y[i]][ids[i, j] % len(pool[y[i]])]
    noisy = rng.rand(n) < 0.3                                # a loss floor well above 0
    y[noisy] = rng.randint(0, CLASSES, size=int(noisy.sum()))
    users = rng.randint(0, USERS, size=(n, 1))
    x = np.concatenate([ids, users], axis=1).astype(np.float32)
    return mx.nd.array(x), mx.nd.array(y.astype(np.float32))


store, out = sys.argv[1], sys.argv[2]
model = sys.argv[3] if len(sys.argv) > 3 else "mlp"
epochs = int(sys.argv[4]) if len(sys.argv) > 4 else int(os.environ.get("EPOCHS", "3"))
if sys.argv[5:] == ["until-stopped"] and os.environ.get("KVHYBRID_STATS_STEPS"):
    epochs = 10**6
kv = mx.kv.create(store)
rank, size = kv.rank, kv.num_workers
mx.random.seed(1)
params = {"learning_rate": 0.05}
if model == "mlp":
    x, y = map(mx.nd.array, synthetic_data(8192, 64, 10))
    net = nn.HybridSequential()
    net.add(nn.Dense(128, activation="relu"), nn.Dense(10))
    net.initialize(mx.init.Xavier())
    net(mx.nd.zeros((1, 64)))
else:
    x, y = sparse_data(8192)
    net = WordsAndUser()
    net.initialize(mx.init.Xavier())
    params = {"learning_rate": 0.5, "rescale_grad": 1.0 / BATCH}  # see sparse_models.make_trainer
kvhybrid.broadcast_parameters(net.collect_params(), kv)
trainer = gluon.Trainer(net.collect_params(), "sgd", params, kvstore=kv)
step_arg = 1 if "rescale_grad" in params else BATCH
loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
data = gluon.data.DataLoader(gluon.data.ArrayDataset(x[rank::size], y[rank::size]),
                             batch_size=BATCH, shuffle=False, last_batch="discard")
for epoch in range(epochs):
    for xb, yb in data:
        with autograd.record():
            loss = loss_fn(net(xb), yb)
        loss.backward()
        trainer.step(step_arg)
# The final model is the servers' (in async mode newer than any group's last pull).
kv.barrier()
for index, param in enumerate(trainer._params):
    if param._stype == "default":
        kv.pull(index, out=param.list_data())
final = float(loss_fn(net(x), y).mean().asscalar())   # sparse weights: pulled in forward
assert trainer._update_on_kvstore, "Gluon updates on the store in async mode"
print(f"rank {rank} {kv.type} final loss {final:.4f}", flush=True)
if rank == 0:
    with open(out, "w") as f:
        json.dump({"loss": final, "type": kv.type}, f)
kv.close()
