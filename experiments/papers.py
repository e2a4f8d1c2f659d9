"""The two papers' headline claims, measured where the network is the bottleneck:
``docs/experiments/papers.md``.

    python -m experiments.papers                          # measure what is missing, write the page
    python -m experiments.papers --page-only              # write the page from what is measured
    python -m experiments.papers --remeasure --rates 100mbit --rounds 1   # a shorter setting
    python -m experiments.papers --tiny --rates 1gbit --out /tmp/papers  # every code path, fast

Every part runs an existing tool on 2 emulated hosts × 2 workers (network namespaces joined
by links shaped to ``--rates``; root only), a client group and a server per host, and keeps
its pages under ``OUT/papers/``:

- ``modes_RATE/``: MXNET-MPI §7's six modes on both tasks (``python -m experiments``);
- ``models_RATE*``: Parallax Table 4's architectures on the LM and NMT models, the α sweep of
  Table 6 and each host's bytes against Table 3 (``python -m benchmarks.models``);
- ``dense_RATE*``: the densified architectures of Table 4 (kvhybrid all-AR, Horovod), whose
  tables cross the link whole every step, with fewer steps;
- ``partitions_RATE*``: Table 5, the partition tuner against a sweep of P
  (``python -m benchmarks.partitions``).

Then the page (``report_papers.py``) sets one row per claim against ours. A part whose
results are in ``OUT/papers`` is kept unless ``--remeasure``: a run stopped part way goes on
where it stopped. ``--tiny`` runs each part at a size that only exercises it (a task, three
modes, an epoch; two α; a few steps): for tests, not for reading.
"""
from __future__ import annotations

import argparse
import logging
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import List, Sequence

log = logging.getLogger("experiments")

#: words per sample of the α sweep (Parallax Table 6 varies the data instance's length)
ALPHA_TOKENS = ["10", "25", "50", "100", "200"]


@dataclass(frozen=True)
class Part:
    """One measured part of the page at one link rate."""
    name: str
    rate: str
    #: the file whose presence says the part is measured (under OUT/papers)
    result: str
    command: List[str]

    def done(self, folder: Path) -> bool:
        return (folder / self.result).is_file()


#: each part's size, as arguments of its tool: the page's, and ``--tiny``'s
SIZES = {
    # 10 LM epochs: the elastic modes exchange the whole table with the center, and need
    # more than the default 6 to reach 0.80 on a slow link
    "full": {"modes": ["--epochs", "lm=10"],
             "models": ["--models", "lm", "nmt", "--systems", "kvhybrid", "kvhybrid all-PS",
                        "dist_sync", "--alpha-tokens", *ALPHA_TOKENS, "--steps", "20",
                        "--warmup", "5"],
             # a densified table crosses the link whole every step (51 MB for the LM):
             # seconds a step at 100 Mbit/s, so fewer steps
             "dense": ["--models", "lm", "nmt", "--systems", "kvhybrid", "kvhybrid all-AR",
                       "Horovod", "--steps", "6", "--warmup", "2"],
             "partitions": ["--sweep", "1", "2", "4", "8", "16", "--steps", "20"]},
    "tiny": {"modes": ["--tasks", "digits", "--modes", "dist-SGD", "mpi-SGD", "mpi-ESGD",
                       "--epochs", "1", "--interval", "4"],
             "models": ["--models", "lm", "--systems", "kvhybrid", "kvhybrid all-PS",
                        "dist_sync", "--alpha-tokens", "10", "50", "--steps", "4",
                        "--warmup", "2"],
             "dense": ["--models", "lm", "--systems", "kvhybrid", "kvhybrid all-AR",
                       "--steps", "3", "--warmup", "1"],
             "partitions": ["--sweep", "1", "2", "--steps", "8"]},
}


