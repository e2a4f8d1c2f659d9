"""The README's status table and headline plot, drawn from the models benchmark's results.

    python -m benchmarks.status            # rewrite them from docs/benchmarks/*.json
    python -m benchmarks.status --check    # exit 1 if the README's table is not what they give

The table sits in README.md between two markers and holds kvhybrid's throughput ÷ each
peer's, median of the rounds with the range, for every setting whose results are in
``docs/benchmarks``: ``models_rounds.json`` (loopback), ``models_2x2_1gbit_rounds.json``
(emulated hosts), and ``models_16cores.json`` (the 16-core machine's run, a summary of its
ratios: that machine is not this one, so ``python -m benchmarks all`` does not rerun it);
and two rows of cost from ``cost.json`` (``benchmarks.cost``): kvhybrid's caller's thread
CPU and machine CPU per step ÷ ``dist_sync``'s at its largest worker count, where lower is
better.
Written from the same rounds and with the same rounding as the benchmark's own tables, so
the README cannot drift from them.
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from . import ROOT as _ROOT
from .common import ratio_text, round_ratios

ROOT = Path(_ROOT)

BEGIN = ("<!-- status table: written by python -m benchmarks.status; edit the benchmarks, "
         "not this -->")
END = "<!-- end of status table -->"
MODELS = [("lm", "LM-like"), ("nmt", "NMT-like"), ("cnn", "CNN")]
#: the status rows of cost, not throughput (``benchmarks.cost``): their key in cost.json
CALLER_CPU, MACHINE_CPU = "caller_cpu_ratio", "machine_cpu_ratio"
PEERS = [("dist_sync", "`dist_sync` (throughput)"), ("Horovod", "Horovod (throughput)"),
         (CALLER_CPU, "`dist_sync` (caller's thread CPU per step: lower is better)"),
         (MACHINE_CPU, "`dist_sync` (machine CPU per step: lower is better)")]
#: (results file, what the setting is), in the table's order
SETTINGS = [("models_rounds.json", "loopback, 4 workers"),
            ("models_2x2_1gbit_rounds.json", "2 emulated hosts × 2 workers, 1 Gbit/s"),
            ("models_16cores.json", "loopback, 4 workers"),
            ("cost.json", "loopback, {workers} workers")]
PLOT = "status.png"

Ratio = Tuple[float, float, float]   # median, least, most


@dataclass
class Setting:
    """One setting's ratios: {peer: {model: (median, least, most)}}, and when it was measured."""
    file: str
    what: str
    ratios: Dict[str, Dict[str, Ratio]]
    rounds: int
    measured: str

    @property
    def cores(self) -> str:
        m = re.search(r"on (\d+) cores", self.measured)
        return f"{m.group(1)} cores" if m else "cores unknown"

    @property
    def when(self) -> str:
        day = re.search(r"Measured: (\d{4}-\d\d-\d\d)", self.measured)
        commit = re.search(r"commit (\w+)( with uncommitted changes)?", self.measured)
        return (f"{day.group(1) if day else '?'}, "
                f"{(commit.group(1) + ('+' if commit.group(2) else '')) if commit else '?'}")


def _ratios_of_rounds(rounds: List[dict]) -> Dict[str, Dict[str, Ratio]]:
    """The models table's ratios (``common.round_ratios``), per peer and model, as (median,
    least, most)."""
    out: Dict[str, Dict[str, Ratio]] = {}
    for peer, _ in PEERS:
        for model, _ in MODELS:
            values = round_ratios(rounds, model, "kvhybrid", peer)
            if values:
                out.setdefault(peer, {})[model] = (statistics.median(values), min(values),
                                                   max(values))
    return out


