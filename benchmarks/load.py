"""Load test: the memory of every process of a job stays flat under many keys and
many steps.

    python -m benchmarks.load                 # 5,000 keys x 200 steps x 4 workers, both shapes
    python -m benchmarks.load --keys 200 --steps 10 --shapes mpi --out /tmp/load

Each shape is one job started through ``kvhybrid-launch``:

* ``mpi``: pure MPI, one client group of all the workers (``kvhybrid-launch -n 4``);
* ``servers``: 2 client groups and 1 parameter server (``-n 4 --clients 2 --servers 1``).

Every worker holds ``--keys`` small dense float32 keys (sizes drawn between
``--min-floats`` and ``--max-floats``, the same on every rank) and a few large ones
(``--large-floats``), and each step makes the store calls a Trainer makes: one ``pushpull``
with the list of every small key (``kvhybrid.DistributedTrainer``: its gradients are views
into one buffer), then ``push`` + ``pull`` of each large key (``gluon.Trainer``'s per-key
path). The optimizer (SGD with momentum) goes where ``DistributedTrainer`` puts it: with one
group it runs on the workers after the sums (``update_on_kvstore=False``), with several it
is handed to the store with ``set_optimizer`` and runs on the servers.

The benchmark's own process samples the RSS of every process of the job — the launcher,
each ``mpirun``, each worker rank, the scheduler and each server, each on its own (children
not included) — every ``--interval`` seconds by walking the launcher's process tree (roles
from ``DMLC_ROLE``, ranks from the workers' own reports). Warm-up is the first 20 % of the
steps (``--warmup-fraction``). "After warm-up" is a process's peak RSS over the window of 5 %
of the steps that follows warm-up, "at the end" its peak over the last 5 % of the steps;
growth under 5 % passes. Every job runs under a hard ``--timeout``: a job that does not
finish is stopped and reported as a hang, naming its shape.

Writes ``load.md`` (per shape and per process: RSS after warm-up and at the end, growth,
median step time), ``load.json`` (every sample) and ``load.png`` (RSS over time) into
``--out``; exits 1 if a job failed or hung (with ``--strict``, also if a process grew 5 % or
more).
"""
from __future__ import annotations

import argparse
import datetime
import gc
import json
import logging
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Dict, List

from .common import footer, save_figure, stop_job, write_outputs
from .pushpull import _env

log = logging.getLogger("benchmarks")

MB = 2 ** 20
GROWTH_LIMIT = 5.0   # per cent, the pass mark
#: launcher arguments of each shape, given the number of workers
SHAPES = {
    "mpi": ("pure MPI, one client group", lambda w: ["-n", str(w)]),
    "servers": ("2 client groups, 1 parameter server",
                lambda w: ["-n", str(w), "--clients", "2", "--servers", "1"]),
}


# -- the measuring side (each worker rank, under kvhybrid-launch) -------------------------------
def key_sizes(keys: int, low: int, high: int) -> List[int]:
    """The small keys' sizes in floats, the same on every rank."""
    import numpy as np
    return [int(n) for n in np.random.RandomState(0).randint(low, high + 1, keys)]


def store_counts(kv) -> Dict[str, int]:
    """What could grow step by step in a process: Python's objects and the store's caches."""
    counts = {"python_objects": len(gc.get_objects()), "call_memos": len(kv.calls),
              "host_views": len(kv.dense.views), "step_ticks": len(kv.clock),
              "keys": len(kv.resume_state().slots)}
    if kv.placement.servers is not None:
        counts["server_key_ids"] = len(kv.placement.servers._ids)
    return counts


