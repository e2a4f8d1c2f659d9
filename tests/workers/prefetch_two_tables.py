"""Two sparse tables (as a translation model's source and target embeddings), trained with
their next rows prefetched or with plain pulls; dumps the weights.

Two tables make two prefetching pushes per step on the rows' thread: the second table's
push is queued before the first table's rows are handed out, on every rank in the same
order (a different order on some rank would pair one rank's gather with another's scatter).

argv: OUT_DIR STEPS TRAINER ("gluon" or "distributed"); KVHYBRID_TEST_PREFETCH=1 prefetches.
Every rank writes OUT_DIR/rank{r}.npz.
"""
import json
import os
import sys

import numpy as np
import mxnet as mx
from mxnet import autograd, gluon

import kvhybrid

VOCAB, DIM, WORDS, BATCH = 500, 8, 5, 6
out_dir, steps, kind = sys.argv[1], int(sys.argv[2]), sys.argv[3]
prefetch = os.environ.get("KVHYBRID_TEST_PREFETCH") == "1"


class TwoTables(gluon.Block):
    def __init__(self):
        super().__init__()
        with self.name_scope():
            self.src = mx.gluon.contrib.nn.SparseEmbedding(VOCAB, DIM)
            self.tgt = mx.gluon.contrib.nn.SparseEmbedding(VOCAB, DIM)
            self.out = gluon.nn.Dense(3, in_units=2 * DIM)

    def forward(self, src, tgt):
        return self.out(mx.nd.concat(self.src(src).mean(axis=1), self.tgt(tgt).mean(axis=1)))


def batch(step: int, rank: int):
    rng = np.random.RandomState(100 * step + rank)
    ids = rng.zipf(1.3, size=(2, BATCH, WORDS)) % VOCAB
    return ids[0].astype(np.float32), ids[1].astype(np.float32), \
        rng.randint(0, 3, size=BATCH).astype(np.float32)


kv = mx.kv.create("hybrid-mpi")
rank = kv.rank
mx.random.seed(5)
net = TwoTables()
net.initialize(mx.init.Xavier())
params = {"learning_rate": 0.5, "momentum": 0.9, "rescale_grad": 1.0 / BATCH}
make = kvhybrid.DistributedTrainer if kind == "distributed" else gluon.Trainer
trainer = make(net.collect_params(), "sgd", params, kvstore=kv)
if kv.rows_engine is not None:
    kv.rows_engine.record = True   # the order this rank's rows thread runs its jobs in
loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
for step in range(steps):
    src, tgt, label = batch(step, rank)
    with autograd.record():
        loss = loss_fn(net(mx.nd.array(src), mx.nd.array(tgt)), mx.nd.array(label))
    loss.backward()
    if prefetch:
        nsrc, ntgt, _ = batch(step + 1, rank)
        kvhybrid.prefetch(trainer, {net.src.weight: nsrc, net.tgt.weight: ntgt})
    trainer.step(1)
rows = mx.nd.arange(VOCAB)
np.savez(os.path.join(out_dir, f"rank{rank}.npz"),
         src=net.src.weight.row_sparse_data(rows).tostype("default").asnumpy(),
         tgt=net.tgt.weight.row_sparse_data(rows).tostype("default").asnumpy(),
         out=net.out.weight.data().asnumpy())
kv.close()
with open(os.path.join(out_dir, f"rows-jobs-rank{rank}.json"), "w") as f:
    json.dump(list(kv.rows_engine.history) if kv.rows_engine is not None else [], f)
