"""The store's own cost per step, against MXNet's ``dist_sync``: CPU first, then time.

    python -m benchmarks.cost                                   # LM, NMT, CNN at 1, 2, 4 workers
    python -m benchmarks.cost --models lm nmt --workers 2 --rounds 3

On a machine with more busy threads than cores a throughput ratio swings ±15 % between
runs; the CPU a step costs does not, and it does not depend on how many cores the machine
has, so it can be measured on 2 cores and holds on 16. Per model and worker count, every
system of ``benchmarks.models`` named by ``--systems`` (default: kvhybrid, kvhybrid
all-PS, ``dist_sync`` and compute only) trains the same steps on loopback, ``--rounds``
times with the systems' order alternated, and the table gives per step:

* ms: the median step after warm-up;
* the caller's thread's CPU ms (a worker's main thread: the critical path of a step on any
  machine, mean over the workers);
* the machine's CPU ms (every process: workers' threads, servers, scheduler);
* the communication's CPU ms: the machine's less compute only's (the same processes
  training alone) in the same round: what moving the gradients costs.

Each as its value in the round with the median caller's CPU, and ÷ ``dist_sync``'s in the
same round: the median over the rounds (range). Writes ``cost.{md,json,png}`` into
``--out``.
"""
from __future__ import annotations

import argparse
import json
import logging
import signal
import statistics
import sys
from pathlib import Path
from typing import Callable, Dict, List, Optional

from .common import (caller_cpu, footer, grouped_bars, machine_cpu, provenance, ratio_cell,
                     save_figure, write_outputs)
from .model_zoo import MODELS
from .models import SYSTEMS, measure

log = logging.getLogger("benchmarks")

PEER = "dist_sync"
COMPUTE = "compute only"
DEFAULT_SYSTEMS = ["kvhybrid", "kvhybrid all-PS", PEER, COMPUTE]

#: what a round's run of one system reports, per step: (label, unit, reader of (run, the
#: same round's compute-only run or None)); a reader gives None where it has no figure
Metric = Callable[[dict, Optional[dict]], Optional[float]]


def _caller(r: dict, _: Optional[dict]) -> Optional[float]:
    return caller_cpu(r)


def _machine(r: dict, _: Optional[dict]) -> Optional[float]:
    return machine_cpu(r)


def _communication(r: dict, compute: Optional[dict]) -> Optional[float]:
    mine, alone = _machine(r, None), _machine(compute, None) if compute else None
    return None if mine is None or alone is None else mine - alone


METRICS: List[tuple] = [
    ("ms / step", lambda r, _: r["step_seconds"] * 1e3),
    ("caller's thread CPU ms / step", _caller),
    ("machine CPU ms / step", _machine),
    ("communication CPU ms / step (machine − compute only)", _communication),
]


#: a communication's CPU below this share of the machine's is within the noise of the two
#: machine figures it is the difference of (ticks of 10 ms, compute only's own spread): no
#: ratio to it (one worker's communication is about that small)
NOISE_SHARE = 0.1


def ratios(rounds: List[dict], model: str, system: str, metric: Metric,
           peer: str = PEER) -> List[float]:
    """``system``'s figure ÷ ``peer``'s in each round that ran both (a noisy minute hits
    both alike); rounds where the peer's figure is not positive, or is a communication's
    CPU within the noise (``NOISE_SHARE``), or the system's communication came out below
    zero (the noise of the two figures it is the difference of), are left out."""
    out = []
    for r in rounds:
        runs = r.get(model, {})
        if system not in runs or peer not in runs:
            continue
        compute = runs.get(COMPUTE)
        mine, theirs = metric(runs[system], compute), metric(runs[peer], compute)
        if mine is None or theirs is None or theirs <= 0:
            continue
        if metric is _communication and (theirs < NOISE_SHARE * _machine(runs[peer], None)
                                         or mine < 0):
            continue
        out.append(mine / theirs)
    return out


def median_round(rounds: List[dict], model: str, system: str) -> dict:
    """The system's run of the round whose caller's thread CPU is the median (its figures
    kept together), and that round's compute-only run."""
    runs = [r[model] for r in rounds if system in r.get(model, {})]
    runs.sort(key=lambda x: _caller(x[system], None) or 0.0)
    chosen = runs[(len(runs) - 1) // 2]
    return {"run": chosen[system], "compute": chosen.get(COMPUTE)}


def cell(rounds: List[dict], model: str, system: str, metric: Metric) -> str:
    picked = median_round(rounds, model, system)
    value = metric(picked["run"], picked["compute"])
    text = "–" if value is None else f"{value:.1f}"
    if system in (PEER, COMPUTE) or value is None:
        return text
    values = ratios(rounds, model, system, metric)
    return f"{text} · {ratio_cell(values)}" if values else text


def table(results: Dict[str, List[dict]], models: List[str], systems: List[str]) -> str:
    lines = ["| model | workers | system | " + " | ".join(label for label, _ in METRICS) + " |",
             "|---|---:|---|" + "---:|" * len(METRICS)]
    for model in models:
        for workers, rounds in results.items():
            for system in systems:
                if not any(system in r.get(model, {}) for r in rounds):
                    continue
                lines.append(f"| {model} | {workers} | {system} | "
                             + " | ".join(cell(rounds, model, system, m) for _, m in METRICS)
                             + " |")
    return "\n".join(lines)


def summary(results: Dict[str, List[dict]], models: List[str], system: str = "kvhybrid",
            workers: Optional[str] = None, metric=_caller) -> Dict[str, List[float]]:
    """{model: ``metric``'s ratios to dist_sync (the caller's thread CPU, or the machine's),
    one per round} at ``workers`` (default: the most measured): a README status row."""
    if not results:
        return {}
    workers = workers or max(results, key=int)
    return {m: ratios(results[workers], m, system, metric) for m in models
            if ratios(results[workers], m, system, metric)}


def plot(saved: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    results, models = saved["workers"], saved["models"]
    shown = [s for s in saved["systems"] if s not in (PEER, COMPUTE)]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), sharey=True)
    groups = [f"{m}\n{w} w" for m in models for w in results]
    for ax, (label, metric) in zip(axes, METRICS[1:3]):
        grouped_bars(ax, groups, {
            s: [statistics.median(ratios(results[w], m, s, metric) or [0.0])
                for m in models for w in results] for s in shown})
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_title(label.replace(" ms / step", " per step"), fontsize=10)
        ax.tick_params(axis="x", labelsize=7)
    axes[0].set_ylabel(f"÷ {PEER}'s (median of the rounds)")
    axes[0].legend(fontsize=8)
    fig.suptitle("kvhybrid's cost per step against dist_sync's (lower is better)", fontsize=10)
    save_figure(fig, path)


