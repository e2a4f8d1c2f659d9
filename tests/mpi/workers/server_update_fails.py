"""An optimizer that fails on the parameter servers (a weight decay MXNet cannot multiply):
MXNet's server loop would print the error and go on with half-updated weights."""
import mxnet as mx
from mxnet import autograd, gluon

import kvhybrid  # noqa: F401

kv = mx.kv.create("hybrid-mpi")
net = gluon.nn.Dense(2, in_units=3)
net.initialize()
trainer = gluon.Trainer(net.collect_params(), mx.optimizer.SGD(learning_rate=0.1, wd="bad"),
                        kvstore=kv)
for step in range(3):
    with autograd.record():
        loss = net(mx.nd.ones((4, 3))).sum()
    loss.backward()
    trainer.step(4)
    mx.nd.waitall()
print("trained on after the servers' optimizer failed", flush=True)
