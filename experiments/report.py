"""Turning the workers' records into the experiments' CSV, tables and plots (like
MXNET-MPI's Figs. 11–14: validation accuracy against wall time and against epochs, and
the mean epoch time of each mode)."""
from __future__ import annotations

import csv
import json
import statistics
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import numpy as np

#: mean epoch time leaves out the first epoch of every worker (start-up: the servers'
#: first contact, MXNet's first allocation of every array), unless it is the only one
WARMUP_EPOCHS = 1


def load_run(folder: Path) -> Dict:
    """One mode's run: rank 0's validation curve and every worker's epoch times."""
    workers = [json.loads(p.read_text()) for p in sorted(folder.glob("worker*.json"))]
    if not workers:
        raise FileNotFoundError(f"no worker*.json in {folder}: the job wrote nothing")
    first = next(w for w in workers if w["rank"] == 0)
    per_worker = [np.mean(w["epoch_seconds"][WARMUP_EPOCHS:] or w["epoch_seconds"])
                  for w in workers]
    return {"validation": first["validation"], "workers": len(workers),
            "steps_per_epoch": first["steps_per_epoch"],
            "mean_epoch_seconds": float(np.mean(per_worker)),
            "epoch_seconds": [w["epoch_seconds"] for w in workers]}


def reached(run: Dict, target: float) -> Optional[Dict]:
    """The first validation at or above ``target`` accuracy, or None."""
    return next((v for v in run["validation"] if v["accuracy"] >= target), None)


