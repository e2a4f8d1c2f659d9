"""A sparse model: a large SparseEmbedding looked up with Zipf-distributed word ids, then
dense layers (a bag-of-words classifier) — the kind of model Parallax routes by sparsity.

    kvhybrid-launch -n 4 --servers 2 python examples/train_sparse_bow.py
    kvhybrid-launch -n 4 --servers 2 --tune-partitions python examples/train_sparse_bow.py

The table lives on the parameter servers (split into KVHYBRID_PARTITIONS pieces); each
step every rank pushes the gradients of the rows its batch used and, handed the next
batch's ids (kvhybrid.prefetch), gets that batch's rows while the step finishes. Rank 0 prints
words/s of the whole job at the end.
"""
import argparse
import logging
import time

import numpy as np
import mxnet as mx
from mxnet import autograd, gluon
from mxnet.gluon import nn


class BagOfWords(gluon.Block):
    def __init__(self, vocab: int, dim: int, hidden: int, classes: int):
        super().__init__()
        with self.name_scope():
            self.embed = gluon.contrib.nn.SparseEmbedding(vocab, dim)
            self.hidden = nn.Dense(hidden, activation="relu", in_units=dim)
            self.out = nn.Dense(classes, in_units=hidden)

    def forward(self, ids):
        return self.out(self.hidden(self.embed(ids).mean(axis=1)))


def batch(rng, size: int, words: int, vocab: int, classes: int):
    ids = (rng.zipf(1.2, size=(size, words)) - 1) % vocab     # a few hot words, a long tail
    return mx.nd.array(ids), mx.nd.array(rng.randint(0, classes, size))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--vocab", type=int, default=200_000)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--words", type=int, default=32, help="words per sample")
    p.add_argument("--batch-size", type=int, default=128, help="per rank")
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--steps", type=int, default=30)
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    import kvhybrid
    kv = mx.kv.create("hybrid-mpi")
    rng = np.random.RandomState(100 + kv.rank)
    mx.random.seed(7)                       # every rank starts from the same weights
    net = BagOfWords(args.vocab, args.dim, args.hidden, args.classes)
    net.initialize(mx.init.Uniform(0.1))
    kvhybrid.broadcast_parameters(net.collect_params(), kv)
    # a sparse weight makes Gluon create the store at the first forward pass: scale up front
    trainer = gluon.Trainer(net.collect_params(), "sgd",
                            {"learning_rate": 0.1, "rescale_grad": 1.0 / args.batch_size},
                            kvstore=kv)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    start = None
    following = batch(rng, args.batch_size, args.words, args.vocab, args.classes)
    for step in range(args.steps):
        if step == 3:
            start = time.perf_counter()     # after the warm-up steps
        x, y = following
        following = batch(rng, args.batch_size, args.words, args.vocab, args.classes)
        with autograd.record():
            loss = loss_fn(net(x), y)
        loss.backward()
        # the next batch's rows come from the servers while this step finishes
        kvhybrid.prefetch(trainer, {net.embed.weight: following[0]})
        trainer.step(1)
    mx.nd.waitall()
    if kv.rank == 0 and start is not None:
        seconds = time.perf_counter() - start
        words = (args.steps - 3) * args.batch_size * args.words * kv.num_workers
        stats = kv.key_stats()
        alpha = ", ".join(f"{v['name']} α={v['alpha']:.4f}" for v in stats.values())
        print(f"{words / seconds:,.0f} words/s over {args.steps - 3} steps "
              f"(KVHYBRID_PARTITIONS={kv.config.partitions}; {alpha}; loss "
              f"{loss.mean().asscalar():.3f})", flush=True)


if __name__ == "__main__":
    main()
