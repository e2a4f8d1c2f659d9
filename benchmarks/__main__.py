"""Regenerate every benchmark's current result in one run.

    python -m benchmarks all                  # every benchmark, about 80 minutes on 2 cores
    python -m benchmarks all --only models fusion
    python -m benchmarks list                 # what ``all`` runs, with each command

Run it from the repository's root, as every benchmark. Each benchmark runs as its own
``python -m benchmarks.<name> ...`` (the command its table names), writing
``<name>.{md,json,png}`` into ``--out`` (``docs/benchmarks``); the experiments go to
``--experiments-out`` (``docs/experiments``). A line per benchmark says
where the run is and how long each took; a benchmark that fails does not stop the others,
and the run exits non-zero naming it. Last, ``benchmarks.status`` redraws the headline plot
and the README's status table from the models' results.

The settings are chosen to fit about 40 minutes on a 2-core machine, and 25 more for the
papers' page on emulated hosts: 3 rounds of every comparison (the systems' order alternated;
one round for the papers' page), shorter runs than each benchmark's defaults (20 steps a
models job, NMT on loopback only, 1,000 keys in the load test, 15 and 3 epochs of the
experiments' tasks; the Module benchmark runs at its own defaults, about 8 minutes; the
shape tuning's three models, 3 rounds of a sweep and a ``--tune``, about 13). The
first full run with the benchmarks' own defaults took 42 minutes.
"""
from __future__ import annotations

import argparse
import logging
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Sequence

from .common import stop_job

log = logging.getLogger("benchmarks")

MODELS_SHORT = ["--rounds", "3", "--steps", "20", "--warmup", "5"]


@dataclass(frozen=True)
class Benchmark:
    """One entry of ``all``: the module run and its arguments (``--out`` is added)."""
    name: str
    module: str
    args: Sequence[str]
    measures: str
    #: the folder option it writes into: "out" (``--out``) or "experiments"
    into: str = "out"

    def command(self, out: str, experiments_out: str) -> List[str]:
        folder = experiments_out if self.into == "experiments" else out
        return [sys.executable, "-m", self.module, *self.args, "--out", folder]


PLAN = [
    Benchmark("models", "benchmarks.models",
              ["--models", "lm", "nmt", "cnn", "--systems", "kvhybrid", "dist_sync", "Horovod",
               *MODELS_SHORT],
              "LM, NMT and CNN on loopback against dist_sync and Horovod"),
    Benchmark("cost", "benchmarks.cost",
              ["--models", "lm", "nmt", "cnn", "--workers", "1", "2", "4", "--rounds", "3"],
              "CPU and time per step against dist_sync's at 1, 2 and 4 workers"),
    Benchmark("models_2x2_1gbit", "benchmarks.models",
              ["--hosts", "2", "--rate", "1gbit", "--models", "lm", "cnn", "--systems",
               "kvhybrid", "dist_sync", *MODELS_SHORT, "--name", "models_2x2_1gbit"],
              "the LM and the CNN on 2 emulated hosts × 2 workers joined at 1 Gbit/s"),
    Benchmark("allreduce", "benchmarks.allreduce",
              ["--sizes-mb", "4", "64", "--rounds", "3", "--repeats", "5"],
              "dense sums of 4 and 64 MB against Open MPI, Horovod and the memory bound"),
    Benchmark("allreduce_mpis", "benchmarks.allreduce_mpis",
              ["--sizes-mb", "4", "64", "--ranks", "2", "4", "--rounds", "3"],
              "the store's dense sums under Open MPI 4 and 5, MPICH and Intel MPI, against "
              "each one's own Allreduce"),
    Benchmark("fusion", "benchmarks.fusion", ["--repeats", "20"],
              "200 small keys a step: key by key, fused, fused in one buffer"),
    Benchmark("module_sparse", "benchmarks.module_sparse",
              ["--workers", "2", "4", "--optimizers", "sgd", "adam", "--rounds", "3"],
              "MXNet's Module over CSR data (a 1,000,000-row row_sparse weight, eval and "
              "checkpoints) in kvhybrid's shapes against dist_sync"),
    Benchmark("sparse_pull", "benchmarks.sparse_pull", ["--workers", "4", "--repeats", "10"],
              "a table's rows pulled by the group's master or by every worker"),
    Benchmark("partitions", "benchmarks.partitions",
              ["--sweep", "1", "2", "4", "--rounds", "1", "--steps", "20"],
              "step time against the partition count P, and the tuner's choice"),
    Benchmark("tuning", "benchmarks.tuning",
              ["--models", "lm", "nmt", "cnn", "--steps", "200", "--rounds", "3"],
              "kvhybrid-launch --tune's shape against a sweep of every shape, per model"),
    Benchmark("compression", "benchmarks.compression",
              ["--rounds", "3", "--epochs", "2", "--thresholds", "0.5"],
              "2bit compression: bytes saved, accuracy against dist_sync's"),
    Benchmark("overlap", "benchmarks.overlap",
              ["--models", "cnn", "--systems", "kvhybrid", "kvhybrid blocking", "--rounds", "3",
               "--steps", "20", "--warmup", "5"],
              "the CNN's dense sums overlapped with backward, against the blocking path"),
    Benchmark("load", "benchmarks.load", ["--keys", "1000", "--steps", "50"],
              "every process's memory under 1,000 keys and 50 steps"),
    Benchmark("experiments", "experiments", ["--epochs", "digits=15", "lm=3"],
              "MXNET-MPI's six training modes: accuracy against wall time", into="experiments"),
    # the papers' claims on emulated hosts: 100 Mbit/s, one round, shorter six-mode runs
    # (about 25 minutes); the page keeps the 1 Gbit/s columns measured earlier
    Benchmark("papers", "experiments.papers",
              ["--remeasure", "--rates", "100mbit", "--rounds", "1", "--epochs", "digits=15",
               "lm=3"],
              "the papers' headline claims on 2 emulated hosts at 100 Mbit/s, one row each",
              into="experiments"),
]
NAMES = [b.name for b in PLAN]