def load(folder: Path) -> List[Setting]:
    """The settings whose results are in ``folder`` (those missing are left out)."""
    found = []
    for name, what in SETTINGS:
        path = folder / name
        if not path.exists():
            continue
        saved = json.loads(path.read_text())
        if CALLER_CPU in saved:   # benchmarks.cost: ratios per round, at most workers
            ratios, rounds = {}, 0
            for row in (CALLER_CPU, MACHINE_CPU):
                by_model = {m: v for m, v in saved.get(row, {}).items() if v}
                if by_model:
                    ratios[row] = {m: (statistics.median(v), min(v), max(v))
                                   for m, v in by_model.items()}
                    rounds = max(rounds, *map(len, by_model.values()))
            what = what.format(workers=max(map(int, saved["workers"]), default=0))
        elif "rounds" in saved and isinstance(saved["rounds"], list):
            ratios, rounds = _ratios_of_rounds(saved["rounds"]), len(saved["rounds"])
        else:   # a summary: {"ratios": {peer: {model: [median, least, most]}}, "rounds": n}
            ratios = {peer: {m: tuple(v) for m, v in by.items()}
                      for peer, by in saved["ratios"].items()}
            rounds = saved["rounds"]
        found.append(Setting(name, what, ratios, rounds, saved.get("measured", "")))
    return found


def cell(r: Optional[Ratio]) -> str:
    """The models table's own format (``common.ratio_cell``)."""
    return "–" if r is None else ratio_text(*r)


def table(settings: List[Setting]) -> str:
    lines = ["| kvhybrid's ÷ | setting | " + " | ".join(m for _, m in MODELS)
             + " | rounds | measured |", "|---|---|" + "---:|" * len(MODELS) + "---:|---|"]
    for s in settings:
        for peer, label in PEERS:
            if peer in s.ratios:
                lines.append(f"| {label} | {s.what}, {s.cores} | "
                             + " | ".join(cell(s.ratios[peer].get(m)) for m, _ in MODELS)
                             + f" | {s.rounds} | {s.when} |")
    return "\n".join(lines)


def block(settings: List[Setting]) -> str:
    return "\n".join([BEGIN, table(settings), "", f"![kvhybrid's throughput ÷ dist_sync's]"
                      f"(docs/benchmarks/{PLOT})", END])


def replace_block(readme: str, new: str) -> str:
    if readme.count(BEGIN) != 1 or readme.count(END) != 1:
        raise ValueError(f"the README needs the status markers once each: {BEGIN!r} ... {END!r}")
    head, rest = readme.split(BEGIN)
    _, tail = rest.split(END)
    return head + new + tail


def plot(settings: List[Setting], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from .common import save_figure

    fig, ax = plt.subplots(figsize=(8, 3.6))
    shown = [s for s in settings if "dist_sync" in s.ratios]
    width = 0.8 / len(MODELS)
    for i, (model, label) in enumerate(MODELS):
        xs, med, low, high = [], [], [], []
        for x, s in enumerate(shown):
            r = s.ratios["dist_sync"].get(model)
            if r:
                xs.append(x + (i - len(MODELS) / 2 + 0.5) * width)
                med.append(r[0])
                low.append(r[0] - r[1])
                high.append(r[2] - r[0])
        ax.bar(xs, med, width, yerr=[low, high], capsize=3, label=label)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(shown)), [f"{s.what}\n{s.cores} ({s.when})" for s in shown],
                  fontsize=8)
    ax.set_ylabel("kvhybrid ÷ dist_sync\n(throughput)")
    ax.set_title("kvhybrid against MXNet's dist_sync: median of the rounds, range as bars",
                 fontsize=10)
    ax.legend(fontsize=8)
    save_figure(fig, path)


def update(folder: Path, readme: Path) -> None:
    """Redraw ``folder``/status.png and the README's table from ``folder``'s results."""
    settings = load(folder)
    if not settings:
        raise ValueError(f"no models results in {folder} ({', '.join(n for n, _ in SETTINGS)})")
    readme.write_text(replace_block(readme.read_text(), block(settings)))
    plot(settings, folder / PLOT)


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.status",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=str(ROOT / "docs" / "benchmarks"),
                   help="the folder of the benchmarks' results")
    p.add_argument("--readme", default=str(ROOT / "README.md"))
    p.add_argument("--check", action="store_true",
                   help="change nothing; exit 1 if the README's table differs from the results'")
    args = p.parse_args(argv)
    folder, readme = Path(args.out), Path(args.readme)
    if args.check:
        text = readme.read_text()
        if replace_block(text, block(load(folder))) != text:
            print(f"{readme}: the status table differs from {folder}'s results; run "
                  "python -m benchmarks.status", file=sys.stderr)
            return 1
        return 0
    update(folder, readme)
    return 0


if __name__ == "__main__":
    sys.exit(main())
