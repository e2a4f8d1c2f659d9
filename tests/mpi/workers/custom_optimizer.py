"""A Trainer whose optimizer class lives in this script (__main__): servers cannot load it."""
import mxnet as mx
from mxnet import autograd, gluon

import kvhybrid  # noqa: F401


@mx.optimizer.register
class ScriptLocalSGD(mx.optimizer.SGD):
    """Plain SGD, but defined in __main__, which the parameter servers cannot import."""


kv = mx.kv.create("hybrid-mpi")
net = gluon.nn.Dense(2, in_units=3)
net.initialize()
trainer = gluon.Trainer(net.collect_params(), ScriptLocalSGD(learning_rate=0.1), kvstore=kv)
with autograd.record():
    loss = net(mx.nd.ones((4, 3))).sum()
loss.backward()
trainer.step(4)
print("trained with an optimizer the servers cannot load", flush=True)