def combine(runs: Sequence[Dict], target: float) -> Dict:
    """One mode's rounds as one run: the median round's (by mean epoch time; its curve is the
    one drawn), with every round's figures under ``"rounds"`` for medians and ranges."""
    order = sorted(runs, key=lambda r: r["mean_epoch_seconds"])
    median = dict(order[(len(order) - 1) // 2])
    median["rounds"] = []
    for i, run in enumerate(runs):
        hit = reached(run, target)
        median["rounds"].append({"round": run.get("round", i),
                                 "mean_epoch_seconds": run["mean_epoch_seconds"],
                                 "target_seconds": hit["train_seconds"] if hit else None,
                                 "final_accuracy": run["validation"][-1]["accuracy"]})
    return median


def spread(values: Sequence[float], digits: int) -> str:
    """``median (min–max)``, or the one value."""
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return (f"{statistics.median(values):.{digits}f} ({min(values):.{digits}f}–"
            f"{max(values):.{digits}f})")


def mean_epochs(run: Dict) -> List[float]:
    return [r["mean_epoch_seconds"] for r in run.get("rounds") or [run]]


def target_times(run: Dict, target: float) -> List[Optional[float]]:
    """Each round's training seconds to ``target`` (None where it was not reached)."""
    if run.get("rounds"):
        return [r["target_seconds"] for r in run["rounds"]]
    hit = reached(run, target)
    return [hit["train_seconds"] if hit else None]


def time_to_target(run: Dict, target: float) -> Optional[float]:
    """The median over the rounds, a round that missed counted as never (None when at least
    half of them missed)."""
    middle = statistics.median(float("inf") if t is None else t
                               for t in target_times(run, target))
    return None if middle == float("inf") else middle


def round_ratios(slow: Dict, fast: Dict) -> List[float]:
    """``slow``'s mean epoch ÷ ``fast``'s, round by round (the runs of one round ran side by
    side)."""
    a = {r["round"]: r["mean_epoch_seconds"] for r in slow.get("rounds") or
         [{"round": 0, "mean_epoch_seconds": slow["mean_epoch_seconds"]}]}
    b = {r["round"]: r["mean_epoch_seconds"] for r in fast.get("rounds") or
         [{"round": 0, "mean_epoch_seconds": fast["mean_epoch_seconds"]}]}
    return [a[k] / b[k] for k in sorted(a) if k in b]


def write_csv(path: Path, task: str, runs: Dict[str, Dict]) -> None:
    with open(path, "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["task", "mode", "epoch", "train_seconds", "accuracy", "perplexity",
                      "loss", "mean_epoch_seconds"])
        for mode, run in runs.items():
            for v in run["validation"]:
                out.writerow([task, mode, v["epoch"], f"{v['train_seconds']:.3f}",
                              f"{v['accuracy']:.4f}", f"{v['perplexity']:.4f}",
                              f"{v['loss']:.4f}", f"{run['mean_epoch_seconds']:.4f}"])


def table(task: str, runs: Dict[str, Dict], shapes: Dict[str, str], target: float,
          perplexity: bool) -> str:
    lines = [f"### {task}: target validation accuracy {target:g}", "",
             "| mode | workers × clients | mean epoch (s) | final accuracy |"
             + (" final perplexity |" if perplexity else "")
             + " time to target (s) | epochs to target |",
             "|---|---|---:|---:|" + ("---:|" if perplexity else "") + "---:|---:|"]
    for mode, run in runs.items():
        last, hit = run["validation"][-1], reached(run, target)
        times = target_times(run, target)
        got = [t for t in times if t is not None]
        when = "not reached" if not got else spread(got, 1) + (
            f", {len(got)} of {len(times)} rounds" if len(got) < len(times) else "")
        lines.append(f"| {mode} | {shapes[mode]} | {spread(mean_epochs(run), 3)} | "
                     f"{last['accuracy']:.4f} |"
                     + (f" {last['perplexity']:.2f} |" if perplexity else "")
                     + f" {when} | {hit['epoch'] if hit else '-'} |")
    return "\n".join(lines) + "\n"


def findings(task: str, runs: Dict[str, Dict], target: float) -> List[str]:
    """Two questions of MXNET-MPI §7, answered from this run."""
    out = []
    sgd, dist = runs.get("mpi-SGD"), runs.get("dist-SGD")
    if sgd and dist:
        ratios = round_ratios(dist, sgd)
        ratio = statistics.median(ratios)
        over = ", the rounds' median (range)" if len(ratios) > 1 else ""
        out.append(f"{task}: mpi-SGD's mean epoch is {statistics.median(mean_epochs(sgd)):.3f} s, "
                   f"dist-SGD's {statistics.median(mean_epochs(dist)):.3f} s: mpi-SGD is "
                   f"{'faster' if ratio > 1 else 'slower'} ({spread(ratios, 2)}x dist-SGD's "
                   f"speed{over}).")
    esgd = runs.get("mpi-ESGD")
    if esgd:
        mine_s = time_to_target(esgd, target)
        mine = f"{mine_s:.1f} s" if mine_s is not None else "never (in this run)"
        parts = []
        for other in ("dist-SGD", "dist-ESGD"):
            if other in runs:
                theirs = time_to_target(runs[other], target)
                faster = mine_s is not None and (theirs is None or mine_s < theirs)
                parts.append(f"{other} {theirs:.1f} s" if theirs is not None else
                             f"{other} never")
                parts[-1] += " (mpi-ESGD faster)" if faster else " (mpi-ESGD not faster)"
        out.append(f"{task}: accuracy {target:g} reached by mpi-ESGD in {mine}; "
                   + "; ".join(parts) + ".")
    return out


def plot(path: Path, task: str, runs: Dict[str, Dict], target: float) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for mode, run in runs.items():
        style = "--" if mode.startswith("dist") else "-"
        epochs = [v["epoch"] for v in run["validation"]]
        accuracy = [v["accuracy"] for v in run["validation"]]
        axes[0].plot([v["train_seconds"] for v in run["validation"]], accuracy, style,
                     marker=".", label=mode)
        axes[1].plot(epochs, accuracy, style, marker=".", label=mode)
    for ax, xlabel in zip(axes[:2], ["training wall time (s), validation excluded", "epoch"]):
        ax.axhline(target, color="grey", lw=0.8, ls=":")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("validation accuracy (rank 0's weights)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    modes = list(runs)
    epochs = [mean_epochs(runs[m]) for m in modes]
    middle = [statistics.median(e) for e in epochs]
    axes[2].bar(range(len(modes)), middle,
                yerr=[[m - min(e) for m, e in zip(middle, epochs)],
                      [max(e) - m for m, e in zip(middle, epochs)]],
                color=["#999999" if m.startswith("dist") else "#1f77b4" for m in modes])
    axes[2].set_xticks(range(len(modes)), modes, rotation=30)
    axes[2].set_ylabel("mean epoch time over workers (s)")
    axes[0].set_title(f"{task}: accuracy against time")
    axes[1].set_title(f"{task}: accuracy against epochs")
    axes[2].set_title(f"{task}: mean epoch time")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
