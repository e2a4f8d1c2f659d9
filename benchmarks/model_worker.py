"""One worker of the model-level benchmark (``python -m benchmarks.models`` starts it
under ``kvhybrid-launch``): trains a model of ``model_zoo`` for a fixed number of steps
through one system and writes what it measured.

Systems: ``hybrid`` (``hybrid-mpi`` with ``kvhybrid.DistributedTrainer``, handing it the
next batch's row ids: ``kvhybrid.prefetch``), ``hybrid-unprefetched`` (the same without
``kvhybrid.prefetch``: the sparse path a script gets that never calls it), ``dist_sync``
(MXNet's own store and ``gluon.Trainer``), ``horovod`` (``horovod.mxnet``'s
``DistributedTrainer``, dense embeddings), ``local`` (no communication: each worker trains
alone, the bound no system beats with the same processes on the same cores). Every worker
draws its own batches (seeded by its rank), the same whatever the system, and starts from
the same weights. Each step's time is also split into what the caller's thread spent in
the forward pass (a blocking pull shows here), in ``trainer.step`` and waiting for the
engine at the end (``waitall``).
"""
from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np
import mxnet as mx
from mxnet import autograd, gluon

import kvhybrid
from kvhybrid.tensor_collectives.mpi_env import load_mpi

from . import model_zoo
from .model_zoo import MODELS
from . import cpu
from .common import WAITS
from .wire import interface_counters

SYSTEMS = ("hybrid", "hybrid-unprefetched", "dist_sync", "horovod", "local")
#: a step's parts as the caller's thread sees them
PHASES = ("forward", "backward", "trainer.step", "waitall")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=sorted(MODELS), required=True)
    p.add_argument("--system", choices=SYSTEMS, required=True)
    p.add_argument("--out", required=True, help="rank 0 writes result.json here")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--warmup", type=int, default=10, help="untimed first steps")
    p.add_argument("--batch-size", type=int, default=32, help="samples per worker")
    p.add_argument("--tokens", type=int, default=50, help="words per sample (sets alpha)")
    p.add_argument("--lr", type=float, help="per sample of the global batch (default: the model's)")
    p.add_argument("--waitall", choices=WAITS, default="step",
                   help="wait for MXNet's engine after every step (each step's time is its "
                        "own), or once after the last, as a loop that never waits (a step's "
                        "time is then the timed steps' total ÷ their number)")
    return p.parse_args(argv)


def make_trainer(system: str, net, lr: float, batch: int):
    """(trainer, rank, workers, store or None); the learning rate applies to the mean
    gradient over every worker's samples in every system."""
    params = {"learning_rate": lr, "rescale_grad": 1.0 / batch}
    if system == "horovod":
        import horovod.mxnet as hvd
        hvd.init()
        hvd.broadcast_parameters(net.collect_params(), root_rank=0)
        # Horovod averages over workers itself
        return hvd.DistributedTrainer(net.collect_params(), "sgd", params), hvd.rank(), \
            hvd.size(), None
    if system.startswith("hybrid"):
        import kvhybrid
        kv = mx.kv.create("hybrid-mpi")
        params["learning_rate"] = lr / kv.num_workers   # the store sums over workers
        return kvhybrid.DistributedTrainer(net.collect_params(), "sgd", params, kvstore=kv), \
            kv.rank, kv.num_workers, kv
    if system == "local":
        world = load_mpi(allow_singleton=True).COMM_WORLD   # only for rank and size
        # MXNet's in-process store (sparse tables need one): nothing leaves the process
        return gluon.Trainer(net.collect_params(), "sgd", params, kvstore="local"), \
            world.rank, world.size, None
    kv = mx.kv.create("dist_sync")
    params["learning_rate"] = lr / kv.num_workers
    return gluon.Trainer(net.collect_params(), "sgd", params, kvstore=kv), kv.rank, \
        kv.num_workers, kv


def hidden_fractions(timeline, steps: int) -> list:
    """Per engine bucket: [name, mean ms from gradient ready to sum done, the mean fraction
    of that time hidden behind backward]. Backward ends when the step's last bucket is
    ready (the first layer's gradients are written last)."""
    ops = list(timeline)
    per_step = len(ops) // steps if steps else 0
    if not per_step:
        return []
    out = []
    for b in range(per_step):
        spans, fractions = [], []
        for s in range(steps):
            step = ops[s * per_step:(s + 1) * per_step]
            backward_end = max(op.ready for op in step)
            op = step[b]
            span = op.end - op.ready
            spans.append(span)
            fractions.append(min(max(backward_end - op.ready, 0.0), span) / span if span else 1.0)
        out.append([ops[b].name, float(np.mean(spans)) * 1e3, float(np.mean(fractions))])
    return out


