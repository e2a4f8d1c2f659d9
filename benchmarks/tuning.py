"""Shape-tuning benchmark: ``kvhybrid-launch --tune``'s pick against a sweep of every shape.

    python -m benchmarks.tuning                                   # loopback, 4 workers, LM
    python -m benchmarks.tuning --models lm nmt cnn
    python -m benchmarks.tuning --hosts 2 --rate 100mbit          # 2 emulated hosts x 2 workers

For each model of ``benchmarks.model_zoo`` (``benchmarks.model_worker`` on ``hybrid-mpi``),
and ``module`` (``examples/train_sparse_module.py``: MXNet's Module over CSR data, Adam, a
pull of every row and a checkpoint each epoch of 16 steps),
``--rounds`` rounds, each a sweep (the whole job through ``kvhybrid-launch`` once in every
shape the hosts allow: ``launch/shape_tune.py``'s grid) and a ``kvhybrid-launch --tune`` with
an empty cache, their order alternated. It compares each pick with the sweep's best (the
pick's throughput in the sweep ÷ the best's) and the tuning's own time with a sweep's, and
says how long a job must be for the tuning to take 15 % of a sweep (trials stop after 24
steps; sweep jobs run whole). Step time: rank 0's median after the warm-up steps
(``KVHYBRID_STATS_FILE``), at the default partition count (the tuner may then change P for
the pick; the page says what it decided). ``--hosts N --rate R``
runs every job on N emulated hosts (``benchmarks/cluster.py``). Writes ``NAME.{md,json,png}``
(default ``tuning``) into ``--out``: one page for every setting and model measured, this
run's models replacing their earlier results in its setting and the rest kept, each model
with its own command and date.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional

from .cluster import add_host_args, check_host_args, launcher_args_on_hosts, setting_name
from .common import footer, save_figure, stop_job, write_outputs
from .model_zoo import MODELS

log = logging.getLogger("benchmarks")

#: the share of a full sweep's time the tuning should take at most
TIME_SHARE = 0.15


#: the Module workload's script (``module``): epochs of 16 steps
MODULE_EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "train_sparse_module.py"
MODULE_BATCHES = 16


def module_epochs(args) -> int:
    """The Module workload's epochs: at least the warm-up and timed steps asked for."""
    return max(2, math.ceil((args.warmup + args.steps) / MODULE_BATCHES))


def worker_command(args, model: str, out: str) -> List[str]:
    if model == "module":
        return ["python", str(MODULE_EXAMPLE), "--optimizer", "adam",
                "--epochs", str(module_epochs(args)),
                "--batches", str(MODULE_BATCHES), "--prefix", os.path.join(out, "module")]
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


def sweep_round(args, model: str, tmp: str, rnd: int, found: Dict[str, dict]) -> float:
    """Every allowed shape once, in turn, each a whole job: its ms per step (None where it
    failed) and seconds appended to ``found``; the round's seconds."""
    from kvhybrid.launch.shape_tune import Grid
    from kvhybrid.launch.tune import step_time
    total = 0.0
    for shape in Grid(args.workers, args.hosts or 1).allowed():
        stats = os.path.join(
            tmp, f"{model}-{shape.clients}-{shape.servers}-{shape.row_masters}-{rnd}.json")
        cmd = [sys.executable, "-m", "kvhybrid.launch.cli", "-n", str(args.workers),
               *args.launcher_args, *shape.flags(), *worker_command(args, model, tmp)]
        rc, out, seconds = _run(cmd, _env(KVHYBRID_STATS_FILE=stats,
                                          KVHYBRID_CACHE_DIR=os.path.join(tmp, "no-cache")),
                                args.timeout)
        ms = step_time(stats) * 1e3 if rc == 0 else None
        log.info("tuning: %s round %d/%d, sweep, %s: %s (%.0f s)", model, rnd + 1, args.rounds,
                 shape.describe(), f"{ms:.2f} ms per step" if ms else f"failed ({rc})", seconds)
        if rc != 0:
            log.warning("tuning: its output's tail:\n%s", out[-2000:])
        entry = found.setdefault(shape.describe(), {"shape": shape.__dict__, "rounds_ms": [],
                                                    "job_seconds": []})
        entry["rounds_ms"].append(ms)
        entry["job_seconds"].append(seconds)
        total += seconds
    return total


