"""kvhybrid before and after a change: the models benchmark on two commits, side by side.

    python -m benchmarks.before_after --base 8f63e34 [--after REV] [--rounds 3] [--models ...]

The base commit (and ``--after``'s, else this working tree is after) is checked out into a
temporary git worktree; each round runs ``benchmarks.models`` (loopback unless --hosts
says otherwise, kvhybrid only unless --systems does) in the base tree and in the after
tree, one right after the other, every job started in its tree (``check_imports`` makes
sure it runs that tree's code), the order alternated from round to round so that neither
always runs on a warmer or busier machine. The ratio of a round
is after's throughput ÷ before's (the same words or images per step in both); the table
gives the median over the rounds and the range. Writes NAME.md, NAME.json and NAME.png.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, List

from . import ROOT
from .common import (DIAGNOSTICS_OUT, WAITS, footer, ratio_cell, run_job, save_figure,
                     write_outputs)

log = logging.getLogger("benchmarks")


def _worktree(base: str, where: Path, name: str = "base") -> Path:
    """A checkout of ``base``, with the C++ helper built in it where it has one (as
    scripts/setup.sh builds it in this tree), so both trees run as installed."""
    tree = where / name
    subprocess.run(["git", "-C", ROOT, "worktree", "add", "--detach", str(tree), base],
                   check=True, capture_output=True, text=True)
    if "ext_modules" in (tree / "setup.py").read_text():
        subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"],
                       cwd=str(tree), check=True, capture_output=True, text=True)
    return tree


def _short(rev: str) -> str:
    return subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", rev], check=True,
                          capture_output=True, text=True).stdout.strip()


def _env(tree: Path) -> Dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(tree))


def check_imports(tree: Path) -> None:
    """Refuse to measure unless a job started in ``tree`` runs the tree's kvhybrid and
    benchmarks: a job that ran another tree's code would compare a commit with itself."""
    code = ("import importlib.util as u\n"
            "for name in ('kvhybrid', 'benchmarks'):\n"
            "    spec = u.find_spec(name)\n"
            "    print(spec.origin if spec and spec.origin else f'no-{name}')")
    found = subprocess.run([sys.executable, "-c", code], cwd=str(tree), env=_env(tree),
                           capture_output=True, text=True, check=True).stdout.split()
    wrong = [f for f in found if not Path(f).resolve().is_relative_to(tree.resolve())]
    if wrong:
        raise SystemExit(f"before_after: a job in {tree} imports {', '.join(wrong)}, not the "
                         "tree's own code: check PYTHONPATH and how kvhybrid is installed")


def _run(tree: Path, args, out: Path) -> Dict[str, dict]:
    """One ``benchmarks.models`` run in ``tree``: {model: {system: result}}."""
    cmd = [sys.executable, "-m", "benchmarks.models", "--models", *args.models,
           "--systems", *args.systems, "--steps", str(args.steps), "--warmup", str(args.warmup),
           "--workers", str(args.workers), "--tokens", str(args.tokens), "--out", str(out),
           "--name", "run"]
    if args.hosts:   # both trees on emulated hosts of the same rate
        cmd += ["--hosts", str(args.hosts), "--rate", args.rate]
    if args.waitall != "step":   # (a tree from before --waitall times every step alone)
        cmd += ["--waitall", args.waitall]
    # run in the tree: ``python -m`` puts the working directory first on the path, before
    # PYTHONPATH, and the tree's benchmarks/__init__ puts the tree first on every job's
    # path; a timeout or Ctrl-C stops the job's launcher and processes
    run_job(cmd, _env(tree), args.timeout, f"the models run in {tree}", "before_after",
            cwd=str(tree))
    return json.loads((out / "run_rounds.json").read_text())["rounds"][0]


def _table(rounds: List[dict], args) -> str:
    lines = ["| model | system | before ms/step | after ms/step | after ÷ before throughput, "
             "median (range) | caller's thread CPU ms/step, before → after | after ÷ before "
             "caller's CPU |", "|---|---|---:|---:|---:|---:|---:|"]
    for model in args.models:
        for system in args.systems:
            before = [r["before"][model][system]["step_seconds"] for r in rounds]
            after = [r["after"][model][system]["step_seconds"] for r in rounds]
            ratios = [b / a for b, a in zip(before, after)]
            cpu = {side: [(r[side][model][system].get("cpu_ms_per_step") or {}).get("caller")
                           for r in rounds] for side in ("before", "after")}
            cpu_cells = "– | –"
            if all(v for v in cpu["before"] + cpu["after"]):
                cpu_cells = (f"{statistics.median(cpu['before']):.2f} → "
                             f"{statistics.median(cpu['after']):.2f} | "
                             + ratio_cell([a / b for b, a in zip(cpu["before"], cpu["after"])]))
            lines.append(f"| {model} | {system} | {statistics.median(before) * 1e3:.1f} | "
                         f"{statistics.median(after) * 1e3:.1f} | {ratio_cell(ratios)} | "
                         f"{cpu_cells} |")
    return "\n".join(lines)


