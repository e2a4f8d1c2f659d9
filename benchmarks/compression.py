"""2bit gradient compression: bytes saved and what it costs in accuracy.

    python -m benchmarks.compression --rounds 3
    python -m benchmarks.compression --rounds 3 --momentum 0.9 --thresholds 0.5 \
        --name compression_momentum

Trains the experiments' digits MLP (scikit-learn's 8x8 digits, 3 dense layers) on
``--ranks`` workers, uncompressed and with MXNet's 2bit compression at each ``--thresholds``
t, under three systems: ``hybrid-mpi`` in one client group (``gluon.Trainer`` with
``compression_params``), ``hybrid-mpi`` with a client group per worker and one server (pure
PS), and MXNet's ``dist_sync`` (the same algorithm: the accuracy to match). Every run is
repeated ``--rounds`` times, the order of the runs reversed every other round. The table
gives median (range) of the final validation accuracy and loss, the bytes a rank puts on
the wire per step inside its group (counted by the store, ring model), the loopback bytes
per step of the whole job (measured: ps-lite's traffic) and the step time. Writes
``NAME.{md,json,png}`` into ``--out`` (``--name``, default ``compression``).
"""
from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List

from .common import footer, grouped_bars, run_job, save_figure, write_outputs

log = logging.getLogger("benchmarks")

NONE = "uncompressed"
BASE = f"hybrid-mpi, {NONE}"


#: the systems: kvhybrid in one client group (pure MPI), kvhybrid with a group per worker
#: (pure PS: the pushes cross to the server, compressed by MXNet's compressor), MXNet
STORES = ("hybrid-mpi", "hybrid-mpi pure PS", "dist_sync")


def system_name(store: str, threshold: float) -> str:
    return f"{store}, " + (NONE if threshold <= 0 else f"2bit, threshold {threshold:g}")


def loopback_bytes() -> int:
    """Bytes sent over loopback by every process on this machine so far (ps-lite's traffic:
    MPI ranks on one host talk through shared memory)."""
    with open("/sys/class/net/lo/statistics/tx_bytes") as f:
        return int(f.read())