def tuned(args, model: str, tmp: str, rnd: int) -> dict:
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
    log.info("tuning: %s round %d/%d, --tune: %s in %.0f s of tuning", model, rnd + 1,
             args.rounds, entry["shape"], entry["seconds"])
    return entry


def measure(args, model: str, tmp: str) -> dict:
    """``--rounds`` rounds of a sweep and a ``--tune``, their order alternated."""
    found: Dict[str, dict] = {}
    sweeps, tunes = [], []
    for rnd in range(args.rounds):
        for what in (("sweep", "tune") if rnd % 2 == 0 else ("tune", "sweep")):
            if what == "sweep":
                sweeps.append(sweep_round(args, model, tmp, rnd, found))
            else:
                tunes.append(tuned(args, model, tmp, rnd))
    for entry in found.values():
        ok = all(entry["rounds_ms"])
        entry["ms_per_step"] = statistics.median(entry["rounds_ms"]) if ok else None
    return {"sweep": found, "sweep_seconds": sweeps, "tunes": tunes, "steps": args.steps,
            "warmup": args.warmup}


def _spread(values: List[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def long_enough(result: dict, share: float = TIME_SHARE) -> Optional[int]:
    """The job length (steps) at which the median tuning takes ``share`` of a sweep: a
    sweep job costs its start-up plus its steps (each shape's measured ms per step), a
    trial's cost does not grow with the job."""
    jobs = [v for v in result["sweep"].values() if v["ms_per_step"]]
    if len(jobs) != len(result["sweep"]):
        return None
    steps = result["steps"] + result["warmup"]
    startup = sum(statistics.median(v["job_seconds"]) - steps * v["ms_per_step"] / 1e3
                  for v in jobs)
    per_step = sum(v["ms_per_step"] / 1e3 for v in jobs)
    tuning = statistics.median(t["seconds"] for t in result["tunes"])
    return max(0, math.ceil((tuning / share - startup) / per_step))


def summarize(result: dict) -> dict:
    from kvhybrid.launch.shape_tune import Shape
    sweep_ms = {k: v["ms_per_step"] for k, v in result["sweep"].items() if v["ms_per_step"]}
    best = min(sweep_ms, key=sweep_ms.get)
    sweep_seconds = statistics.mean(result["sweep_seconds"])
    picks = [Shape(**t["shape"]).describe() for t in result["tunes"]]
    # a pick that failed in the sweep has no ratio: the page names it
    ratios = [sweep_ms[best] / sweep_ms[p] for p in picks if p in sweep_ms]
    return {"best": best, "picks": picks,
            "ratio": _spread(ratios) if ratios else {"median": 0.0, "min": 0.0, "max": 0.0},
            "picks_failed_in_sweep": sum(p not in sweep_ms for p in picks),
            "time_ratio": _spread([t["seconds"] / sweep_seconds for t in result["tunes"]]),
            # the shapes' trials alone, without the pick's partition search
            "shape_time_ratio": _spread([t.get("shape_seconds", t["seconds"]) / sweep_seconds
                                         for t in result["tunes"]]),
            "sweep_seconds": sweep_seconds,
            "trials": _spread([t.get("trial_count", sum(x["trial"] is not None
                                                         for x in t["trials"]))
                               for t in result["tunes"]]),
            "long_enough": long_enough(result)}


def _range(s: dict, digits: int = 2) -> str:
    return f"{s['median']:.{digits}f} ({s['min']:.{digits}f}–{s['max']:.{digits}f})"


def report(settings: Dict[str, dict]) -> str:
    """The page: a summary row per setting and model, then each setting's sweeps and
    ``--tune`` tables, its command and when it was measured (``settings``: ``setting``'s)."""
    lines = ["# Shape tuning: `kvhybrid-launch --tune` against a sweep of every shape", "",
             "`benchmarks.model_worker` on `hybrid-mpi` (`module`: "
             "`examples/train_sparse_module.py`, MXNet's Module over CSR data with Adam, a pull "
             "of every row and a checkpoint each epoch of 16 steps). Per setting and model, "
             "rounds of a "
             "sweep (every shape in turn, each a whole job, at the default partition count) "
             "and a `--tune` with an empty cache, their order alternated. ms per step: rank "
             "0's median after 3 warm-up steps, a sweep's shape at its median over the rounds. "
             "A trial stops once 24 steps have begun, whatever the job's length: the tuning's "
             "share of a sweep's time falls as jobs grow; the last column is the job length at "
             f"which it is {TIME_SHARE:.0%} (each shape's start-up and ms per step as "
             "measured). Where the pick differs from the sweep's best by less than the sweep's "
             "own spread between rounds, that is run-to-run noise, which the pick inherits.",
             "", "| setting | model | sweep's best | picks (per round) | pick's throughput ÷ "
             "best's, median (range) | trials, median (max) | tuning's time ÷ sweep's: shapes "
             f"| with the partition search | a job long enough for {TIME_SHARE:.0%} |",
             "|---|---|---|---|---|---|---|---|---|"]
    for where, setting in settings.items():
        for model, r in setting["models"].items():
            s = r["summary"]
            enough = f"{s['long_enough']:,} steps" if s["long_enough"] is not None else "–"
            failed = (f" ({s['picks_failed_in_sweep']} pick(s) failed in the sweep)"
                      if s["picks_failed_in_sweep"] else "")
            lines.append(f"| {where} | {model} | {s['best']} | {'; '.join(s['picks'])} | "
                         f"**{_range(s['ratio'], 3)}**{failed} | {s['trials']['median']:.0f} "
                         f"({s['trials']['max']:.0f}) | {_range(s['shape_time_ratio'])} | "
                         f"{_range(s['time_ratio'])} (sweep {s['sweep_seconds']:.0f} s) | "
                         f"{enough} |")
    for where, setting in settings.items():
        lines += ["", f"## {where}"]
        lines += _setting_tables(setting["models"])
    return "\n".join(lines) + "\n"


def _setting_tables(results: Dict[str, dict]) -> List[str]:
    lines = []
    for model, r in results.items():
        lines += ["", f"### {model}: the sweep", "", r["about"], "", r["command"], r["measured"],
                  "",
                  "| shape | ms per step (median) | every round's | ÷ best | a job's seconds |",
                  "|---|---|---|---|---|"]
        best = r["sweep"][r["summary"]["best"]]["ms_per_step"]
        for name, v in r["sweep"].items():
            ms = v["ms_per_step"]
            tag = (" (best)" if name == r["summary"]["best"] else "") + \
                  (" ← picked" if name in r["summary"]["picks"] else "")
            each = ", ".join(f"{x:.1f}" if x else "failed" for x in v["rounds_ms"])
            lines.append(f"| {name}{tag} | {f'{ms:.2f}' if ms else 'failed'} | {each} | "
                         f"{f'{ms / best:.3f}' if ms else '–'} | "
                         f"{statistics.median(v['job_seconds']):.1f} |")
        for rnd, t in enumerate(r["tunes"]):
            lines += ["", f"### {model}: `--tune`, round {rnd + 1} (its own table)", "", "```",
                      t["table"], "```", "", t["partition_search"].replace("\n", "; ")]
    return lines


def setting(results: Dict[str, dict], args) -> dict:
    """This run's part of a setting's section of the page: each model's results with what
    its jobs were and the command and provenance of the run that measured it."""
    where = setting_name(args.hosts, args.rate, args.workers, args.delay)
    rounds = (f"{args.rounds} round{'s' if args.rounds > 1 else ''}, "
              f"`--tune-budget {args.budget:.0f}`.")
    command, measured = footer("tuning")
    for model, r in results.items():
        jobs = (f"jobs of {module_epochs(args)} epochs of {MODULE_BATCHES} steps"
                if model == "module" else
                f"jobs of {args.warmup} + {args.steps} steps, {args.tokens} tokens per sample")
        r.update(about=f"{args.workers} workers ({where}), {jobs}, {rounds}", command=command,
                 measured=measured)
    return {"where": where, "models": results}


def with_setting(page: Path, new: dict) -> Dict[str, dict]:
    """The page's settings (its JSON, if any) with ``new``'s models in place of the same
    models of its setting, the setting's other models kept."""
    settings = {}
    if page.exists():
        try:
            settings = json.loads(page.read_text()).get("settings", {})
        except (ValueError, AttributeError):
            log.warning("tuning: %s is not a tuning page's results; starting a new one", page)
    for old in settings.values():   # (pages that kept a run's provenance per setting)
        kept = {field: old.pop(field, "") for field in ("about", "command", "measured")}
        for r in old["models"].values():
            for field, value in kept.items():
                r.setdefault(field, value)
    models = settings.get(new["where"], {"models": {}})["models"]
    models.update(new["models"])
    settings[new["where"]] = {"where": new["where"], "models": models}
    return settings


def plot(settings: Dict[str, dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [(where, model, r) for where, st in settings.items()
            for model, r in st["models"].items()]
    cols = min(3, len(rows))
    fig, axes = plt.subplots(math.ceil(len(rows) / cols), cols,
                             figsize=(4.5 * cols + 1, 4.2 * math.ceil(len(rows) / cols)),
                             squeeze=False)
    for ax in axes.flat[len(rows):]:
        ax.set_visible(False)
    for ax, (where, model, r) in zip(axes.flat, rows):
        names = list(r["sweep"])
        ms = [r["sweep"][n]["ms_per_step"] or 0 for n in names]
        tried = {json.dumps(x["shape"], sort_keys=True) for t in r["tunes"] for x in t["trials"]
                 if x["trial"] is not None}
        colours = ["tab:red" if n in r["summary"]["picks"] else
                   "tab:blue" if json.dumps(r["sweep"][n]["shape"], sort_keys=True) in tried
                   else "lightgrey" for n in names]
        ax.bar(range(len(names)), ms, color=colours)
        many = len(names) > 6   # (labels side by side would overlap)
        ax.set_xticks(range(len(names)), [n.replace(", ", "\n") for n in names],
                      fontsize=6 if many else 7, rotation=60 if many else 0,
                      ha="right" if many else "center")
        ax.set_title(f"{model}, {where}\nred = picked, blue = tried, grey = pruned/untried",
                     fontsize=8)
        ax.set_ylabel("ms per step in the sweep (lower is better)")
        ax.grid(alpha=0.3, axis="y")
    save_figure(fig, path)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", choices=sorted(MODELS) + ["module"], default=["lm"])
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--steps", type=int, default=300, help="a job's timed steps (the sweep runs "
                   "each shape's whole job; a trial stops after 24)")
    p.add_argument("--warmup", type=int, default=5, help="the worker's untimed first steps")
    p.add_argument("--tokens", type=int, default=50)
    p.add_argument("--budget", type=float, default=600, help="--tune-budget, seconds")
    p.add_argument("--rounds", type=int, default=3,
                   help="rounds per model: a sweep and a --tune each, their order alternated")
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
            r = measure(args, model, tmp)
            r["summary"] = summarize(r)
            results[model] = r
    settings = with_setting(Path(args.out, f"{args.name}.json"), setting(results, args))
    write_outputs(args.out, args.name, report(settings), {"settings": settings},
                  lambda res, path: plot(res["settings"], path))


if __name__ == "__main__":
    main()