def _run(cmd: List[str], timeout: float):
    """Run one benchmark, its output on ours; its exit status, or why it has none. Stopped
    (a timeout, Ctrl-C, SIGTERM), it gets SIGTERM first so that it stops its jobs' scheduler,
    servers and mpiruns, and SIGKILL after ``common.STOP_GRACE`` seconds."""
    proc = subprocess.Popen(cmd, start_new_session=True)
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        stop_job(proc)
        return f"not finished in {timeout:.0f} s"
    except BaseException:
        stop_job(proc)
        raise


def run_all(plan: Sequence[Benchmark], out: str, experiments_out: str,
            timeout: float) -> List[str]:
    """Run ``plan`` in order; the names of those that failed."""
    failed: List[str] = []
    started = time.monotonic()
    took = {}
    for i, bench in enumerate(plan, 1):
        cmd = bench.command(out, experiments_out)
        log.info("benchmarks: [%d/%d] %s: %s ...", i, len(plan), bench.name, bench.measures)
        log.info("benchmarks: $ %s", shlex.join(["python", *cmd[1:]]))
        t0 = time.monotonic()
        rc = _run(cmd, timeout)
        took[bench.name] = time.monotonic() - t0
        if rc != 0:
            failed.append(bench.name)
        log.info("benchmarks: [%d/%d] %s %s in %.0f s (%.0f s so far)", i, len(plan), bench.name,
                 "done" if rc == 0 else f"FAILED ({rc})", took[bench.name],
                 time.monotonic() - started)
    log.info("benchmarks: %d of %d done in %.1f min: %s", len(plan) - len(failed), len(plan),
             (time.monotonic() - started) / 60,
             ", ".join(f"{n} {s:.0f} s" for n, s in took.items()))
    return failed


def main(argv: Optional[List[str]] = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    p = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n\n")[0])
    p.add_argument("what", choices=["all", "list"],
                   help="all: run the benchmarks; list: print what all runs")
    p.add_argument("--only", nargs="+", choices=NAMES, metavar="NAME",
                   help=f"run these only, in the plan's order (of {', '.join(NAMES)})")
    p.add_argument("--skip", nargs="+", choices=NAMES, metavar="NAME", default=[],
                   help="run all but these")
    p.add_argument("--out", default="docs/benchmarks",
                   help="folder for the benchmarks' results (default: %(default)s)")
    p.add_argument("--experiments-out", default="docs/experiments",
                   help="folder for the experiments' results (default: %(default)s)")
    p.add_argument("--readme", default="README.md",
                   help="the README whose status table is rewritten from the models' results")
    p.add_argument("--timeout", type=float, default=1800, help="seconds per benchmark")
    args = p.parse_args(argv)
    plan = [b for b in PLAN if (not args.only or b.name in args.only) and b.name not in args.skip]
    if not plan:
        p.error("--only and --skip leave nothing to run")
    if args.what == "list":
        for b in plan:
            print(f"{b.name:18} {b.measures}\n{'':18} $ "
                  f"{shlex.join(['python', *b.command(args.out, args.experiments_out)[1:]])}")
        return 0
    # SIGTERM unwinds like Ctrl-C: the running benchmark is stopped with its jobs
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    failed = run_all(plan, args.out, args.experiments_out, args.timeout)
    from .status import update
    try:
        update(Path(args.out), Path(args.readme))
    except (OSError, ValueError) as exc:
        log.error("benchmarks: the status table and plot were not redrawn: %s", exc)
        failed.append("status")
    if failed:
        log.error("benchmarks: failed: %s (their earlier results, if any, are left as they were)",
                  ", ".join(failed))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
