"""Where a worker's caller's thread spends its CPU, kvhybrid beside ``dist_sync``.

On 2 cores the sparse models are bound by the machine's CPU, and what kvhybrid adds over
MXNet's own store is Python on the caller's thread (``python -m benchmarks.models``: its
CPU column). This benchmark says where: it trains a model of ``model_zoo`` through
``benchmarks.model_worker`` with the store's calls and the step's phases wrapped, and
reports the thread CPU each took per step (the outermost call of each, mean over the
workers, median over the rounds), inclusive of what it calls:

    python -m benchmarks.caller_cpu --models lm nmt --rounds 3 --name caller_cpu
    python -m benchmarks.caller_cpu --models nmt --systems "kvhybrid all-PS" dist_sync

The wrappers cost a little CPU themselves (a few microseconds a call), so compare the rows
with each other, not the total with ``benchmarks.models``. Writes ``NAME.{md,json,png}``.
"""
from __future__ import annotations

import argparse
import atexit
import collections
import functools
import json
import logging
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional

from .common import footer, resolve, save_figure, write_outputs
from .models import add_wrapped_worker_args, run_wrapped_workers

log = logging.getLogger("benchmarks")

#: the forward pass (Gluon's calls of the net), and the rows' pull inside it
FORWARD = "forward (the net's calls)"
ROWS = "  a sparse weight's rows (Gluon, then the store's row_sparse_pull)"

#: the forward pass's operator calls into MXNet (shape inference, the engine push), the
#: rows' pull left out: the same operators in every system, so what differs is what runs
#: beside them
OPERATORS = "  the net's operators (each a call into MXNet; not the rows' pull)"

#: (module, attribute path, label): what is timed; a label names the outermost call only
TIMED = [
    ("mxnet.gluon", "Block.__call__", FORWARD),
    ("mxnet.gluon.parameter", "Parameter.row_sparse_data", ROWS),
    ("mxnet.ndarray.register", "_imperative_invoke", OPERATORS),
    ("mxnet.ndarray", "NDArray.backward", "backward"),
    ("mxnet.gluon", "Trainer.step", "trainer.step"),   # (STEP)
    ("mxnet.kvstore", "KVStore.pushpull", "MXNet KVStore: pushpull"),
    ("mxnet.kvstore", "KVStore.push", "MXNet KVStore: push"),
    ("mxnet.kvstore", "KVStore.pull", "MXNet KVStore: pull"),
    ("mxnet.kvstore", "KVStore.row_sparse_pull", "MXNet KVStore: row_sparse_pull"),
    ("kvhybrid.kvstore.store", "HybridMPIStore.pushpull", "store: pushpull (dense)"),
    ("kvhybrid.kvstore.calls", "Calls.pushpull", "  its memo and agreement"),
    ("kvhybrid.kvstore.overlap", "_gather", "  gradients into buckets"),
    ("kvhybrid.kvstore.overlap", "_sum", "  buckets' allreduce, update and copy back"),
    ("mxnet.optimizer", "Updater.__call__", "    the optimizer (MXNet's Updater)"),
    ("kvhybrid.kvstore.flat_update", "FlatSGD.update",
     "    the optimizer (one SGD operator per bucket)"),
    ("kvhybrid.kvstore.overlap", "copy_to_all", "    weights to the outs"),
    ("kvhybrid.kvstore.server_round_trips", "RoundTripPlan.run",
     "  keys to the servers and back (a client per worker)"),
    ("kvhybrid.kvstore.store", "HybridMPIStore.push", "store: push (rows)"),
    ("kvhybrid.kvstore.sparse_pull", "RowPulls.settle", "  settle the prefetched pulls' checks"),
    ("kvhybrid.kvstore.calls", "Calls.recall", "  the call's memo (its checks, kept)"),
    ("kvhybrid.kvstore.sparse_push", "RowPushes._read_rows", "  the gradient, by reference"),
    ("kvhybrid.kvstore.sparse_push", "local_ids", "  read the gradient's row ids"),
    ("kvhybrid.kvstore.sparse_push", "push_and_prefetch", "  rows to the master, next ids"),
    ("kvhybrid.kvstore.sparse_push", "push_and_prefetch_alone",
     "  rows to the servers, next ids (a client per worker)"),
    ("kvhybrid.kvstore.sparse_push", "gather_patiently", "    the gather"),
    ("kvhybrid.kvstore.store", "HybridMPIStore.row_sparse_pull", "store: row_sparse_pull"),
    ("kvhybrid.kvstore.sparse_pull", "checked_row_ids", "  check the ids"),
    ("kvhybrid.kvstore.sparse_pull", "RowPulls._pull_as_before",
     "  a loop's pull of prefetched ids"),
    ("kvhybrid.kvstore.sparse_pull", "_holds", "    read the ids, compare with those handed"),
    ("kvhybrid.kvstore.sparse_pull", "copy", "  a pull's rows to its out (an engine copy)"),
    ("kvhybrid.kvstore.sparse_pull", "PullCheck.start", "    start the check"),
    ("kvhybrid.kvstore.sparse_pull", "Prefetch.write_rows", "  prefetched rows to the out"),
    ("kvhybrid.kvstore.store", "HybridMPIStore.prefetch_rows", "store: prefetch_rows"),
    ("kvhybrid.tensor_collectives.engine", "EngineComm.enqueue", "communication thread: enqueue"),
    ("kvhybrid.tensor_collectives.engine", "EngineComm.submit", "communication thread: submit"),
]

