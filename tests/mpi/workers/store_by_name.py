"""One SGD step through a store named by a string, as MXNet users name ``dist_sync``:
``gluon.Trainer(kvstore=NAME)``, ``Module.fit(kvstore=NAME)`` or
``Module.init_optimizer(kvstore=NAME)``. Rank r's gradient is r + 1 in every element; each
rank writes its weights after the step and its trainer's store to OUT/NAME-API-rankR.json.

    store_by_name.py OUT NAME[,NAME...] API[,API...]     (API: trainer, fit, init_optimizer)
"""
import json
import os
import sys

import numpy as np
import mxnet as mx
from mxnet import autograd, gluon

import kvhybrid  # noqa: F401  (files the names with MXNet)

LR = 0.1


def _rank() -> int:
    """This process's rank in its mpirun (before any store exists)."""
    for var in ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"):
        if var in os.environ:
            return int(os.environ[var])
    return 0


def _x(rank: int):
    return mx.nd.ones((1, 2)) * (rank + 1)


def trainer(name: str, rank: int):
    net = gluon.nn.Dense(1, in_units=2, use_bias=False)
    net.initialize(mx.init.Zero())
    step = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": LR}, kvstore=name)
    with autograd.record():
        y = net(_x(rank)).sum()
    y.backward()
    step.step(1)
    return net.weight.data().asnumpy(), step._kvstore


def _module():
    fc = mx.sym.FullyConnected(mx.sym.Variable("data"), num_hidden=1, no_bias=True, name="fc")
    loss = mx.sym.MakeLoss(mx.sym.sum(fc * mx.sym.Variable("label")))   # (the label: ones)
    return mx.mod.Module(loss, data_names=["data"], label_names=["label"])


def fit(name: str, rank: int):
    mod = _module()
    data = mx.io.NDArrayIter(_x(rank), mx.nd.ones((1, 1)), batch_size=1, label_name="label")
    mod.fit(data, kvstore=name, optimizer="sgd", optimizer_params={"learning_rate": LR},
            initializer=mx.init.Zero(), eval_metric="loss", num_epoch=1)
    return mod.get_params()[0]["fc_weight"].asnumpy(), mod._kvstore


def init_optimizer(name: str, rank: int):
    mod = _module()
    mod.bind(data_shapes=[("data", (1, 2))], label_shapes=[("label", (1, 1))])
    mod.init_params(mx.init.Zero())
    mod.init_optimizer(kvstore=name, optimizer="sgd", optimizer_params={"learning_rate": LR})
    mod.forward_backward(mx.io.DataBatch([_x(rank)], [mx.nd.ones((1, 1))]))
    mod.update()
    return mod.get_params()[0]["fc_weight"].asnumpy(), mod._kvstore


def main() -> None:
    out, names, apis = sys.argv[1], sys.argv[2].split(","), sys.argv[3].split(",")
    rank = _rank()
    for name in names:
        for api in apis:
            weights, kv = globals()[api](name, rank)
            mx.nd.waitall()
            mine = rank if kv is None else kv.rank   # (the job's rank: several mpiruns)
            with open(os.path.join(out, f"{name}-{api}-rank{mine}.json"), "w") as f:
                json.dump({"weights": np.asarray(weights).ravel().tolist(),
                           "store": None if kv is None else type(kv).__name__,
                           "type": None if kv is None else kv.type,
                           "workers": None if kv is None else kv.num_workers,
                           "steps": None if kv is None else kv.clock.steps}, f)


if __name__ == "__main__":
    main()
