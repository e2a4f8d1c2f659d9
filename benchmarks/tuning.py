"""Shape-tuning benchmark: ``kvhybrid-launch --tune``'s pick against a sweep of every shape.

    python -m benchmarks.tuning                                   # loopback, 4 workers, LM
    python -m benchmarks.tuning --models lm nmt cnn
    python -m benchmarks.tuning --hosts 2 --rate 100mbit --name tuning_2x2_100mbit

For each model of ``benchmarks.model_zoo`` (``benchmarks.model_worker`` on ``hybrid-mpi``),
runs the job through ``kvhybrid-launch`` once in every shape the hosts allow (client groups,
servers, row masters: ``launch/shape_tune.py``'s grid), then once as ``kvhybrid-launch --tune``
with an empty cache, and compares the pick with the sweep's best: the pick's throughput in
the sweep ÷ the best's, and the tuning's own time ÷ the sweep's. Step time: rank 0's median
after the warm-up steps (``KVHYBRID_STATS_FILE``), at the default partition count (the
tuner may then change P for the pick; the page says what it decided). ``--hosts N --rate R``
runs every job on N emulated hosts (``benchmarks/cluster.py``). Writes ``NAME.{md,json,png}``
(default ``tuning``) into ``--out``.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List

from .cluster import add_host_args, check_host_args, launcher_args_on_hosts, setting_name
from .common import footer, save_figure, stop_job, write_outputs
from .model_zoo import MODELS

log = logging.getLogger("benchmarks")


def worker_command(args, model: str, out: str) -> List[str]:
    return ["python", "-m", "benchmarks.model_worker", "--model", model, "--system", "hybrid",
            "--out", out, "--steps", str(args.steps), "--warmup", str(args.warmup),
            "--tokens", str(args.tokens)]


def _env(**extra) -> Dict[str, str]:
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    for var in ("KVHYBRID_PARTITIONS", "KVHYBRID_ROUTES", "KVHYBRID_STATS_FILE"):
        env.pop(var, None)
    env.update(extra)
    return env


def _run(cmd: List[str], env: Dict[str, str], timeout: float) -> tuple:
    """(exit code or None on a timeout, output, seconds) of one launcher run."""
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
        return proc.returncode, out, time.monotonic() - t0
    except subprocess.TimeoutExpired:
        stop_job(proc)
        return None, "", time.monotonic() - t0
    except BaseException:
        stop_job(proc)
        raise


def sweep(args, model: str, tmp: str) -> Dict[str, dict]:
    """Every allowed shape, ``--rounds`` times in turn: the median ms per step (None where a
    job failed), every round's, and the seconds of one sweep (the mean over the rounds)."""
    from kvhybrid.launch.shape_tune import Grid
    from kvhybrid.launch.tune import step_time
    grid = Grid(args.workers, args.hosts or 1)
    found = {s.describe(): {"shape": s.__dict__, "rounds_ms": [], "all_seconds": []}
             for s in grid.allowed()}
    for rnd in range(args.rounds):
        for shape in grid.allowed():
            stats = os.path.join(
                tmp, f"{model}-{shape.clients}-{shape.servers}-{shape.row_masters}-{rnd}.json")
            cmd = [sys.executable, "-m", "kvhybrid.launch.cli", "-n", str(args.workers),
                   *args.launcher_args, *shape.flags(), *worker_command(args, model, tmp)]
            rc, out, seconds = _run(cmd, _env(KVHYBRID_STATS_FILE=stats,
                                              KVHYBRID_CACHE_DIR=os.path.join(tmp, "no-cache")),
                                    args.timeout)
            ms = step_time(stats) * 1e3 if rc == 0 else None
            log.info("tuning: %s sweep %d/%d, %s: %s (%.0f s)", model, rnd + 1, args.rounds,
                     shape.describe(), f"{ms:.2f} ms per step" if ms else f"failed ({rc})",
                     seconds)
            if rc != 0:
                log.warning("tuning: its output's tail:\n%s", out[-2000:])
            entry = found[shape.describe()]
            entry["all_seconds"].append(seconds)
            if ms:
                entry["rounds_ms"].append(ms)
    for entry in found.values():
        ok = len(entry["rounds_ms"]) == args.rounds
        entry["ms_per_step"] = statistics.median(entry["rounds_ms"]) if ok else None
        entry["seconds"] = statistics.mean(entry.pop("all_seconds"))
    return found