#: the label whose calls count the steps
STEP = "trainer.step"

#: a label counted only inside one call and outside another: (inside, outside)
WITHIN = {OPERATORS: (FORWARD, ROWS)}


class Tally:
    """Thread CPU and calls per label, outermost calls only, on the threads ``counts``
    accepts (default: the main thread, the caller's)."""

    def __init__(self, warmup: int = 0,
                 counts: Optional[Callable[[threading.Thread], bool]] = None):
        self.cpu_ns: Dict[str, int] = collections.Counter()
        self.calls: Dict[str, int] = collections.Counter()
        self._inside: Dict[str, int] = collections.Counter()
        main = threading.main_thread()
        self._counts = counts or (lambda thread: thread is main)
        self.start_ns = time.thread_time_ns()
        self.warmup, self.steps = warmup, 0

    def stepped(self) -> None:
        """After each ``trainer.step``: the counts start over once the warm-up is done."""
        self.steps += 1
        if self.steps == self.warmup:
            self.cpu_ns.clear()
            self.calls.clear()
            self.start_ns = time.thread_time_ns()

    def wrap(self, module: str, path: str, label: str) -> None:
        owner, name, original = resolve(module, path)
        inside, outside = WITHIN.get(label, (None, None))

        @functools.wraps(original)
        def timed(*args, **kwargs):
            if (not self._counts(threading.current_thread()) or self._inside[label]
                    or (inside is not None and not self._inside[inside])
                    or (outside is not None and self._inside[outside])):
                return original(*args, **kwargs)
            self._inside[label] += 1
            try:
                return self.timed_call(label, original, *args, **kwargs)
            finally:
                self._inside[label] -= 1
                if label == STEP:
                    self.stepped()

        setattr(owner, name, timed)

    def timed_call(self, label: str, function: Callable, *args, **kwargs):
        """``function(*args, **kwargs)``, its thread CPU and one call counted under ``label``."""
        begin = time.thread_time_ns()
        try:
            return function(*args, **kwargs)
        finally:
            self.cpu_ns[label] += time.thread_time_ns() - begin
            self.calls[label] += 1


def worker(argv: List[str]) -> None:
    """One worker: wrap, train (``benchmarks.model_worker``), write ``cpu-<pid>.json``."""
    from . import model_worker
    args = model_worker.parse_args(argv)
    tally = Tally(args.warmup)
    for module, path, label in TIMED:
        tally.wrap(module, path, label)

    def write() -> None:   # (the final loss's forward pass is counted: one of many steps)
        steps = args.steps - args.warmup
        # (a client per worker runs an mpirun each: every one is rank 0 of its own job)
        with open(os.path.join(args.out, f"cpu-{os.getpid()}.json"), "w") as f:
            json.dump({"total": (time.thread_time_ns() - tally.start_ns) / steps / 1e3,
                       "us_per_step": {k: v / steps / 1e3 for k, v in tally.cpu_ns.items()},
                       "calls_per_step": {k: v / steps for k, v in tally.calls.items()}}, f)

    atexit.register(write)
    model_worker.main(argv)


def run_system(args, model: str, name: str, tmp: str) -> Dict:
    return combine(worker_readings("caller_cpu", "cpu", args, model, name, tmp),
                   statistics.mean)


def worker_readings(bench: str, prefix: str, args, model: str, name: str,
                    tmp: str) -> List[Dict]:
    """Train ``model`` on system ``name`` with ``bench``'s workers; each worker's reading
    (``<prefix>-<pid>.json``)."""
    readings = list(run_wrapped_workers(bench, args, model, name, tmp).glob(f"{prefix}-*.json"))
    if len(readings) != args.workers:
        raise SystemExit(f"{bench}: {model} on {name} left {len(readings)} readings for "
                         f"{args.workers} workers: a worker ended before it wrote its reading "
                         "(its output is above)")
    return [json.loads(p.read_text()) for p in readings]


def measure(args, bench: str, thread: str, run: Callable[[str, str], Dict],
            summary: Callable[[Dict], str]) -> Dict[str, Dict[str, List[Dict]]]:
    """``run(model, system)`` for every model and system of ``args``, ``args.rounds`` times
    with the systems' order alternated: {model: {system: [each round's reading]}};
    ``summary(reading)`` says its µs a step on the ``thread`` the benchmark reads."""
    results: Dict[str, Dict[str, List[Dict]]] = {}
    for model in args.models:
        results[model] = {s: [] for s in args.systems}
        for r in range(args.rounds):
            for system in args.systems if r % 2 == 0 else args.systems[::-1]:
                log.info("%s: %s, round %d of %d: %s", bench, model, r + 1, args.rounds, system)
                got = run(model, system)
                log.info("%s: %s on %s: %s µs a step on the %s thread", bench, model, system,
                         summary(got), thread)
                results[model][system].append(got)
    return results


