"""Train one model under MXNET-MPI §7's six modes, through the launcher, and compare.

    python -m experiments                        # both tasks, all six modes
    python -m experiments --tasks digits --modes mpi-SGD dist-SGD --epochs 5
    python -m experiments --hosts 2 --workers 8 --rate 1gbit   # on 2 emulated hosts (root)
    python -m experiments --hosts 2 --rate 100mbit --rounds 3  # timed: 3 rounds, order alternated

For each task and mode it runs ``kvhybrid-launch ... python -m experiments.worker``
(a scheduler, the servers, one ``mpirun`` per client), then writes into ``--out``:
``<task>.csv`` (validation after every epoch), ``<task>.png`` (accuracy against wall time
and epochs, mean epoch time), ``experiments.md`` (the tables, the answers to §7's
questions, the command) and ``experiments.json``. With ``--rounds N`` every mode runs N times,
the modes' order reversed every other round: the tables give the median round's curve and the
median of each figure with its range, the answers the median of the rounds' ratios.

``--hosts N`` runs every job on N emulated hosts (``benchmarks/cluster.py``: network
namespaces joined by links of ``--rate``), the workers spread evenly over them, a client
group and a server per host unless ``--clients``/``--servers`` say otherwise: the regime
the paper measured, where the network, not the cores, is what the modes share. Where
matplotlib is missing (the 16-core machine's pack), the tables and JSON are written and
``--replot`` draws the plots later from the JSON.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List

from benchmarks.cluster import launcher_args_on_hosts, setting_name, why_no_hosts
from benchmarks.common import provenance, stop_job
from . import report
from .modes import MODES, Mode
from .tasks import TASKS

log = logging.getLogger("experiments")

#: per task: epochs, batch per worker, learning rate, target validation accuracy. One
#: learning rate for every mode (per sample of one worker's batch, momentum 0.9): the largest
#: at which dist-ASGD still converges on digits (0.05 and 0.1 diverge: four workers' stale
#: updates through one momentum on the server)
DEFAULTS = {"digits": {"epochs": 30, "batch": 16, "lr": 0.02, "target": 0.95},
            "lm": {"epochs": 6, "batch": 32, "lr": 0.1, "target": 0.80}}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m experiments",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--tasks", nargs="+", choices=sorted(TASKS), default=["digits", "lm"])
    p.add_argument("--modes", nargs="+", choices=list(MODES), default=list(MODES))
    p.add_argument("--workers", type=int, default=4, help="in every mode")
    p.add_argument("--clients", type=int,
                   help="client groups of the mpi-* modes (default: one per --hosts, else 2)")
    p.add_argument("--servers", type=int, help="default: one per --hosts, else 1")
    p.add_argument("--epochs", nargs="+", metavar="[TASK=]N",
                   help="epochs of every task (N), or of some (lm=3); default: each task's ("
                        + ", ".join(f"{t} {d['epochs']}" for t, d in DEFAULTS.items()) + ")")
    p.add_argument("--interval", type=int, default=16,
                   help="ESGD: steps between center exchanges (KVHYBRID_ELASTIC_INTERVAL)")
    p.add_argument("--alpha", type=float,
                   help="ESGD: elastic force (KVHYBRID_ELASTIC_ALPHA; default 0.9 / clients)")
    p.add_argument("--hosts", type=int, default=0,
                   help="emulate this many hosts (network namespaces, root only) joined by "
                        "links of --rate; 0: everything on loopback")
    p.add_argument("--rate", default="1gbit", help="emulated link bandwidth (tc tbf rate)")
    p.add_argument("--delay", help="emulated link latency each way (tc netem delay), e.g. 100us")
    p.add_argument("--rounds", type=int, default=1,
                   help="runs of every mode, the modes' order reversed every other round: "
                        "the tables give medians and ranges (default: %(default)s)")
    p.add_argument("--out", default="docs/experiments")
    p.add_argument("--timeout", type=float, default=1200, help="seconds per run")
    p.add_argument("--replot", action="store_true",
                   help="run nothing: draw the plots of --out's experiments.json (a run made "
                        "where matplotlib is missing)")
    args = p.parse_args(argv)
    if args.replot:
        if not (Path(args.out) / "experiments.json").is_file():
            p.error(f"--replot draws from --out's experiments.json, and {args.out} has none: "
                    "run the experiments first, or point --out at the folder they wrote")
        return args
    if args.hosts < 0:
        p.error(f"--hosts must be 0 (loopback) or more, got {args.hosts}")
    if args.hosts:
        if args.workers % args.hosts:
            p.error(f"--workers {args.workers} must be a multiple of --hosts {args.hosts}: every "
                    "emulated host runs as many workers")
        missing = why_no_hosts()
        if missing:
            p.error(f"--hosts {missing}")
    if args.clients is None:
        args.clients = args.hosts or 2
    if args.servers is None:
        args.servers = args.hosts or 1
    if args.workers < 1 or args.clients < 1 or args.workers % args.clients:
        p.error(f"--workers {args.workers} must be a positive multiple of --clients "
                f"{args.clients}")
    if args.servers < 1:
        p.error("--servers must be at least 1: every mode but mpi-SGD with one client "
                "needs parameter servers")
    if args.interval < 1:
        p.error("--interval must be at least 1 step")
    if args.rounds < 1:
        p.error(f"--rounds must be at least 1, got {args.rounds}")
    args.epochs = _epochs(p, args.epochs or [])
    if args.alpha is not None and not 0 < args.alpha < 1:
        p.error(f"--alpha must lie strictly between 0 and 1, got {args.alpha}")
    return args


def _epochs(p: argparse.ArgumentParser, given: List[str]) -> Dict[str, int]:
    """Each task's epochs from ``--epochs`` (``N`` for every task, or ``task=N``)."""
    epochs = {t: d["epochs"] for t, d in DEFAULTS.items()}
    for item in given:
        task, _, n = item.rpartition("=")
        if task and task not in DEFAULTS:
            p.error(f"--epochs {item}: no task {task!r}; the tasks are {', '.join(DEFAULTS)}")
        if not n.isdigit() or int(n) < 1:
            p.error(f"--epochs {item}: the epochs must be a whole number of at least 1")
        epochs.update({task: int(n)} if task else {t: int(n) for t in epochs})
    return epochs


