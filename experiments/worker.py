"""One worker of an experiment: trains a task on the store it is given, under
``kvhybrid-launch``, with ``gluon.Trainer`` on MXNet's stores and
``kvhybrid.DistributedTrainer`` on kvhybrid's (which also hands over the next batch's rows
of a sparse table, ``prefetch``, as the models benchmark does). The runner
(``python -m experiments``) starts it; by hand:

    kvhybrid-launch -n 4 --clients 2 --servers 1 python -m experiments.worker \\
        --task digits --store hybrid-mpi-elastic --out /tmp/run

Every worker writes ``worker<rank>.json`` into ``--out``: its epoch times, and for rank 0
the validation figures of its own weights after every epoch, with the training time so
far (validation excluded). Every worker evaluates its own weights after every epoch (in
the async and elastic modes they differ); rank 0's are the ones recorded.
"""
from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np
import mxnet as mx
from mxnet import autograd, gluon
from mxnet.gluon.contrib.nn import SparseEmbedding

import kvhybrid
from .tasks import TASKS, evaluate


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--task", choices=sorted(TASKS), required=True)
    p.add_argument("--store", required=True, help="what mx.kv.create gets")
    p.add_argument("--out", required=True, help="folder for worker<rank>.json")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=32, help="per worker")
    p.add_argument("--lr", type=float, default=0.1, help="per sample of one worker's batch")
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--workers-per-update", type=int, default=1,
                   help="workers whose gradients one optimizer step sums; lr is divided by it")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-steps", action="store_true",
                   help="print 'rank R step S' before every step (for fault injection)")
    p.add_argument("--step-sleep", type=float, default=0.0, metavar="S",
                   help="sleep S seconds after every step (stretches a run for fault tests)")
    return p.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    kv = mx.kv.create(args.store)
    rank, size = kv.rank, kv.num_workers
    task = TASKS[args.task]()
    x, y = task.train
    shard = slice(rank, None, size)
    np.random.seed(args.seed + rank)   # the DataLoader's shuffle
    train = gluon.data.DataLoader(gluon.data.ArrayDataset(x[shard], y[shard]),
                                  batch_size=args.batch_size, shuffle=True, last_batch="discard")
    mx.random.seed(args.seed)          # the same initial weights everywhere
    net = task.build()
    net.initialize(mx.init.Xavier())
    net.hybridize()
    # rescale_grad set here and step(1): with a sparse weight Gluon sets the store up at
    # the first forward pass, before any step could tell it the batch size
    # kvhybrid's stores get its DistributedTrainer, which hands them a step's dense keys in
    # one call (MXNet's own stores get gluon.Trainer)
    trainer_class = (kvhybrid.DistributedTrainer if isinstance(kv, kvhybrid.HybridMPIStore)
                     else gluon.Trainer)
    trainer = trainer_class(net.collect_params(), "sgd",
                            {"learning_rate": args.lr / args.workers_per_update,
                             "momentum": args.momentum, "rescale_grad": 1.0 / args.batch_size},
                            kvstore=kv)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    record = {"rank": rank, "workers": size, "store": args.store, "task": args.task,
              "steps_per_epoch": len(train), "epoch_seconds": [], "validation": []}
    if rank == 0:
        print(f"{args.task} on {args.store}: {size} workers, {len(train)} steps of "
              f"{args.batch_size} per worker per epoch", flush=True)
    # kvhybrid fetches a sparse table's rows for the next batch while this step finishes
    # (kvhybrid.prefetch), as a user after speed would; MXNet's stores have no such call
    tables = [b.weight for b in net._children.values() if isinstance(b, SparseEmbedding)] \
        if trainer_class is not gluon.Trainer else []
    trained = 0.0
    step = 0
    for epoch in range(1, args.epochs + 1):
        start = time.perf_counter()
        batches = list(train)   # this epoch's shuffle, so each step knows the next batch
        for i, (data, label) in enumerate(batches):
            if args.log_steps:
                print(f"rank {rank} step {step}", flush=True)
            step += 1
            with autograd.record():
                loss = loss_fn(net(data), label)
            loss.backward()
            if tables and i + 1 < len(batches):
                trainer.prefetch({t: batches[i + 1][0] for t in tables})
            trainer.step(1)
            if args.step_sleep:
                time.sleep(args.step_sleep)
        mx.nd.waitall()
        seconds = time.perf_counter() - start
        trained += seconds
        record["epoch_seconds"].append(seconds)
        # every worker evaluates (a sparse weight's rows come through the store, which may
        # need the whole client group); rank 0 keeps its figures
        scores = evaluate(net, task.valid)
        if rank == 0:
            record["validation"].append({"epoch": epoch, "train_seconds": trained, **scores})
            print(f"epoch {epoch}/{args.epochs}: validation accuracy {scores['accuracy']:.4f}  "
                  f"perplexity {scores['perplexity']:.2f}  epoch {seconds:.2f} s", flush=True)
    with open(os.path.join(args.out, f"worker{rank}.json"), "w") as f:
        json.dump(record, f)
    if args.epochs:   # the last epoch's figures: the weights have not changed since
        print(f"rank {rank} finished, validation accuracy {scores['accuracy']:.4f}", flush=True)
    close = getattr(kv, "close", None)   # the hybrid stores; MXNet's own close at exit
    if close is not None:
        close()


if __name__ == "__main__":
    main()