def parts(rate: str, rounds: int, folder: Path, epochs: Sequence[str],
          size: str = "full") -> List[Part]:
    hosts = ["--hosts", "2", "--rate", rate]
    r = ["--rounds", str(rounds)]
    args = SIZES[size]
    return [
        Part("modes", rate, f"modes_{rate}/experiments.json",
             [sys.executable, "-m", "experiments", *hosts, *r, *args["modes"], "--out",
              str(folder / f"modes_{rate}"), *(["--epochs", *epochs] if epochs else [])]),
        Part("models", rate, f"models_{rate}_rounds.json",
             [sys.executable, "-m", "benchmarks.models", *hosts, *args["models"], *r,
              "--name", f"models_{rate}", "--out", str(folder)]),
        Part("dense", rate, f"dense_{rate}_rounds.json",
             [sys.executable, "-m", "benchmarks.models", *hosts, *args["dense"], *r,
              "--name", f"dense_{rate}", "--out", str(folder)]),
        Part("partitions", rate, f"partitions_{rate}.json",
             [sys.executable, "-m", "benchmarks.partitions", *hosts, *args["partitions"],
              "--rounds", str(rounds), "--name", f"partitions_{rate}", "--out", str(folder)]),
    ]


def _bits_per_second(rate: str) -> float:
    """tc's rate notation in bits per second (100mbit, 1gbit, 500kbit)."""
    match = re.fullmatch(r"([\d.]+)([kmg]?)bit", rate.lower())
    if not match:
        return float("inf")
    return float(match.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[match.group(2)]


def page_rates(folder: Path, asked: Sequence[str]) -> List[str]:
    """The rates the page shows: those asked for and those measured earlier (a shorter
    run of one rate keeps the other's columns), the slowest link first."""
    found = {m.group(1) for f in folder.glob("*") if (m := re.match(
        r"(?:modes|models|dense|partitions)_(\d[\w.]*bit)", f.name))}
    return sorted(set(asked) | found, key=_bits_per_second)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m experiments.papers",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--rates", nargs="+", default=["100mbit", "1gbit"],
                   help="the emulated links' bandwidths (tc tbf rate), one setting each")
    p.add_argument("--rounds", type=int, default=3,
                   help="rounds of every timed comparison, the order alternated")
    p.add_argument("--epochs", nargs="+", metavar="[TASK=]N", default=[],
                   help="the six modes' epochs (python -m experiments --epochs); default: "
                        "digits 30, lm 10")
    p.add_argument("--only", nargs="+", choices=["modes", "models", "dense", "partitions"],
                   help="measure these parts only")
    p.add_argument("--remeasure", action="store_true",
                   help="measure every part again, even those whose results are in --out")
    p.add_argument("--page-only", action="store_true",
                   help="measure nothing: write the page from what --out holds")
    p.add_argument("--tiny", action="store_true",
                   help="every part at a size that only exercises its code (for tests)")
    p.add_argument("--out", default="docs/experiments")
    args = p.parse_args(argv)
    if args.rounds < 1:
        p.error(f"--rounds must be at least 1, got {args.rounds}")
    if not args.page_only:
        if os.geteuid() != 0:
            p.error("the papers' settings run on emulated hosts (network namespaces): run as "
                    "root, or write the page from measured results with --page-only")
        if shutil.which("ip") is None or shutil.which("tc") is None:
            p.error("the emulated hosts need iproute2's ip and tc on PATH (apt-get install "
                    "iproute2)")
    return args


def main(argv=None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    args = parse_args(argv)
    folder = Path(args.out) / "papers"
    folder.mkdir(parents=True, exist_ok=True)
    failed: List[str] = []
    if not args.page_only:
        size = "tiny" if args.tiny else "full"
        plan = [p for rate in args.rates
                for p in parts(rate, args.rounds, folder, args.epochs, size)
                if not args.only or p.name in args.only]
        for n, part in enumerate(plan, 1):
            if part.done(folder) and not args.remeasure:
                log.info("[%d/%d] %s at %s: kept (%s)", n, len(plan), part.name, part.rate,
                         folder / part.result)
                continue
            log.info("[%d/%d] %s at %s: %s", n, len(plan), part.name, part.rate,
                     " ".join(["python", *part.command[1:]]))
            start = time.perf_counter()
            rc = subprocess.run(part.command).returncode
            log.info("[%d/%d] %s at %s: %s in %.0f s", n, len(plan), part.name, part.rate,
                     "done" if rc == 0 else f"failed (exit {rc})", time.perf_counter() - start)
            if rc != 0:
                failed.append(f"{part.name} at {part.rate}")
    from .report_papers import write_page
    write_page(Path(args.out), page_rates(folder, args.rates))
    if failed:
        log.error("failed: %s", ", ".join(failed))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