def main(argv=None) -> None:
    args = parse_args(argv)
    model = MODELS[args.model]
    mx.random.seed(0)
    net = model.build(args.system != "horovod")
    net.initialize(mx.init.Xavier())
    trainer, rank, workers, kv = make_trainer(args.system, net, args.lr or model.lr,
                                              args.batch_size)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    batches = model_zoo.worker_batches(model, rank, args.batch_size, args.tokens)
    times, alphas, phases = [], [], []
    for step in range(args.steps):
        inputs, label = batches[step % len(batches)]
        if step == args.warmup:   # the timed steps' traffic, counted by the kernel
            wire_start = interface_counters()
            cpu_start, machine_start = cpu.thread_seconds(), cpu.machine_seconds()
            meetings_start = kv.collectives() if hasattr(kv, "collectives") else {}
            sent_start = dict(kv.group.bytes_sent) if hasattr(kv, "group") else {}
            if getattr(kv, "engine", None) is not None:
                kv.engine.record = True
        if step >= args.warmup and model.sparse_keys:   # α of each table at this step
            alphas.append([len(np.unique(x)) / rows for x, rows in zip(inputs, model.vocabs)])
        start = time.perf_counter()
        with autograd.record():
            loss = loss_fn(net(*[mx.nd.array(x) for x in inputs]), mx.nd.array(label))
        forward = time.perf_counter()
        loss.backward()
        if args.system == "hybrid" and model.sparse_keys:   # the next batch's rows, ahead
            following = batches[(step + 1) % len(batches)][0]
            kvhybrid.prefetch(trainer, {t.weight: ids for t, ids in zip(net.tables, following)})
        stepping = time.perf_counter()
        trainer.step(1)
        waiting = time.perf_counter()
        if args.waitall == "step" or step == args.steps - 1:
            mx.nd.waitall()
        end = time.perf_counter()
        if step == args.warmup:
            timed_start = start
        if step >= args.warmup:
            times.append(end - start)
            phases.append((forward - start, stepping - forward, waiting - stepping,
                           end - waiting))
    queued = None
    if args.waitall == "end":   # (no step's time is its own: each is the mean)
        times = [(end - timed_start) / len(times)] * len(times)
        # the share of the timed window the caller's thread took to queue the timed steps:
        # it runs ahead of MXNet's engine, then waits in the last waitall, so its CPU is
        # not the step's bound here
        queued = (waiting - timed_start) / (end - timed_start)
    wire_end = interface_counters()
    timed = args.steps - args.warmup
    cpu_ms = cpu.per_step_ms(cpu_start, cpu.thread_seconds(), timed)
    machine_ms = (cpu.machine_seconds() - machine_start) * 1e3 / timed
    meetings = ({k: (v - meetings_start[k]) / timed for k, v in kv.collectives().items()}
                if hasattr(kv, "collectives") else {})
    hidden = hidden_fractions(kv.engine.timeline, timed) \
        if getattr(kv, "engine", None) is not None else []
    os.makedirs(args.out, exist_ok=True)   # (run by hand, --out may not exist yet)
    with open(os.path.join(args.out, f"wire-rank{rank}.json"), "w") as f:
        json.dump({"steps": args.steps - args.warmup, "cpu_ms_per_step": cpu_ms,
                   "queued_fraction": queued,
                   "interfaces": {k: v["bytes"] - wire_start.get(k, {}).get("bytes", 0)
                                  for k, v in wire_end.items()},
                   "packets": {k: v["packets"] - wire_start.get(k, {}).get("packets", 0)
                               for k, v in wire_end.items()}}, f)
    # the loss after the fixed number of steps, on one batch every system and rank shares
    inputs, label = model.batch(np.random.RandomState(7), 256, args.tokens)
    final = float(loss_fn(net(*[mx.nd.array(x) for x in inputs]), mx.nd.array(label))
                  .mean().asscalar())
    # (from the warm-up's end, as the times: not the tables' first broadcast)
    sent = {k: v - sent_start.get(k, 0) for k, v in kv.group.bytes_sent.items()} \
        if hasattr(kv, "group") else {}
    if rank == 0:
        step = float(np.median(times))
        words = workers * args.batch_size * model.words_per_sample(args.tokens)
        with open(os.path.join(args.out, "result.json"), "w") as f:
            json.dump({"model": args.model, "system": args.system, "workers": workers,
                       "step_seconds": step, "words_per_second": words / step,
                       "loss": final, "steps": args.steps, "waitall": args.waitall,
                       "bytes_sent": sent,
                       "sent_steps": timed,
                       "dense_bytes": sum(p.data().size * 4 for name, p in
                                          net.collect_params().items() if "embedding" not in name),
                       "table_bytes": [v * model_zoo.DIM * 4 for v in model.vocabs],
                       "alpha": np.mean(alphas, axis=0).tolist() if alphas else [],
                       "collectives_per_step": meetings, "hidden": hidden,
                       # medians of the caller's thread's time per step, in seconds
                       "phases": dict(zip(PHASES, np.median(phases, axis=0).tolist())),
                       # every process of the machine, during the timed steps
                       "machine_cpu_ms_per_step": machine_ms,
                       "key_stats": {str(k): v for k, v in kv.key_stats().items()}
                       if hasattr(kv, "key_stats") else {}}, f)
        print(f"{args.model} on {args.system}: {step * 1e3:.1f} ms per step, "
              f"{words / step:,.0f} words/s, loss {final:.5f}", flush=True)
    if hasattr(kv, "close"):
        kv.close()


if __name__ == "__main__":
    main()
