"""When each rank reaches each point of a sparse model's step: the critical path, in time.

A sparse model's step is a cycle through the group's master: the rows of step t+1 reach
the ranks, each computes, meets the others (the pushpull's agreement, the pull's check,
the push's gather), the master pushes the rows' sum and asks the servers for the next
rows, and hands them out. This benchmark trains a model of ``model_zoo`` through
``benchmarks.model_worker`` (kvhybrid, one client group with servers) with the store's
calls and the communication thread's jobs wrapped, and reports when each happened on
each rank, relative to the moment the master's own rows of that step were ready; the
median over the steps after the warm-up:

    python -m benchmarks.step_timeline --models lm --steps 300 --name step_timeline

A gap between one rank's point and the next rank's says who waited for whom. Writes
``NAME.{md,json,png}``.
"""
from __future__ import annotations

import argparse
import atexit
import bisect
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
from typing import Dict, List, Optional, Tuple

from .common import footer, resolve, save_figure, write_outputs
from .models import add_wrapped_worker_args, run_wrapped_workers

log = logging.getLogger("benchmarks")

#: (module, attribute path, label at entry or None, label at exit or None), main thread
POINTS = [
    ("kvhybrid.kvstore.sparse_pull", "RowPulls._pull_prefetched", "pull: called", None),
    ("kvhybrid.kvstore.sparse_pull", "RowPulls._wait_for_prefetch", None, "pull: rows ready"),
    ("kvhybrid.kvstore.store", "HybridMPIStore.pushpull", "pushpull: called", None),
    ("kvhybrid.kvstore.store", "HybridMPIStore.push", "push: called", "push: returned"),
    ("kvhybrid.kvstore.sparse_pull", "RowPulls._wait_for_check", None, "push: checks settled"),
    ("mxnet.gluon", "Trainer.step", None, "step: returned"),
]
#: the communication thread's jobs by the start of their names (EngineComm.enqueue, submit)
JOBS = [("the prefetched rows", "hand-out"), ("the check of the prefetched rows", "check"),
        ("the agreement on", "agreement"), ("bucket", "bucket")]
#: the label every step's times are measured from (the master's)
ANCHOR = "pull: rows ready"
STEP = "step: returned"


class Recorder:
    """``(perf_counter_ns, label)`` of each wrapped point, in the order they happened."""

    def __init__(self):
        self.events: List[Tuple[int, str]] = []

    def mark(self, label: str) -> None:
        self.events.append((time.perf_counter_ns(), label))

    def wrap(self, module: str, path: str, enter: Optional[str], leave: Optional[str]) -> None:
        owner, name, original = resolve(module, path)
        main = threading.main_thread()

        @functools.wraps(original)
        def marked(*args, **kwargs):
            mine = threading.current_thread() is main
            if mine and enter:
                self.mark(enter)
            try:
                return original(*args, **kwargs)
            finally:
                if mine and leave:
                    self.mark(leave)

        setattr(owner, name, marked)

    def wrap_jobs(self) -> None:
        """Each job of the communication thread marks its start and end."""
        from kvhybrid.tensor_collectives.engine import EngineComm

        def label_of(name: str) -> Optional[str]:
            return next((lab for start, lab in JOBS if name.startswith(start)), None)

        def marking(work, label):
            def job():
                self.mark(f"{label}: began")
                try:
                    work()
                finally:
                    self.mark(f"{label}: ended")
            return job

        enqueue, submit = EngineComm.enqueue, EngineComm.submit

        def marked_enqueue(comm, name, work):
            label = label_of(name)
            return enqueue(comm, name, marking(work, label) if label else work)

        def marked_submit(comm, name, arrays, work, priority=0):
            label = label_of(name)
            return submit(comm, name, arrays, marking(work, label) if label else work, priority)

        EngineComm.enqueue, EngineComm.submit = marked_enqueue, marked_submit


def worker(argv: List[str]) -> None:
    """One rank: wrap, train (``benchmarks.model_worker``), write ``events-<rank>.json``."""
    from . import model_worker
    args = model_worker.parse_args(argv)
    recorder = Recorder()
    for point in POINTS:
        recorder.wrap(*point)
    recorder.wrap_jobs()

    def write() -> None:
        rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("PMI_RANK", "0")))
        with open(os.path.join(args.out, f"events-{rank}.json"), "w") as f:
            json.dump({"rank": rank, "events": recorder.events}, f)

    atexit.register(write)
    model_worker.main(argv)


#: points that come before the anchor in a step's cycle (the rows on their way)
BEFORE = {"hand-out: began", "hand-out: ended", "pull: called", ANCHOR}


def anchors_of(events: List[Tuple[int, str]]) -> List[Optional[int]]:
    """The master's ``ANCHOR`` of each step: its first after each ``trainer.step`` (a NMT
    pulls two tables a step)."""
    anchors: List[Optional[int]] = [None]
    for t, label in events:
        if label == ANCHOR and anchors[-1] is None:
            anchors[-1] = t
        elif label == STEP:
            anchors.append(None)
    return anchors[:-1]