def table(results: Dict[str, Dict[str, List[Dict]]], systems: List[str]) -> str:
    lines = []
    for model, by_system in results.items():
        lines += [f"### {model}", "",
                  "| where | " + " | ".join(f"{s}: CPU µs / step (calls)" for s in systems)
                  + " |", "|---|" + "---:|" * len(systems)]
        med = {s: _median(by_system[s]) for s in systems}
        lines.append("| **the caller's thread, all of it** | "
                     + " | ".join(f"**{med[s]['total']:.0f}**" for s in systems) + " |")
        for _, _, label in TIMED:
            cells = [med[s]["us_per_step"].get(label) for s in systems]
            if all(c is None for c in cells):
                continue
            shown = [f"{c:.0f} ({med[s]['calls_per_step'][label]:.0f})" if c is not None else ""
                     for s, c in zip(systems, cells)]
            lines.append(f"| {label.replace('  ', '&nbsp;&nbsp;')} | " + " | ".join(shown) + " |")
        lines.append("")
    return "\n".join(lines)


def combine(runs: List[Dict], how) -> Dict:
    """Workers' or rounds' readings as one (``how``: mean or median of each figure)."""
    labels = {k for r in runs for k in r["us_per_step"]}
    return {"total": how(r["total"] for r in runs),
            **{part: {k: how(r[part].get(k, 0.0) for r in runs) for k in labels}
               for part in ("us_per_step", "calls_per_step")}}


def _median(runs: List[Dict]) -> Dict:
    return combine(runs, statistics.median)


def segments(med: Dict, system: str) -> Dict[str, float]:
    """A system's step as parts that do not overlap: the model's own work, and each call
    into its store (the store's calls taken out of the phase that makes them)."""
    us = med["us_per_step"]
    prefix = "store" if system.startswith("kvhybrid") else "MXNet KVStore"
    calls = {k: v for k, v in us.items() if k.startswith(prefix + ":")}
    pulls = sum(v for k, v in calls.items() if "pull" in k and "pushpull" not in k)
    in_step = sum(v for k, v in calls.items() if "prefetch" not in k) - pulls
    parts = {"forward (the model)": us.get(FORWARD, 0.0) - pulls,
             "backward": us.get("backward", 0.0),
             "trainer.step (the Trainer)": us.get("trainer.step", 0.0) - in_step}
    parts.update(calls)
    parts["the rest (data, the loop)"] = med["total"] - sum(parts.values())
    return parts


def plot(results, systems: List[str], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(results), figsize=(6.5 * len(results), 3.6), squeeze=False)
    colors: Dict[str, tuple] = {}
    for ax, (model, by_system) in zip(axes[0], results.items()):
        for i, system in enumerate(systems):
            left = 0.0
            for label, width in segments(_median(by_system[system]), system).items():
                if width <= 0:
                    continue
                color = colors.setdefault(label, plt.get_cmap("tab20")(len(colors) % 20))
                ax.barh(i, width, left=left, color=color, label=label)
                left += width
        ax.set_yticks(range(len(systems)), systems)
        ax.set_xlabel("caller's thread CPU µs per step")
        ax.set_title(model)
    handles = {lab: h for ax in axes[0] for h, lab in zip(*ax.get_legend_handles_labels())}
    axes[0][-1].legend(handles.values(), handles.keys(), fontsize=6, loc="lower right")
    save_figure(fig, path)


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--worker":
        worker(argv[1:])
        return
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=["lm", "nmt"])
    p.add_argument("--systems", nargs="+", default=["kvhybrid", "dist_sync"],
                   choices=["kvhybrid", "kvhybrid all-PS", "kvhybrid unprefetched",
                            "kvhybrid all-PS unprefetched", "dist_sync"])
    p.add_argument("--rounds", type=int, default=3, help="runs per system, order alternated")
    add_wrapped_worker_args(p, "caller_cpu", steps=400, warmup=10)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    with tempfile.TemporaryDirectory() as tmp:
        results = measure(args, "caller_cpu", "caller's", lambda model, system: run_system(
            args, model, system, tmp), lambda got: f"{got['total']:.0f}")
    text = (f"# The caller's thread's CPU per step: {args.workers} workers on loopback, "
            f"{args.servers} server(s), {args.tokens} words per sample, {args.rounds} round(s)\n\n"
            "Thread CPU of each call on a worker's caller's thread, inclusive of what it calls "
            "(indented rows are inside the row above), the outermost call of each row only; "
            "µs per step over every step, mean over the workers, median over the rounds; "
            "calls per step in brackets. The wrappers add a few µs a call. Counted from the end of the warm-up.\n\n"
            + table(results, args.systems) + "\n" + "\n".join(footer("caller_cpu", argv))
            + "\n")
    write_outputs(args.out, args.name, text, results,
                  lambda res, path: plot(res, args.systems, path))

if __name__ == "__main__":
    main()
