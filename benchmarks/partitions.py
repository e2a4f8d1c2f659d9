"""Partition-count benchmark: the tuner's P against a brute-force sweep (Parallax Table 5).

    python -m benchmarks.partitions --workers 4 --servers 2
    python -m benchmarks.partitions --hosts 2 --rate 100mbit --name partitions_100mbit

Runs ``examples/train_sparse_bow.py`` (a 200,000 × 64 SparseEmbedding looked up with
Zipf word ids, plus dense layers) through ``kvhybrid-launch`` at every P of ``--sweep``
(``--rounds`` times each, in turn), then once more as ``kvhybrid-launch
--tune-partitions`` with an empty cache, and compares the throughput at the tuner's P
with the best of the sweep. Step time: rank 0's median after 3 warm-up steps
(``KVHYBRID_STATS_FILE``). Writes ``NAME.{md,json,png}`` (``--name``, default
``partitions``; the page ends with the tuner's own table and fit, the plot shows its samples
and curve) into ``--out``. ``--hosts N --rate R`` runs every job on
N emulated hosts (``benchmarks/cluster.py``), a server per host unless ``--servers`` says
otherwise: where the servers' links, not the cores, decide the best P.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Dict, List

from .cluster import add_host_args, check_host_args, launcher_args_on_hosts, setting_name
from .common import footer, run_job, save_figure, write_outputs

log = logging.getLogger("benchmarks")

ROOT = Path(__file__).resolve().parents[1]   # the repository
MODEL = ROOT / "examples" / "train_sparse_bow.py"


def _launch(args, extra: List[str]) -> List[str]:
    return [sys.executable, "-m", "kvhybrid.launch.cli", "-n", str(args.workers), "--servers",
            str(args.servers), *args.launcher_args, *extra, "python", str(MODEL), "--steps", str(args.steps),
            "--batch-size", str(args.batch_size)]


def _env(**extra) -> Dict[str, str]:
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    env.pop("KVHYBRID_PARTITIONS", None)
    env.update(extra)
    return env


def sweep(args, tmp: str) -> Dict[int, List[float]]:
    from kvhybrid.launch.tune import step_time
    times: Dict[int, List[float]] = {p: [] for p in args.sweep}
    for rnd in range(args.rounds):
        for p in args.sweep:
            stats = os.path.join(tmp, f"sweep-{p}-{rnd}.json")
            log.info("partitions: sweep round %d/%d, P=%d ...", rnd + 1, args.rounds, p)
            run_job(_launch(args, []), _env(KVHYBRID_PARTITIONS=str(p), KVHYBRID_STATS_FILE=stats),
                    args.timeout, f"the job with P={p}", "partitions")
            times[p].append(step_time(stats))
            log.info("partitions: P=%d: %.2f ms per step", p, times[p][-1] * 1e3)
    return times


def tuner(args, tmp: str) -> dict:
    cache = os.path.join(tmp, "cache")
    log.info("partitions: kvhybrid-launch --tune-partitions (empty cache) ...")
    report_dir = Path(tmp, "tuning")
    run_job(_launch(args, ["--tune-partitions", "--tune-out", str(report_dir)]),
            _env(KVHYBRID_CACHE_DIR=cache), args.timeout * 6, "the tuning run", "partitions")
    (entry,) = json.loads(Path(cache, "partitions.json").read_text()).values()
    # the launcher's own summary (its table and fit), kept as a section of the page
    entry["summary"] = (report_dir / "partitions_tuning.md").read_text().strip()
    return entry


def report(result: dict, args) -> str:
    med = {int(p): statistics.median(t) for p, t in result["sweep"].items()}
    words = args.batch_size * 32 * args.workers
    best = min(med, key=med.get)
    chosen = result["tuner"]["partitions"]
    where = setting_name(args.hosts, args.rate, args.workers, args.delay)
    lines = [f"# Partition count: the tuner against a brute-force sweep, {where}", "",
             f"`examples/train_sparse_bow.py` (SparseEmbedding 200,000 × 64, Zipf(1.2) ids, "
             f"{args.batch_size} samples × 32 words per rank and step) on {args.workers} workers "
             f"and {args.servers} servers ({where}), {args.steps} steps per job; median ms per step after "
             f"3 warm-up steps, median over {args.rounds} jobs per P.", "",
             "| P | ms per step | words/s | vs best |", "|---|---|---|---|"]
    for p in sorted(med):
        tag = " (best)" if p == best else ""
        tag += " ← tuner" if p == chosen else ""
        lines.append(f"| {p}{tag} | {med[p] * 1e3:.2f} | {words / med[p]:,.0f} | "
                     f"{med[best] / med[p]:.3f} |")
    samples = result["tuner"]["samples"]
    ratio = med[best] / med[chosen] if chosen in med else float("nan")
    lines += ["", f"Tuner: {len(samples)} settings sampled "
              f"({', '.join(f'P={p}: {t * 1e3:.2f} ms' for p, t in samples)}), chose P = {chosen}; "
              f"its throughput in the sweep is **{ratio:.3f}×** the best P's "
              f"({'within' if ratio >= 0.95 else 'outside'} 5 %).", ""]
    if result["tuner"].get("summary"):
        lines += ["## The tuner's own table and fit (`kvhybrid-launch --tune-partitions`)", "",
                  result["tuner"]["summary"], ""]
    lines += footer("partitions")
    return "\n".join(lines) + "\n"


def plot(result: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    from kvhybrid.kvstore.partition_tuner import predict

    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    ps = sorted(int(p) for p in result["sweep"])
    for p in ps:
        ts = result["sweep"][str(p)] if str(p) in result["sweep"] else result["sweep"][p]
        ax.plot([p] * len(ts), [t * 1e3 for t in ts], ".", color="grey", alpha=0.6)
    med = [statistics.median(result["sweep"].get(str(p), result["sweep"].get(p))) * 1e3 for p in ps]
    ax.plot(ps, med, "o-", color="black", label="sweep (median of jobs)")
    samples = result["tuner"]["samples"]
    ax.plot([p for p, _ in samples], [t * 1e3 for _, t in samples], "s", color="tab:blue",
            label="tuner's samples")
    theta = result["tuner"]["theta"]
    if theta:
        grid = np.linspace(min(p for p, _ in samples), max(p for p, _ in samples), 200)
        ax.plot(grid, predict(theta, grid) * 1e3, "-", color="tab:blue", label="tuner's fit")
    ax.axvline(result["tuner"]["partitions"], color="red", ls="--",
               label=f"tuner's P = {result['tuner']['partitions']}")
    ax.set_xscale("log", base=2)
    ax.set_xticks(ps, [str(p) for p in ps])
    ax.set_xlabel("partitions P")
    ax.set_ylabel("ms per step (lower is better)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    save_figure(fig, path)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--servers", type=int, help="default: one per --hosts, else 2")
    p.add_argument("--sweep", type=int, nargs="+", default=[1, 2, 3, 4, 6, 8, 12, 16])
    p.add_argument("--rounds", type=int, default=2, help="jobs per P of the sweep")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--timeout", type=float, default=300, help="seconds per job")
    add_host_args(p)
    p.add_argument("--out", default="docs/benchmarks")
    p.add_argument("--name", default="partitions",
                   help="file names: NAME.{md,json,png}")
    args = p.parse_args(argv)
    check_host_args(p, args)
    if args.servers is None:
        args.servers = args.hosts or 2
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    # SIGTERM unwinds like Ctrl-C: the running job is stopped, the emulated hosts deleted
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    Path(args.out).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="kvhybrid-partitions-") as tmp, \
            contextlib.ExitStack() as stack:
        args.launcher_args = launcher_args_on_hosts(stack, args.hosts, args.rate, args.delay,
                                                    args.workers, tmp)
        result = {"sweep": sweep(args, tmp), "tuner": tuner(args, tmp)}
        chosen = result["tuner"]["partitions"]
        if chosen not in result["sweep"]:   # the fit may land between swept settings
            args.sweep = [chosen]
            result["sweep"].update(sweep(args, tmp))
    result["sweep"] = {str(k): v for k, v in result["sweep"].items()}
    result["where"] = setting_name(args.hosts, args.rate, args.workers, args.delay)
    write_outputs(args.out, args.name, report(result, args), result, plot)


if __name__ == "__main__":
    main()
