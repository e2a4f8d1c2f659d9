"""Models and data shared by the training workers and the single-process reference."""
from __future__ import annotations

import numpy as np
import mxnet as mx
from mxnet import autograd, gluon
from mxnet.gluon import nn

IN_FEATURES, CLASSES = 20, 5


def make_net(model: str) -> gluon.Block:
    net = nn.HybridSequential()
    with net.name_scope():
        if model == "mlp":
            net.add(nn.Dense(32, activation="relu", in_units=IN_FEATURES),
                    nn.Dense(16, activation="tanh", in_units=32),
                    nn.Dense(CLASSES, in_units=16))
        elif model == "cnn":  # shapes left to deferred initialisation on purpose
            net.add(nn.Conv2D(6, kernel_size=3, activation="relu"),
                    nn.MaxPool2D(pool_size=2),
                    nn.Conv2D(8, kernel_size=3, activation="relu"),
                    nn.Flatten(),
                    nn.Dense(CLASSES))
        else:
            raise ValueError(model)
    return net


def batch(model: str, step: int, n: int, seed: int = 7):
    """The union batch of ``n`` samples for ``step``: the same in every process."""
    rng = np.random.RandomState(seed * 1000 + step)
    shape = (n, IN_FEATURES) if model == "mlp" else (n, 1, 10, 10)
    x = rng.standard_normal(shape).astype(np.float32)
    y = rng.randint(0, CLASSES, size=n).astype(np.float32)
    return x, y


def sample_input(model: str):
    return mx.nd.zeros((1, IN_FEATURES) if model == "mlp" else (1, 1, 10, 10))


def make_optimizer():
    return "sgd", {"learning_rate": 0.1, "momentum": 0.9, "wd": 1e-3}


def train_steps(net, trainer, model: str, steps: int, per_device: int, ctxs, offset: int,
                total: int) -> float:
    """Train ``steps`` steps; this process's devices take samples [offset, offset + len(ctxs)*per_device)."""
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    last = 0.0
    for step in range(steps):
        x, y = batch(model, step, total)
        losses = []
        with autograd.record():
            for d, ctx in enumerate(ctxs):
                lo = offset + d * per_device
                xb = mx.nd.array(x[lo:lo + per_device], ctx=ctx)
                yb = mx.nd.array(y[lo:lo + per_device], ctx=ctx)
                losses.append(loss_fn(net(xb), yb))
        autograd.backward(losses)
        trainer.step(per_device * len(ctxs))
        last = float(sum(loss.sum().asscalar() for loss in losses))
    return last


def weights(net) -> dict:
    return {name: p.data().asnumpy() for name, p in
            sorted(net._collect_params_with_prefix().items())}
