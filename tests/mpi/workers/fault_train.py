"""Train the sparse bag-of-words model through a kvhybrid store, for fault and checkpoint tests.

    fault_train.py OUT STEPS [--store S] [--kind weight|grad|dense] [--save-at K] [--resume]
                   [--sleep SECONDS]

Prints ``rank R step S`` before each step (the fault harness waits for these lines).
``--save-at K`` saves a checkpoint in OUT/ckpt after K steps (then trains on, until
killed or STEPS); ``--resume`` starts from OUT/ckpt. Rank 0 writes the final weights to
OUT/final.npz; every rank prints ``rank R finished`` and, for elastic and async stores,
its training accuracy on a fixed batch.
"""
import argparse
import os
import sys
import time

import numpy as np
import mxnet as mx
from mxnet import autograd, gluon

sys.path.insert(0, os.path.dirname(__file__))
import kvhybrid  # noqa: E402
from sparse_models import make_sparse_net, make_trainer, sparse_batch, trained_weights  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("out")
p.add_argument("steps", type=int)
p.add_argument("--store", default="hybrid-mpi")
p.add_argument("--kind", default="weight")
p.add_argument("--save-at", type=int)
p.add_argument("--resume", action="store_true")
p.add_argument("--sleep", type=float, default=0.0)
p.add_argument("--per-worker", type=int, default=8)
args = p.parse_args()

kv = mx.kv.create(args.store)
rank, size = kv.rank, kv.num_workers
mx.random.seed(7)                       # the same initial weights on every rank and run
net = make_sparse_net(args.kind)
net.initialize(mx.init.Xavier(), ctx=mx.cpu())
batch = args.per_worker
trainer, step_arg = make_trainer(net, args.kind, kv, batch,
                                 fused=bool(os.environ.get("KVHYBRID_TEST_FUSED")))
loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
ckpt = os.path.join(args.out, "ckpt")


def train_step(step: int) -> None:
    x, y = sparse_batch(step, size * batch)
    lo = rank * batch
    with autograd.record():
        loss = loss_fn(net(mx.nd.array(x[lo:lo + batch])), mx.nd.array(y[lo:lo + batch]))
    loss.backward()
    trainer.step(step_arg)


if args.resume:   # a forward pass creates the store's keys; the checkpoint gives their values
    net(mx.nd.array(sparse_batch(0, 1)[0]))
    first = kvhybrid.load_checkpoint(trainer, ckpt)["step"]
    print(f"rank {rank} resumed at step {first}", flush=True)
else:
    train_step(0)
    first = 1
for step in range(first, args.steps):
    if args.save_at == step:
        kvhybrid.save_checkpoint(trainer, ckpt, step=step)
        print(f"rank {rank} checkpoint saved at step {step}", flush=True)
    print(f"rank {rank} step {step}", flush=True)
    train_step(step)
    if args.sleep:
        time.sleep(args.sleep)

if kv.placement.servers is not None:   # a master: how many keys travelled packed (packs.py)
    print(f"rank {rank} packed keys {len(kv.placement.servers._packed)}", flush=True)
weights = trained_weights(net)   # pulls sparse weights: a call every rank makes
if rank == 0:
    np.savez(os.path.join(args.out, "final.npz"), **weights)
x, y = sparse_batch(10 ** 6, 256)
accuracy = float((net(mx.nd.array(x)).argmax(axis=1).asnumpy() == y).mean())
print(f"rank {rank} finished, accuracy {accuracy:.4f}", flush=True)
kv.close()
