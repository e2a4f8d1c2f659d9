"""Where a worker's communication thread spends its CPU, job by job.

kvhybrid's per-step work off the caller's thread runs on one communication thread per
worker (``tensor_collectives/engine.py``): the buckets' allreduces, the rows' hand-out to and
from the group's master, the checks of prefetched pulls, the agreements on repeated calls.
``dist_sync`` has no such thread, so on a machine with fewer cores than busy threads its
CPU is what kvhybrid pays beyond MXNet's own path (``python -m benchmarks.models``: the
JSON's ``cpu_ms_per_step.communication``). This benchmark says what it pays for: it trains
a model of ``model_zoo`` through ``benchmarks.model_worker`` with each job the store queues
on that thread timed by its kind, and the calls inside the jobs timed as ``caller_cpu``
times the caller's (thread CPU, the outermost call of each row, inclusive of what it
calls, µs per step after the warm-up, mean over the workers, median over the rounds):

    python -m benchmarks.comm_cpu --models lm nmt --rounds 3
    python -m benchmarks.comm_cpu --hosts 2 --rate 1gbit --models lm   # emulated hosts (root)

A job's row counts its whole work; the indented rows are calls inside jobs. "Waiting for
other ranks" is the patient waits (MPI tests, ``sched_yield`` inside them, and sleeps)
inside all of the jobs above it. Writes ``NAME.{md,json,png}``.

``--perf`` says instead what code the thread's CPU runs: Linux's ``perf record`` samples
every communication thread over the timed steps, and each sample counts for the library
it fell in (the Python interpreter and the extension modules it calls, the kernel, libc,
the MPI library, MXNet, kvhybrid's own C++). Only the master's push is wrapped then (it
tells the roles apart), so the Python share is the store's own: what a communication
thread in compiled code could save at most. It needs ``perf`` (Debian: ``linux-perf``)
and the right to sample kernel code (root, or ``kernel.perf_event_paranoid`` at most 1):

    python -m benchmarks.comm_cpu --hosts 2 --rate 1gbit --models lm --perf   # root
"""
from __future__ import annotations

import argparse
import atexit
import contextlib
import functools
import json
import logging
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Set

from . import cpu
from .caller_cpu import Tally, combine, measure, worker_readings
from .cluster import add_host_args, launcher_args_on_hosts, setting_name, why_no_hosts
from .common import footer, resolve, save_figure, write_outputs
from .cpu import COMMUNICATION_THREAD
from .models import add_wrapped_worker_args

log = logging.getLogger("benchmarks")

#: the rows of the table for jobs: "job: " and the kind of each job queued (its name less
#: what names its keys); these are the calls inside jobs, (module, attribute path, label)
TIMED = [
    ("kvhybrid.kvstore.calls", "agree", "  the ranks' agreement on a call"),
    ("kvhybrid.kvstore.sparse_push", "agree", "  the ranks' agreement on a call"),
    ("kvhybrid.kvstore.sparse_pull", "agree", "  the ranks' agreement on a call"),
    ("kvhybrid.tensor_collectives.algorithms", "Algorithms.allreduce",
     "  a bucket's sum (MPI, or the host's meeting)"),
    ("kvhybrid.kvstore.sparse_push", "_rows_of", "  the gradient's rows and the next ids"),
    ("kvhybrid.kvstore.sparse_push", "gather_patiently", "  the gather to the master"),
    ("kvhybrid.kvstore.sparse_pull", "gather_patiently", "  the gather to the master"),
    ("kvhybrid.kvstore.sparse_push", "sum_rows", "  the master's sums of the rows"),
    ("kvhybrid.kvstore.ps.link", "ServerLink.push_rows", "  the master's push to the servers"),
    ("kvhybrid.kvstore.ps.link", "ServerLink.start_pull_rows",
     "  the master's ask for the next rows"),
    ("kvhybrid.kvstore.sparse_push", "_hand_out_packed",
     "  the servers' rows, packed for each rank (the master)"),
    ("kvhybrid.kvstore.sparse_push", "new_host_row_sparse", "  arrays for the next rows"),
    ("kvhybrid.kvstore.sparse_push", "scatter_bytes", "  the scatter from the master"),
    ("kvhybrid.kvstore.sparse_pull", "scatter_bytes", "  the scatter from the master"),
    ("kvhybrid.kvstore.sparse_pull", "unique_ids", "  a served pull's ids, sorted"),
    ("kvhybrid.kvstore.sparse_pull", "make_rows", "  a served pull's rows, their memory"),
    ("kvhybrid.kvstore.sparse_pull", "PullCheck.needs_plain_pull",
     "  the check's meeting or small allreduce"),
    ("kvhybrid.tensor_collectives.ops", "_wait_requests",
     "waiting for other ranks (MPI tests and sleeps, inside the jobs)"),
    ("kvhybrid.tensor_collectives.engine", "EngineComm._wait_started",
     "waiting for MXNet's engine to start a job"),
]

