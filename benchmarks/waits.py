"""How a rank waits for a small collective: the latency and the CPU of each way.

    python -m benchmarks.waits --ranks 2 --bytes 16 65536 --late-ms 0 1

Every wait on the store's per-step path (the agreement of a call, the gather of rows to the
master, the hand-out of pulled rows) is a non-blocking MPI call waited for "patiently":
``kvhybrid.tensor_collectives.ops.wait_patiently`` tests, spins briefly, then sleeps between
tests so that a rank that waits for a slower one leaves the cores to it. Each round times an
``Iallreduce`` of ``--bytes`` waited for:

* ``spinning``: ``Wait()``, MPI's busy loop (the latency floor, a core kept busy);
* ``sleeping``: sleeps between tests from the first test on, with Linux's default timer
  slack (how the store waited before it spun first);
* ``polling``: ``wait_patiently``, as the store waits where its ranks are on several hosts;
* ``host barrier``: ``Group.meet`` (every rank sleeps on a futex until the last arrives,
  ``host_barrier.py``), then ``wait_patiently``: as the store waits where they share one;
* ``in the barrier``: ``Group.meet_bringing`` alone, no MPI call: where the answer fits in
  the number each rank brings to the meeting (a check of prefetched rows,
  ``sparse_pull.PullCheck``), the bytes are not sent;
* ``summed in the barrier``: the sum made in the meeting, no MPI call: each rank leaves its
  bytes in shared memory before it arrives and adds everyone's after
  (``meeting_sum.py``), as the engine path sums a small bucket where its ranks share a
  host.

with every rank there at once (``--late-ms 0``) or the last rank that late. Rank 0's wall time
(median of ``--repeats``) and its CPU time per wait are reported. The ways' order alternates
between rounds. Writes ``NAME.{md,json,png}`` (default ``bench-out/``).
"""
from __future__ import annotations

import argparse
import ctypes
import json
import logging
import os
import statistics
import sys
import tempfile
import time
from typing import Dict, List

from .common import (DIAGNOSTICS_OUT, footer, grouped_bars, mpirun_command, run_job,
                     save_figure, write_outputs)

log = logging.getLogger("benchmarks")

WAYS = ("spinning", "sleeping", "polling", "host barrier", "in the barrier",
        "summed in the barrier")
#: Linux's timer slack of a thread unless changed, ns
DEFAULT_SLACK_NS = 50_000


def _sleeping(request) -> None:
    delay = 50e-6
    while not request.Test():
        time.sleep(delay)
        delay = min(delay * 1.5, 1e-4)


