"""``kvhybrid-launch --tune-partitions``: find how many pieces to split row_sparse tables into.

Runs the job once per sampled partition count P (``KVHYBRID_PARTITIONS``), reads the
step times rank 0 writes (``KVHYBRID_STATS_FILE``), drops the warm-up steps, and lets
``PartitionSearch`` pick the next P; then fits ``t = θ0 + θ1/P + θ2·P`` and takes the
best P inside the sampled range (Parallax §4.2), or the fastest sample where it beat the
fit's prediction there (``PartitionSearch.result``). The result is remembered per job
signature (the command and the job's shape) in ``KVHYBRID_CACHE_DIR`` (default
``~/.cache/kvhybrid``): later runs of the same job start with it, and a later tuning
starts its search there. The training command should run a few dozen steps.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional

log = logging.getLogger("kvhybrid.launch")

WARMUP_STEPS = 3


def cache_path() -> Path:
    base = os.environ.get("KVHYBRID_CACHE_DIR") or os.path.join(Path.home(), ".cache", "kvhybrid")
    return Path(base) / "partitions.json"


def trials_dir() -> tempfile.TemporaryDirectory:
    """A folder for the trials' stats files, beside the cache rather than in this machine's
    /tmp: rank 0 writes them on its own host, which across machines is another one."""
    base = cache_path().parent
    try:
        base.mkdir(parents=True, exist_ok=True)
        return tempfile.TemporaryDirectory(prefix="trials-", dir=base)
    except OSError as exc:
        raise OSError(f"tuning writes its trials' step times under {base} "
                      f"(KVHYBRID_CACHE_DIR), which failed: {exc.strerror or exc}; set "
                      "KVHYBRID_CACHE_DIR to a writable folder every host sees") from exc


#: why a job's stats may be missing, said after what was missing
NO_STATS_HINT = ("the training must use the hybrid-mpi store and close it (it does at "
                 "exit), and rank 0's host must see the launcher's KVHYBRID_CACHE_DIR "
                 "(across machines, a folder every host shares: set KVHYBRID_CACHE_DIR)")


def signature(command: List[str], workers: int, clients: int, servers: int) -> str:
    text = json.dumps([[os.path.basename(command[0])] + command[1:], workers, clients, servers])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def load_cache() -> Dict[str, dict]:
    try:
        return json.loads(cache_path().read_text())
    except (OSError, ValueError):
        return {}


def remembered(sig: str) -> Optional[int]:
    entry = load_cache().get(sig)
    return int(entry["partitions"]) if entry else None


def remember(sig: str, entry: dict) -> None:
    cache = load_cache()
    cache[sig] = entry
    path = cache_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(cache, indent=1))
    tmp.replace(path)


def step_time(stats_file: str, warmup: int = WARMUP_STEPS) -> float:
    """Median seconds per step after ``warmup`` steps, from rank 0's stats."""
    return step_time_of(json.loads(Path(stats_file).read_text()), warmup)


def step_time_of(stats: dict, warmup: int = WARMUP_STEPS) -> float:
    """``step_time`` of stats already read."""
    steps = stats["step_seconds"]
    if len(steps) <= warmup:
        raise ValueError(f"the job ran {len(steps) + 1} steps: tuning needs more than "
                         f"{warmup + 1} (the first {warmup} are warm-up); run more steps")
    return statistics.median(steps[warmup:])


def tune(run_job: Callable[[Dict[str, str]], int], sig: str, start: int, max_p: int,
         max_samples: int, out_dir: Optional[str]) -> int:
    """Sample, fit, remember, report. ``run_job(env)`` runs the job once with ``env``
    added; returns an exit code (non-zero ends the tuning)."""
    from kvhybrid.kvstore.partition_tuner import PartitionSearch, predict

    search = PartitionSearch(start=min(start, max_p), max_p=max_p, max_samples=max_samples)
    with trials_dir() as tmp:
        while (p := search.next()) is not None:
            n = len(search.samples) + 1
            log.info("tune %d/%d: running the job with KVHYBRID_PARTITIONS=%d ...", n,
                     max_samples, p)
            stats = os.path.join(tmp, f"p{p}.json")
            t0 = time.monotonic()
            rc = run_job({"KVHYBRID_PARTITIONS": str(p), "KVHYBRID_STATS_FILE": stats})
            if rc != 0:
                log.error("tune: the job failed with P=%d (exit code %d); stopping", p, rc)
                return rc
            try:
                seconds = step_time(stats)
            except (OSError, ValueError, KeyError) as exc:
                log.error("tune: no step times from the job with P=%d (%s): %s", p, exc,
                          NO_STATS_HINT)
                return 1
            search.record(p, seconds)
            log.info("tune %d/%d: P=%d: %.2f ms per step (job took %.0f s)", n, max_samples, p,
                     seconds * 1e3, time.monotonic() - t0)
    chosen, theta = search.result()
    samples = sorted(search.samples.items())
    lines = ["| P | ms per step (median after warm-up) | model |", "|---|---|---|"]
    for p, t in samples:
        model = f"{predict(theta, p) * 1e3:.2f}" if theta else "–"
        lines.append(f"| {p}{' ← chosen' if p == chosen else ''} | {t * 1e3:.2f} | {model} |")
    if chosen not in search.samples:
        lines.append(f"| {chosen} ← chosen | – | {predict(theta, chosen) * 1e3:.2f} |")
    fit = (f"t(P) = {theta[0] * 1e3:.3f} + {theta[1] * 1e3:.3f}/P + {theta[2] * 1e3:.4f}·P ms"
           if theta else "fewer than 3 settings: the fastest sample")
    summary = "\n".join([f"partition tuning: {len(samples)} settings sampled; {fit}; "
                         f"chosen P = {chosen}", *lines])
    print(summary, flush=True)
    remember(sig, {"partitions": chosen, "theta": theta, "samples": samples,
                   "when": time.strftime("%Y-%m-%d %H:%M:%S")})
    log.info("tune: remembered P=%d for this job in %s (later runs use it unless "
             "KVHYBRID_PARTITIONS is set)", chosen, cache_path())
    if out_dir:
        write_report(Path(out_dir), samples, chosen, theta, summary)
    return 0


def write_report(out: Path, samples, chosen: int, theta, summary: str) -> None:
    """partitions_tuning.{md,png}: the samples and the fitted curve."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    from kvhybrid.kvstore.partition_tuner import predict

    out.mkdir(parents=True, exist_ok=True)
    (out / "partitions_tuning.md").write_text(summary + "\n")
    fig, ax = plt.subplots(figsize=(6, 4))
    ps = [p for p, _ in samples]
    ax.plot(ps, [t * 1e3 for _, t in samples], "o", label="sampled (median ms per step)")
    if theta:
        grid = np.linspace(min(ps), max(ps), 200)
        ax.plot(grid, predict(theta, grid) * 1e3, "-", label="fit θ0 + θ1/P + θ2·P")
    ax.axvline(chosen, color="red", ls="--", label=f"chosen P = {chosen}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("partitions P")
    ax.set_ylabel("ms per step")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "partitions_tuning.png", dpi=110)
    plt.close(fig)