#: the row only a rank that talks to the servers for others (a group's or a host's
#: master) has: the table's columns split the workers by it
MASTER_CALL = "  the master's push to the servers"

#: the table's columns per system, by role
ROLES = {"masters": "masters", "others": "the other ranks"}

#: ``--perf``: samples a second of the communication thread's CPU
PERF_HZ = 1999

#: ``--perf``'s rows, "code: " and what runs the CPU, by the name of the shared object a
#: sample fell in: the first whose prefixes match (kvhybrid's own helpers, which are Python
#: extension modules too, are told apart by their file names first, then any other
#: extension module counts as Python: ``library_of``)
OWN_CODE = "code: kvhybrid's C++ helpers"
LIBRARIES = [
    ("code: the kernel (system calls: the switches after MPI's yields and the waits' "
     "sleeps, sockets, futexes)", ("[kernel", "[vdso]")),
    ("code: the MPI library (Open MPI or MPICH, libevent)",
     ("libmpi", "mca_", "libopen-", "libevent", "libpmix", "libhwloc", "libucs", "libucp")),
    ("code: MXNet", ("libmxnet",)),
    ("code: libc (memory copies, allocation, locks)",
     ("libc.so", "libc-", "libpthread", "libm.so", "libm-", "ld-linux")),
    ("code: Python (the interpreter, numpy, ctypes, mpi4py)",
     ("libpython", "python", "libffi")),
]
#: what names a Python extension module (numpy's, ctypes', mpi4py's): the Python row
EXTENSION = ".cpython-"
OTHER_CODE = "code: other (libstdc++, unresolved)"

#: what queues a job, and where its work is among the arguments (after ``self``)
QUEUES = [("EngineComm.submit", 2), ("EngineComm.enqueue", 1)]


def job_kind(name: str) -> str:
    """A job's name less what names its keys and sizes: "bucket 0 (keys 5..0)" and "the
    check of the prefetched rows of key 6" become "bucket" and "the check"."""
    kind = re.split(r" of | \(", name, maxsplit=1)[0]
    return re.sub(r"(?: \d+)+$", "", kind) or name


def on_communication_thread(thread: threading.Thread) -> bool:
    return thread.name.startswith(COMMUNICATION_THREAD)


def worker(argv: List[str]) -> None:
    """One worker: wrap, train (``benchmarks.model_worker``), write ``comm-<pid>.json``.
    ``--perf`` first: sample the communication threads with ``perf`` instead of timing
    their jobs and calls (see the module)."""
    import mxnet as mx
    from . import model_worker
    from kvhybrid.tensor_collectives import engine
    sampled = bool(argv) and argv[0] == "--perf"
    argv = argv[1:] if sampled else argv
    args = model_worker.parse_args(argv)
    tally = Tally(args.warmup, counts=on_communication_thread)
    for module, path, label in TIMED:
        if not sampled or label == MASTER_CALL:
            tally.wrap(module, path, label)
    for path, position in QUEUES if not sampled else ():
        _wrap_queue(tally, engine, path, position)
    recording: List[subprocess.Popen] = []
    data = os.path.join(args.out, f"perf-{os.getpid()}.data")
    libraries: Dict[str, float] = {}
    owner, name, step = resolve("mxnet.gluon", "Trainer.step")
    # the threads' CPU at the warm-up's end and the last step (they end with the store),
    # each read once the thread has run every job queued so far: in a loop that never
    # waits (--waitall end) the caller's thread runs steps ahead of it, and a reading taken
    # at once left out most of the timed steps' work (NMT: 470 us a step, where a master's
    # jobs added up to 3000)
    seconds: Dict[int, float] = {}

    def counted_step(*a, **kw):
        try:
            return step(*a, **kw)
        finally:
            read = tally.steps + 1 in (args.warmup, args.steps)   # (this step ends a window)
            if read:
                mx.nd.waitall()   # (the jobs run in their queue's order: all before, too)
            tally.stepped()
            if read and sampled and recording:
                libraries.update(stop_perf(recording.pop(), data))
            if read:
                seconds[tally.steps] = cpu.thread_seconds()["communication"]
            if read and sampled and tally.steps == args.warmup:
                recording.append(start_perf(communication_threads(), data))

    setattr(owner, name, counted_step)

    def write() -> None:
        steps = args.steps - args.warmup
        total = seconds[args.steps] - seconds[args.warmup]
        us = {k: v / steps / 1e3 for k, v in tally.cpu_ns.items()}
        calls = {k: v / steps for k, v in tally.calls.items()}
        if sampled:   # (the split of the whole thread's CPU; no call counts)
            us.update(split_by_library(libraries, total / steps * 1e6, own_modules()))
        with open(os.path.join(args.out, f"comm-{os.getpid()}.json"), "w") as f:
            json.dump({"total": total / steps * 1e6, "us_per_step": us,
                       "calls_per_step": calls}, f)

    atexit.register(write)
    model_worker.main(argv)


