"""MXNet's Module API over CSR data, as MXNet's sparse examples train, through kvhybrid's
launcher shapes beside MXNet's ``dist_sync``: seconds an epoch and a checkpoint, and CPU.

    python -m benchmarks.module_sparse --workers 2 4 --optimizers sgd adam --rounds 3

Each job is examples/train_sparse_module.py itself (a 1,000,000 x 2 row_sparse weight,
batches of 2048 CSR rows, ``prepare`` with the batch's ids, update on the store; each epoch
a pull of every row, a score of the held-out part, a checkpoint that pulls every row again
and that rank 0 saves),
clocked on every rank at the example's marks: an epoch (training, the pull of every row, eval)
and its checkpoint, in wall seconds, the rank's main thread's CPU and the machine's CPU
(``/proc/stat``: every process of the job; nothing else should run). The first epoch warms
up and is left out. The systems run in each round in turn, their order reversed every other
round; the page gives each kvhybrid shape's figures ÷ ``dist_sync``'s of the same round.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List

from .common import footer, grouped_bars, ratio_cell, run_job, write_outputs
from .cpu import machine_seconds

log = logging.getLogger("benchmarks")

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "train_sparse_module.py"
#: system -> (its label, how its job is launched for n workers and s servers)
SYSTEMS = {
    "dist_sync": ("dist_sync (a ps-lite worker per rank)",
                  lambda n, s: ["-n", n, "--clients", n, "--servers", s]),
    "one group": ("kvhybrid, one group + servers", lambda n, s: ["-n", n, "--servers", s]),
    "groups": ("kvhybrid, groups of 2 + servers",
               lambda n, s: ["-n", n, "--clients", n // 2, "--servers", s]),
    "group per worker": ("kvhybrid, a group per worker + servers",
                         lambda n, s: ["-n", n, "--clients", n, "--servers", s]),
    "pure MPI": ("kvhybrid, pure MPI", lambda n, s: ["-n", n]),
}
FIGURES = ("epoch_s", "checkpoint_s", "epoch_thread_cpu_s", "epoch_machine_cpu_s")


# -- the measuring side: the example on each rank, clocked at its marks ------------------------
def worker(out: str, example_args: List[str]) -> None:
    spec = importlib.util.spec_from_file_location("train_sparse_module", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    marks: List[tuple] = []

    def mark(epoch: int, phase: str) -> None:
        marks.append((epoch, phase, time.perf_counter(), time.thread_time(), machine_seconds()))

    example.main(example_args, mark)
    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("PMI_RANK", "0")))
    client = os.environ.get("KVHYBRID_CLIENT_ID", "0")
    with open(os.path.join(out, f"client{client}-rank{rank}.json"), "w") as f:
        json.dump(marks, f)


def _phases(marks: List[list]) -> Dict[str, List[float]]:
    """Per epoch after the first: an epoch's and its checkpoint's seconds and CPU."""
    at = {(e, p): rest for e, p, *rest in marks}
    got: Dict[str, List[float]] = {k: [] for k in FIGURES}
    for epoch in sorted({e for e, _, *_ in marks})[1:]:
        train, ckpt, done = at[(epoch, "train")], at[(epoch, "checkpoint")], at[(epoch, "done")]
        got["epoch_s"].append(ckpt[0] - train[0])
        got["checkpoint_s"].append(done[0] - ckpt[0])
        got["epoch_thread_cpu_s"].append(ckpt[1] - train[1])
        got["epoch_machine_cpu_s"].append(ckpt[2] - train[2])
    return got


# -- the driving side -------------------------------------------------------------------------
def run_system(system: str, n: int, optimizer: str, args) -> Dict[str, float]:
    servers = 1 if n <= 2 else 2
    launch = [str(x) for x in SYSTEMS[system][1](n, servers)]
    store = "dist_sync" if system == "dist_sync" else "hybrid-mpi"
    with tempfile.TemporaryDirectory(prefix="kvhybrid-module-") as tmp:
        cmd = [sys.executable, "-m", "kvhybrid.launch.cli", *launch, sys.executable, "-m",
               "benchmarks.module_sparse", "--worker-out", tmp, "--", "--kvstore", store,
               "--optimizer", optimizer, "--epochs", str(args.epochs),
               "--batches", str(args.batches), "--features", str(args.features),
               "--prefix", os.path.join(tmp, "checkpoints", "model")]
        run_job(cmd, dict(os.environ), args.timeout,
                f"{SYSTEMS[system][0]}, {n} workers, {optimizer}", "module_sparse", cwd=ROOT)
        ranks = [_phases(json.load(open(os.path.join(tmp, name))))
                 for name in sorted(os.listdir(tmp)) if name.endswith(".json")]
    # per epoch: the slowest rank's seconds (a synchronous epoch waits for it), a rank's main
    # thread's CPU (their mean), the machine's CPU (every rank reads the same counters)
    per_epoch = {
        "epoch_s": [max(r["epoch_s"][i] for r in ranks) for i in range(len(ranks[0]["epoch_s"]))],
        "checkpoint_s": [max(r["checkpoint_s"][i] for r in ranks)
                         for i in range(len(ranks[0]["checkpoint_s"]))],
        "epoch_thread_cpu_s": [statistics.mean(r["epoch_thread_cpu_s"][i] for r in ranks)
                               for i in range(len(ranks[0]["epoch_thread_cpu_s"]))],
        "epoch_machine_cpu_s": ranks[0]["epoch_machine_cpu_s"]}
    return {k: statistics.median(v) for k, v in per_epoch.items()}


def measure(args) -> List[dict]:
    rounds = []
    for r in range(args.rounds):
        systems = list(SYSTEMS) if r % 2 == 0 else list(reversed(SYSTEMS))
        got: Dict[str, Dict] = {}
        for n in args.workers:
            for optimizer in args.optimizers:
                for system in systems:
                    if system == "groups" and n < 4:
                        continue   # (groups of 2 out of 2 workers: a group per worker's pair)
                    log.info("module_sparse: round %d/%d, %d workers, %s, %s", r + 1,
                             args.rounds, n, optimizer, SYSTEMS[system][0])
                    key = f"{n} {optimizer}"
                    got.setdefault(key, {})[system] = run_system(system, n, optimizer, args)
        rounds.append(got)
    return rounds


def _ratios(rounds, key: str, system: str, figure: str) -> List[float]:
    return [r[key][system][figure] / r[key]["dist_sync"][figure]
            for r in rounds if system in r.get(key, {})]


def report(rounds: List[dict], args) -> str:
    keys = list(rounds[0])
    lines = ["# MXNet's Module over CSR data: kvhybrid's shapes against dist_sync\n",
             f"examples/train_sparse_module.py: a {args.features:,} x 2 row_sparse weight, "
             f"{args.batches} batches of 2048 CSR rows a rank and epoch, {args.epochs} epochs "
             "(the first left out). An epoch: training, a pull of every row, the held-out "
             "score; a checkpoint: `get_params` (a pull of every row) and rank 0's save. "
             f"Each figure ÷ `dist_sync`'s in the same round: the median over {len(rounds)} "
             "rounds (the systems' order reversed every other round), its range in brackets; "
             "lower is better. Seconds are the slowest rank's; the thread's CPU is a rank's "
             "main thread's (their mean); the machine's is every process's.\n",
             "| workers, optimizer | kvhybrid shape | epoch (s) | checkpoint (s) | "
             "epoch: caller's thread CPU | epoch: machine CPU | `dist_sync`'s epoch, "
             "checkpoint (s, median) |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for key in keys:
        base = [r[key]["dist_sync"] for r in rounds]
        base_text = (f"{statistics.median(b['epoch_s'] for b in base):.2f}, "
                     f"{statistics.median(b['checkpoint_s'] for b in base):.2f}")
        for system in SYSTEMS:
            if system == "dist_sync" or system not in rounds[0][key]:
                continue
            cells = [ratio_cell(_ratios(rounds, key, system, f)) for f in FIGURES]
            lines.append(f"| {key} | {SYSTEMS[system][0]} | " + " | ".join(cells) +
                         f" | {base_text} |")
    lines += ["", *footer("module_sparse"), ""]
    return "\n".join(lines)


def plot(rounds: List[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = list(rounds[0])
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.4))
    for ax, figure, title in zip(axes, ("epoch_s", "checkpoint_s"), ("an epoch", "a checkpoint")):
        series = {SYSTEMS[s][0]: [statistics.median(_ratios(rounds, k, s, figure))
                                  if s in rounds[0][k] else 0.0 for k in keys]
                  for s in SYSTEMS if s != "dist_sync"}
        grouped_bars(ax, keys, series)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_ylabel("seconds ÷ dist_sync's (lower is better)")
        ax.set_title(title)
    handles, labels = axes[0].get_legend_handles_labels()   # (below both: clear of the bars)
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=8)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.module_sparse",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, nargs="+", default=[2, 4])
    p.add_argument("--optimizers", nargs="+", default=["sgd", "adam"],
                   choices=("sgd", "adam", "adagrad"))
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--epochs", type=int, default=4, help="the first warms up")
    p.add_argument("--batches", type=int, default=16, help="batches a rank and epoch")
    p.add_argument("--features", type=int, default=1_000_000, help="rows of the weight")
    p.add_argument("--timeout", type=int, default=600, help="seconds per job")
    p.add_argument("--out", default="docs/benchmarks")
    p.add_argument("--worker-out", help=argparse.SUPPRESS)
    p.add_argument("example_args", nargs="*", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker_out:
        worker(args.worker_out, args.example_args)
        return
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    rounds = measure(args)
    saved = {"args": {k: v for k, v in vars(args).items()
                      if k not in ("worker_out", "example_args")}, "rounds": rounds}
    write_outputs(args.out, "module_sparse", report(rounds, args), saved,
                  lambda results, path: plot(results["rounds"], path))


if __name__ == "__main__":
    main()
