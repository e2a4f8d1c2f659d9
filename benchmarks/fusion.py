"""Tensor fusion benchmark: many small keys per step, fused or one by one.

    python -m benchmarks.fusion --keys 200 --key-kb 64 --ranks 2 4

One step = summing ``--keys`` float32 keys of ``--key-kb`` KB across the ranks:

* ``store, key by key``: ``pushpull(k, grad)`` per key, as ``gluon.Trainer`` calls it;
* ``store, fused``: one ``pushpull(keys, grads)`` on separately allocated arrays (copied into
  a bucket and back);
* ``store, fused, gradients in one buffer``: the same call on arrays that are views into one
  buffer, as ``kvhybrid.DistributedTrainer`` lays out Gluon's gradients (no copies);
* ``MPI, key by key``: a raw mpi4py ``Allreduce`` per key on numpy buffers;
* ``MPI, one buffer``: one raw ``Allreduce`` of all the bytes (the floor for fusion);
* ``Horovod``: ``hvd.allreduce_`` per key, then a wait (Horovod fuses in its own thread).

Writes ``fusion.md``, ``fusion.json`` and ``fusion.png`` into ``--out``.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Dict, List

from .common import footer, grouped_bars, mpirun_command, run_job as run, save_figure, timed

log = logging.getLogger("benchmarks")

CASES = {"store_per_key": "hybrid-mpi, key by key (gluon.Trainer)",
         "store_fused": "hybrid-mpi, fused, separate arrays",
         "store_fused_views": "hybrid-mpi, fused, gradients in one buffer (DistributedTrainer)",
         "mpi_per_key": "MPI Allreduce, key by key",
         "mpi_one_buffer": "MPI Allreduce, one buffer",
         "horovod": "Horovod allreduce_ per key (its fusion)"}


def worker_mpi(args) -> Dict[str, List[float]]:
    import numpy as np
    import mxnet as mx
    import kvhybrid  # noqa: F401
    from mpi4py import MPI

    kv = mx.kv.create("hybrid-mpi")
    comm = MPI.COMM_WORLD
    n = args.key_kb * 1024 // 4
    keys = list(range(args.keys))
    grads = [mx.nd.ones((n,)) for _ in keys]
    bucket = mx.nd.ones((n * args.keys,))
    views = [bucket[k * n:(k + 1) * n] for k in keys]
    kv.init(keys, [mx.nd.zeros((n,)) for _ in keys])
    bufs = [np.ones(n, np.float32) for _ in keys]
    one = np.ones(n * args.keys, np.float32)

    def per_key():
        for k in keys:
            kv.pushpull(k, grads[k])

    def mpi_per_key():
        for b in bufs:
            comm.Allreduce(MPI.IN_PLACE, b, op=MPI.SUM)

    cases = {"store_per_key": per_key,
             "store_fused": lambda: kv.pushpull(keys, grads),
             "store_fused_views": lambda: kv.pushpull(keys, views),
             "mpi_per_key": mpi_per_key,
             "mpi_one_buffer": lambda: comm.Allreduce(MPI.IN_PLACE, one, op=MPI.SUM)}
    out = {}
    for name, fn in cases.items():
        out[name] = timed(fn, args.repeats, args.warmup, comm.Barrier)
    kv.close()
    return out


def worker_horovod(args) -> Dict[str, List[float]]:
    import mxnet as mx
    import horovod.mxnet as hvd
    from mpi4py import MPI

    hvd.init()
    n = args.key_kb * 1024 // 4
    grads = [mx.nd.ones((n,)) for _ in range(args.keys)]

    def step():
        for i, g in enumerate(grads):
            hvd.allreduce_(g, average=False, name=f"k{i}")
        mx.nd.waitall()

    return {"horovod": timed(step, args.repeats, args.warmup, MPI.COMM_WORLD.Barrier)}


def run_job(kind: str, ranks: int, args) -> Dict[str, List[float]]:
    with tempfile.TemporaryDirectory(prefix="kvhybrid-fusion-") as tmp:
        result = os.path.join(tmp, "result.json")
        cmd = mpirun_command(ranks, "fusion") + [
            sys.executable, "-m", "benchmarks.fusion", "--worker", kind, "--result", result,
            "--keys", str(args.keys), "--key-kb", str(args.key_kb), "--repeats",
            str(args.repeats), "--warmup", str(args.warmup)]
        env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                   OMP_NUM_THREADS="1")
        run(cmd, env, args.timeout, f"the {kind} job on {ranks} ranks", "fusion")
        return json.load(open(result))


def report(results: Dict, args) -> str:
    mb = args.keys * args.key_kb / 1024
    lines = ["# Tensor fusion: many small keys per step\n",
             f"{args.keys} float32 keys of {args.key_kb} KB ({mb:.1f} MB) summed across the "
             f"ranks; median of {args.repeats} steps on rank 0, in ms.\n",
             "| ranks | " + " | ".join(CASES[c] for c in CASES)
             + " | fused (one buffer) speed-up over key by key |",
             "|---" * (len(CASES) + 2) + "|"]
    for ranks, r in results.items():
        cells = [f"{r[c]:.2f}" if c in r else "–" for c in CASES]
        lines.append(f"| {ranks} | " + " | ".join(cells) +
                     f" | {r['store_per_key'] / r['store_fused_views']:.1f}× |")
    lines += ["", *footer("fusion"), ""]
    return "\n".join(lines)


def plot(results: Dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.8))
    ranks = list(results)
    grouped_bars(ax, [f"{r} ranks" for r in ranks],
                 {CASES[c]: [results[r].get(c, 0) for r in ranks] for c in CASES})
    ax.set_ylabel("ms per step (median)")
    ax.set_title("200 small keys per step")
    ax.legend(fontsize=7)
    save_figure(fig, path)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.fusion",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--keys", type=int, default=200)
    p.add_argument("--key-kb", type=int, default=64)
    p.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--no-horovod", action="store_true", help="skip the Horovod job")
    p.add_argument("--timeout", type=int, default=600, help="seconds per job")
    p.add_argument("--out", default="docs/benchmarks")
    p.add_argument("--worker", choices=["mpi", "horovod"], help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        from mpi4py import MPI
        times = (worker_mpi if args.worker == "mpi" else worker_horovod)(args)
        if MPI.COMM_WORLD.Get_rank() == 0:
            with open(args.result, "w") as f:
                json.dump(times, f)
        return
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    results: Dict[int, Dict[str, float]] = {}
    for ranks in args.ranks:
        raw: Dict[str, List[float]] = {}
        for kind in ["mpi"] + ([] if args.no_horovod else ["horovod"]):
            log.info("fusion: %s on %d ranks ...", kind, ranks)
            raw.update(run_job(kind, ranks, args))
        results[ranks] = {c: statistics.median(t) * 1e3 for c, t in raw.items()}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    text = report(results, args)
    (out / "fusion.md").write_text(text)
    (out / "fusion.json").write_text(json.dumps(
        {"args": {k: v for k, v in vars(args).items() if k not in ("worker", "result")},
         "results": results}, indent=1))
    plot(results, out / "fusion.png")
    print(text)


if __name__ == "__main__":
    main()