def run_mode(args, task: str, mode: Mode, folder: Path) -> float:
    """Train ``task`` under ``mode``; return the job's wall seconds. The launcher's output
    goes to ``folder/job.log``."""
    d = DEFAULTS[task]
    epochs = args.epochs[task]
    cmd = [sys.executable, "-m", "kvhybrid.launch.cli",
           *mode.launcher_args(args.workers, args.clients, args.servers), *args.launcher_args,
           "python", "-m", "experiments.worker", "--task", task, "--store", mode.store,
           "--out", str(folder), "--epochs", str(epochs), "--batch-size", str(d["batch"]),
           "--lr", str(d["lr"]),
           "--workers-per-update", str(mode.workers_per_update(args.workers, args.clients))]
    env = dict(os.environ, KVHYBRID_ELASTIC_INTERVAL=str(args.interval))
    if args.alpha is not None:
        env["KVHYBRID_ELASTIC_ALPHA"] = str(args.alpha)
    start = time.perf_counter()
    with open(folder / "job.log", "w") as logfile:
        proc = subprocess.Popen(cmd, env=env, stdout=logfile, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            rc = proc.wait(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            stop_job(proc)
            raise RuntimeError(f"{task} under {mode.name} did not finish in {args.timeout:.0f} s "
                               "(raise --timeout)")
        except BaseException:   # Ctrl-C or SIGTERM of the runner: leave nothing running
            stop_job(proc)
            raise
    if rc != 0:
        tail = (folder / "job.log").read_text()[-3000:]
        raise RuntimeError(f"{task} under {mode.name} failed (exit {rc}):\n{tail}")
    return time.perf_counter() - start


def main(argv=None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    args = parse_args(argv)
    out = Path(args.out)
    if args.replot:
        return replot(out)
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    out.mkdir(parents=True, exist_ok=True)
    jobs = [(r, t, m) for r in range(args.rounds) for t in args.tasks
            for m in (args.modes if r % 2 == 0 else args.modes[::-1])]
    # every round's run of every mode: combined into the median round's after the loop
    runs_of: Dict[str, Dict[str, List[Dict]]] = {t: {m: [] for m in args.modes}
                                                  for t in args.tasks}
    shapes = {m: f"{args.workers} × {MODES[m].clients(args.workers, args.clients)}"
              for m in args.modes}
    where = setting_name(args.hosts, args.rate, args.workers, args.delay)
    failures: List[str] = []
    with tempfile.TemporaryDirectory(prefix="kvhybrid-experiments-") as tmp, \
            contextlib.ExitStack() as stack:
        args.launcher_args = launcher_args_on_hosts(stack, args.hosts, args.rate, args.delay,
                                                    args.workers, tmp)
        for n, (round_, task, name) in enumerate(jobs, 1):
            mode, folder = MODES[name], Path(tmp) / f"{task}-{name}-{round_}"
            folder.mkdir()
            log.info("[%d/%d] %s%s under %s (%s on %s), %s: %d workers, %d client(s), "
                     "%d server(s) ...", n, len(jobs), task,
                     f", round {round_ + 1} of {args.rounds}," if args.rounds > 1 else "",
                     name, mode.store,
                     "MXNet" if "dist_" in mode.store else "kvhybrid", where, args.workers,
                     mode.clients(args.workers, args.clients), args.servers)
            try:
                seconds = run_mode(args, task, mode, folder)
                run = report.load_run(folder)
            except (RuntimeError, FileNotFoundError) as exc:
                log.error("[%d/%d] %s", n, len(jobs), exc)
                failures.append(f"{task} {name}" + (f" (round {round_ + 1})"
                                                     if args.rounds > 1 else ""))
                continue
            run["round"] = round_
            runs_of[task][name].append(run)
            last = run["validation"][-1]
            log.info("[%d/%d] done in %.0f s: accuracy %.4f, mean epoch %.3f s", n, len(jobs),
                     seconds, last["accuracy"], run["mean_epoch_seconds"])
    target = {t: DEFAULTS[t]["target"] for t in args.tasks}
    results = {t: {m: report.combine(runs, target[t]) for m, runs in modes.items() if runs}
               for t, modes in runs_of.items()}
    rounds = (f"{args.rounds} rounds, the modes' order reversed every other round: the median "
              "round's curve, each figure's median (range) over the rounds. "
              if args.rounds > 1 else "")
    md = ["# MXNET-MPI §7: six training modes", "",
          f"{args.workers} workers, {where}; mpi-* modes in {args.clients} client groups, "
          f"dist-* modes a client per worker; {args.servers} parameter server(s). ESGD: center "
          f"exchange every {args.interval} steps, alpha {args.alpha or '0.9 / clients'}. "
          + rounds + "Validation after every epoch on rank 0's own weights; wall time is training time, "
          "validation excluded; mean epoch time averages every worker's epochs after the first "
          f"{report.WARMUP_EPOCHS}.", ""]
    answers = []
    for task, runs in results.items():
        if not runs:
            continue
        report.write_csv(out / f"{task}.csv", task, runs)
        md += [report.table(task, runs, shapes, target[task], TASKS[task]().perplexity),
               f"![{task}]({task}.png)", ""]
        answers += report.findings(task, runs, target[task])
    md += ["## Answers", ""] + [f"- {a}" for a in answers] + [""]
    md += [f"Command: `python -m experiments {shlex.join(sys.argv[1:])}`", provenance()]
    (out / "experiments.md").write_text("\n".join(md) + "\n")
    (out / "experiments.json").write_text(json.dumps(
        {"args": vars(args), "results": results}, indent=1))
    print("\n".join(md))
    replot(out)
    if failures:
        log.error("failed: %s", ", ".join(failures))
        return 1
    return 0


def replot(out: Path) -> int:
    """Draw ``<task>.png`` from ``out/experiments.json``: after a run, or later where
    matplotlib is (a run on a machine without it wrote its tables and JSON). Without
    matplotlib it says how, and draws nothing."""
    saved = json.loads((out / "experiments.json").read_text())
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        log.warning("no matplotlib here: the plots are not drawn; draw them where it is "
                    "with python -m experiments --replot --out %s", out)
        return 0
    for task, runs in saved["results"].items():
        if runs:
            report.plot(out / f"{task}.png", task, runs, DEFAULTS[task]["target"])
            log.info("drew %s", out / f"{task}.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