def tuned(args, model: str, tmp: str) -> dict:
    """``kvhybrid-launch --tune`` with an empty cache: the cache's entry for the job."""
    cache = tempfile.mkdtemp(dir=tmp, prefix="cache-")
    cmd = [sys.executable, "-m", "kvhybrid.launch.cli", "-n", str(args.workers),
           *args.launcher_args, "--tune", "--tune-budget", str(args.budget),
           *worker_command(args, model, tmp)]
    rc, out, seconds = _run(cmd, _env(KVHYBRID_CACHE_DIR=cache), args.budget + args.timeout)
    if rc != 0:
        raise SystemExit(f"tuning: kvhybrid-launch --tune of {model} failed ({rc}):\n"
                         f"{out[-3000:]}")
    entries = json.loads(Path(cache, "partitions.json").read_text()).values()
    (entry,) = [e for e in entries if "shape" in e]
    start = out.index("shape tuning:")
    entry["table"] = out[start:out.index("\n", out.index("chosen:", start))]
    entry["run_seconds"] = seconds
    log.info("tuning: %s --tune: %s in %.0f s of tuning", model, entry["shape"],
             entry["seconds"])
    return entry


def summarize(result: dict) -> dict:
    from kvhybrid.launch.shape_tune import Shape
    sweep_ms = {k: v["ms_per_step"] for k, v in result["sweep"].items() if v["ms_per_step"]}
    best = min(sweep_ms, key=sweep_ms.get)
    pick = Shape(**result["tune"]["shape"]).describe()
    sweep_seconds = sum(v["seconds"] for v in result["sweep"].values())
    return {"best": best, "pick": pick,
            "ratio": sweep_ms[best] / sweep_ms[pick] if pick in sweep_ms else None,
            "time_ratio": result["tune"]["seconds"] / sweep_seconds,
            # the shapes' trials alone, without the pick's partition search
            "shape_time_ratio": result["tune"].get("shape_seconds", result["tune"]["seconds"])
            / sweep_seconds,
            "sweep_seconds": sweep_seconds,
            "trials": sum(t["trial"] is not None for t in result["tune"]["trials"])}


