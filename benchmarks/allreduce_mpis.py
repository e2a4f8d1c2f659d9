"""The store's dense pushpull under each MPI it runs with, against that MPI's own Allreduce.

    python -m benchmarks.allreduce_mpis --sizes-mb 4 64 --ranks 2 4 --rounds 3

MPIs: the one first on this PATH (Open MPI 4 here), and those installed beside it under
``.venv`` (Open MPI 5 in ``.venv/ompi5``, MPICH in ``.venv/mpich``, Intel MPI in
``.venv/impi``: scripts/run_tests.sh installs them from their pip wheels), each put first on
PATH and LD_LIBRARY_PATH for its jobs, as a user of it would. Per MPI and rank count, each
round runs three jobs, their order rotated between rounds:

* ``store``: ``kv.pushpull`` of a float32 key of each size on the default (engine) path,
  started with the command line ``kvhybrid-launch`` writes for that MPI;
* ``mpi``: ``MPI_Allreduce`` in place on NDArray memory under that MPI's plain ``mpirun``;
* ``mpi_launcher``: the same under the store's command line (its huge pages, and with Open
  MPI its allreduce rules): what of the difference is the store's own.

Writes ``allreduce_mpis.md`` and ``.json`` into ``--out``: the median ms of each, and the
ratios MPI time ÷ store time (above 1: the store is faster) with their range over the rounds.
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
from typing import Dict, List, Optional, Tuple

from .allreduce import MB, _measure, _plain_env, _zeros_view, worker_mpi
from .common import footer, run_job, save_worker_result, write_outputs

log = logging.getLogger("benchmarks")

ROOT = Path(__file__).resolve().parent.parent
#: name -> the prefix its pip wheel was installed under (None: this PATH's mpirun)
BESIDE = {"Open MPI 5": ROOT / ".venv" / "ompi5", "MPICH": ROOT / ".venv" / "mpich",
          "Intel MPI": ROOT / ".venv" / "impi"}


def worker_store(args) -> Dict:
    import mxnet as mx
    import kvhybrid  # noqa: F401
    from kvhybrid.tensor_collectives.algorithms import TRIALS

    kv = mx.kv.create("hybrid-mpi")
    results = {}
    for key, size_mb in enumerate(args.sizes_mb):
        grad, _ = _zeros_view(int(size_mb * MB) // 4)
        kv.init(key, mx.nd.zeros(grad.shape))

        def store(key=key, grad=grad) -> None:
            kv.pushpull(key, grad)
            grad.wait_to_read()   # (the engine path returns at once; the sum is done here)

        for _ in range(TRIALS * 4 + 1):   # let the algorithm settle first
            store()
        results[str(size_mb)] = _measure({"store": store}, args, kv.group.comm.Barrier)
    rank = kv.group.rank
    kv.close()
    return {"times": results} if rank == 0 else {}


def installed() -> List[Tuple[str, Dict[str, str]]]:
    """(name, environment) of each MPI found: this PATH's, then those beside it."""
    from kvhybrid.launch.mpirun import implementation
    found = []
    for name, prefix in [("this PATH's", None), *BESIDE.items()]:
        env = _plain_env()
        if prefix is not None:
            if not (prefix / "bin" / "mpirun").exists():
                log.info("allreduce_mpis: %s is not installed under %s: left out", name, prefix)
                continue
            env["PATH"] = f"{prefix / 'bin'}{os.pathsep}{env.get('PATH', '')}"
            env["LD_LIBRARY_PATH"] = f"{prefix / 'lib'}{os.pathsep}{env.get('LD_LIBRARY_PATH', '')}"
        found.append((str(implementation(_which(env))), env))
    return found


def _which(env: Dict[str, str]) -> str:
    import shutil
    path = shutil.which("mpirun", path=env["PATH"])
    if path is None:
        raise SystemExit("allreduce_mpis: no mpirun on PATH")
    return path


def _command(kind: str, ranks: int, env: Dict[str, str], args, result: str):
    from kvhybrid.launch.mpirun import MpiJob, build_command, flavour, job_env
    mpirun = _which(env)
    worker = [sys.executable, "-m", "benchmarks.allreduce_mpis", "--worker", kind, "--result",
              result, "--sizes-mb", *map(str, args.sizes_mb), "--repeats", str(args.repeats),
              "--warmup", str(args.warmup)]
    if kind in ("store", "mpi_launcher"):   # what kvhybrid-launch hands its ranks
        full = {**job_env({}), **env}
        return build_command(MpiJob(ranks, worker), mpirun, flavour(mpirun), full), full
    openmpi = flavour(mpirun) == "openmpi"
    return [mpirun, "-np", str(ranks), *(["--oversubscribe", "--bind-to", "none"]
                                          if openmpi else []), *worker], env