def main(argv: Optional[List[str]] = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    p = argparse.ArgumentParser(prog="python -m benchmarks.cost",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", choices=sorted(MODELS), default=["lm", "nmt", "cnn"])
    p.add_argument("--workers", nargs="+", type=int, default=[1, 2, 4])
    p.add_argument("--systems", nargs="+", choices=list(SYSTEMS), default=DEFAULT_SYSTEMS)
    p.add_argument("--rounds", type=int, default=3, help="runs per system, order alternated")
    p.add_argument("--servers", type=int, default=1, dest="servers_wanted")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--tokens", type=int, default=50, help="words per sample")
    p.add_argument("--timeout", type=float, default=900, help="seconds per job")
    p.add_argument("--out", default="docs/benchmarks")
    p.add_argument("--name", default="cost", help="file names: NAME.md, NAME.json, NAME.png")
    p.add_argument("--replot", action="store_true",
                   help="measure nothing: write the page and plot again from --out's NAME.json")
    args = p.parse_args(argv)
    if args.replot:
        write_page(args.out, args.name, json.loads((Path(args.out) / f"{args.name}.json")
                                                   .read_text()))
        return
    if args.rounds < 1:
        p.error(f"--rounds must be at least 1, got {args.rounds}")
    if args.steps <= args.warmup:
        p.error(f"--steps ({args.steps}) must exceed --warmup ({args.warmup})")
    if any(w < 1 for w in args.workers):
        p.error(f"--workers must be at least 1 each, got {args.workers}")
    if PEER not in args.systems:
        p.error(f"--systems must include {PEER}: every ratio is to it")
    # SIGTERM unwinds like Ctrl-C: the running job is stopped
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    measured, results = provenance(), {}
    for i, workers in enumerate(args.workers, 1):
        log.info("cost: [%d/%d] %d worker(s): %s, %d round(s)", i, len(args.workers), workers,
                 ", ".join(args.systems), args.rounds)
        setting = measure(argparse.Namespace(**{**vars(args), "workers": workers,
                                                "delay": None}), 0, "", [])
        results[str(workers)] = setting.rounds
    saved = {"command": sys.argv[1:], "measured": measured, "steps": args.steps,
             "warmup": args.warmup, "models": args.models, "systems": args.systems,
             "workers": results, "servers": args.servers_wanted,
             "batch_size": args.batch_size, "tokens": args.tokens, "rounds": args.rounds}
    write_page(args.out, args.name, saved)   # (adds the README status rows' ratios)


def write_page(out: str, name: str, saved: dict) -> None:
    """``name``.{md,json,png} from a run's measurements (``saved``: what NAME.json holds)."""
    saved = {**saved, "caller_cpu_ratio": summary(saved["workers"], saved["models"]),
             "machine_cpu_ratio": summary(saved["workers"], saved["models"], metric=_machine)}
    text = "\n".join([
        f"# The store's cost per step against `{PEER}`'s: loopback, {saved['servers']} "
        f"server(s), batch {saved['batch_size']} per worker, {saved['tokens']} words per "
        f"sample, {saved['rounds']} round(s) with the systems' order alternated", "",
        table(saved["workers"], saved["models"], saved["systems"]), "",
        f"Each cell: the figure per step in the round with the median caller's thread CPU, "
        f"then ÷ `{PEER}`'s in the same round, median over the rounds (range); lower is "
        "cheaper. Caller's thread: a worker's main thread (mean over the workers), the one "
        "that runs forward, backward and `trainer.step` and so bounds a step on any machine. "
        "Machine: every process (workers, servers, scheduler; MXNet's and kvhybrid's own "
        "threads). Communication: the machine's CPU less that of the same processes training "
        "alone (compute only) in the same round; no ratio where `dist_sync`'s is below "
        f"{NOISE_SHARE:.0%} of its machine CPU or a system's is below zero (within the "
        f"noise of the two figures). {saved['steps']} steps a job, the first "
        f"{saved['warmup']} left out of the times.", "",
        *footer("cost", saved["command"], saved["measured"])]) + "\n"
    write_outputs(out, name, text, saved, plot)


if __name__ == "__main__":
    main()
