"""pushpull benchmark: hybrid-mpi against raw MPI Allreduce, Horovod and MXNet's dist_sync.

One command runs every peer on this machine, in one run, on the same key sizes:

    python -m benchmarks.pushpull --sizes-mb 4 64 --ranks 2

* ``mpi``: in one mpirun job, alternating call by call: raw mpi4py
  ``Allreduce`` (in place, and into a second buffer) on numpy buffers of the
  same bytes, and the store's ``pushpull`` on NDArrays (in place, as
  ``gluon.Trainer`` calls it with update_on_kvstore=False, and into ``out``);
* ``horovod``: ``hvd.allreduce_`` in its own mpirun job (its threads would slow
  the others down);
* ``dist_sync``: MXNet's parameter server — scheduler, as many servers as
  ranks, and ranks workers on loopback — timing ``push`` + ``pull``;
* ``memory``: ``np.copyto`` and ``np.add`` of the same bytes in one process.

Writes ``pushpull.md``, ``pushpull.json`` and ``pushpull.png`` into ``--out``
and prints the table with the ratios. Medians of ``--repeats`` timed calls
after ``--warmup`` untimed ones.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List

from .common import DIAGNOSTICS_OUT, footer, mpirun_command, save_worker_result, timed, write_outputs

log = logging.getLogger("benchmarks")

MB = 2 ** 20


# -- the measuring side (runs inside the jobs) --------------------------------------------
def _mpi_cases(kv, comm, MPI, key: int, n: int) -> Dict:
    """The calls compared at one key size, on buffers of ``n`` float32."""
    import numpy as np
    import mxnet as mx
    from kvhybrid.tensor_collectives.ndarray_view import host_view

    buf = np.ones(n, dtype=np.float32)
    recv = np.empty_like(buf)
    raw_nd = mx.nd.ones((n,))
    raw_nd.wait_to_read()
    raw_view = host_view(raw_nd)   # the same kind of memory the store works on
    grad, out = mx.nd.ones((n,)), mx.nd.zeros((n,))
    kv.init(key, mx.nd.zeros((n,)))
    return {
        "mpi_allreduce_inplace": lambda: comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM),
        "mpi_allreduce": lambda: comm.Allreduce(buf, recv, op=MPI.SUM),
        "mpi_allreduce_ndarray": lambda: comm.Allreduce(MPI.IN_PLACE, raw_view, op=MPI.SUM),
        "hybrid_pushpull_inplace": lambda: kv.pushpull(key, grad),
        "hybrid_pushpull_out": lambda: kv.pushpull(key, grad, out=out),
    }


def worker_mpi(sizes_mb: List[float], repeats: int, warmup: int) -> Dict:
    import mxnet as mx
    import kvhybrid  # noqa: F401
    from mpi4py import MPI

    kv = mx.kv.create("hybrid-mpi")
    comm = MPI.COMM_WORLD
    results: Dict[str, Dict[str, List[float]]] = {}
    for key, size_mb in enumerate(sizes_mb):
        cases = _mpi_cases(kv, comm, MPI, key, int(size_mb * MB) // 4)
        times = {name: [] for name in cases}
        for fn in cases.values():
            timed(fn, 0, warmup, comm.Barrier)
        for _ in range(repeats):  # alternate call by call so that noise hits all alike
            for name, fn in cases.items():
                times[name] += timed(fn, 1, 0, comm.Barrier)
        results[str(size_mb)] = times
    kv.close()
    return results if comm.rank == 0 else {}


def worker_horovod(sizes_mb: List[float], repeats: int, warmup: int) -> Dict:
    import mxnet as mx
    import horovod.mxnet as hvd

    hvd.init()
    results = {}
    for size_mb in sizes_mb:
        n = int(size_mb * MB) // 4
        grad = mx.nd.ones((n,))

        def allreduce():
            hvd.allreduce_(grad, average=False, name=f"g{size_mb}")
            grad.wait_to_read()

        barrier = lambda: hvd.allreduce(mx.nd.ones((1,)), name="barrier").wait_to_read()  # noqa: E731
        results[str(size_mb)] = {"horovod_allreduce": timed(allreduce, repeats, warmup, barrier)}
    return results if hvd.rank() == 0 else {}


def _push_pull(kv, key: int, grad):
    def call():
        kv.push(key, grad)
        kv.pull(key, out=grad)
        grad.wait_to_read()
    return call


def worker_dist_sync(sizes_mb: List[float], repeats: int, warmup: int) -> Dict:
    import mxnet as mx

    kv = mx.kv.create("dist_sync")
    results = {}
    for key, size_mb in enumerate(sizes_mb):
        n = int(size_mb * MB) // 4
        kv.init(key, mx.nd.zeros((n,)))
        results[str(size_mb)] = {"dist_sync_push_pull": timed(
            _push_pull(kv, key, mx.nd.ones((n,))), repeats, warmup, kv._barrier)}
    rank = kv.rank
    del kv  # release the ps-lite handle now: kept into teardown it aborts the process
    return results if rank == 0 else {}


def worker_memory(sizes_mb: List[float], repeats: int, warmup: int) -> Dict:
    import numpy as np

    results = {}
    for size_mb in sizes_mb:
        n = int(size_mb * MB) // 4
        a, b = np.ones(n, dtype=np.float32), np.ones(n, dtype=np.float32)
        results[str(size_mb)] = {
            "memory_copy": timed(lambda: np.copyto(b, a), repeats, warmup, lambda: None),
            "memory_add": timed(lambda: np.add(a, b, out=b), repeats, warmup, lambda: None),
        }
    return results


WORKERS = {"mpi": worker_mpi, "horovod": worker_horovod, "dist_sync": worker_dist_sync,
           "memory": worker_memory}


# -- the driving side ---------------------------------------------------------------------------
#: Environments every peer is measured under. ``hugepages`` makes glibc's malloc
#: back large allocations (MXNet's arrays, MPI's buffers) with transparent huge
#: pages; numpy already does so for its own arrays.
VARIANTS = {"default": {}, "hugepages": {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}}


def _env(variant: str = "default") -> Dict[str, str]:
    env = dict(os.environ)
    env.update({"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
                "OMP_NUM_THREADS": env.get("OMP_NUM_THREADS", "1"), "PYTHONUNBUFFERED": "1"})
    env.update(VARIANTS[variant])
    return env


def _worker_cmd(kind: str, args, out: str) -> List[str]:
    return [sys.executable, "-m", "benchmarks.pushpull", "--worker", kind, "--result", out,
            "--sizes-mb", *map(str, args.sizes_mb), "--repeats", str(args.repeats),
            "--warmup", str(args.warmup)]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(cmd, env, timeout, what):
    try:
        proc = subprocess.run(cmd, env=env, timeout=timeout, capture_output=True, text=True)
    except subprocess.TimeoutExpired:
        raise SystemExit(f"pushpull: {what} still running after {timeout:.0f} s (--timeout)")
    if proc.returncode != 0:
        raise SystemExit(f"pushpull: {what} failed (exit {proc.returncode}):\n"
                         f"{(proc.stdout + proc.stderr)[-3000:]}")


def run_dist_sync(args, out: str, env: Dict[str, str]) -> None:
    """Scheduler, servers and workers of MXNet's parameter server on loopback."""
    env = dict(env)
    env.update({"DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_PS_ROOT_PORT": str(_free_port()),
                "DMLC_NUM_SERVER": str(args.ranks), "DMLC_NUM_WORKER": str(args.ranks),
                "PS_VERBOSE": "0"})
    procs, workers = [], []
    try:
        for role, count in (("scheduler", 1), ("server", args.ranks)):
            for _ in range(count):
                procs.append(subprocess.Popen([sys.executable, "-c", "import mxnet"],
                                              env={**env, "DMLC_ROLE": role},
                                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        workers = [subprocess.Popen(_worker_cmd("dist_sync", args, out),
                                    env={**env, "DMLC_ROLE": "worker"},
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                   for _ in range(args.ranks)]
        deadline = time.monotonic() + args.timeout
        for w in workers:
            try:
                output, _ = w.communicate(timeout=max(1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise SystemExit(f"pushpull: dist_sync workers still running after {args.timeout} s")
            if w.returncode != 0:
                raise SystemExit(f"pushpull: a dist_sync worker failed:\n{output[-3000:]}")
    finally:
        for p in procs + workers:
            if p.poll() is None:
                p.kill()
            p.wait()


def measure(args) -> Dict:
    """``{variant: {size: {case: [seconds]}}}``"""
    kinds = ["memory", "mpi"] + ([] if args.no_horovod else ["horovod"]) + ["dist_sync"]
    results: Dict[str, Dict[str, Dict[str, List[float]]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for variant in args.variants:
            env = _env(variant)
            for kind in kinds:
                out = os.path.join(tmp, f"{variant}-{kind}.json")
                log.info("pushpull: measuring %s (%s environment) ...", kind, variant)
                t0 = time.monotonic()
                if kind == "dist_sync":
                    run_dist_sync(args, out, env)
                elif kind == "memory":
                    _run(_worker_cmd(kind, args, out), env, args.timeout, kind)
                else:
                    _run(mpirun_command(args.ranks, "pushpull") + _worker_cmd(kind, args, out),
                         env, args.timeout, kind)
                log.info("pushpull: %s done in %.0f s", kind, time.monotonic() - t0)
                for size, cases in json.load(open(out)).items():
                    results.setdefault(variant, {}).setdefault(size, {}).update(cases)
    return results


COLUMNS = [
    ("memory_copy", "memcpy, 1 proc"), ("memory_add", "add, 1 proc"),
    ("mpi_allreduce_inplace", "MPI Allreduce in place (numpy)"),
    ("mpi_allreduce", "MPI Allreduce (numpy, 2 buffers)"),
    ("mpi_allreduce_ndarray", "MPI Allreduce in place (NDArray memory)"),
    ("hybrid_pushpull_inplace", "**hybrid-mpi pushpull**"),
    ("hybrid_pushpull_out", "hybrid-mpi pushpull(out=)"),
    ("horovod_allreduce", "Horovod allreduce_"), ("dist_sync_push_pull", "dist_sync push+pull"),
]


def _medians(results: Dict) -> Dict:
    return {v: {s: {k: statistics.median(t) * 1e3 for k, t in c.items()} for s, c in sizes.items()}
            for v, sizes in results.items()}


def report(results: Dict, args) -> str:
    med = _medians(results)
    lines = [f"# pushpull on {args.ranks} ranks, one machine", "",
             f"Median ms per call of {args.repeats} calls (after {args.warmup} warm-up calls), "
             "float32 keys. Every column of a row was measured in the same run.", "",
             "| environment | key | " + " | ".join(t for _, t in COLUMNS) + " |",
             "|---|---|" + "---|" * len(COLUMNS)]
    ratios = ["", "| environment | key | store overhead vs raw Allreduce on the same memory | "
              "vs raw Allreduce on numpy | dist_sync / hybrid-mpi | Horovod / hybrid-mpi |",
              "|---|---|---|---|---|---|"]
    for variant, sizes in med.items():
        for size in sorted(sizes, key=float):
            m = sizes[size]
            lines.append(f"| {variant} | {float(size):g} MB | "
                         + " | ".join(f"{m[k]:.2f}" if k in m else "-" for k, _ in COLUMNS) + " |")
            hy = m["hybrid_pushpull_inplace"]
            ratio = lambda k: f"{m[k] / hy:.2f}x" if k in m else "-"  # noqa: E731
            ratios.append(f"| {variant} | {float(size):g} MB | "
                          f"{100 * (hy / m['mpi_allreduce_ndarray'] - 1):+.1f} % | "
                          f"{100 * (hy / m['mpi_allreduce_inplace'] - 1):+.1f} % | "
                          f"{ratio('dist_sync_push_pull')} | {ratio('horovod_allreduce')} |")
    env_text = "; ".join(f"`{v}`: {' '.join(f'{k}={x}' for k, x in e.items()) or 'as is'}"
                         for v, e in VARIANTS.items() if v in med)
    lines += ratios + ["", f"Environments: {env_text}. mpirun without tuning flags."] \
        + footer("pushpull")
    return "\n".join(lines) + "\n"


def plot(results: Dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    med = _medians(results)
    panels = [(v, s) for v in med for s in sorted(med[v], key=float)]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels), 4.2), squeeze=False,
                             sharey=True)
    titles = [t.strip("*") for _, t in COLUMNS]
    for ax, (variant, size) in zip(axes[0], panels):
        m = med[variant][size]
        vals = [m.get(k, 0.0) for k, _ in COLUMNS]
        colors = ["#d62728" if k.startswith("hybrid") else "#7f7f7f" for k, _ in COLUMNS]
        ax.barh(titles, vals, color=colors)
        for y, v in enumerate(vals):
            if v:
                ax.text(v, y, f" {v:.1f}", va="center", fontsize=7)
        ax.set_title(f"{float(size):g} MB, {variant}")
        ax.set_xlabel("ms per call (median; lower is better)")
        ax.set_xscale("log")
    axes[0][0].invert_yaxis()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes-mb", type=float, nargs="+", default=[4, 64])
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--timeout", type=float, default=600, help="seconds per job")
    p.add_argument("--out", default=DIAGNOSTICS_OUT, help="folder for pushpull.{md,json,png}")
    p.add_argument("--no-horovod", action="store_true", help="skip Horovod (if not installed)")
    p.add_argument("--variants", nargs="+", choices=sorted(VARIANTS), default=list(VARIANTS),
                   help="environments to measure under")
    p.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.ranks < 2:
        p.error("--ranks must be at least 2")
    if args.worker:
        save_worker_result(WORKERS[args.worker](args.sizes_mb, args.repeats, args.warmup), args.result)
        return
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    results = measure(args)
    write_outputs(args.out, "pushpull", report(results, args), results, plot)


if __name__ == "__main__":
    main()
