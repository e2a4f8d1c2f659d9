"""Turning the workers' records into the experiments' CSV, tables and plots (like
MXNET-MPI's Figs. 11–14: validation accuracy against wall time and against epochs, and
the mean epoch time of each mode)."""
from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Dict, List, Optional

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
        lines.append(f"| {mode} | {shapes[mode]} | {run['mean_epoch_seconds']:.3f} | "
                     f"{last['accuracy']:.4f} |"
                     + (f" {last['perplexity']:.2f} |" if perplexity else "")
                     + (f" {hit['train_seconds']:.1f} | {hit['epoch']} |" if hit
                        else " not reached | - |"))
    return "\n".join(lines) + "\n"


def findings(task: str, runs: Dict[str, Dict], target: float) -> List[str]:
    """Two questions of MXNET-MPI §7, answered from this run."""
    out = []
    sgd, dist = runs.get("mpi-SGD"), runs.get("dist-SGD")
    if sgd and dist:
        ratio = dist["mean_epoch_seconds"] / sgd["mean_epoch_seconds"]
        out.append(f"{task}: mpi-SGD's mean epoch is {sgd['mean_epoch_seconds']:.3f} s, "
                   f"dist-SGD's {dist['mean_epoch_seconds']:.3f} s: mpi-SGD is "
                   f"{'faster' if ratio > 1 else 'slower'} ({ratio:.2f}x dist-SGD's speed).")
    esgd = runs.get("mpi-ESGD")
    if esgd:
        hit = reached(esgd, target)
        mine = f"{hit['train_seconds']:.1f} s" if hit else "never (in this run)"
        parts = []
        for other in ("dist-SGD", "dist-ESGD"):
            if other in runs:
                theirs = reached(runs[other], target)
                faster = hit is not None and (theirs is None or
                                              hit["train_seconds"] < theirs["train_seconds"])
                parts.append(f"{other} {theirs['train_seconds']:.1f} s" if theirs else
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
    axes[2].bar(range(len(modes)), [runs[m]["mean_epoch_seconds"] for m in modes],
                color=["#999999" if m.startswith("dist") else "#1f77b4" for m in modes])
    axes[2].set_xticks(range(len(modes)), modes, rotation=30)
    axes[2].set_ylabel("mean epoch time over workers (s)")
    axes[0].set_title(f"{task}: accuracy against time")
    axes[1].set_title(f"{task}: accuracy against epochs")
    axes[2].set_title(f"{task}: mean epoch time")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