def timeline(ranks: Dict[int, List[Tuple[int, str]]], warmup: int) -> Dict:
    """Each label's median time on each rank (ms) from the master's ``ANCHOR`` of the same
    step, and the median step (the master's anchor to its next). A point before the
    anchor in the cycle (``BEFORE``) is its first time within half a step of the master's
    anchor (another rank's rows may come a little before or after the master's); any other
    is its first time between the rank's own anchor of the step and its next (a rank whose
    rows came early may check before the master has its rows)."""
    own = {r: anchors_of(events) for r, events in ranks.items()}
    anchors = own[0]
    use = [k for k in range(warmup, min(len(a) for a in own.values()) - 1)
           if all(own[r][k] is not None and own[r][k + 1] is not None for r in own)]
    if not use:
        raise SystemExit("step_timeline: no step had the master's prefetched rows (the "
                         "model must pull rows prefetched with prefetch_rows)")
    step = statistics.median(anchors[k + 1] - anchors[k] for k in use)
    times: Dict[str, Dict[int, List[int]]] = {}
    for r, events in ranks.items():
        for t, label in events:
            times.setdefault(label, {}).setdefault(r, []).append(t)
    medians: Dict[str, Dict[int, float]] = {}
    for label, by_rank in times.items():
        for r, ts in by_rank.items():
            offsets = []
            for k in use:
                if label in BEFORE:
                    i = bisect.bisect_right(ts, anchors[k] - step // 2)
                    t = ts[i] if i < len(ts) and ts[i] <= anchors[k] + step // 2 else None
                else:
                    i = bisect.bisect_left(ts, own[r][k])
                    t = ts[i] if i < len(ts) and ts[i] < own[r][k + 1] else None
                if t is not None:
                    offsets.append((t - anchors[k]) / 1e6)
            if offsets:
                medians.setdefault(label, {})[r] = statistics.median(offsets)
    order = sorted(medians, key=lambda lab: min(medians[lab].values()))
    return {"step_ms": step / 1e6, "labels": order, "medians": medians, "steps": len(use)}


def run(args, model: str, tmp: str) -> Dict:
    ranks = {}
    for path in run_wrapped_workers("step_timeline", args, model, "kvhybrid",
                                    tmp).glob("events-*.json"):
        got = json.loads(path.read_text())
        ranks[got["rank"]] = [tuple(e) for e in got["events"]]
    if sorted(ranks) != list(range(args.workers)):
        raise SystemExit(f"step_timeline: {model} left readings of ranks {sorted(ranks)}, not "
                         f"0 to {args.workers - 1}: a worker ended before it wrote its "
                         "events (its output is above)")
    return timeline(ranks, args.warmup)


def table(results: Dict[str, Dict], workers: int) -> str:
    lines = []
    for model, res in results.items():
        lines += [f"### {model}: {res['step_ms']:.2f} ms a step (median of {res['steps']} steps)",
                  "", "| point | " + " | ".join(
                      f"rank {r}{' (master)' if r == 0 else ''}" for r in range(workers)) + " |",
                  "|---|" + "---:|" * workers]
        for label in res["labels"]:
            cells = [res["medians"][label].get(r) for r in range(workers)]
            lines.append(f"| {label} | " + " | ".join("" if c is None else f"{c:+.2f}"
                                                      for c in cells) + " |")
        lines.append("")
    return "\n".join(lines)


def plot(results: Dict[str, Dict], workers: int, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(results), figsize=(7 * len(results), 0.4 + 0.28 * max(
        len(r["labels"]) for r in results.values())), squeeze=False)
    for ax, (model, res) in zip(axes[0], results.items()):
        for r in range(workers):
            xs = [res["medians"][lab].get(r) for lab in res["labels"]]
            ys = [i + 0.15 * (r - workers / 2) for i in range(len(xs))]
            ax.scatter([x for x in xs if x is not None],
                       [y for x, y in zip(xs, ys) if x is not None], s=12,
                       label=f"rank {r}" + (" (master)" if r == 0 else ""))
        ax.set_yticks(range(len(res["labels"])), res["labels"], fontsize=7)
        ax.invert_yaxis()
        ax.axvline(0, color="grey", lw=0.5)
        ax.set_xlabel("ms from the master's rows being ready (median over the steps)")
        ax.set_title(f"{model}: {res['step_ms']:.1f} ms a step")
        ax.legend(fontsize=7)
    save_figure(fig, path)


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--worker":
        worker(argv[1:])
        return
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=["lm"], choices=["lm", "nmt"])
    add_wrapped_worker_args(p, "step_timeline", steps=300, warmup=50)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for model in args.models:
            log.info("step_timeline: %s, %d steps", model, args.steps)
            results[model] = run(args, model, tmp)
            log.info("step_timeline: %s: %.2f ms a step", model, results[model]["step_ms"])
    text = (f"# When each rank reaches each point of a step: {args.workers} workers on loopback "
            f"(one client group), {args.servers} server(s), {args.tokens} words per sample\n\n"
            "Milliseconds from the moment the master's own prefetched rows of the step were "
            f"ready (`{ANCHOR}`), median over the steps after the {args.warmup}-step warm-up; "
            "`push: checks settled`: the pull checks' wait before the push's gather ends; "
            "`hand-out`: the communication thread's job that hands the step's rows out (it "
            "begins in the step before).\n\n"
            + table(results, args.workers) + "\n" + "\n".join(footer("step_timeline", argv))
            + "\n")
    write_outputs(args.out, args.name, text, results,
                  lambda res, path: plot(res, args.workers, path))


if __name__ == "__main__":
    main()