def report(results: Dict[str, dict], args) -> str:
    where = setting_name(args.hosts, args.rate, args.workers, args.delay)
    lines = [f"# Shape tuning: `kvhybrid-launch --tune` against a sweep of every shape, {where}",
             "",
             f"`benchmarks.model_worker` on `hybrid-mpi`, {args.workers} workers ({where}), "
             f"{args.steps} steps per job, {args.tokens} tokens per sample; ms per step: rank "
             f"0's median after 3 warm-up steps; the sweep: the median of {args.rounds} "
             f"job{'s' if args.rounds > 1 else ''} per shape (the shapes in turn) at the "
             "default partition count, its time that of one sweep; `--tune` with an empty "
             f"cache and `--tune-budget {args.budget:.0f}`, each trial one job. Where a "
             "trial's time differs from its shape's in the sweep, that is run-to-run noise, "
             "which the pick inherits.", "",
             "| model | pick (`--tune`) | sweep's best | pick's throughput ÷ best's | trials "
             "| tuning's time ÷ sweep's: shapes | with the partition search |",
             "|---|---|---|---|---|---|---|"]
    for model, r in results.items():
        s = r["summary"]
        ratio = f"**{s['ratio']:.3f}**" if s["ratio"] else "– (the pick failed in the sweep)"
        shapes = r["tune"].get("shape_seconds", r["tune"]["seconds"])
        lines.append(f"| {model} | {s['pick']} | {s['best']} | {ratio} | {s['trials']} | "
                     f"{s['shape_time_ratio']:.2f} ({shapes:.0f} s ÷ "
                     f"{s['sweep_seconds']:.0f} s) | {s['time_ratio']:.2f} "
                     f"({r['tune']['seconds']:.0f} s) |")
    for model, r in results.items():
        lines += ["", f"## {model}: the sweep", "",
                  "| shape | ms per step (median) | every job's | ÷ best |", "|---|---|---|---|"]
        best = r["sweep"][r["summary"]["best"]]["ms_per_step"]
        for name, v in r["sweep"].items():
            ms = v["ms_per_step"]
            tag = (" (best)" if name == r["summary"]["best"] else "") + \
                  (" ← pick" if name == r["summary"]["pick"] else "")
            each = ", ".join(f"{x:.1f}" for x in v.get("rounds_ms", [])) or "–"
            lines.append(f"| {name}{tag} | {f'{ms:.2f}' if ms else 'failed'} | {each} | "
                         f"{f'{ms / best:.3f}' if ms else '–'} |")
        lines += ["", f"## {model}: the trials of `--tune` (its own table)", "", "```",
                  r["tune"]["table"], "```", "",
                  r["tune"]["partition_search"].replace("\n", "; ")]
    return "\n".join(lines + ["", *footer("tuning")]) + "\n"


def plot(results: Dict[str, dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(4.5 * len(results) + 1, 4.2),
                             squeeze=False)
    for ax, (model, r) in zip(axes[0], results.items()):
        names = list(r["sweep"])
        ms = [r["sweep"][n]["ms_per_step"] or 0 for n in names]
        tried = {json.dumps(t["shape"], sort_keys=True): t for t in r["tune"]["trials"]
                 if t["trial"] is not None}
        colours = ["tab:red" if n == r["summary"]["pick"] else
                   "tab:blue" if json.dumps(r["sweep"][n]["shape"], sort_keys=True) in tried
                   else "lightgrey" for n in names]
        ax.bar(range(len(names)), ms, color=colours)
        ax.set_xticks(range(len(names)), [n.replace(", ", "\n") for n in names], fontsize=7)
        ax.set_title(f"{model}: red = pick, blue = tried, grey = pruned/untried", fontsize=8)
        ax.set_ylabel("ms per step in the sweep (lower is better)")
        ax.grid(alpha=0.3, axis="y")
    save_figure(fig, path)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", choices=sorted(MODELS), default=["lm"])
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5, help="the worker's untimed first steps")
    p.add_argument("--tokens", type=int, default=50)
    p.add_argument("--budget", type=float, default=600, help="--tune-budget, seconds")
    p.add_argument("--rounds", type=int, default=2, help="jobs per shape in the sweep")
    p.add_argument("--timeout", type=float, default=300, help="seconds per sweep job")
    add_host_args(p)
    p.add_argument("--out", default="docs/benchmarks")
    p.add_argument("--name", default="tuning")
    args = p.parse_args(argv)
    check_host_args(p, args)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    # SIGTERM unwinds like Ctrl-C: the running job is stopped, the emulated hosts deleted
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    results = {}
    with tempfile.TemporaryDirectory(prefix="kvhybrid-tuning-") as tmp, \
            contextlib.ExitStack() as stack:
        args.launcher_args = launcher_args_on_hosts(stack, args.hosts, args.rate, args.delay,
                                                    args.workers, tmp)
        for model in args.models:
            r = {"sweep": sweep(args, model, tmp), "tune": tuned(args, model, tmp)}
            r["summary"] = summarize(r)
            results[model] = r
    out = {"where": setting_name(args.hosts, args.rate, args.workers, args.delay),
           "models": results}
    write_outputs(args.out, args.name, report(results, args), out,
                  lambda res, path: plot(res["models"], path))


if __name__ == "__main__":
    main()
