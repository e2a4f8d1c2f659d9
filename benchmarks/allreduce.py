"""Allreduce benchmark: kvhybrid's algorithms and its store against MPI, Horovod and memory.

    python -m benchmarks.allreduce --sizes-mb 4 16 64 --ranks 2 4

For each rank count, one job per environment (an MPI library is tuned per job), all
jobs repeated ``--rounds`` times in turn so that a noisy minute hits every peer alike:

* ``kvhybrid``: started as ``kvhybrid-launch`` starts ranks (its environment and its
  Open MPI allreduce rules); per size, call by call in turn: each algorithm on NDArray
  memory (``mpi``, ``ring``, ``shm``, and ``hierarchical`` over two emulated hosts),
  and the store's ``pushpull`` on an NDArray with the algorithm auto settled on (after
  its trial calls);
* ``Open MPI default``: ``Allreduce`` in place on NDArray memory, plain ``mpirun``;
* ``Open MPI tuned``: the same under ``MALLOC_MMAP_MAX_=0
  MALLOC_TRIM_THRESHOLD_=4294967295`` and the segmented ring (``--mca
  coll_tuned_allreduce_algorithm 5``, 1 MB segments) forced for every size;
* ``Horovod``: ``hvd.allreduce_`` on an NDArray, plain ``mpirun``;
* ``memory bound``: every rank at once copying / adding arrays of the size (under the
  launcher's huge pages).

Bus bandwidth is NCCL's: ``bytes / time * 2 (P-1) / P``. Writes ``allreduce.md``,
``allreduce.json`` and ``allreduce.png`` into ``--out``.
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
from typing import Dict, List

from .common import footer, run_job, save_figure, save_worker_result, timed, write_outputs

log = logging.getLogger("benchmarks")

MB = 2 ** 20

#: column key -> label, in table order
COLUMNS = {
    "memory_copy": "memory bound: copy",
    "memory_add": "memory bound: add",
    "ompi_default": "Open MPI default",
    "ompi_tuned": "Open MPI tuned",
    "horovod": "Horovod",
    "alg_mpi": "kvhybrid: mpi (launcher's rules)",
    "alg_ring": "kvhybrid: ring",
    "alg_shm": "kvhybrid: shm",
    "alg_hierarchical": "kvhybrid: hierarchical (2 emulated hosts)",
    "store": "**kvhybrid store pushpull (auto)**",
}

TUNED_ENV = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": "4294967295"}
TUNED_MCA = ["--mca", "coll_tuned_use_dynamic_rules", "1",
             "--mca", "coll_tuned_allreduce_algorithm", "5",
             "--mca", "coll_tuned_allreduce_algorithm_segmentsize", "1048576"]


# -- the measuring side (runs inside the jobs) --------------------------------------------
def _zeros_view(n: int):
    """An NDArray of ``n`` float32 zeros and a numpy view of its memory (summing zeros
    keeps the values finite however often it is repeated)."""
    import mxnet as mx
    from kvhybrid.tensor_collectives.ndarray_view import host_view
    arr = mx.nd.zeros((n,))
    arr.wait_to_read()
    return arr, host_view(arr)


def _measure(cases: Dict, args, barrier) -> Dict[str, List[float]]:
    """Each case's times, call by call in turn so that noise hits all alike; each timed call
    right after an untimed one of the same case, so that it finds its arrays in the cache
    as a job of one case does (and a training step's sum finds its gradient): after the
    other cases' calls a 4 MB sum took twice as long, for the store and for Open MPI alike."""
    times = {name: [] for name in cases}
    for fn in cases.values():
        timed(fn, 0, args.warmup, barrier)
    for _ in range(args.repeats):
        for name, fn in cases.items():
            times[name] += timed(fn, 1, 1, barrier)
    return times


def worker_kvhybrid(args) -> Dict:
    import mxnet as mx
    import kvhybrid  # noqa: F401
    from kvhybrid.tensor_collectives.algorithms import TRIALS, Algorithms

    kv = mx.kv.create("hybrid-mpi")
    group = kv.group
    algos = group.algorithms
    size = group.size
    emulated = Algorithms(group, emulate_node_size=size // 2) if size >= 2 else None
    results, chosen = {}, {}
    for key, size_mb in enumerate(args.sizes_mb):
        n = int(size_mb * MB) // 4
        grad, view = _zeros_view(n)
        kv.init(key, mx.nd.zeros((n,)))
        cases = {f"alg_{name}": (lambda name=name: algos.run(name, view))
                 for name in ("mpi", "ring", "shm")}
        if emulated is not None:
            cases["alg_hierarchical"] = lambda: emulated.run("hierarchical", view)
        def store(key=key, grad=grad) -> None:
            kv.pushpull(key, grad)
            grad.wait_to_read()   # (the engine path returns at once; the sum is done here)

        cases["store"] = store
        for _ in range(TRIALS * len(algos.candidates()) + 1):  # let auto settle first
            store()
        # the store sums on its communication thread's group when it has one
        summing = kv.engine.group.algorithms if kv.engine is not None else algos
        chosen[str(size_mb)] = summing.select(n * 4)
        results[str(size_mb)] = _measure(cases, args, group.comm.Barrier)
    kv.close()
    return {"times": results, "selected": chosen} if group.rank == 0 else {}


def worker_mpi(args) -> Dict:
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    results = {}
    for size_mb in args.sizes_mb:
        _, view = _zeros_view(int(size_mb * MB) // 4)
        results[str(size_mb)] = _measure(
            {args.column: lambda: comm.Allreduce(MPI.IN_PLACE, view, op=MPI.SUM)}, args, comm.Barrier)
    return {"times": results} if comm.rank == 0 else {}


def worker_horovod(args) -> Dict:
    import horovod.mxnet as hvd
    from mpi4py import MPI

    hvd.init()
    results = {}
    for size_mb in args.sizes_mb:
        grad, _ = _zeros_view(int(size_mb * MB) // 4)

        def allreduce():
            hvd.allreduce_(grad, average=False, name=f"g{size_mb}")
            grad.wait_to_read()

        results[str(size_mb)] = _measure({"horovod": allreduce}, args, MPI.COMM_WORLD.Barrier)
    return {"times": results} if hvd.rank() == 0 else {}


def worker_memory(args) -> Dict:
    import numpy as np
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    results = {}
    for size_mb in args.sizes_mb:
        n = int(size_mb * MB) // 4
        # ones, not zeros: untouched zero pages would all read from one cached page
        a, b = np.ones(n, dtype=np.float32), np.ones(n, dtype=np.float32)
        results[str(size_mb)] = _measure({"memory_copy": lambda: np.copyto(b, a),
                                          "memory_add": lambda: np.add(a, b, out=b)},
                                         args, comm.Barrier)
    return {"times": results} if comm.rank == 0 else {}


WORKERS = {"kvhybrid": worker_kvhybrid, "ompi_default": worker_mpi, "ompi_tuned": worker_mpi,
           "horovod": worker_horovod, "memory": worker_memory}


# -- the driving side ---------------------------------------------------------------------------
def _plain_env() -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OMPI_MCA_", "KVHYBRID_", "MALLOC_")) and k != "GLIBC_TUNABLES"}
    env.update({"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
                "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"})
    return env


def _command(kind: str, ranks: int, args, result: str) -> tuple:
    """(argv, env) of one job, started as its peer would be."""
    from kvhybrid.launch.mpirun import (DEFAULT_ENV, MpiJob, build_command, find_mpirun, flavour,
                                        job_env)
    mpirun = find_mpirun()
    openmpi = flavour(mpirun) == "openmpi"
    worker = [sys.executable, "-m", "benchmarks.allreduce", "--worker", kind, "--result",
              result, "--sizes-mb", *map(str, args.sizes_mb), "--repeats", str(args.repeats),
              "--warmup", str(args.warmup)]
    env = _plain_env()
    if kind == "memory":  # the bound for the store: under the launcher's huge pages
        env.update(DEFAULT_ENV)
    if kind == "kvhybrid":  # exactly what kvhybrid-launch hands its ranks
        full = job_env({})
        full.update({k: env[k] for k in ("OMPI_ALLOW_RUN_AS_ROOT", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM",
                                         "OMP_NUM_THREADS")})
        return build_command(MpiJob(ranks, worker), mpirun, flavour(mpirun), full), full
    cmd = [mpirun, "-np", str(ranks)] + (["--oversubscribe", "--bind-to", "none"] if openmpi else [])
    if kind == "ompi_tuned":
        if not openmpi:
            return None, None
        env.update(TUNED_ENV)
        cmd += TUNED_MCA + [x for k in TUNED_ENV for x in ("-x", k)]
    return cmd + worker, env


def measure(args) -> Dict:
    """``{ranks: {"times": {size: {column: [s]}}, "selected": {size: [algorithm per round]}}}``"""
    kinds = ["memory", "ompi_default", "ompi_tuned"] + ([] if args.no_horovod else ["horovod"]) \
        + ["kvhybrid"]
    out: Dict[str, Dict] = {}
    with tempfile.TemporaryDirectory(prefix="kvhybrid-allreduce-") as tmp:
        for ranks in args.ranks:
            entry = out.setdefault(str(ranks), {"times": {}, "selected": {}})
            for rnd in range(args.rounds):
                for kind in kinds:
                    result = os.path.join(tmp, f"{ranks}-{kind}-{rnd}.json")
                    cmd, env = _command(kind, ranks, args, result)
                    if cmd is None:
                        continue
                    t0 = time.monotonic()
                    log.info("allreduce: %d ranks, round %d/%d: %s ...", ranks, rnd + 1,
                             args.rounds, kind)
                    run_job(cmd, env, args.timeout, f"the {kind} job on {ranks} ranks", "allreduce")
                    got = json.load(open(result))
                    for size, cols in got["times"].items():
                        for col, times in cols.items():
                            entry["times"].setdefault(size, {}).setdefault(col, []).extend(times)
                    for size, name in got.get("selected", {}).items():
                        entry["selected"].setdefault(size, []).append(name)
                    log.info("allreduce: %s done in %.0f s", kind, time.monotonic() - t0)
    return out


def medians(results: Dict) -> Dict:
    return {r: {s: {c: statistics.median(t) * 1e3 for c, t in cols.items()}
                for s, cols in e["times"].items()} for r, e in results.items()}


def bus_gbs(size_mb: float, ranks: int, ms: float) -> float:
    return size_mb * MB / (ms / 1e3) * 2 * (ranks - 1) / ranks / 1e9


def targets(med: Dict, results: Dict) -> List[str]:
    """The store's targets against its peers, each with its measured ratio and verdict."""
    lines = ["| target | ranks | key | measured | verdict |", "|---|---|---|---|---|"]

    def row(what, ranks, size, value, ok, fmt="{:.2f}×"):
        lines.append(f"| {what} | {ranks} | {float(size):g} MB | {fmt.format(value)} | "
                     f"{'met' if ok else '**missed**'} |")

    for ranks, sizes in med.items():
        for size in sorted(sizes, key=float):
            m = sizes[size]
            st = m["store"]
            if "ompi_tuned" in m:
                row("store ≥ 0.95× Open MPI tuned (tuned time / store time)", ranks, size,
                    m["ompi_tuned"] / st, m["ompi_tuned"] / st >= 0.95)
            if float(size) == max(map(float, sizes)):
                row("store ≥ 2× Open MPI default", ranks, size, m["ompi_default"] / st,
                    m["ompi_default"] / st >= 2)
                if "horovod" in m:
                    row("store ≥ 2× Horovod", ranks, size, m["horovod"] / st, m["horovod"] / st >= 2)
                if ranks == "2":
                    row("store ≤ 1.5× the two-core memory-bound add", ranks, size,
                        st / m["memory_add"], st / m["memory_add"] <= 1.5)
    return lines


def _choices(names: List[str]) -> str:
    """What auto settled on in each round: 'shm' or 'shm ×2, mpi ×1'."""
    counts = {n: names.count(n) for n in dict.fromkeys(names)}
    if len(counts) == 1:
        return next(iter(counts))
    return ", ".join(f"{n} ×{c}" for n, c in counts.items()) or "?"


def report(results: Dict, args) -> str:
    med = medians(results)
    cols = [c for c in COLUMNS if any(c in m for s in med.values() for m in s.values())]
    lines = ["# Allreduce on one machine: kvhybrid against MPI, Horovod and the memory bound", "",
             f"float32 arrays in NDArray memory. Median of {args.repeats * args.rounds} calls "
             f"({args.rounds} rounds of jobs × {args.repeats}, after {args.warmup} warm-up calls "
             "each; the cases of a job in turn, each timed call right after an untimed one of "
             "its own), ms, with the bus bandwidth in GB/s (NCCL's: bytes / time × 2(P−1)/P) "
             "below it. Memory bound: every rank copying / adding at once.", "",
             "| ranks | key | " + " | ".join(COLUMNS[c] for c in cols) + " | auto chose |",
             "|---|---|" + "---|" * (len(cols) + 1)]
    for ranks, sizes in med.items():
        for size in sorted(sizes, key=float):
            m = sizes[size]
            cells = [f"{m[c]:.2f}<br>{bus_gbs(float(size), int(ranks), m[c]):.1f} GB/s"
                     if c in m and not c.startswith("memory") else (f"{m[c]:.2f}" if c in m else "–")
                     for c in cols]
            lines.append(f"| {ranks} | {float(size):g} MB | " + " | ".join(cells)
                         + f" | {_choices(results[ranks]['selected'].get(size, []))} |")
    lines += ["", "## Targets (same run)", ""] + targets(med, results)
    lines += ["", "Environments: *Open MPI default*: plain `mpirun --oversubscribe --bind-to none`; "
              "*tuned*: the same plus " + " ".join(f"{k}={v}" for k, v in TUNED_ENV.items())
              + " `" + " ".join(TUNED_MCA) + "`; *kvhybrid*: the command `kvhybrid-launch` builds "
              "(`GLIBC_TUNABLES=glibc.malloc.hugetlb=1`, launch/ompi_allreduce_rules.conf); "
              "Horovod under plain mpirun."] + footer("allreduce")
    return "\n".join(lines) + "\n"


def plot(results: Dict, path: Path) -> None:
    """Time per call against key size, one panel per rank count (as MXNET-MPI's Figs. 17-19)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    med = medians(results)
    fig, axes = plt.subplots(1, len(med), figsize=(6.2 * len(med), 4.6), squeeze=False)
    palette = iter([c for i, c in enumerate(plt.get_cmap("tab10").colors) if i != 3])  # red: store
    colors = {c: ("#d62728" if c == "store" else "black" if c.startswith("memory") else next(palette))
              for c in COLUMNS}
    for ax, (ranks, sizes) in zip(axes[0], med.items()):
        xs = sorted(sizes, key=float)
        for col, label in COLUMNS.items():
            if not all(col in sizes[s] for s in xs):
                continue
            style = dict(lw=3.2, zorder=5) if col == "store" else \
                dict(ls=":" if col == "memory_copy" else "--", lw=1.2) if col.startswith("memory") \
                else dict(lw=1.3)
            ax.plot([float(s) for s in xs], [sizes[s][col] for s in xs], marker="o",
                    label=label.strip("*"), color=colors[col], **style)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks([float(s) for s in xs], [f"{float(s):g}" for s in xs])
        ax.set_xlabel("key size (MB, float32)")
        ax.set_ylabel("ms per allreduce (median, lower is better)")
        ax.set_title(f"{ranks} ranks on {os.cpu_count()} cores")
        ax.grid(alpha=0.3, which="both")
    axes[0][0].legend(fontsize=7, loc="upper left")
    save_figure(fig, path)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes-mb", type=float, nargs="+", default=[4, 16, 64])
    p.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    p.add_argument("--repeats", type=int, default=20, help="timed calls per job and case")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--rounds", type=int, default=3, help="times every job is run, in turn")
    p.add_argument("--timeout", type=float, default=600, help="seconds per job")
    p.add_argument("--out", default="docs/benchmarks", help="folder for allreduce.{md,json,png}")
    p.add_argument("--no-horovod", action="store_true", help="skip Horovod (if not installed)")
    p.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if min(args.ranks) < 2:
        p.error("--ranks must be at least 2")
    if args.worker:
        args.column = args.worker
        save_worker_result(WORKERS[args.worker](args), args.result)
        return
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    results = measure(args)
    write_outputs(args.out, "allreduce", report(results, args), results, plot)


if __name__ == "__main__":
    main()