def _plot(results: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 3.5))
    labels, medians, lows, highs = [], [], [], []
    for key, r in results["ratios"].items():
        labels.append(key)
        medians.append(r["median"])
        lows.append(r["median"] - r["min"])
        highs.append(r["max"] - r["median"])
    ax.bar(labels, medians, yerr=[lows, highs], capsize=4, color="tab:blue")
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_ylabel("after ÷ before throughput")
    ax.set_title(f"kvhybrid {results['base']} → {results.get('after', 'working tree')}, "
                 f"{len(results['rounds'])} rounds")
    save_figure(fig, path)


def main(argv=None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    p = argparse.ArgumentParser(prog="python -m benchmarks.before_after",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--base", required=True, help="the commit to compare against (before)")
    p.add_argument("--after", help="the commit after (default: this working tree)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--models", nargs="+", default=["lm", "nmt", "cnn"])
    p.add_argument("--systems", nargs="+", default=["kvhybrid"])
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--tokens", type=int, default=50, help="words per sample (sets α)")
    p.add_argument("--hosts", type=int, default=0,
                   help="emulated hosts (benchmarks.models --hosts; root only); 0: loopback")
    p.add_argument("--rate", default="1gbit", help="their links' bandwidth, with --hosts")
    p.add_argument("--waitall", choices=WAITS, default="step",
                   help="benchmarks.models --waitall: wait for MXNet's engine after every "
                        "step, or once at the end (both trees must know the option)")
    p.add_argument("--timeout", type=float, default=1800)
    p.add_argument("--out", default=DIAGNOSTICS_OUT)
    p.add_argument("--name", default="before_after")
    args = p.parse_args(argv)
    if args.rounds < 1:
        p.error(f"--rounds must be at least 1, got {args.rounds}")
    base = _short(args.base)
    after = _short(args.after or "HEAD")
    if not args.after and subprocess.run(
            ["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no"],
            capture_output=True, text=True).stdout.strip():
        after += " with uncommitted changes"
    rounds: List[dict] = []
    with tempfile.TemporaryDirectory(prefix="kvhybrid-before-after-") as tmp:
        where = Path(tmp)
        trees = {"before": _worktree(base, where),
                 "after": _worktree(after, where, "after") if args.after else Path(ROOT)}
        try:
            for tree in trees.values():
                check_imports(tree)
            for i in range(args.rounds):
                order = ["before", "after"] if i % 2 == 0 else ["after", "before"]
                result = {}
                for name in order:
                    log.info("before_after: round %d of %d, %s (%s)", i + 1, args.rounds, name,
                             base if name == "before" else after)
                    result[name] = _run(trees[name], args, where / f"{name}{i}")
                rounds.append(result)
        finally:
            for tree in trees.values():
                if tree != Path(ROOT):
                    subprocess.run(["git", "-C", ROOT, "worktree", "remove", "--force",
                                    str(tree)], capture_output=True)
    ratios = {}
    for model in args.models:
        for system in args.systems:
            r = [x["before"][model][system]["step_seconds"] /
                 x["after"][model][system]["step_seconds"] for x in rounds]
            ratios[f"{model} {system}"] = {"median": statistics.median(r), "min": min(r),
                                           "max": max(r), "rounds": r}
    results = {"base": base, "after": after, "rounds": rounds, "ratios": ratios}
    where = f"{args.hosts} emulated hosts at {args.rate}" if args.hosts else "loopback"
    table = "\n".join([
        f"# kvhybrid before ({base}) and after ({after}), {where}, {args.workers} workers,"
        f" {args.tokens} words per sample, {args.rounds} round(s) with the order alternated", "",
        _table(rounds, args), "",
        f"Median step after warm-up ({args.warmup} of {args.steps} steps) of each run, median "
        "over the rounds; the ratio is after's throughput ÷ before's in the same round.", "",
        *footer("before_after", argv if argv is not None else sys.argv[1:])]) + "\n"
    write_outputs(args.out, args.name, table, results, _plot)


if __name__ == "__main__":
    main()