def _wrap_queue(tally: Tally, engine, path: str, position: int) -> None:
    """Wrap ``EngineComm.<path>`` so that the job it queues is timed under "job: <kind>"."""
    owner, name, original = resolve(engine.__name__, path)

    def queue(self, job_name, *args, **kwargs):
        label = "job: " + job_kind(job_name)
        args = list(args)
        work = kwargs["work"] if "work" in kwargs else args[position - 1]
        timed = functools.partial(tally.timed_call, label, work)
        if "work" in kwargs:
            kwargs["work"] = timed
        else:
            args[position - 1] = timed
        return original(self, job_name, *args, **kwargs)

    setattr(owner, name, queue)


#: what the table says about its rows: jobs and calls timed, or (``--perf``) code sampled
JOBS_TEXT = (
    "Thread CPU of each job a worker's communication thread ran (\"job:\", by kind) and of "
    "the calls inside jobs (indented; the outermost call of each row only), inclusive of "
    "what each calls; µs per step over every step after the warm-up, mean over the "
    "masters (the ranks that talk to the servers for the others: a group's or each "
    "host's) and over the other ranks apart, median over the rounds; calls per step in "
    "brackets. The whole thread's CPU is read from /proc (benchmarks/cpu.py) at the "
    "warm-up's end and the last step: what no job holds is the thread's queue and its "
    "wait for MXNet's engine to start a job. The wrappers add a few µs a call.\n\n")
PERF_TEXT = (
    "The whole communication thread's CPU, read from /proc (benchmarks/cpu.py) at the "
    "warm-up's end and the last step, split by where `perf record` found it (%d samples "
    "a second of the thread's CPU, over the timed steps): the shared object each sample "
    "fell in, grouped (\"code:\"); µs per step and, in brackets, the share of the "
    "thread's; mean over the masters (the ranks that talk to the servers for the others) "
    "and over the other ranks apart, median over the rounds. No job or call is timed. "
    "The Python row is the interpreter and the extension modules it calls (numpy, "
    "ctypes, mpi4py): the most a communication thread in compiled code could save. The "
    "kernel row is mostly the context switches after MPI's yields (`mpi_yield_when_idle`) "
    "and the patient waits' sleeps. Sampling adds its interrupts to the thread's CPU: the "
    "totals run above a plain run's, and the shares are the reading.\n\n" % PERF_HZ)


def communication_threads() -> List[int]:
    """This process's communication threads' ids, as the kernel knows them."""
    tids = [t.native_id for t in threading.enumerate() if on_communication_thread(t)]
    if not tids:
        raise RuntimeError("comm_cpu --perf: this worker has no communication thread to "
                           "sample (kvhybrid's engine path is off?)")
    return tids


def perf_refused() -> Optional[str]:
    """Why ``--perf`` cannot sample here (with the fix), or None: ``perf`` is looked for and
    made to record a command of no length, before any job starts."""
    if shutil.which("perf") is None:
        return "needs Linux's perf on the PATH (Debian: apt install linux-perf)"
    with tempfile.TemporaryDirectory() as tmp:
        trial = subprocess.run(["perf", "record", "-q", "-F", str(PERF_HZ), "-o",
                                os.path.join(tmp, "trial.data"), "--", "true"],
                               capture_output=True, text=True, timeout=60)
    if trial.returncode != 0:
        return (f"perf record may not sample here ({trial.stderr.strip()[-300:]}): "
                f"{PERF_FIX}")
    return None


#: how to let ``perf`` sample kernel code too
PERF_FIX = "run as root or set kernel.perf_event_paranoid to 1 or less"


def start_perf(tids: Iterable[int], data: str) -> subprocess.Popen:
    """``perf record`` of the threads ``tids`` into ``data``, until ``stop_perf``; nothing
    waits for it to start (only the samples' shares are read, not their count)."""
    return subprocess.Popen(["perf", "record", "-q", "-F", str(PERF_HZ), "-o", data,
                             "-t", ",".join(str(t) for t in tids)],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)


