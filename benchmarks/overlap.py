"""Dense sums overlapped with backward, side by side: ``python -m benchmarks.overlap``.

Each model trains under kvhybrid with the engine path (the default), kvhybrid with the
blocking path (``KVHYBRID_ENGINE=0``: sums after the whole backward pass) and MXNet's
``dist_sync``, on loopback with the models benchmark's shape (4 workers, 1 server). The
machine is noisy, so every comparison is repeated ``--rounds`` times with the systems'
order alternated, and the tables give the median ratio with its range. Also written: how
much of each engine bucket's allreduce was hidden behind backward (time from its
gradients being ready to its sum being done) and how many collectives a step makes.
"""
from __future__ import annotations

import argparse
import json
import logging
import statistics
import tempfile
from pathlib import Path
from typing import Dict, List

from .common import footer, ratio_cell, save_figure
from .model_zoo import MODELS
from .models import run_system

log = logging.getLogger("benchmarks")

SYSTEMS = ["kvhybrid", "kvhybrid blocking", "dist_sync"]
#: (numerator, denominator) of each ratio reported
RATIOS = [("kvhybrid", "kvhybrid blocking"), ("kvhybrid", "dist_sync"),
          ("kvhybrid blocking", "dist_sync")]


def ratios(systems: List[str]):
    """The ratios reported among ``systems``: (numerator, denominator) of each."""
    return [(a, b) for a, b in RATIOS if a in systems and b in systems]


def tables(runs: Dict[str, List[Dict[str, dict]]], args) -> str:
    """runs[model] = one {system: result} per round."""
    systems, pairs = args.systems, ratios(args.systems)
    lines = [f"# Dense sums overlapped with backward: loopback, {args.workers} workers, "
             f"1 server, {args.rounds} rounds with the systems' order alternated", "",
             "| model | " + " | ".join(f"{s} ms/step (median)" for s in systems) + " | " +
             " | ".join(f"{a} ÷ {b}" for a, b in pairs) + " |",
             "|---|" + "---:|" * (len(systems) + len(pairs))]
    for model, rounds in runs.items():
        ms = [f"{statistics.median(r[s]['step_seconds'] for r in rounds) * 1e3:.1f}"
              for s in systems]
        cells = [ratio_cell([r[a]["words_per_second"] / r[b]["words_per_second"]
                             for r in rounds]) for a, b in pairs]
        lines.append(f"| {model} | " + " | ".join(ms + cells) + " |")
    lines += ["", "Ratios are throughput ratios (higher: the first system is faster): median "
              "over the rounds, range in brackets.", "",
              "## Engine buckets: how much of each allreduce backward hid", "",
              "| model | bucket | ms from gradients ready to sum done | fraction hidden "
              "behind backward |", "|---|---|---:|---:|"]
    for model, rounds in runs.items():
        hidden = rounds[-1]["kvhybrid"].get("hidden") or []
        for name, ms, fraction in hidden:
            lines.append(f"| {model} | {name} | {ms:.1f} | {fraction:.0%} |")
    lines += ["", "Buckets in the order they are summed (last layer first). Backward ends when "
              "the last bucket's gradients are ready; the last bucket can hide nothing.", "",
              "## Collectives per step (kvhybrid, engine path)", "",
              "| model | on the caller's thread (agreements, rows) | engine buckets | "
              "blocking path: on the caller's thread |", "|---|---:|---:|---:|"]
    for model, rounds in runs.items():
        engine = rounds[-1]["kvhybrid"].get("collectives_per_step") or {}
        blocking = rounds[-1]["kvhybrid blocking"].get("collectives_per_step") or {}
        lines.append(f"| {model} | {engine.get('group', 0):.1f} | {engine.get('engine', 0):.1f} "
                     f"| {blocking.get('group', 0):.1f} |")
    return "\n".join(lines + ["", *footer("overlap")]) + "\n"


def plot(runs, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 4))
    models = list(runs)
    for i, (a, b) in enumerate(ratios(list(next(iter(runs.values()))[0]))):
        for j, model in enumerate(models):
            values = [r[a]["words_per_second"] / r[b]["words_per_second"] for r in runs[model]]
            x = j + (i - 1) * 0.25
            ax.bar(x, statistics.median(values), 0.22, color=f"C{i}",
                   label=f"{a} ÷ {b}" if j == 0 else None)
            ax.plot([x, x], [min(values), max(values)], color="black", linewidth=1)
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set_xticks(range(len(models)), models)
    ax.set_ylabel("throughput ratio (median, range)")
    ax.set_title("the engine path against the blocking path (loopback)")
    ax.legend(fontsize=8)
    save_figure(fig, path)


def main(argv=None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    p = argparse.ArgumentParser(prog="python -m benchmarks.overlap",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", choices=sorted(MODELS), default=["cnn", "lm", "nmt"])
    p.add_argument("--systems", nargs="+", choices=SYSTEMS, default=SYSTEMS,
                   help="kvhybrid (the engine path) and the peers it is set against")
    p.add_argument("--rounds", type=int, default=3, help="repeats, the systems' order alternated")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--tokens", type=int, default=50, help="words per sample")
    p.add_argument("--timeout", type=float, default=900)
    p.add_argument("--out", default="docs/benchmarks")
    p.add_argument("--name", default="overlap", help="file names: NAME.md, NAME.json, NAME.png")
    args = p.parse_args(argv)
    if not {"kvhybrid", "kvhybrid blocking"} <= set(args.systems):
        p.error("--systems needs kvhybrid and kvhybrid blocking: the benchmark sets the engine "
                "path against the blocking path")
    args.hosts, args.servers, args.launcher_args = 0, 1, []
    runs: Dict[str, List[Dict[str, dict]]] = {m: [] for m in args.models}
    with tempfile.TemporaryDirectory(prefix="kvhybrid-overlap-") as tmp:
        for round_ in range(args.rounds):
            order = args.systems if round_ % 2 == 0 else args.systems[::-1]
            for model in args.models:
                log.info("overlap: round %d of %d, %s: %s", round_ + 1, args.rounds, model,
                         ", ".join(order))
                runs[model].append({s: run_system(args, model, s, args.tokens, tmp)
                                    for s in order})
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    text = tables(runs, args)
    (out / f"{args.name}.md").write_text(text)
    (out / f"{args.name}.json").write_text(json.dumps(runs))
    plot(runs, out / f"{args.name}.png")
    print(text)
    log.info("overlap: wrote %s/%s.{md,json,png}", out, args.name)


if __name__ == "__main__":
    main()