def worker(args) -> Dict[str, Dict[str, List[float]]]:
    """{case: {"wall": [...], "cpu": [...]}} on this rank, every case of every round."""
    import numpy as np
    from mpi4py import MPI

    from kvhybrid.kvstore.calls import PULL_CHECK
    from kvhybrid.tensor_collectives import ops
    from kvhybrid.tensor_collectives.group import Group, GroupSettings

    def default_slack() -> None:   # undo what the store's waits set on this thread
        ctypes.CDLL(None).prctl(ops.PR_SET_TIMERSLACK, ctypes.c_ulong(DEFAULT_SLACK_NS), 0, 0, 0)
        ops._slack.set = False

    group = Group(MPI, MPI.COMM_WORLD, GroupSettings(), "waits")
    comm = group.comm
    late_rank = comm.size - 1
    if not group.meet():
        log.warning("waits: no host barrier here (ranks on several hosts, or its helper not "
                    "built): its row polls")
    #: how a way waits for the request, and what it does before posting it
    ways = {"spinning": lambda r: r.Wait(), "sleeping": _sleeping,
            "polling": ops.wait_patiently, "host barrier": ops.wait_patiently,
            "in the barrier": ops.wait_patiently,   # (without one: polls, as the store then)
            "summed in the barrier": ops.wait_patiently}
    group.algorithms.patient = True   # (as the engine path's group: sums_in_meetings)
    before = {"host barrier": group.meet}
    out: Dict[str, Dict[str, List[float]]] = {}
    for rnd in range(args.rounds):
        order = WAYS if rnd % 2 == 0 else WAYS[::-1]
        for nbytes in args.bytes:
            buf = np.ones(max(1, nbytes // 4), np.float32)
            for late_ms in args.late_ms:
                for way in order:
                    if way == "sleeping":
                        default_slack()
                    wall, cpu = [], []
                    for i in range(args.warmup + args.repeats):
                        comm.Barrier()
                        if late_ms and comm.rank == late_rank:
                            time.sleep(late_ms / 1e3)
                        t0, c0 = time.perf_counter(), time.thread_time()
                        if way == "in the barrier" and group.meets_on_host:
                            group.meet_bringing(PULL_CHECK | 1)   # (what a check brings)
                        elif way == "summed in the barrier" and \
                                group.algorithms.sums_in_meetings(buf.nbytes):
                            group.algorithms.run("meeting", buf)
                        else:
                            if way in before:
                                before[way]()
                            ways[way](comm.Iallreduce(MPI.IN_PLACE, buf))
                        if i >= args.warmup:
                            wall.append(time.perf_counter() - t0)
                            cpu.append(time.thread_time() - c0)
                    case = out.setdefault(f"{nbytes} {late_ms:g} {way}", {"wall": [], "cpu": []})
                    case["wall"].append(statistics.median(wall))
                    case["cpu"].append(statistics.mean(cpu))
    return out


def report(results: Dict, args) -> str:
    lines = [f"# Waiting for a small collective: {args.ranks} ranks\n",
             f"Rank 0's wait for an `Iallreduce`, µs: wall time (median of {args.repeats} "
             f"waits, median over {args.rounds} rounds) and CPU time per wait (the same). "
             "'late': the last rank starts that many ms after the others.\n",
             "| bytes | late (ms) | " + " | ".join(f"{w}: wall, CPU" for w in WAYS) + " |",
             "|---:|---:|" + "---:|" * len(WAYS)]
    for nbytes in args.bytes:
        for late_ms in args.late_ms:
            cells = []
            for way in WAYS:
                case = results[f"{nbytes} {late_ms:g} {way}"]
                cells.append(f"{statistics.median(case['wall']) * 1e6:.0f}, "
                             f"{statistics.median(case['cpu']) * 1e6:.0f}")
            lines.append(f"| {nbytes} | {late_ms:g} | " + " | ".join(cells) + " |")
    lines += ["", *footer("waits"), ""]
    return "\n".join(lines)


def plot(results: Dict, path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = sorted({" ".join(k.split(" ", 2)[:2]) for k in results},   # "bytes late way"
                   key=lambda c: [float(x) for x in c.split()])
    fig, ax = plt.subplots(figsize=(8, 3.8))
    grouped_bars(ax, [f"{c.split()[0]} B, late {c.split()[1]} ms" for c in cases],
                 {w: [statistics.median(results[f"{c} {w}"]["wall"]) * 1e6 for c in cases]
                  for w in WAYS})
    ax.set_ylabel("µs per wait (rank 0, median)")
    ax.set_title("Waiting for a small Iallreduce")
    ax.legend(fontsize=8)
    save_figure(fig, path)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.waits",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--bytes", type=int, nargs="+", default=[16, 65536])
    p.add_argument("--late-ms", type=float, nargs="+", default=[0, 1])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--repeats", type=int, default=200)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--timeout", type=int, default=600, help="seconds for the job")
    p.add_argument("--out", default=DIAGNOSTICS_OUT)
    p.add_argument("--name", default="waits")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.ranks < 2:
        p.error("--ranks must be at least 2: a wait needs another rank to wait for")
    if args.worker:
        from mpi4py import MPI
        results = worker(args)
        if MPI.COMM_WORLD.Get_rank() == 0:
            with open(args.result, "w") as f:
                json.dump(results, f)
        return
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    with tempfile.TemporaryDirectory(prefix="kvhybrid-waits-") as tmp:
        result = os.path.join(tmp, "result.json")
        forwarded = list(argv if argv is not None else sys.argv[1:])
        cmd = mpirun_command(args.ranks, "waits") + [
            sys.executable, "-m", "benchmarks.waits", "--worker", "--result", result, *forwarded]
        env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        log.info("waits: %d ranks, %d rounds ...", args.ranks, args.rounds)
        run_job(cmd, env, args.timeout, f"the waits job on {args.ranks} ranks", "waits")
        results = json.load(open(result))
    write_outputs(args.out, args.name, report(results, args), results, plot)


if __name__ == "__main__":
    main()
