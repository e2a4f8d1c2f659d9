"""Which design pulls a sparse weight's rows faster: the group's master, or every worker?

    python -m benchmarks.sparse_pull --workers 2 4 --servers 2

Why it matters (Parallax §3.1 meets MXNET-MPI's client groups): before each
forward pass every worker needs the current rows of its batch's ids.

* ``master``: one client group; its master pulls the union of the group's ids
  from the servers once and hands each rank its rows (``Scatterv``) — what
  hybrid-mpi does. Run as ``kvhybrid-launch -n N --clients 1``.
* ``every worker``: each worker is a ps-lite worker and pulls its own rows —
  run as ``kvhybrid-launch -n N --clients N`` (a group per worker).

Both run the store's real ``row_sparse_pull`` against real servers on this
machine, on the same table and the same Zipf-distributed ids. It also times a
training step's traffic, ``push`` of the gradient rows then the next pull
(the pull waits for the servers to apply the push). Writes ``sparse_pull.md``,
``sparse_pull.json`` and ``sparse_pull.png`` into ``--out``.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict

from .common import footer, grouped_bars, run_job as run, save_figure

log = logging.getLogger("benchmarks")

DESIGNS = {"master": "master pulls the union, scatters", "every": "every worker pulls its rows"}


# -- the measuring side (one rank of a launched job) -----------------------------------------
def worker(args) -> None:
    import numpy as np
    import mxnet as mx
    import kvhybrid  # noqa: F401

    kv = mx.kv.create("hybrid-mpi")
    shape = (args.rows, args.dim)
    table = mx.nd.sparse.row_sparse_array(
        (np.ones(shape, np.float32), np.arange(args.rows)), shape=shape)
    kv.set_optimizer(mx.optimizer.SGD(learning_rate=0.0))   # the rows stay as they are
    kv.init(0, table)
    rng = np.random.RandomState(100 + kv.rank)
    out = mx.nd.sparse.zeros("row_sparse", shape)
    pulls, steps, rows = [], [], []
    for step in range(args.warmup + args.repeats):
        ids = mx.nd.array(rng.zipf(1.1, args.ids) % args.rows)
        grad = mx.nd.sparse.row_sparse_array(
            (np.ones((len(np.unique(ids.asnumpy())), args.dim), np.float32),
             np.unique(ids.asnumpy()).astype(np.int64)), shape=shape)
        kv.barrier()                                         # every worker starts together
        t0 = time.perf_counter()
        kv.row_sparse_pull(0, out=out, row_ids=ids)
        out.wait_to_read()
        t1 = time.perf_counter()
        kv.push(0, grad)
        kv.row_sparse_pull(0, out=out, row_ids=ids)
        out.wait_to_read()
        t2 = time.perf_counter()
        if step >= args.warmup:
            pulls.append(t1 - t0)
            steps.append(t2 - t0)
            rows.append(len(out.indices))
    with open(os.path.join(args.worker_out, f"rank{kv.rank}.json"), "w") as f:
        json.dump({"pull": pulls, "step": steps, "rows": rows}, f)
    kv.close()


# -- the driving side -------------------------------------------------------------------------
def run_design(design: str, n: int, args) -> Dict:
    clients = 1 if design == "master" else n
    with tempfile.TemporaryDirectory(prefix="kvhybrid-sparse-pull-") as tmp:
        cmd = [sys.executable, "-m", "kvhybrid.launch.cli", "-n", str(n), "--clients",
               str(clients), "--servers", str(args.servers), sys.executable, "-m",
               "benchmarks.sparse_pull", "--worker-out", tmp, "--rows", str(args.rows),
               "--dim", str(args.dim), "--ids", str(args.ids), "--repeats", str(args.repeats),
               "--warmup", str(args.warmup)]
        env = dict(os.environ, OMP_NUM_THREADS="1")
        run(cmd, env, args.timeout, f"the {design} job with {n} workers", "sparse_pull")
        ranks = [json.load(open(os.path.join(tmp, f"rank{r}.json"))) for r in range(n)]
    # a step waits for the slowest worker: per step, the slowest rank's time
    pull = [max(r["pull"][i] for r in ranks) for i in range(args.repeats)]
    step = [max(r["step"][i] for r in ranks) for i in range(args.repeats)]
    rows = statistics.mean(statistics.mean(r["rows"]) for r in ranks)
    return {"pull_ms": statistics.median(pull) * 1e3, "step_ms": statistics.median(step) * 1e3,
            "rows_per_worker": rows}


def report(results: Dict, args) -> str:
    lines = ["# Sparse-weight pulls: the master for its group, or every worker\n",
             f"Table {args.rows} x {args.dim} float32 on {args.servers} server(s); each worker "
             f"pulls the rows of {args.ids} Zipf(1.1) ids per step. Median over {args.repeats} "
             "steps of the slowest worker's time, in ms.\n",
             "| workers | design | rows per worker | pull | push + pull |",
             "|---|---|---|---|---|"]
    for n, by in results.items():
        for design, r in by.items():
            lines.append(f"| {n} | {DESIGNS[design]} | {r['rows_per_worker']:.0f} | "
                         f"{r['pull_ms']:.2f} | {r['step_ms']:.2f} |")
    lines.append("")
    for n, by in results.items():
        ratio = by["every"]["pull_ms"] / by["master"]["pull_ms"]
        step = by["every"]["step_ms"] / by["master"]["step_ms"]
        lines.append(f"- {n} workers: every-worker pulls take {ratio:.2f}x the master design's "
                     f"time (push + pull: {step:.2f}x)")
    lines += ["", *footer("sparse_pull"), ""]
    return "\n".join(lines)


def plot(results: Dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.5))
    workers = list(results)
    for ax, metric, title in zip(axes, ("pull_ms", "step_ms"), ("row_sparse_pull", "push + pull")):
        grouped_bars(ax, [f"{n} workers" for n in workers],
                     {DESIGNS[d]: [results[n][d][metric] for n in workers] for d in DESIGNS})
        ax.set_ylabel("ms (median, slowest worker)")
        ax.set_title(title)
    axes[0].legend(fontsize=8)
    save_figure(fig, path)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.sparse_pull",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, nargs="+", default=[2, 4])
    p.add_argument("--servers", type=int, default=2)
    p.add_argument("--rows", type=int, default=100_000)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--ids", type=int, default=1024, help="ids per worker per step")
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--timeout", type=int, default=600, help="seconds per job")
    p.add_argument("--out", default="docs/benchmarks")
    p.add_argument("--worker-out", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker_out:
        worker(args)
        return
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    results: Dict[int, Dict] = {}
    for n in args.workers:
        results[n] = {}
        for design in DESIGNS:
            log.info("sparse_pull: %d workers, %s ...", n, DESIGNS[design])
            results[n][design] = run_design(design, n, args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    text = report(results, args)
    (out / "sparse_pull.md").write_text(text)
    (out / "sparse_pull.json").write_text(json.dumps(
        {"args": {k: v for k, v in vars(args).items() if k != "worker_out"},
         "results": results}, indent=1))
    plot(results, out / "sparse_pull.png")
    print(text)


if __name__ == "__main__":
    main()