def worker(args) -> None:
    import numpy as np
    import mxnet as mx
    from mxnet import autograd, gluon
    import kvhybrid  # noqa: F401  (registers hybrid-mpi)
    from experiments.tasks import digits, evaluate

    kv = mx.kv.create(args.store)
    rank, n = kv.rank, kv.num_workers
    task = digits()
    mx.random.seed(0)   # the same initial weights on every rank
    net = task.build()
    net.initialize(mx.init.Xavier())
    params = {"type": "2bit", "threshold": args.threshold} if args.threshold > 0 else None
    optimizer = mx.optimizer.SGD(learning_rate=args.lr, momentum=args.momentum)
    if args.store == "dist_sync":
        step = _push_pull_step(kv, net, optimizer, params, args.batch)
    else:
        trainer = gluon.Trainer(net.collect_params(), optimizer, kvstore=kv,
                                compression_params=params)
        step = trainer.step
    x, y = task.train
    x, y = x[rank::n], y[rank::n]
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    curve, steps, seconds, before, lo_before = [], 0, [], {}, 0
    for epoch in range(args.epochs):
        order = np.random.RandomState(epoch).permutation(len(y))
        for start in range(0, len(y) - args.batch + 1, args.batch):
            idx = order[start:start + args.batch]
            t0 = time.perf_counter()
            with autograd.record():
                loss = loss_fn(net(mx.nd.array(x[idx])), mx.nd.array(y[idx]))
            loss.backward()
            step(args.batch)
            mx.nd.waitall()
            seconds.append(time.perf_counter() - t0)
            if not seconds[1:]:   # the first step also initialised and broadcast the keys
                before = dict(getattr(kv, "group", None) and kv.group.bytes_sent or {})
                lo_before = loopback_bytes()
            else:
                steps += 1
        curve.append(evaluate(net, task.valid))
    # MXNet's dist_sync does not count its bytes: its row shows the accuracy to match
    sent = ({k: v - before.get(k, 0) for k, v in kv.group.bytes_sent.items()}
            if hasattr(kv, "group") else None)
    lo_sent = loopback_bytes() - lo_before   # includes the evaluations' nothing: local
    if rank == 0:
        with open(args.result, "w") as f:
            elements = sum(p.data().size for p in net.collect_params().values())
            json.dump({"curve": curve, "steps": steps, "bytes_sent": sent, "ranks": n,
                       "elements": elements, "compressed": args.threshold > 0,
                       "loopback_bytes": lo_sent,
                       "group_size": kv.group.size if hasattr(kv, "group") else 0,
                       "step_seconds": statistics.median(seconds[len(seconds) // 4:])}, f)


def _push_pull_step(kv, net, optimizer, params, batch: int):
    """What gluon.Trainer would do on dist_sync, with push and pull: MXNet 1.9.1 refuses
    compression in pushpull ("Compression not supported with PushPull"), which Trainer calls."""
    import mxnet as mx
    weights = list(net.collect_params().values())
    optimizer.rescale_grad = 1.0 / batch   # as Trainer.step(batch) sets it
    if params:
        kv.set_gradient_compression(params)
    kv.set_optimizer(optimizer)
    for i, w in enumerate(weights):
        kv.init(i, w.data())
        kv.pull(i, w.data())

    def step(_batch: int) -> None:
        for i, w in enumerate(weights):
            kv.push(i, w.grad(), priority=-i)
            kv.pull(i, w.data(), priority=-i)
        mx.nd.waitall()
    return step


def run_system(args, store: str, threshold: float, folder: Path) -> Dict:
    """One training run; MXNet's dist_sync runs with a server and a ps-lite worker per rank
    (the launcher's pure-PS shape)."""
    import os
    result = folder / f"{store.replace(' ', '-')}-{threshold:g}.json"
    pure_ps = store != "hybrid-mpi"
    shape = (["--clients", str(args.ranks), "--servers", "1"] if pure_ps
             else args.launcher_args.split())
    cmd = [sys.executable, "-m", "kvhybrid.launch.cli", "-n", str(args.ranks), *shape,
           "python", "-m", "benchmarks.compression", "--worker", "--store", store.split()[0],
           "--threshold", str(threshold), "--epochs", str(args.epochs),
           "--batch", str(args.batch), "--lr", str(args.lr), "--momentum", str(args.momentum),
           "--result", str(result)]
    run_job(cmd, os.environ, args.timeout, system_name(store, threshold), "compression")
    return json.loads(result.read_text())


def mpi_wire_bytes(run: Dict) -> float:
    """Bytes a rank puts on the wire per step inside its group, in a ring: 2(g-1)/g of what
    it allreduces, (g-1) times what it allgathers (g ranks in the group); NaN for MXNet."""
    g, sent = run["group_size"], run["bytes_sent"]
    if sent is None:
        return float("nan")
    return (2 * (g - 1) / g * sent.get("dense", 0) + (g - 1) * sent.get("compressed", 0)) \
        / run["steps"]


def summarize(runs: Dict[str, List[Dict]]) -> Dict[str, Dict]:
    base = statistics.median(r["step_seconds"] for r in runs[BASE])
    out = {}
    for name, rs in runs.items():
        def med(values):
            values = list(values)
            return statistics.median(values), min(values), max(values)
        out[name] = {
            "accuracy": med(r["curve"][-1]["accuracy"] for r in rs),
            "loss": med(r["curve"][-1]["loss"] for r in rs),
            "wire": statistics.median(mpi_wire_bytes(r) for r in rs),
            "time_ratio": med(r["step_seconds"] / base for r in rs),
            "loopback": statistics.median(r["loopback_bytes"] / r["steps"] for r in rs),
            "curves": [[c["accuracy"] for c in r["curve"]] for r in rs],
        }
    return out


def _kib(value: float) -> str:
    return "—" if value != value else f"{value / 1024:.1f} KiB"


def report(summary: Dict[str, Dict], args) -> str:
    lines = [f"# 2bit gradient compression: {args.ranks} ranks, digits MLP, SGD lr {args.lr:g} "
             f"momentum {args.momentum:g}, {args.epochs} epochs, batch {args.batch} per rank, "
             f"{args.rounds} rounds, median (range)", "",
             "| system | final val accuracy | final val loss | MPI bytes / rank / step (ring) "
             "| loopback bytes / step, whole job (measured) | step time vs first row |",
             "|---|---|---|---|---|---|"]
    for name, s in summary.items():
        a, loss, t = s["accuracy"], s["loss"], s["time_ratio"]
        lines.append(f"| {name} | {a[0]:.3f} ({a[1]:.3f}–{a[2]:.3f}) | {loss[0]:.3f} "
                     f"({loss[1]:.3f}–{loss[2]:.3f}) | {_kib(s['wire'])} | "
                     f"{_kib(s['loopback'])} | {t[0]:.2f}× ({t[1]:.2f}–{t[2]:.2f}) |")
    lines += ["", "`hybrid-mpi`: one client group (pure MPI): the ranks allgather their 2-bit "
              "codes. `hybrid-mpi pure PS`: a client group per rank and one server: each rank "
              "pushes to the server, compressed by MXNet's own compressor (its codes pass "
              "through unchanged), and pulls 4 bytes an element. `dist_sync`: MXNet, one "
              "server, the same algorithm, so the accuracy to match; it runs a hand-written "
              "push/pull loop, as MXNet 1.9.1's gluon.Trainer cannot compress on it (\"Compression "
              "not supported with PushPull\"), so its step time is not comparable.",
              "MPI bytes are counted by the store and turned into a ring's wire bytes; loopback "
              "bytes are the machine's `lo` counter over the training steps (ps-lite's traffic; "
              "MPI ranks on one host use shared memory).", ""] + footer("compression")
    return "\n".join(lines) + "\n"


def plot(summary: Dict[str, Dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for name, s in summary.items():
        curves = s["curves"]
        median = [statistics.median(c[e] for c in curves) for e in range(len(curves[0]))]
        left.plot(range(1, len(median) + 1), median, marker="o", label=name)
    left.set_xlabel("epoch")
    left.set_ylabel("validation accuracy (median of rounds)")
    left.legend()
    names = list(summary)
    series = {"MPI, per rank (ring)": [summary[k]["wire"] / 1024 for k in names],
              "loopback, whole job (measured)": [summary[k]["loopback"] / 1024 for k in names]}
    grouped_bars(right, [k.replace(", ", "\n") for k in names],
                 {k: [0 if v != v else v for v in vals] for k, vals in series.items()})
    right.tick_params(axis="x", labelsize=6)
    right.set_ylabel("KiB / step")
    right.legend(fontsize=7)
    save_figure(fig, path)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.compression",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--launcher-args", default="",
                   help="kvhybrid-launch flags of the 'hybrid-mpi' system (default: pure MPI)")
    p.add_argument("--thresholds", type=float, nargs="+", default=[0.5, 0.1])
    p.add_argument("--epochs", type=int, default=12)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--momentum", type=float, default=0.0)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--out", default="docs/benchmarks")
    p.add_argument("--name", default="compression", help="output files' name (default: %(default)s)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--threshold", type=float, default=0, help=argparse.SUPPRESS)
    p.add_argument("--store", default="hybrid-mpi", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.ranks < 2:
        p.error("--ranks must be at least 2: compression acts between ranks")
    if any(t <= 0 for t in args.thresholds):
        p.error("--thresholds must be > 0 (uncompressed always runs)")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    systems = [(store, t) for t in [0.0] + list(args.thresholds) for store in STORES]
    runs: Dict[str, List[Dict]] = {system_name(*s): [] for s in systems}
    with tempfile.TemporaryDirectory(prefix="kvhybrid-compression-") as tmp:
        for rnd in range(args.rounds):
            order = systems if rnd % 2 == 0 else systems[::-1]
            for i, (store, t) in enumerate(order, 1):
                log.info("round %d/%d, run %d/%d: %s", rnd + 1, args.rounds, i, len(order),
                         system_name(store, t))
                runs[system_name(store, t)].append(run_system(args, store, t, Path(tmp)))
    summary = summarize(runs)
    write_outputs(args.out, args.name, report(summary, args),
                  {"args": {k: v for k, v in vars(args).items() if k != "worker"},
                   "summary": summary, "runs": runs}, lambda res, path: plot(summary, path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