def worker(args) -> None:
    import numpy as np
    import mxnet as mx
    import psutil
    import kvhybrid  # noqa: F401

    kv = mx.kv.create("hybrid-mpi")
    rank, me = kv.rank, psutil.Process()
    sizes = key_sizes(args.keys, args.min_floats, args.max_floats)
    small = list(range(args.keys))
    large = list(range(args.keys, args.keys + len(args.large_floats)))
    # DistributedTrainer's layout: the small gradients are views into one buffer
    flat = mx.nd.zeros((sum(sizes),))
    bounds = np.cumsum([0] + sizes)
    small_grads = [flat[int(a):int(b)] for a, b in zip(bounds, bounds[1:])]
    small_weights = [mx.nd.ones((n,)) for n in sizes]
    large_grads = [mx.nd.zeros((n,)) for n in args.large_floats]
    large_weights = [mx.nd.ones((n,)) for n in args.large_floats]
    kv.init(small + large, small_weights + large_weights)
    on_store = {"auto": kv.num_workers != kv.group.size, "yes": True, "no": False}[
        args.update_on_kvstore]
    optimizer = mx.optimizer.SGD(learning_rate=0.01, momentum=0.9,
                                 rescale_grad=1.0 / kv.num_workers)
    updater = None
    if on_store:
        kv.set_optimizer(optimizer)
    else:
        updater = mx.optimizer.get_updater(optimizer)
    grad = 0.001 * (rank + 1)
    warm = max(1, int(args.steps * args.warmup_fraction))
    every = max(1, args.steps // 10)
    records, counts, top = [], {}, []
    if rank == 0:
        print(f"load: {args.keys} small keys, {len(large)} large, {kv.num_workers} workers, "
              f"optimizer {'on the store' if on_store else 'on the workers'}", flush=True)
    start = time.time()
    for step in range(args.steps):
        if step == warm:
            counts["after_warmup"] = store_counts(kv)
            if args.tracemalloc:
                import tracemalloc
                tracemalloc.start(8)
                before = tracemalloc.take_snapshot()
        t0 = time.perf_counter()
        flat[:] = grad   # backward writes every gradient again
        for g in large_grads:
            g[:] = grad
        if on_store:
            kv.pushpull(small, small_grads, out=small_weights)
            for k, g, w in zip(large, large_grads, large_weights):
                kv.push(k, g)
                kv.pull(k, out=w)
        else:
            kv.pushpull(small, small_grads)
            for k, g in zip(large, large_grads):
                kv.push(k, g)
                kv.pull(k, out=g)
            updater(small + large, small_grads + large_grads, small_weights + large_weights)
        mx.nd.waitall()
        records.append((time.time(), time.perf_counter() - t0, me.memory_info().rss))
        if rank == 0 and ((step + 1) % every == 0 or step + 1 == args.steps):
            recent = statistics.median(r[1] for r in records[-every:])
            print(f"load: step {step + 1}/{args.steps}, {recent * 1e3:.0f} ms per step, "
                  f"rank 0 RSS {records[-1][2] / MB:.0f} MB", flush=True)
    counts["end"] = store_counts(kv)
    if args.tracemalloc:
        import tracemalloc
        diff = tracemalloc.take_snapshot().compare_to(before, "traceback")
        top = [{"bytes": d.size_diff, "blocks": d.count_diff,
                "where": [f"{f.filename}:{f.lineno}" for f in d.traceback]} for d in diff[:15]]
    if on_store:   # the servers' optimizer moved the weights (from 1), to finite values
        checked = all(bool(np.isfinite(w.asnumpy()).all()) and float(w[0].asscalar()) < 1
                      for w in small_weights[:1] + large_weights[-1:])
    else:          # the gradients hold the last step's sum over every worker
        expected = 0.001 * sum(range(1, kv.num_workers + 1))
        checked = all(np.allclose(g.asnumpy(), expected, rtol=1e-5)
                      for g in small_grads[-1:] + large_grads[:1])
    with open(os.path.join(args.result, f"worker{rank}.json"), "w") as f:
        json.dump({"rank": rank, "pid": os.getpid(), "client": kv.placement.client_rank,
                   "start": start, "warmup_steps": warm, "update_on_kvstore": on_store,
                   "steps": records, "counts": counts, "tracemalloc_top": top,
                   "sums_checked": checked}, f)
    kv.close()
    if not checked:
        raise SystemExit(f"load: rank {rank}: the store's results are wrong")


# -- the driving side ----------------------------------------------------------------------------
MPIRUNS = ("mpirun", "mpiexec", "orterun", "prterun")
#: the roles ``describe`` recognises; any other is read again on the next round
JOB_ROLES = ("launcher", "mpirun", "worker", "scheduler", "server")


def describe(proc, root: int) -> Dict[str, object]:
    """A process's role in the job, from its command line and environment."""
    import psutil
    try:
        cmdline = proc.cmdline()
        env = proc.environ()
    except (psutil.AccessDenied, psutil.ZombieProcess):
        cmdline, env = [proc.name()], {}
    client = env.get("KVHYBRID_CLIENT_ID")
    if proc.pid == root:
        role = "launcher"
    elif not cmdline:   # inside execve: the new image has no arguments yet
        role = proc.name()
    elif os.path.basename(cmdline[0]) in MPIRUNS:
        role = "mpirun"
    elif "benchmarks.load" in cmdline and "--worker" in cmdline:
        role = "worker"
    elif (cmdline[-2:] in (["-c", "import mxnet"], ["-m", "kvhybrid.kvstore.ps.node"])
          and env.get("DMLC_ROLE")):
        role = env["DMLC_ROLE"]
    else:
        role = proc.name()
    return {"role": role, "client": client, "cmdline": " ".join(cmdline)[:200],
            "created": proc.create_time()}


class Sampler(threading.Thread):
    """The RSS of every process under ``root`` (itself included), each on its own, every
    ``interval`` seconds: ``samples[pid] = [(time, rss)]``, ``info[pid]`` its role."""

    def __init__(self, root: int, interval: float):
        super().__init__(daemon=True)
        self.root, self.interval = root, interval
        self.samples: Dict[int, List[List[float]]] = {}
        self.load: List[float] = []   # the machine's 1-minute load average, each round
        self.info: Dict[int, Dict[str, object]] = {}
        self._argv: Dict[int, List[str]] = {}
        self.done = threading.Event()

    def run(self) -> None:
        import psutil
        try:
            root = psutil.Process(self.root)
        except psutil.NoSuchProcess:
            return
        while not self.done.is_set():
            now = time.time()
            try:
                procs = [root] + root.children(recursive=True)
            except psutil.NoSuchProcess:
                return
            self.load.append(os.getloadavg()[0])
            for p in procs:
                try:
                    rss = p.memory_info().rss
                    # a child between fork and exec shows its parent's command line, and
                    # inside execve an empty one or none of its environment: its role is
                    # read again until it is one of the job's
                    argv = p.cmdline()
                    if self._argv.get(p.pid) != argv \
                            or self.info[p.pid]["role"] not in JOB_ROLES:
                        self.info[p.pid] = describe(p, self.root)
                        self._argv[p.pid] = argv
                except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                    continue
                self.samples.setdefault(p.pid, []).append([now, rss])
            self.done.wait(self.interval)


def _stop(proc: subprocess.Popen, sampler: Sampler) -> None:
    """``common.stop_job`` (SIGTERM to the launcher, which stops its job; SIGKILL to its
    session later), then SIGKILL to every process of the job still alive: they run in
    sessions of their own."""
    import psutil
    stop_job(proc)
    for pid, info in list(sampler.info.items()):
        try:
            p = psutil.Process(pid)
            if p.create_time() == info["created"]:   # that process, not a reused pid
                p.kill()
        except psutil.Error:
            pass


def _follow(path: str, lines: List[str], done: threading.Event) -> None:
    """The job's output as it is written: kept, and its progress lines logged."""
    with open(path, errors="replace") as f:
        part = ""
        while True:
            chunk = f.readline()
            if not chunk:
                if done.is_set():
                    break
                time.sleep(0.2)
                continue
            part += chunk
            if part.endswith("\n"):
                lines.append(part.rstrip("\n"))
                if "load: " in part or "rror" in part:
                    log.info("  %s", part.rstrip())
                part = ""


def _worker_cmd(args, result: str) -> List[str]:
    return ["python", "-m", "benchmarks.load", "--worker", "--result", result,
            "--keys", str(args.keys), "--steps", str(args.steps),
            "--min-floats", str(args.min_floats), "--max-floats", str(args.max_floats),
            "--large-floats", *map(str, args.large_floats),
            "--warmup-fraction", str(args.warmup_fraction),
            "--update-on-kvstore", args.update_on_kvstore] + \
        (["--tracemalloc"] if args.tracemalloc else [])


def run_shape(args, shape: str, tmp: str) -> Dict:
    """One job; its samples, the workers' reports, and how it ended."""
    result = tempfile.mkdtemp(dir=tmp)
    launcher = SHAPES[shape][1](args.workers)
    cmd = [sys.executable, "-m", "kvhybrid.launch.cli", *launcher, *_worker_cmd(args, result)]
    log.info("load: %s (kvhybrid-launch %s): %d keys + %d large, %d steps ...", shape,
             " ".join(launcher), args.keys, len(args.large_floats), args.steps)
    t0 = time.time()
    output = os.path.join(result, "output.log")
    with open(output, "w") as out:
        proc = subprocess.Popen(cmd, env=_env(), stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    sampler = Sampler(proc.pid, args.interval)
    sampler.start()
    lines: List[str] = []
    written = threading.Event()
    reader = threading.Thread(target=_follow, args=(output, lines, written), daemon=True)
    reader.start()
    status = "ok"
    try:
        proc.wait(timeout=args.timeout)
    except subprocess.TimeoutExpired:
        status = f"hang: not finished after {args.timeout:.0f} s (stopped)"
        _stop(proc, sampler)
    except BaseException:   # Ctrl-C or SIGTERM of the benchmark
        _stop(proc, sampler)
        raise
    finally:
        sampler.done.set()
        written.set()
        sampler.join()
        reader.join(timeout=10)
    if status == "ok" and proc.returncode != 0:
        status = f"failed: exit code {proc.returncode}"
    workers = [json.loads(p.read_text()) for p in sorted(Path(result).glob("worker*.json"))]
    if status == "ok" and len(workers) != args.workers:
        status = f"failed: {len(workers)} of {args.workers} workers reported"
    total = time.time() - t0
    log.info("load: %s %s in %.0f s, %d processes sampled", shape, status, total,
             len(sampler.samples))
    if status != "ok":
        log.error("load: %s: the job's last output:\n%s", shape, "\n".join(lines[-40:]))
    return {"shape": shape, "launcher": launcher, "status": status, "start": t0,
            "total_seconds": total, "workers": sorted(workers, key=lambda w: w["rank"]),
            "samples": {str(pid): s for pid, s in sampler.samples.items()},
            "info": {str(pid): i for pid, i in sampler.info.items()},
            "load_average": statistics.mean(sampler.load) if sampler.load else None,
            "output_tail": lines[-40:] if status != "ok" else []}


def _peak(samples, lo: float, hi: float, after: bool) -> float:
    """The highest sample in [lo, hi]; when none fell there (steps shorter than the
    interval), the first sample after ``lo`` (``after``) or the last before ``hi``: never
    one from start-up or teardown."""
    inside = [rss for t, rss in samples if lo <= t <= hi]
    if inside:
        return max(inside)
    if after:
        return next((rss for t, rss in samples if t >= lo), samples[-1][1])
    return next((rss for t, rss in reversed(samples) if t <= hi), samples[0][1])


def analyse(run: Dict, steps: int, interval: float) -> Dict:
    """Per process: RSS after warm-up and at the end, growth; per shape: step times."""
    workers = run["workers"]
    if not workers or any(len(w["steps"]) != steps for w in workers):
        return {"processes": [], "windows": None}
    warm = workers[0]["warmup_steps"]
    window = max(1, round(0.05 * steps))
    ends = [max(w["steps"][i][0] for w in workers) for i in range(steps)]   # every rank done
    after = (ends[warm - 1], ends[min(steps - 1, warm - 1 + window)])
    last = (ends[max(0, steps - 1 - window)], ends[-1])
    by_pid = {str(w["pid"]): w for w in workers}
    servers = sorted((int(p) for p, i in run["info"].items() if i["role"] == "server"))
    rows = []
    for pid, samples in run["samples"].items():
        info = run["info"][pid]
        # a process of the job's steps lives through both windows (not `mpirun --version`),
        # give or take a sampling interval
        if not samples or samples[0][0] > after[1] + interval \
                or samples[-1][0] < last[0] - interval:
            continue
        w = by_pid.get(pid)
        if w is not None:
            # a group's master holds the link to the servers (a ps-lite worker)
            ps = ", ps-lite worker" if "server_key_ids" in w["counts"]["end"] else ""
            name = f"worker rank {w['rank']} (client {info['client']}{ps})"
        elif info["role"] == "server":
            name = f"server {servers.index(int(pid))}"
        elif info["role"] == "mpirun":
            name = f"mpirun (client {info['client']})"
        else:
            name = str(info["role"])
        a, b = _peak(samples, *after, after=True), _peak(samples, *last, after=False)
        row = {"name": name, "pid": int(pid), "role": info["role"], "after_warmup": a,
               "end": b, "growth": 100.0 * (b - a) / a, "peak": max(s[1] for s in samples),
               "samples": len(samples)}
        if w is not None:
            own = [s[2] for s in w["steps"]]
            oa, ob = max(own[warm:warm + window]), max(own[-window:])
            row.update(step_ms=statistics.median(s[1] for s in w["steps"][warm:]) * 1e3,
                       own_growth=100.0 * (ob - oa) / oa, counts=w["counts"])
        rows.append(row)
    order = {"worker": 0, "server": 1, "scheduler": 2, "mpirun": 3, "launcher": 4}
    rows.sort(key=lambda r: (order.get(r["role"], 5), r["name"]))
    first = min(w["steps"][0][0] - w["steps"][0][1] for w in workers)
    return {"processes": rows, "windows": {"after_warmup": after, "end": last},
            "warmup_steps": warm, "window_steps": window, "loop_start": first,
            "steps_seconds": ends[-1] - first,
            "step_ms": statistics.median(s[1] for w in workers for s in w["steps"][warm:]) * 1e3}


def _shape_title(shape: str, args) -> str:
    what, launcher = SHAPES[shape]
    return f"({'ab'[list(SHAPES).index(shape)]}) {what}: `kvhybrid-launch {' '.join(launcher(args.workers))}`"


def report(results: Dict, args) -> str:
    sizes = key_sizes(args.keys, args.min_floats, args.max_floats)
    large = ", ".join(f"{n / 2**20:g} M" for n in args.large_floats)
    lines = [f"# Load test: memory of every process under {args.keys:,} keys and {args.steps} "
             "steps", "",
             f"{datetime.date.today().isoformat()}. {args.workers} workers; {args.keys:,} small "
             f"dense float32 keys of {min(sizes)}–{max(sizes)} floats ({sum(sizes) * 4 / MB:.1f} "
             f"MB in all) and {len(args.large_floats)} large ones of {large} floats; "
             f"{args.steps} steps. Each step every worker makes a Trainer's store calls: one "
             "`pushpull` of the list of small keys (their gradients are views into one buffer, "
             "as in `kvhybrid.DistributedTrainer`), then `push` + `pull` of each large key; SGD "
             "with momentum runs on the workers with one group (`update_on_kvstore=False`) and "
             "on the servers through `set_optimizer` with several.", "",
             f"RSS of each process on its own (children not included), sampled every "
             f"{args.interval:g} s by walking the launcher's process tree. Warm-up: the first "
             f"{args.warmup_fraction:.0%} of the steps. *After warm-up*: the process's peak RSS "
             f"over the {max(1, round(0.05 * args.steps))} steps after warm-up; *at end*: its peak "
             "over the last as many steps. Pass: growth < 5 %. *Own reading*: a worker's RSS "
             "read by itself after every step, same windows. Step: median after warm-up. Every "
             f"job ran under a hard timeout of {args.timeout:.0f} s (a hang is reported as one); "
             "every wait inside the job has kvhybrid's watchdog.", ""]
    for shape, run in results.items():
        a = run["analysis"]
        lines += [f"## {_shape_title(shape, args)}", ""]
        if run["status"] != "ok":
            lines += [f"**FAILED ({run['status']})**. Last output:", "", "```",
                      *run["output_tail"][-20:], "```", ""]
        if not a["processes"]:
            continue
        lines += [f"Median step {a['step_ms']:.0f} ms; {args.steps} steps in "
                  f"{a['steps_seconds']:.0f} s; the whole job (start-up and teardown included) "
                  f"{run['total_seconds']:.0f} s; {'no hang' if run['status'] == 'ok' else run['status']}; "
                  f"the machine's load average over the job {run['load_average']:.1f} on "
                  f"{os.cpu_count()} cores.",
                  "", "| process | pid | RSS after warm-up (MB) | RSS at end (MB) | growth | "
                  "< 5 % | own reading | median step (ms) | samples |",
                  "|---|---:|---:|---:|---:|---|---:|---:|---:|"]
        for r in a["processes"]:
            own = f"{r['own_growth']:+.2f} %" if "own_growth" in r else ""
            step = f"{r['step_ms']:.0f}" if "step_ms" in r else ""
            lines.append(f"| {r['name']} | {r['pid']} | {r['after_warmup'] / MB:.1f} | "
                         f"{r['end'] / MB:.1f} | {r['growth']:+.2f} % "
                         f"({(r['end'] - r['after_warmup']) / MB:+.1f} MB) | "
                         f"{'pass' if r['growth'] < GROWTH_LIMIT else '**FAIL**'} | {own} | "
                         f"{step} | {r['samples']} |")
        workers = [r for r in a["processes"] if "counts" in r]
        if workers:
            c = workers[0]["counts"]
            lines += ["", f"{workers[0]['name']}'s Python objects and store caches, after warm-up "
                      "→ at end: " + ", ".join(f"{k.replace('_', ' ')} {c['after_warmup'][k]:,} → "
                                               f"{c['end'][k]:,}" for k in c["end"]) + "."]
        lines.append("")
    lines += ["## Summary", "", summary(results, args), "", *footer("load")]
    return "\n".join(lines) + "\n"


def summary(results: Dict, args) -> str:
    parts, failed, grew = [], [], []
    for shape, run in results.items():
        a = run["analysis"]
        if run["status"] != "ok" or not a["processes"]:
            failed.append(f"{SHAPES[shape][0]} ({shape}) {run['status']}")
            continue
        worst = max(a["processes"], key=lambda r: r["growth"])
        fails = [f"{r['name']} {r['growth']:+.1f} %" for r in a["processes"]
                 if r["growth"] >= GROWTH_LIMIT]
        grew += [f"{SHAPES[shape][0]}: {', '.join(fails)}"] if fails else []
        parts.append(f"{SHAPES[shape][0]}: {len(a['processes'])} processes sampled, the largest "
                     f"growth after warm-up {worst['growth']:+.2f} % ({worst['name']}, "
                     f"{worst['after_warmup'] / MB:.0f} → {worst['end'] / MB:.0f} MB), median step "
                     f"{a['step_ms']:.0f} ms, {args.steps} steps in {a['steps_seconds']:.0f} s, no "
                     "hang")
    verdict = []
    if failed:
        verdict.append(f"FAILED: {'; '.join(failed)}")
    if grew:
        verdict.append(f"Not flat (5 % or more after warm-up): {'; '.join(grew)}")
    if not verdict:
        verdict.append("Every process of every job stayed under 5 % growth and no job hung")
    return (". ".join(verdict) + f" ({args.workers} workers, {args.keys:,} small keys + "
            f"{len(args.large_floats)} large, {args.steps} steps). " + ". ".join(parts) + ".")


def plot(results: Dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shapes = [s for s, r in results.items() if r["analysis"]["processes"]] or list(results)
    fig, axes = plt.subplots(2, len(shapes), figsize=(7 * len(shapes), 8), squeeze=False)
    for col, shape in enumerate(shapes):
        run, top, bottom = results[shape], axes[0][col], axes[1][col]
        a = run["analysis"]
        for r in a["processes"]:
            samples = run["samples"][str(r["pid"])]
            t = [s[0] - run["start"] for s in samples]
            top.plot(t, [s[1] / MB for s in samples], label=r["name"], lw=1)
            bottom.plot(t, [100.0 * (s[1] / r["after_warmup"] - 1) for s in samples], lw=1)
        if a["windows"]:
            for ax in (top, bottom):
                ax.axvspan(a["loop_start"] - run["start"], a["windows"]["after_warmup"][0]
                           - run["start"], color="#dddddd", label="warm-up" if ax is top else None)
                for lo, hi in a["windows"].values():
                    ax.axvspan(lo - run["start"], hi - run["start"], color="#b6d7a8", alpha=0.5)
        bottom.axhline(GROWTH_LIMIT, color="#d62728", ls="--", lw=1, label="+5 % pass mark")
        bottom.set_ylim(-20, 20)
        top.set_title(f"{SHAPES[shape][0]} ({run['status']})")
        top.set_ylabel("RSS (MB)")
        top.set_yscale("log")
        bottom.set_ylabel("RSS vs after warm-up (%)")
        bottom.set_xlabel("seconds since the job started (green: the compared windows)")
        top.legend(fontsize=6, ncol=2, loc="lower right")
        bottom.legend(fontsize=7)
    save_figure(fig, path)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.load",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--keys", type=int, default=5000, help="small dense keys")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--shapes", nargs="+", choices=list(SHAPES), default=list(SHAPES))
    p.add_argument("--min-floats", type=int, default=16, help="smallest small key")
    p.add_argument("--max-floats", type=int, default=256, help="largest small key")
    p.add_argument("--large-floats", type=int, nargs="*", default=[2**20, 2**21, 2**22],
                   help="sizes of the large keys")
    p.add_argument("--warmup-fraction", type=float, default=0.2)
    p.add_argument("--interval", type=float, default=0.5, help="seconds between RSS samples")
    p.add_argument("--update-on-kvstore", choices=("auto", "yes", "no"), default="auto",
                   help="where the optimizer runs (auto: as kvhybrid.DistributedTrainer decides)")
    p.add_argument("--tracemalloc", action="store_true",
                   help="workers trace Python allocations after warm-up (slow; for finding a leak)")
    p.add_argument("--timeout", type=float, default=1800, help="hard limit per job, seconds")
    p.add_argument("--strict", action="store_true",
                   help="exit 1 also when a process grows 5 %% or more (always on a hang or failure)")
    p.add_argument("--out", default="docs/benchmarks", help="folder for load.{md,json,png}")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        worker(args)
        return
    if not 0 < args.warmup_fraction < 1 or args.steps * args.warmup_fraction < 1:
        p.error("--warmup-fraction must leave at least one warm-up step and one measured step")
    if args.keys + len(args.large_floats) > 2 ** 15:
        p.error("int keys must stay below 32768 with parameter servers: fewer --keys")
    if "servers" in args.shapes and args.workers % 2:
        p.error("the servers shape splits --workers into 2 client groups: give an even number")
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    results = {}
    with tempfile.TemporaryDirectory(prefix="kvhybrid-load-") as tmp:
        for shape in args.shapes:
            run = run_shape(args, shape, tmp)
            run["analysis"] = analyse(run, args.steps, args.interval)
            results[shape] = run
    write_outputs(args.out, "load", report(results, args), results, plot)
    text = summary(results, args)
    log.info("load: %s", text)
    grew = any(r["growth"] >= GROWTH_LIMIT for run in results.values()
               for r in run["analysis"]["processes"])
    if any(r["status"] != "ok" for r in results.values()) or (args.strict and grew):
        sys.exit(1)


if __name__ == "__main__":
    main()
