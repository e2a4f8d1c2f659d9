"""A model with a sparse-gradient embedding, and its data, for workers and the reference."""
import numpy as np
import mxnet as mx
from mxnet import autograd, gluon
from mxnet.gluon import nn

VOCAB, DIM, WORDS, CLASSES = 1000, 8, 6, 4


class BagOfWords(gluon.HybridBlock):
    def __init__(self):
        super().__init__()
        with self.name_scope():
            self.embed = nn.Embedding(VOCAB, DIM, sparse_grad=True)
            self.out = nn.Dense(CLASSES, in_units=DIM)

    def hybrid_forward(self, F, ids):
        return self.out(self.embed(ids).mean(axis=1))


def make_sparse_net():
    return BagOfWords()


def sparse_batch(step: int, n: int):
    rng = np.random.RandomState(11 + step)
    ids = rng.zipf(1.3, size=(n, WORDS)) % VOCAB       # few hot rows, a long tail
    return ids.astype(np.float32), rng.randint(0, CLASSES, size=n).astype(np.float32)


def sparse_train_steps(net, trainer, steps, per_device, ctxs, offset, total):
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    for step in range(steps):
        x, y = sparse_batch(step, total)
        losses = []
        with autograd.record():
            for d, ctx in enumerate(ctxs):
                lo = offset + d * per_device
                losses.append(loss_fn(net(mx.nd.array(x[lo:lo + per_device], ctx=ctx)),
                                      mx.nd.array(y[lo:lo + per_device], ctx=ctx)))
        autograd.backward(losses)
        trainer.step(per_device * len(ctxs))