def measure(args) -> Dict:
    """``{mpi: {ranks: {size: {kind: [ms per round]}}}}`` (each job's median call)."""
    out: Dict[str, Dict] = {}
    with tempfile.TemporaryDirectory(prefix="kvhybrid-mpis-") as tmp:
        for name, env in installed():
            for ranks in args.ranks:
                entry = out.setdefault(name, {}).setdefault(str(ranks), {})
                for rnd in range(args.rounds):
                    kinds = KINDS[rnd % 3:] + KINDS[:rnd % 3]
                    for kind in kinds:
                        result = os.path.join(tmp, f"{len(out)}-{ranks}-{kind}-{rnd}.json")
                        cmd, job_env_ = _command(kind, ranks, env, args, result)
                        log.info("allreduce_mpis: %s, %d ranks, round %d/%d: %s", name, ranks,
                                 rnd + 1, args.rounds, kind)
                        run_job(cmd, job_env_, args.timeout, f"the {kind} job of {name} on "
                                f"{ranks} ranks", "allreduce_mpis")
                        for size, cols in json.load(open(result))["times"].items():
                            times = next(iter(cols.values()))
                            entry.setdefault(size, {}).setdefault(kind, []).append(
                                statistics.median(times) * 1e3)
    return out


def report(results: Dict, args, argv: Optional[List[str]] = None,
           measured: Optional[str] = None) -> str:
    lines = ["# The store's pushpull under each MPI, against that MPI's own Allreduce", "",
             f"float32 keys, {args.rounds} rounds (the three jobs' order rotated), "
             f"{args.repeats} timed calls a job after {args.warmup} warm-up ones: ms per call "
             "(median over the rounds of each job's median), and MPI ÷ store: the MPI's time ÷ "
             "the store's in the same round, median over the rounds (range); above 1 the "
             "store is faster. *Plain*: the MPI's `mpirun` as it comes; *launcher's line*: "
             "under the store's command line (huge pages; Open MPI: its allreduce rules), "
             "so that only the store's own work differs.", "",
             "| MPI | ranks | key | store ms | MPI_Allreduce ms, plain | the same, launcher's "
             "line | plain ÷ store | launcher's line ÷ store |",
             "|---|---|---|---:|---:|---:|---:|---:|"]
    for name, per_ranks in results.items():
        for ranks, sizes in per_ranks.items():
            for size in sorted(sizes, key=float):
                store = sizes[size]["store"]
                cells = [f"{statistics.median(sizes[size][k]):.2f}" for k in KINDS]
                for kind in KINDS[1:]:
                    ratios = sorted(m / s for m, s in zip(sizes[size][kind], store))
                    cells.append(f"{statistics.median(ratios):.2f}× ({ratios[0]:.2f}–"
                                 f"{ratios[-1]:.2f})")
                lines.append(f"| {name} | {ranks} | {float(size):g} MB | " + " | ".join(cells)
                             + " |")
    lines += ["", "The store's jobs run under the command line `kvhybrid-launch` writes for "
              "that MPI; the plain MPI's under its `mpirun` alone (Open MPI: `--oversubscribe "
              "--bind-to none`)."]
    return "\n".join(lines + footer("allreduce_mpis", argv, measured)) + "\n"


WORKERS = {"store": worker_store, "mpi": worker_mpi, "mpi_launcher": worker_mpi}
#: the jobs of a round, in their first round's order
KINDS = ["store", "mpi", "mpi_launcher"]


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes-mb", type=float, nargs="+", default=[4, 64])
    p.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    p.add_argument("--repeats", type=int, default=10, help="timed calls per job")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--rounds", type=int, default=3, help="rounds of the two jobs per MPI")
    p.add_argument("--timeout", type=float, default=300, help="seconds per job")
    p.add_argument("--out", default="docs/benchmarks", help="folder for allreduce_mpis.{md,json}")
    p.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if min(args.ranks) < 2:
        p.error("--ranks must be at least 2")
    if args.rounds < 1:
        p.error(f"--rounds must be at least 1, got {args.rounds}")
    if args.worker:
        args.column = "mpi"
        save_worker_result(WORKERS[args.worker](args), args.result)
        return
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    results = measure(args)
    # (no plot: a table says it, and docs/benchmarks keeps to 40 files)
    write_outputs(args.out, "allreduce_mpis", report(results, args), results,
                  plot=lambda *_: None)


if __name__ == "__main__":
    main()
