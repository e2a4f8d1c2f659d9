"""What the benchmarks share: timing a call on every rank, running a job, bar charts."""
from __future__ import annotations

import importlib
import json
import logging
import statistics
import subprocess
import time
from pathlib import Path
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

log = logging.getLogger("benchmarks")

#: where the diagnostic tools (before_after, caller_cpu, step_timeline, engine_copies,
#: ring_segments, waits) and pushpull, whose results are not kept, write by default: a git-ignored
#: folder, not docs/benchmarks, which holds the current result of each benchmark that
#: ``python -m benchmarks all`` regenerates
DIAGNOSTICS_OUT = str(Path(__file__).resolve().parent.parent / "bench-out")


def timed(fn: Callable[[], None], repeats: int, warmup: int, barrier) -> List[float]:
    """Seconds of ``repeats`` calls of ``fn`` after ``warmup`` untimed ones; every rank
    starts each call together (``barrier``)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        barrier()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def mpirun_command(ranks: int, bench: str) -> List[str]:
    """``mpirun -np ranks`` for a plain MPI benchmark job on this machine (Open MPI: more
    ranks than cores allowed, none bound to a core); exits naming ``bench`` if there is none."""
    from kvhybrid.launch.mpirun import find_mpirun, flavour
    try:
        mpirun = find_mpirun()
    except FileNotFoundError as exc:
        raise SystemExit(f"{bench}: {exc}") from None
    cmd = [mpirun, "-np", str(ranks)]
    if flavour(mpirun) == "openmpi":
        cmd += ["--oversubscribe", "--bind-to", "none"]
    return cmd


#: when a ``model_worker`` waits for MXNet's engine (``--waitall``): after every step, so
#: each step is timed alone, or once after the last, as a loop that never waits
WAITS = ("step", "end")


def resolve(module: str, path: str) -> Tuple[object, str, object]:
    """(the object that holds the last name of the dotted ``path`` inside ``module``, that
    name, what it holds now): where a wrapping benchmark (caller_cpu, step_timeline) puts
    its wrapper."""
    owner = importlib.import_module(module)
    *outer, name = path.split(".")
    for part in outer:
        owner = getattr(owner, part)
    return owner, name, getattr(owner, name)


def run_job(cmd: Sequence[str], env: Mapping[str, str], timeout: float, what: str,
            bench: str, cwd: Optional[str] = None) -> None:
    """Run a benchmark job (in ``cwd``, else here); exit with its output's tail (naming
    ``what``) if it fails. On a timeout, or when the benchmark itself is stopped, the job (a
    ``kvhybrid-launch``) gets SIGTERM first, so that it stops its scheduler, servers and
    mpiruns; SIGKILL only after ``STOP_GRACE`` seconds."""
    proc = subprocess.Popen(list(cmd), env=dict(env), cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        stop_job(proc)
        raise SystemExit(f"{bench}: {what} did not finish in {timeout:.0f} s; raise "
                         "--timeout") from None
    except BaseException:   # Ctrl-C or SIGTERM of the benchmark
        stop_job(proc)
        raise
    if proc.returncode != 0:
        raise SystemExit(f"{bench}: {what} failed (exit {proc.returncode}):\n{output[-3000:]}")


STOP_GRACE = 30.0


def stop_job(proc: subprocess.Popen) -> None:
    """SIGTERM to a job's launcher, which stops its scheduler, servers and mpiruns;
    SIGKILL to its whole session ``STOP_GRACE`` seconds later (as ``--tune`` stops a
    trial)."""
    from kvhybrid.launch.shape_tune import stop_session
    stop_session(proc, STOP_GRACE)


def ratio_cell(values: Sequence[float]) -> str:
    """A ratio measured over several rounds: its median, its range in brackets."""
    return ratio_text(statistics.median(values), min(values), max(values))


def ratio_text(median: float, least: float, most: float) -> str:
    """``ratio_cell``'s text from the three figures (a summary that kept no rounds)."""
    return f"{median:.2f}× ({least:.2f}–{most:.2f})"