def stop_perf(proc: subprocess.Popen, data: str) -> Dict[str, float]:
    """Stop ``start_perf``'s recording; its samples' shares (%) by shared object."""
    if proc.poll() is not None:   # (it stopped by itself: it may not sample here)
        raise RuntimeError(f"comm_cpu --perf: perf record stopped at once "
                           f"({proc.communicate()[1].strip()}): {PERF_FIX}")
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=60)
    report = subprocess.run(["perf", "report", "-i", data, "--stdio", "--no-children",
                             "--sort", "dso", "-g", "none"],
                            capture_output=True, text=True, timeout=120)
    if report.returncode != 0:
        raise RuntimeError(f"comm_cpu --perf: perf report failed: {report.stderr.strip()}")
    return shares_by_object(report.stdout)


def shares_by_object(report: str) -> Dict[str, float]:
    """``perf report --sort dso``'s rows: {shared object: % of the samples}."""
    shares: Dict[str, float] = {}
    for line in report.splitlines():
        row = re.match(r"\s*([\d.]+)%\s+(\S.*?)\s*$", line)
        if row and not line.lstrip().startswith("#"):
            shares[row.group(2)] = shares.get(row.group(2), 0.0) + float(row.group(1))
    return shares


def own_modules() -> Set[str]:
    """The file names of kvhybrid's compiled helpers (``_rows.cpython-311-...so``)."""
    import kvhybrid
    return {p.name for p in Path(kvhybrid.__file__).parent.rglob("*.so")}


def library_of(dso: str, own: Set[str]) -> str:
    """The ``--perf`` row a shared object's samples count for."""
    if dso in own:
        return OWN_CODE
    if EXTENSION in dso:
        return LIBRARIES[-1][0]
    for label, prefixes in LIBRARIES:
        if dso.startswith(prefixes):
            return label
    return OTHER_CODE


def split_by_library(shares: Dict[str, float], total_us: float,
                     own: Set[str]) -> Dict[str, float]:
    """The thread's ``total_us`` a step split as its samples fell ({row: µs a step})."""
    if not shares:
        raise RuntimeError("comm_cpu --perf: perf recorded no samples of the communication "
                           "thread (were the timed steps too few?)")
    whole = sum(shares.values())
    split: Dict[str, float] = {}
    for dso, share in shares.items():
        label = library_of(dso, own)
        split[label] = split.get(label, 0.0) + total_us * share / whole
    return split


def run_system(args, model: str, name: str, tmp: str) -> Dict:
    runs = worker_readings("comm_cpu", "comm", args, model, name, tmp)
    masters = [r for r in runs if r["calls_per_step"].get(MASTER_CALL)]
    others = [r for r in runs if not r["calls_per_step"].get(MASTER_CALL)]
    return {role: combine(part, statistics.mean)
            for role, part in (("masters", masters), ("others", others)) if part}


def rows(med: Dict) -> List[str]:
    """The labels of a reading in the table's order: the jobs by their CPU, then the calls
    inside them as ``TIMED`` lists them; with ``--perf``, the code by its CPU."""
    us = med["us_per_step"]
    if sampled(med):   # (only the master's push was timed, to tell the roles apart)
        return sorted((k for k in us if k.startswith("code: ")), key=lambda k: -us[k])
    jobs = sorted((k for k in us if k.startswith("job: ")), key=lambda k: -us[k])
    inside = list(dict.fromkeys(label for _, _, label in TIMED))
    return jobs + [label for label in inside if label in us]


def sampled(med: Dict) -> bool:
    """Whether a reading is ``--perf``'s (its rows split the thread by code)."""
    return any(k.startswith("code: ") for k in med["us_per_step"])


def medians(by_system: Dict[str, List[Dict]]) -> Dict[str, Dict]:
    """Each (system, role) column's median over the rounds."""
    return {(s, role): combine([r[role] for r in rounds], statistics.median)
            for s, rounds in by_system.items() for role in ROLES if role in rounds[0]}


