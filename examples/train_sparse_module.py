"""MXNet's Module API over sparse data: a linear classifier on CSR input with a row_sparse
weight of a million rows, trained the way MXNet's own sparse examples train.

    kvhybrid-launch -n 2 --servers 1 python examples/train_sparse_module.py
    kvhybrid-launch -n 4 --clients 2 --servers 2 python examples/train_sparse_module.py
    kvhybrid-launch -n 2 python examples/train_sparse_module.py --optimizer adam   # pure MPI

Each step pulls the rows the batch's features name (``mod.prepare`` with the batch's column
indices), runs forward and backward, and updates on the store (a push, and a pull the
Module skips for the row_sparse weight). Each epoch pulls every row (``mod.prepare(None,
all_row_ids)``), scores the held-out part, and saves a checkpoint (``get_params``: another
pull of every row). Every rank makes each of these calls: a pull is a call of the whole
group. ``--kvstore dist_sync`` trains the same model through MXNet's own store.
"""
import argparse
import logging
import os
import time

import numpy as np
import mxnet as mx


def dataset(samples: int, features: int, nnz: int, seed: int):
    """A synthetic data set: ``nnz`` Zipf-distributed feature ids a sample (a few hot
    features, a long tail; ids repeat across samples) with their values, and labels from a
    hidden linear model."""
    rng = np.random.RandomState(seed)
    ranks = np.sort((rng.zipf(1.3, size=(samples, nnz)) - 1) % (features - nnz), axis=1)
    ids = np.sort(((ranks + np.arange(nnz)) * 7919) % features, axis=1)   # distinct in a row
    values = rng.uniform(0.5, 1.5, size=(samples, nnz)).astype(np.float32)
    hidden = rng.normal(size=features).astype(np.float32)
    labels = ((values * hidden[ids]).sum(axis=1) > 0).astype(np.float32)
    return ids.astype(np.int64), values, labels


class CSRBatches(mx.io.DataIter):
    """Batches of ``dataset``'s samples ``rows`` as CSR matrices (a whole data set of a
    million features is past MXNet's 2**31 elements for one array; a batch is not)."""

    def __init__(self, ids, values, labels, rows, features: int, batch_size: int):
        super().__init__(batch_size)
        self._parts = (ids, values, labels)
        self._rows, self._features, self._next = rows, features, 0
        self.provide_data = [mx.io.DataDesc("data", (batch_size, features))]
        self.provide_label = [mx.io.DataDesc("softmax_label", (batch_size,))]

    def reset(self):
        self._next = 0

    def next(self):
        rows = self._rows[self._next:self._next + self.batch_size]
        if len(rows) < self.batch_size:   # (a short last batch is dropped)
            raise StopIteration
        self._next += self.batch_size
        ids, values, labels = (a[rows] for a in self._parts)
        indptr = np.arange(0, ids.size + 1, ids.shape[1], dtype=np.int64)
        data = mx.nd.sparse.csr_matrix((values.ravel(), ids.ravel(), indptr),
                                       shape=(len(rows), self._features))
        return mx.io.DataBatch([data], [mx.nd.array(labels)])


def part(samples, rank: int, num_workers: int, features: int, batch_size: int) -> CSRBatches:
    """This rank's equal share of ``samples`` (rows ``rank::num_workers``): every rank gets
    the same number of batches, as a synchronous store needs."""
    each = len(samples[0]) // num_workers
    rows = np.arange(rank, each * num_workers, num_workers)
    return CSRBatches(*samples, rows, features, batch_size)


def linear_model(features: int, classes: int):
    """``softmax(sparse.dot(csr, weight) + bias)``; the weight is row_sparse."""
    x = mx.sym.Variable("data", stype="csr")
    weight = mx.sym.Variable("weight", shape=(features, classes), stype="row_sparse",
                             init=mx.init.Normal(0.01))
    bias = mx.sym.Variable("bias", shape=(classes,))
    out = mx.sym.broadcast_add(mx.sym.sparse.dot(x, weight), bias)
    return mx.sym.SoftmaxOutput(out, mx.sym.Variable("softmax_label"), name="softmax")