def round_ratios(rounds: Sequence[Mapping[str, Mapping[str, dict]]], key: str, a: str,
                 b: str, read=lambda run: run["words_per_second"]) -> List[float]:
    """``a``'s figure ÷ ``b``'s (``read``: throughput unless told) in each round that ran
    both on ``key`` (a model, or a sweep's words per sample) and has both figures: the same
    round's runs, so a noisy minute hits both."""
    out = []
    for r in rounds:
        runs = r.get(key, {})
        if a in runs and b in runs:
            mine, theirs = read(runs[a]), read(runs[b])
            if mine is not None and theirs:
                out.append(mine / theirs)
    return out


def caller_cpu(run: dict) -> Optional[float]:
    """A run's CPU ms a step on a worker's caller's thread (None where not recorded)."""
    return (run.get("cpu_ms_per_step") or {}).get("caller")


def machine_cpu(run: dict) -> Optional[float]:
    """A run's CPU ms a step of every process of the machine (None where not recorded)."""
    return run.get("machine_cpu_ms_per_step")


def footer(module: str, argv: Optional[List[str]] = None,
           measured: Optional[str] = None) -> List[str]:
    """The lines that end every table: the command that reproduces it (this process's, or
    ``argv``: that of the run that measured it) and when, on what code and machine it was
    measured (``measured``: a line ``provenance()`` gave that run; default: now)."""
    import shlex
    import sys
    argv = sys.argv[1:] if argv is None else argv
    return [f"Command: `python -m benchmarks.{module} {shlex.join(argv)}`",
            measured or provenance()]


def provenance() -> str:
    """When, on which commit and on what machine a result is measured, as one line: a
    result that does not say so cannot be compared with the next one. A working tree whose
    code differs from the commit is named as such (``docs/``, where the benchmarks write,
    and Markdown files do not count)."""
    import datetime
    import os
    import platform
    root = Path(__file__).resolve().parent.parent

    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", "-C", str(root), *args], capture_output=True,
                                  text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    commit = git("rev-parse", "--short", "HEAD") or "unknown (not a git checkout)"
    if git("status", "--porcelain", "--untracked-files=no", "--", ".", ":!docs", ":!*.md"):
        commit += " with uncommitted changes"
    system = platform.system()
    try:
        release = dict(line.split("=", 1) for line in
                       Path("/etc/os-release").read_text().splitlines() if "=" in line)
        system = release.get("PRETTY_NAME", system).strip('"')
    except OSError:
        pass
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return (f"Measured: {when}, commit {commit}, on {os.cpu_count()} cores "
            f"({system}, host {platform.node()}).")


def save_worker_result(result: Optional[dict], path: str) -> None:
    """A job's rank 0 writes what it measured (the other ranks return nothing)."""
    if result:
        with open(path, "w") as f:
            json.dump(result, f)


def write_outputs(out_dir: str, name: str, table: str, results, plot: Callable) -> None:
    """``name``.md, .json and .png into ``out_dir``; the table is printed too."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.md").write_text(table)
    (out / f"{name}.json").write_text(json.dumps(results))
    plot(results, out / f"{name}.png")
    print(table)
    log.info("%s: wrote %s/%s.{md,json,png}", name, out, name)


def grouped_bars(ax, groups: Sequence[str], series: Mapping[str, Sequence[float]]) -> None:
    """One bar per series in each group, side by side, labelled for a legend."""
    width = 0.8 / len(series)
    for i, (label, values) in enumerate(series.items()):
        ax.bar([x + (i - len(series) / 2 + 0.5) * width for x in range(len(groups))],
               list(values), width, label=label)
    ax.set_xticks(range(len(groups)), list(groups))


def save_figure(fig, path: Path) -> None:
    import matplotlib.pyplot as plt
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


Series = Dict[str, List[float]]