def table(results: Dict[str, Dict[str, List[Dict]]], systems: List[str]) -> str:
    lines = []
    for model, by_system in results.items():
        med = medians({s: by_system[s] for s in systems})
        columns = list(med)
        labels = list(dict.fromkeys(label for c in columns for label in rows(med[c])))
        lines += [f"### {model}", "",
                  "| where | " + " | ".join(f"{s}, {ROLES[role]}: CPU µs / step "
                                            f"({'share' if sampled(med[s, role]) else 'calls'})"
                                            for s, role in columns)
                  + " |", "|---|" + "---:|" * len(columns),
                  "| **the communication thread, all of it** | "
                  + " | ".join(f"**{med[c]['total']:.0f}**" for c in columns) + " |"]
        for label in labels:
            shown = [f"{med[c]['us_per_step'][label]:.0f} "
                     f"({med[c]['calls_per_step'][label]:.1f})"
                     if med[c]["calls_per_step"].get(label) else "" for c in columns]
            if label.startswith("code: "):   # (µs a step, and the share of the thread's)
                shown = [f"{med[c]['us_per_step'].get(label, 0):.0f} "
                         f"({100 * med[c]['us_per_step'].get(label, 0) / med[c]['total']:.0f} %)"
                         for c in columns]
            lines.append(f"| {label.replace('  ', '&nbsp;&nbsp;')} | " + " | ".join(shown) + " |")
        lines.append("")
    return "\n".join(lines)


def plot(results, systems: List[str], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(results), figsize=(6.5 * len(results), 3.2), squeeze=False)
    colors: Dict[str, tuple] = {}
    for ax, (model, by_system) in zip(axes[0], results.items()):
        columns = medians({s: by_system[s] for s in systems})
        for i, med in enumerate(columns.values()):
            left = 0.0
            for label in (k for k in rows(med) if k.startswith(("job: ", "code: "))):
                width = med["us_per_step"][label]
                color = colors.setdefault(label, plt.get_cmap("tab10")(len(colors) % 10))
                ax.barh(i, width, left=left, color=color, label=label.split(": ", 1)[1])
                left += width
            ax.barh(i, max(0.0, med["total"] - left), left=left, color="lightgrey",
                    label="between jobs (the queue, the engine's start)")
        ax.set_yticks(range(len(columns)), [f"{s}, {ROLES[role]}" for s, role in columns])
        ax.set_xlabel("communication thread CPU µs per step")
        ax.set_title(model)
        handles = dict(zip(*reversed(ax.get_legend_handles_labels())))
        ax.legend(handles.values(), handles.keys(), fontsize=6, loc="lower right")
    save_figure(fig, path)


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--worker":
        worker(argv[1:])
        return
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=["lm", "nmt"])
    p.add_argument("--systems", nargs="+", default=["kvhybrid"],
                   choices=["kvhybrid", "kvhybrid unprefetched", "kvhybrid group-master"])
    p.add_argument("--rounds", type=int, default=3, help="runs per system, order alternated")
    add_host_args(p)   # (a server on each host, unless --servers says otherwise)
    add_wrapped_worker_args(p, "comm_cpu", steps=400, warmup=10)
    p.add_argument("--perf", action="store_true",
                   help="split the thread's CPU by the code it runs (Python, the kernel, "
                        "libc, MPI, MXNet, kvhybrid's C++), sampled by Linux's perf, "
                        "instead of timing its jobs")
    args = p.parse_args(argv)
    if args.warmup < 1:
        p.error("--warmup must be at least 1: the threads' CPU is read from its end on")
    refused = perf_refused() if args.perf else None
    if refused:
        p.error(f"--perf: {refused}")
    args.worker_flags = ["--perf"] if args.perf else []
    if "kvhybrid group-master" in args.systems and not args.hosts:
        p.error("--systems 'kvhybrid group-master' needs --hosts")
    missing = why_no_hosts() if args.hosts else None
    if missing:
        p.error(f"--hosts {missing}")
    if args.hosts and "--servers" not in argv:
        args.servers = args.hosts
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    where = setting_name(args.hosts, args.rate, args.workers, args.delay)
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        args.launcher_args = launcher_args_on_hosts(stack, args.hosts, args.rate, args.delay,
                                                    args.workers, tmp)
        results = measure(args, "comm_cpu", "communication", lambda model, system: run_system(
            args, model, system, tmp), lambda got: ", ".join(
                f"{ROLES[k]} {v['total']:.0f}" for k, v in got.items()))
    text = (f"# The communication thread's CPU per step: {where}, {args.workers} workers, "
            f"{args.servers} server(s), {args.tokens} words per sample, {args.rounds} "
            "round(s)\n\n" + (PERF_TEXT if args.perf else JOBS_TEXT)
            + table(results, args.systems) + "\n" + "\n".join(footer("comm_cpu", argv))
            + "\n")
    write_outputs(args.out, args.name, text, results,
                  lambda res, path: plot(res, args.systems, path))


if __name__ == "__main__":
    main()