def batch_row_ids(data_batch):
    """The rows of the weight a batch needs: its CSR column indices (unsorted across
    samples, with repeats, int64), as MXNet's sparse examples hand them to ``prepare``."""
    return {"weight": data_batch.data[0].indices}


def optimizer_params(name: str, lr: float) -> dict:
    if name == "adagrad":   # (MXNet's AdaGrad on row_sparse weights takes no weight decay)
        return {"learning_rate": lr}
    params = {"learning_rate": lr, "wd": 1e-4}
    if name == "sgd":
        params["momentum"] = 0.9
    return params


def main(argv=None, mark=lambda epoch, phase: None) -> None:
    """Train; ``mark(epoch, phase)`` is called on every rank as each epoch's training and
    its checkpoint start ("train", "checkpoint") and as the checkpoint ends ("done"), for a
    benchmark's clocks (``benchmarks/module_sparse.py``)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kvstore", default="hybrid-mpi", help="the store (default hybrid-mpi; "
                   "dist_sync for MXNet's own)")
    p.add_argument("--features", type=int, default=1_000_000, help="rows of the weight")
    p.add_argument("--classes", type=int, default=2)
    p.add_argument("--nnz", type=int, default=24, help="features a sample")
    p.add_argument("--batch-size", type=int, default=2048, help="per rank")
    p.add_argument("--batches", type=int, default=16, help="batches a rank and epoch")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--optimizer", default="sgd", choices=("sgd", "adam", "adagrad"))
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--prefix", default=None, help="where rank 0 saves its checkpoints "
                   "(PREFIX-symbol.json, PREFIX-EPOCH.params; epoch 0: the initial weights)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    import kvhybrid  # noqa: F401  (files the hybrid-mpi stores with MXNet)
    kv = mx.kv.create(args.kvstore)
    per_rank = args.batch_size * args.batches
    shape = (kv.rank, kv.num_workers, args.features, args.batch_size)
    train = part(dataset(per_rank * kv.num_workers, args.features, args.nnz, seed=1), *shape)
    held = part(dataset(args.batch_size * kv.num_workers, args.features, args.nnz, seed=2),
                *shape)

    mx.random.seed(7)   # (the store gives every rank rank 0's initial weights anyway)
    mod = mx.mod.Module(linear_model(args.features, args.classes), data_names=["data"],
                        label_names=["softmax_label"])
    mod.bind(data_shapes=train.provide_data, label_shapes=train.provide_label)
    mod.init_params()
    mod.init_optimizer(kvstore=kv, optimizer=args.optimizer,
                       optimizer_params=optimizer_params(args.optimizer, args.lr))
    all_rows = mx.nd.arange(0, args.features, dtype="int64")
    if args.prefix:
        os.makedirs(os.path.dirname(os.path.abspath(args.prefix)), exist_ok=True)

    def checkpoint(epoch: int) -> float:
        start = time.perf_counter()
        mod.get_params()   # a pull of every row, on every rank
        if kv.rank == 0 and args.prefix:
            mod.save_checkpoint(args.prefix, epoch)
        return time.perf_counter() - start

    checkpoint(0)
    metric = mx.metric.create(["acc", "ce"])
    for epoch in range(1, args.epochs + 1):
        mark(epoch, "train")
        start = time.perf_counter()
        train.reset()
        metric.reset()
        for data_batch in train:
            mod.prepare(data_batch, sparse_row_id_fn=batch_row_ids)
            mod.forward_backward(data_batch)
            mod.update()
            mod.update_metric(metric, data_batch.label)
        mod.prepare(None, lambda _: {"weight": all_rows})
        held.reset()
        score = dict(mod.score(held, ["acc", "ce"]))
        seconds = time.perf_counter() - start
        mark(epoch, "checkpoint")
        saving = checkpoint(epoch)
        mark(epoch, "done")
        if kv.rank == 0:
            trained = dict(metric.get_name_value())
            print(f"epoch {epoch}: train accuracy {trained['accuracy']:.3f}, held-out accuracy "
                  f"{score['accuracy']:.3f} (cross-entropy {score['cross-entropy']:.4f}); "
                  f"{seconds:.2f} s, checkpoint {saving:.2f} s", flush=True)


if __name__ == "__main__":
    main()
