"""The main job: a Gluon MLP trained data-parallel through ``hybrid-mpi``.

    kvhybrid-launch -n 4 --clients 2 --servers 2 python examples/train_mlp.py
    kvhybrid-launch -n 4 python examples/train_mlp.py        # pure MPI
    kvhybrid-launch -n 4 --clients 2 --servers 1 python examples/train_mlp.py --store hybrid-mpi-elastic

Each rank trains on its own shard of a synthetic 10-class problem; gradients
are summed across ranks by the store. Rank 0 prints the loss and accuracy over
all ranks and the samples/s of the whole job, every epoch, and at the end
checks that every rank holds the same weights (with hybrid-mpi-elastic: every rank of
each client group; the groups only meet through the center variables).
"""
import argparse
import logging
import time

import numpy as np
import mxnet as mx
from mxnet import autograd, gluon
from mxnet.gluon import nn

import kvhybrid
from kvhybrid.tensor_collectives import allreduce


def synthetic_data(samples: int, features: int, classes: int, seed: int = 0):
    """Gaussian clusters, one per class: the same data set on every rank."""
    rng = np.random.RandomState(seed)
    centers = rng.standard_normal((classes, features)) * 0.12
    y = rng.randint(0, classes, samples)
    x = centers[y] + rng.standard_normal((samples, features))
    return x.astype(np.float32), y.astype(np.float32)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=64, help="per rank")
    p.add_argument("--samples", type=int, default=32768, help="in the whole data set")
    p.add_argument("--features", type=int, default=128)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--store", default="hybrid-mpi",
                   choices=["hybrid-mpi", "hybrid-mpi-async", "hybrid-mpi-elastic"],
                   help="mpi-SGD, mpi-ASGD, or mpi-ESGD (elastic averaging; needs servers)")
    p.add_argument("--lr", type=float, default=0.05)
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(message)s")

    kv = mx.kv.create(args.store)
    rank, size = kv.rank, kv.num_workers
    say = print if rank == 0 else (lambda *a, **k: None)
    x, y = synthetic_data(args.samples, args.features, args.classes)
    shard = slice(rank, None, size)  # rank r takes every size-th sample
    train = gluon.data.DataLoader(gluon.data.ArrayDataset(x[shard], y[shard]),
                                  batch_size=args.batch_size, shuffle=True, last_batch="discard")

    net = nn.HybridSequential()
    net.add(nn.Dense(args.hidden, activation="relu"), nn.Dense(args.hidden, activation="relu"),
            nn.Dense(args.classes))
    net.initialize(mx.init.Xavier())
    net.hybridize()
    net(mx.nd.zeros((1, args.features)))              # finish deferred initialisation
    kvhybrid.broadcast_parameters(net.collect_params(), kv)
    trainer = gluon.Trainer(net.collect_params(), "sgd",
                            {"learning_rate": args.lr / size, "momentum": 0.9}, kvstore=kv)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    groups = size // kv.group.size
    say(f"{args.store}: {size} workers in {groups} client group(s), {len(x[shard])} samples per "
        f"worker, batch {args.batch_size} per worker, "
        f"{sum(p.data().size for p in net.collect_params().values()):,} weights")

    for epoch in range(args.epochs):
        loss_sum, correct, samples = mx.nd.zeros((1,)), mx.nd.zeros((1,)), 0
        kv.barrier()
        start = time.perf_counter()
        for data, label in train:
            with autograd.record():
                out = net(data)
                loss = loss_fn(out, label)
            loss.backward()
            trainer.step(args.batch_size)
            loss_sum += loss.sum()
            correct += (out.argmax(axis=1) == label).sum()
            samples += len(label)
        loss_sum.wait_to_read()
        kv.barrier()
        seconds = time.perf_counter() - start
        stats = mx.nd.concat(loss_sum, correct, mx.nd.array([samples]), dim=0)
        allreduce(stats, group=kv.group)               # totals over every rank
        loss_sum, correct, samples = stats.asnumpy()
        say(f"epoch {epoch + 1}/{args.epochs}: loss {loss_sum / samples:.4f}  "
            f"accuracy {correct / samples:.3f}  {samples / seconds:,.0f} samples/s "
            f"({seconds:.2f} s)")

    # Synchronous data parallelism keeps the copies identical: check it.
    checksum = mx.nd.array([sum(float(p.data().sum().asscalar())
                                for p in net.collect_params().values())], dtype="float64")
    lo, hi = checksum.copy(), checksum.copy()
    allreduce(lo, op="min", group=kv.group)
    allreduce(hi, op="max", group=kv.group)
    same = float(hi.asscalar() - lo.asscalar()) <= 1e-6 * max(1.0, abs(float(hi.asscalar())))
    scope = f"all {size} ranks" if groups == 1 else f"the {kv.group.size} ranks of this client group"
    say(f"weights identical on {scope}: {'yes' if same else 'NO'}")
    kv.close()
    if not same:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
