"""The ring allreduce's segment size: kvhybrid's ring with fixed segment sizes and with its
rule (an eighth of a chunk, held between 128 KB and 1 MB: ``tensor_collectives/ring.py``),
next to MPI's ``Allreduce``, over emulated hosts or on loopback. Waits sleep between tests,
as on the engine's communication thread, where the ring runs in training.

    python -m benchmarks.ring_segments --hosts 4 --rate 1gbit
    python -m benchmarks.ring_segments --hosts 0 --sizes-mb 4 16 64

Each round times every system on every size (the systems' order alternates between
rounds); a result that differs from MPI's sum fails the run.
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

from .common import DIAGNOSTICS_OUT, footer, grouped_bars, run_job, save_figure, \
    save_worker_result, timed, write_outputs

log = logging.getLogger("benchmarks")

RULE = "ring (rule)"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.ring_segments", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hosts", type=int, default=4,
                   help="emulated hosts, one rank each (root only); 0: --ranks on loopback")
    p.add_argument("--rate", default="1gbit", help="their links' bandwidth (tc tbf rate)")
    p.add_argument("--ranks", type=int, default=4, help="ranks on loopback (--hosts 0)")
    p.add_argument("--sizes-mb", type=float, nargs="+", default=[1, 4.13, 16],
                   help="sums to time, in MB (4.13: the CNN's largest bucket)")
    p.add_argument("--segments-kb", type=int, nargs="+", default=[128, 1024],
                   help="fixed segment sizes to time next to the rule")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--repeats", type=int, default=10, help="timed calls per system and size")
    p.add_argument("--timeout", type=float, default=900)
    p.add_argument("--out", default=DIAGNOSTICS_OUT)
    p.add_argument("--name", default="ring_segments")
    p.add_argument("--worker", help=argparse.SUPPRESS)   # (under mpirun: where to write)
    return p.parse_args(argv)


def worker(args) -> None:
    import numpy as np
    from mpi4py import MPI
    from kvhybrid.tensor_collectives import ring
    from kvhybrid.tensor_collectives.ops import wait_all_patiently, wait_patiently

    comm = MPI.COMM_WORLD
    size, rank = comm.Get_size(), comm.Get_rank()
    rule = (ring.MIN_SEGMENT_BYTES, ring.MAX_SEGMENT_BYTES)
    systems = ["MPI Allreduce", RULE] + [f"ring {kb} KB" for kb in args.segments_kb]
    rng = np.random.default_rng(rank)
    times: Dict[str, Dict[str, List[float]]] = {}

    patient = wait_all_patiently

    for r in range(args.rounds):
        for name in systems if r % 2 == 0 else systems[::-1]:
            if name == RULE:
                ring.MIN_SEGMENT_BYTES, ring.MAX_SEGMENT_BYTES = rule
            elif name != "MPI Allreduce":
                ring.MIN_SEGMENT_BYTES = ring.MAX_SEGMENT_BYTES = int(name.split()[1]) << 10
            for mb in args.sizes_mb:
                x = rng.standard_normal(int(mb * 2**20) // 4).astype(np.float32)
                want = np.empty_like(x)
                comm.Allreduce(x, want)
                work = np.empty(ring.workspace_elements(x.size, x.itemsize, size), np.float32)
                got = x.copy()

                def once() -> None:
                    got[:] = x
                    if name == "MPI Allreduce":
                        wait_patiently(comm.Iallreduce(MPI.IN_PLACE, got))
                    else:
                        ring.ring_allreduce(got, comm, MPI, work, wait_all=patient)

                t = timed(once, args.repeats, 2, lambda: wait_patiently(comm.Ibarrier()))
                if not np.allclose(got, want, rtol=1e-5, atol=1e-4):
                    raise SystemExit(f"ring_segments: {name} summed {mb} MB wrongly")
                slowest = comm.allreduce(statistics.median(t), op=MPI.MAX)
                times.setdefault(name, {}).setdefault(str(mb), []).append(slowest * 1e3)
    save_worker_result({"times_ms": times, "ranks": size} if rank == 0 else None, args.worker)


def launch(args) -> dict:
    """Run the worker as ``kvhybrid-launch`` would start its ranks: over the emulated hosts'
    namespaces, or on this machine through shared memory."""
    from kvhybrid.launch.cli import netns_mpi_args, one_machine_mpi_args
    from kvhybrid.launch.mpirun import MpiJob, build_command, find_mpirun, flavour, implementation
    from kvhybrid.launch.transport import wrap
    here = Path(__file__).resolve().parent.parent
    env = dict(os.environ, PYTHONPATH=str(here), OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    mpirun = find_mpirun()
    with tempfile.TemporaryDirectory() as tmp:
        result = Path(tmp) / "result.json"
        command = [sys.executable, "-m", "benchmarks.ring_segments", *sys.argv[1:],
                   "--worker", str(result)]
        if args.hosts:
            from .cluster import EmulatedCluster
            with EmulatedCluster(hosts=args.hosts, rate=args.rate) as cluster:
                job = MpiJob(args.hosts, command, extra_args=netns_mpi_args(implementation(mpirun)),
                             hostfile=str(cluster.hostfile(Path(tmp) / "hosts", slots=1)))
                cmd = wrap("netns", cluster.names[0],
                           build_command(job, mpirun, flavour(mpirun), env), {}, env)
                run_job(cmd, env, args.timeout, "the ring job", "ring_segments", cwd=str(here))
        else:
            job = MpiJob(args.ranks, command, extra_args=one_machine_mpi_args([], env))
            run_job(build_command(job, mpirun, flavour(mpirun), env), env, args.timeout,
                    "the ring job", "ring_segments", cwd=str(here))
        return json.loads(result.read_text())


def table(args, results: dict) -> str:
    where = (f"{args.hosts} emulated hosts at {args.rate}, one rank each" if args.hosts
             else f"loopback, {args.ranks} ranks")
    times = results["times_ms"]
    systems = list(times)
    sizes = [str(mb) for mb in args.sizes_mb]
    lines = [f"# Ring allreduce segments, {where}, {args.rounds} round(s), patient waits", "",
             "| MB | " + " | ".join(f"{s} ms" for s in systems) + " | rule ÷ each ring |",
             "|---:|" + "---:|" * (len(systems) + 1)]
    for mb in sizes:
        cells = [f"{statistics.median(times[s][mb]):.1f} ({min(times[s][mb]):.1f}–"
                 f"{max(times[s][mb]):.1f})" for s in systems]
        rule = statistics.median(times[RULE][mb])
        ratios = ", ".join(f"{statistics.median(times[s][mb]) / rule:.2f}× ({s[5:]})"
                           for s in systems if s.startswith("ring ") and s != RULE)
        lines.append(f"| {mb} | " + " | ".join(cells) + f" | {ratios} |")
    lines += ["", "Slowest rank's median call of each round; the table gives the median over the "
              "rounds and their range. rule ÷ each ring: how much faster (>1) the rule's "
              "segments are than that fixed size.", ""] + footer("ring_segments")
    return "\n".join(lines) + "\n"


def plot(results: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    times = results["times_ms"]
    sizes = list(next(iter(times.values())))
    fig, ax = plt.subplots(figsize=(7, 4))
    grouped_bars(ax, [f"{mb} MB" for mb in sizes],
                 {s: [statistics.median(times[s][mb]) for mb in sizes] for s in times})
    ax.set_ylabel("ms per allreduce (median)")
    ax.legend()
    save_figure(fig, path)


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.worker:
        worker(args)
        return
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    results = launch(args)
    write_outputs(args.out, args.name, table(args, results), results, plot)


if __name__ == "__main__":
    main()
