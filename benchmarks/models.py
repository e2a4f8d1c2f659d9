"""Model-level benchmark: kvhybrid against MXNet's parameter server and Horovod, trained side
by side on the same models, data, batch and worker count (Parallax §6).

    python -m benchmarks.models                   # loopback, 4 workers, every model
    python -m benchmarks.models --models lm --alpha-tokens 10 50 200
    python -m benchmarks.models --hosts 4 --rate 1gbit --name models_1gbit
    python -m benchmarks.models --suite   # both, the α sweep and every target, one run

Systems (each a job through ``kvhybrid-launch``):

* ``kvhybrid``: ``hybrid-mpi``, one client group + servers, the launcher's defaults: dense
  keys by allreduce, row_sparse keys routed by their α and aggregated for the servers by
  the group's master on one host, by each host's first rank across hosts (``--row-masters
  auto``: Parallax's local aggregation per machine);
* ``kvhybrid group-master`` (emulated hosts only; on one host it is ``kvhybrid``): the same,
  but the group's master aggregates and pushes every host's rows (``--row-masters group``);
* ``kvhybrid all-AR``: every key by allreduce (tables forced ``dense``; no servers);
* ``kvhybrid pure-MPI`` (on request): no servers, ``kvhybrid-launch -n N``'s default shape:
  tables routed by their α, their rows summed in the group (route ``rows``);
* ``kvhybrid all-PS``: every key on the servers (a client group per worker);
* ``dist_sync``: MXNet's own store (tables as ``SparseEmbedding``), a client per worker;
* ``Horovod``: ``horovod.mxnet.DistributedTrainer`` (dense embeddings, as Horovod needs);
* ``compute only`` (loopback only): the same processes training alone, no communication:
  the bound on this machine's cores that no system can beat.

Reports the median step time after warm-up, words (or images) per second, the ratio to each
peer, the loss after the fixed number of steps (synchronous systems must agree), and the
bytes kvhybrid handed to MPI and the servers per worker and step; on emulated hosts also
the bytes each host's link carried per step, counted, next to Parallax's Table 3 for the
system's routing (``wire.py``). Writes
``NAME.{md,json,png}`` (``--name``, default ``models``) and, with ``--alpha-tokens``,
``NAME_alpha.{md,json,png}`` (an α point at ``--tokens`` is the LM's run of the same round)
into ``--out``. ``--hosts 4 --rate 1gbit`` runs every job on
an emulated cluster (``cluster.py``: network namespaces joined by shaped links; root only).
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import json
import logging
import os
import signal
import statistics
import sys
import tempfile
from pathlib import Path
from dataclasses import dataclass, field
from typing import Dict, List, Optional

from .cluster import add_host_args, launcher_args_on_hosts, setting_name, why_no_hosts
from .common import DIAGNOSTICS_OUT, WAITS, caller_cpu, footer, grouped_bars, machine_cpu, \
    provenance, ratio_cell, round_ratios, run_job, save_figure, write_outputs
from .model_zoo import MODELS
from .wire import describe, per_host, table3

log = logging.getLogger("benchmarks")

#: settings a system runs with (the blocking path: dense sums after backward, as before
#: the engine path)
SYSTEM_ENV = {"kvhybrid blocking": {"KVHYBRID_ENGINE": "0"}}

#: name -> (worker system, launcher shape, tables forced to allreduce)
SYSTEMS = {
    "kvhybrid": ("hybrid", "group+servers", False),
    "kvhybrid group-master": ("hybrid", "group-master", False),
    "kvhybrid all-AR": ("hybrid", "group", True),
    "kvhybrid pure-MPI": ("hybrid", "group", False),
    "kvhybrid all-PS": ("hybrid", "per-worker+servers", False),
    "kvhybrid blocking": ("hybrid", "group+servers", False),
    "kvhybrid unprefetched": ("hybrid-unprefetched", "group+servers", False),
    "kvhybrid all-PS unprefetched": ("hybrid-unprefetched", "per-worker+servers", False),
    "dist_sync": ("dist_sync", "per-worker+servers", False),
    "Horovod": ("horovod", "group", False),
    "compute only": ("local", "group", False),
}
#: systems that do not train the same model (no communication): left out of the loss check
UNSYNCED = {"compute only"}
#: systems run only when named (``--systems``): variants of the default path
ON_REQUEST = set(SYSTEM_ENV) | {"kvhybrid unprefetched", "kvhybrid all-PS unprefetched",
                                 "kvhybrid pure-MPI"}


def launcher_args(shape: str, workers: int, servers: int) -> List[str]:
    if shape == "group":
        return ["-n", str(workers)]
    if shape == "group-master":
        return ["-n", str(workers), "--clients", "1", "--servers", str(servers),
                "--row-masters", "group"]
    clients = 1 if shape == "group+servers" else workers
    return ["-n", str(workers), "--clients", str(clients), "--servers", str(servers)]


def add_wrapped_worker_args(p: argparse.ArgumentParser, name: str, steps: int,
                            warmup: int) -> None:
    """The arguments ``run_wrapped_workers`` reads, and where the benchmark writes
    ``NAME.{md,json,png}``."""
    p.add_argument("--steps", type=int, default=steps)
    p.add_argument("--warmup", type=int, default=warmup)
    p.add_argument("--tokens", type=int, default=50)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--servers", type=int, default=1)
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--name", default=name)
    p.add_argument("--out", default=DIAGNOSTICS_OUT)
    p.add_argument("--waitall", choices=WAITS, default="step",
                   help="as benchmarks.models --waitall: wait for MXNet's engine after every "
                        "step, or once after the last (a loop that never waits)")


def run_wrapped_workers(benchmark: str, args, model: str, name: str, tmp: str) -> Path:
    """Train ``model`` on system ``name`` (``SYSTEMS``) with every worker started as
    ``python -m benchmarks.<benchmark> --worker`` (a benchmark that wraps calls around
    ``benchmarks.model_worker``: ``args`` has what ``add_wrapped_worker_args`` adds,
    ``launcher_args`` where it runs on emulated hosts, and ``worker_flags`` the benchmark's
    own flags for its workers, if any); returns the folder the workers wrote their
    readings to."""
    system, shape, _ = SYSTEMS[name]
    out = tempfile.mkdtemp(dir=tmp)
    cmd = [sys.executable, "-m", "kvhybrid.launch.cli",
           *launcher_args(shape, args.workers, args.servers),
           *getattr(args, "launcher_args", []),
           "python", "-m", f"benchmarks.{benchmark}", "--worker",
           *getattr(args, "worker_flags", []), "--model", model,
           "--system", system, "--out", out, "--steps", str(args.steps),
           "--warmup", str(args.warmup), "--tokens", str(args.tokens),
           "--waitall", args.waitall]
    run_job(cmd, dict(os.environ), args.timeout, f"{model} on {name}", benchmark)
    return Path(out)


def run_system(args, model: str, name: str, tokens: int, tmp: str) -> dict:
    system, shape, all_ar = SYSTEMS[name]
    out = tempfile.mkdtemp(dir=tmp)
    cmd = [sys.executable, "-m", "kvhybrid.launch.cli",
           *launcher_args(shape, args.workers, args.servers), *args.launcher_args,
           "python", "-m", "benchmarks.model_worker", "--model", model, "--system", system,
           "--out", out, "--steps", str(args.steps), "--warmup", str(args.warmup),
           "--batch-size", str(args.batch_size), "--tokens", str(tokens),
           "--waitall", getattr(args, "waitall", "step")]
    env = dict(os.environ)
    env.pop("KVHYBRID_ROUTES", None)
    env.update(SYSTEM_ENV.get(name, {}))
    if all_ar and MODELS[model].sparse_keys:   # a fresh process names its tables 0, 1, ...
        tables = 2 if model == "nmt" else 1
        env["KVHYBRID_ROUTES"] = ",".join(f"sparseembedding{k}_weight=dense" for k in range(tables))
    run_job(cmd, env, args.timeout, f"{model} on {name}", "models")
    with open(os.path.join(out, "result.json")) as f:
        result = json.load(f)
    readings = [json.loads(p.read_text()) for p in Path(out).glob("wire-rank*.json")]
    # on loopback the interfaces this process sees are the machine's, shared with everything
    result["wire_per_host"] = per_host(readings) if args.hosts else None
    result["payload_per_host"] = per_host(readings, payload=True) if args.hosts else None
    # CPU ms per step of each worker's threads, by role: the mean over the workers
    result["cpu_ms_per_step"] = {k: statistics.mean(r["cpu_ms_per_step"][k] for r in readings)
                                 for k in readings[0]["cpu_ms_per_step"]} if readings else {}
    queued = [r["queued_fraction"] for r in readings if r.get("queued_fraction") is not None]
    result["queued_fraction"] = statistics.mean(queued) if queued else None
    machines = args.hosts or args.workers
    result["table3_per_host"] = table3("dense" if all_ar or system == "horovod" else "rows",
                                       result["dense_bytes"], result["table_bytes"],
                                       result["alpha"], machines)
    log.info("models: %-4s %-16s %8.1f ms/step %12s words/s  loss %.5f", model, name,
             result["step_seconds"] * 1e3, f"{result['words_per_second']:,.0f}", result["loss"])
    return result


def ratio_table(results: Dict[str, Dict[str, dict]], steps: int,
                setting: Optional[Setting] = None) -> str:
    lines = ["| model | system | ms / step | words / s | kvhybrid ÷ this | loss after "
             f"{steps} steps | MB / worker / step (MPI, servers) | CPU ms / step (a worker's "
             "caller's thread, the machine) |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for model, systems in results.items():
        ours = systems.get("kvhybrid")
        for name, r in systems.items():
            vs = ""
            if ours and name != "kvhybrid":
                vs = (ratio_cell(setting.ratios(model, "kvhybrid", name)) if setting else
                      f"{ours['words_per_second'] / r['words_per_second']:.2f}×")
            sent = r.get("bytes_sent") or {}
            # (older results counted from the start, over every step)
            per = (r.get("sent_steps") or r.get("steps")) if sent else None
            mb = (f"{(sent.get('dense', 0) + sent.get('rows', 0)) / per / 2**20:.3f}, "
                  f"{sent.get('servers', 0) / per / 2**20:.3f}" if per else "")
            caller = (r.get("cpu_ms_per_step") or {}).get("caller")
            machine = r.get("machine_cpu_ms_per_step")
            cpu_ = (f"{caller:.1f}, {machine:.0f}" if caller is not None and machine is not None
                    else "")
            lines.append(f"| {model} | {name} | {r['step_seconds'] * 1e3:.1f} | "
                         f"{r['words_per_second']:,.0f} | {vs} | {r['loss']:.5f} | {mb} | "
                         f"{cpu_} |")
    return "\n".join(lines)


def cost_table(setting: Setting, peer: str = "dist_sync") -> str:
    """Each kvhybrid system ÷ ``peer`` per round, median (range): throughput, and the CPU a
    step took on a worker's caller's thread and on the machine (lower is cheaper), which on
    2 cores hold still where throughput swings. "" where no round ran ``peer`` with CPU."""
    lines = []
    for model, systems in (setting.rounds[0] if setting.rounds else {}).items():
        for name in (n for n in systems if n.startswith("kvhybrid")):
            cells = [round_ratios(setting.rounds, model, name, peer, read)
                     for read in (lambda run: run["words_per_second"], caller_cpu, machine_cpu)]
            if any(cells[1:]):
                lines.append(f"| {model} | {name} | "
                             + " | ".join(ratio_cell(c) if c else "" for c in cells) + " |")
    if not lines:
        return ""
    return "\n".join([f"Each kvhybrid system ÷ `{peer}` in the same round, median over the "
                      "rounds (range): throughput (above 1 is faster), and CPU per step "
                      "(below 1 is cheaper)", "",
                      "| model | system | throughput | caller's thread CPU | machine CPU |",
                      "|---|---|---:|---:|---:|", *lines])


def queued_sentence(results: Dict[str, Dict[str, dict]]) -> str:
    """How soon the callers' threads had queued the timed steps in a loop that never waits
    (``queued_fraction``, mean over the workers), per model and system: where it is well
    below 1 the caller's thread ran ahead of MXNet's engine and waited at the end, and its
    CPU did not bound the step."""
    parts = [f"{model} {name} {r['queued_fraction']:.0%}" for model, systems in results.items()
             for name, r in systems.items() if r.get("queued_fraction") is not None]
    return ("the callers' threads had queued every timed step after this share of the "
            "timed window: " + ", ".join(parts)) if parts else \
        "the callers' threads' share of the timed window was not recorded"


def bytes_table(results: Dict[str, Dict[str, dict]], where: str) -> str:
    lines = [f"Bytes per host and step ({where}): counted on each host's link (received + "
             "sent, headers included) against Parallax's Table 3 for the system's routing "
             "(m variables; dense keys allreduced or on the servers, tables as rows on the "
             "servers or densified)", "",
             "| model | system | counted MB | Table 3 MB | counted ÷ Table 3 |",
             "|---|---|---:|---:|---:|"]
    for model, systems in results.items():
        for name, r in systems.items():
            cells = describe(r.get("wire_per_host"), r["table3_per_host"])
            lines.append(f"| {model} | {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(results, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    models = list(results)
    names = [n for n in SYSTEMS if any(n in results[m] for m in models)]
    fig, ax = plt.subplots(figsize=(9, 4))
    grouped_bars(ax, models, {n: [results[m].get(n, {}).get("words_per_second", 0) /
                                  max(r["words_per_second"] for r in results[m].values())
                                  for m in models] for n in names})
    ax.set_ylabel("throughput ÷ the best system's")
    ax.set_title("model-level throughput, same models, data and workers")
    ax.legend(fontsize=8)
    save_figure(fig, path)


def plot_alpha(results, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    tokens = sorted(int(t) for t in results)
    fig, ax = plt.subplots(figsize=(7, 4))
    for name in ("kvhybrid", "dist_sync"):
        ax.plot(tokens, [results[str(t)][name]["words_per_second"] for t in tokens], marker="o",
                label=name)
    ax.set_xscale("log")
    ax.set_xlabel("words per sample (α grows with it)")
    ax.set_ylabel("words / s")
    ax.set_title("LM-like: throughput against α")
    ax.legend()
    save_figure(fig, path)


@dataclass
class Setting:
    """One setting's measurements: a {model: {system: result}} per round, and an α sweep
    ({words per sample: {system: result}}) per round."""
    where: str
    hosts: int
    servers: int
    rounds: List[Dict[str, Dict[str, dict]]] = field(default_factory=list)
    sweeps: List[Dict[str, Dict[str, dict]]] = field(default_factory=list)
    rate: str = ""   # the emulated links' (tc's notation); "" on loopback
    #: the arguments of the run that measured it (``python -m benchmarks.models ...``)
    command: List[str] = field(default_factory=list)
    #: steps each job ran and the first of them left out as warm-up (0: the run's --steps)
    steps: int = 0
    warmup: int = 0
    #: when, on which commit and machine it was measured (``common.provenance``)
    measured: str = ""

    @property
    def median(self) -> Dict[str, Dict[str, dict]]:
        """Per model and system, the round with the median throughput (its figures kept
        together)."""
        return {model: {name: _median_run([r[model][name] for r in self.rounds])
                        for name in systems} for model, systems in self.rounds[0].items()}

    @property
    def median_sweep(self) -> Dict[str, Dict[str, dict]]:
        return {t: {name: _median_run([r[t][name] for r in self.sweeps]) for name in systems}
                for t, systems in (self.sweeps[0] if self.sweeps else {}).items()}

    def ratios(self, model: str, a: str, b: str, sweep: bool = False) -> List[float]:
        """``a``'s throughput ÷ ``b``'s in each round (the same round's runs)."""
        return round_ratios(self.sweeps if sweep else self.rounds, model, a, b)


def _median_run(runs: List[dict]) -> dict:
    return sorted(runs, key=lambda r: r["words_per_second"])[(len(runs) - 1) // 2]


def load_setting(path: Path, hosts: int, rate: str, servers: int, workers: int,
                 delay: Optional[str] = None) -> Setting:
    """A setting measured earlier, from the ``NAME_rounds.json`` its run wrote."""
    saved = json.loads(Path(path).read_text())
    return Setting(where=saved.get("where") or setting_name(hosts, rate, workers, delay),
                   hosts=hosts, servers=saved.get("servers", servers), rounds=saved["rounds"],
                   sweeps=saved.get("sweeps", []), rate=rate if hosts else "",
                   command=saved.get("command", []), steps=saved.get("steps", 0),
                   warmup=saved.get("warmup", 0), measured=saved.get("measured", ""))


def measure(args, hosts: int, rate: str, alpha_tokens: List[int],
            steps: Optional[int] = None, warmup: Optional[int] = None) -> Setting:
    """Every model under every system (and the α sweep) in one setting, ``args.rounds``
    times with the systems' order alternated: loopback (``hosts`` 0) or ``hosts`` emulated
    hosts joined by links of ``rate``; ``steps``/``warmup`` replace the run's for this
    setting."""
    args = argparse.Namespace(**vars(args))
    args.hosts, args.rate = hosts, rate
    args.steps, args.warmup = steps or args.steps, warmup or args.warmup
    args.servers = args.servers_wanted or hosts or 1
    systems = [n for n in (args.systems or [n for n in SYSTEMS if n not in ON_REQUEST])
               if (n != "kvhybrid group-master" or hosts) and (n != "compute only" or not hosts)]
    setting = Setting(where=setting_name(hosts, rate, args.workers, args.delay), hosts=hosts,
                      servers=args.servers, rate=rate if hosts else "", command=sys.argv[1:],
                      steps=args.steps, warmup=args.warmup, measured=provenance())
    with tempfile.TemporaryDirectory(prefix="kvhybrid-models-") as tmp, \
            contextlib.ExitStack() as stack:
        args.launcher_args = launcher_args_on_hosts(stack, hosts, rate, args.delay,
                                                    args.workers, tmp)
        log.info("models: %s, %d workers, %d server(s), %d round(s) of %d steps (%d warm-up)",
                 setting.where, args.workers, args.servers, args.rounds, args.steps, args.warmup)
        for round_ in range(args.rounds):
            order = systems if round_ % 2 == 0 else systems[::-1]
            pair = ("kvhybrid", "dist_sync") if round_ % 2 == 0 else ("dist_sync", "kvhybrid")
            log.info("models: %s, round %d of %d: %s", setting.where, round_ + 1, args.rounds,
                     ", ".join(order))
            runs = {m: {n: run_system(args, m, n, args.tokens, tmp) for n in order}
                    for m in args.models}
            setting.rounds.append(runs)
            # an α point at the run's own words per sample is the LM's run of this round
            setting.sweeps.append({str(t): {
                n: copy.deepcopy(runs["lm"][n]) if t == args.tokens and n in runs.get("lm", {})
                else run_system(args, "lm", n, t, tmp) for n in pair} for t in alpha_tokens})
    return setting


def write_setting(args, name: str, setting: Setting) -> None:
    results, sweep = setting.median, setting.median_sweep
    table = "\n".join([
        f"# Model-level throughput, {setting.where}: {args.workers} workers, {setting.servers} "
        f"server(s), batch {args.batch_size} per worker, {args.tokens} words per sample, "
        f"{len(setting.rounds)} round(s) with the systems' order alternated", "",
        ratio_table(results, setting.steps or args.steps, setting), "",
        f"Median step after warm-up ({setting.warmup or args.warmup} steps), of the round with "
        "the median throughput"
        + ("" if getattr(args, "waitall", "step") == "step" else
           " (the workers waited for MXNet's engine once, after the last step: a step is the "
           "timed steps' time ÷ their number; " + queued_sentence(results) + ")")
        + ". kvhybrid ÷ this: "
        "throughput ratio of the same round's runs, median over the rounds (range). Loss: on "
        "one fixed batch after the run (synchronous systems take the same steps). MB: what "
        "kvhybrid handed to MPI collectives and pushed to the servers, per worker and step "
        "after warm-up (pulls not counted). CPU: what a worker's caller's thread used per "
        "step (mean over the workers) and what every process of the machine used (servers "
        "and MXNet's own threads included): where there are more busy threads than cores, "
        "the step is bound by the machine's CPU ms ÷ its cores.", "",
        *([cost, ""] if (cost := cost_table(setting)) else []),
        bytes_table(results, setting.where), "",
        *footer("models", setting.command or None, setting.measured or None)]) + "\n"
    write_outputs(args.out, name, table, results, plot)
    (Path(args.out) / f"{name}_rounds.json").write_text(json.dumps(
        {"where": setting.where, "servers": setting.servers, "command": setting.command,
         "steps": setting.steps, "warmup": setting.warmup, "measured": setting.measured,
         "rounds": setting.rounds, "sweeps": setting.sweeps}))
    if sweep:
        lines = [f"# LM-like, {setting.where}: kvhybrid and dist_sync against α", "",
                 "| words per sample | kvhybrid words/s | dist_sync words/s | kvhybrid ÷ dist_sync |",
                 "|---:|---:|---:|---:|"]
        for t, r in sweep.items():
            a, b = r["kvhybrid"]["words_per_second"], r["dist_sync"]["words_per_second"]
            lines.append(f"| {t} | {a:,.0f} | {b:,.0f} | "
                         f"{ratio_cell(setting.ratios(t, 'kvhybrid', 'dist_sync', True))} |")
        ending = footer("models", setting.command or None, setting.measured or None)
        write_outputs(args.out, f"{name}_alpha", "\n".join(lines + ["", *ending]) + "\n",
                      sweep, plot_alpha)


#: the suite's (steps, warm-up) at 100 Mbit/s, where one Horovod LM step takes 12 s
SLOW_STEPS = (20, 5)

#: throughput targets: (setting, model, peer, kvhybrid ÷ peer at least);
#: setting: "loopback", "4 hosts" (1 Gbit/s), "2x2 hosts" (2 hosts × 2 workers, every rate);
#: peer "better": the faster of dist_sync and Horovod in each round
TARGETS = [("loopback", "lm", "dist_sync", 1.0), ("loopback", "nmt", "dist_sync", 1.0),
           ("loopback", "cnn", "dist_sync", 1.3),
           ("loopback", "lm", "better", 0.95), ("loopback", "nmt", "better", 0.95),
           ("loopback", "cnn", "better", 0.95),
           ("4 hosts", "lm", "dist_sync", 2.0), ("4 hosts", "nmt", "dist_sync", 1.5),
           ("4 hosts", "cnn", "dist_sync", 1.0), ("4 hosts", "lm", "Horovod", 4.0),
           ("4 hosts", "nmt", "Horovod", 1.5), ("4 hosts", "cnn", "Horovod", 0.95),
           ("2x2 hosts", "lm", "dist_sync", 1.5), ("2x2 hosts", "lm", "better", 1.0),
           ("2x2 hosts", "nmt", "better", 1.0), ("2x2 hosts", "cnn", "better", 1.0)]
#: α sweep on loopback: kvhybrid ÷ dist_sync at every words-per-sample at least
ALPHA_TARGET = 0.95


def _kind(setting: Setting, workers: int) -> str:
    if not setting.hosts:
        return "loopback"
    return "4 hosts" if setting.hosts == workers else "2x2 hosts"


def _better_ratios(setting: Setting, model: str) -> List[float]:
    """kvhybrid ÷ the faster of dist_sync and Horovod, round by round."""
    out = []
    for r in setting.rounds:
        peers = [r[model][n]["words_per_second"] for n in ("dist_sync", "Horovod")
                 if n in r.get(model, {})]
        if "kvhybrid" in r.get(model, {}) and peers:
            out.append(r[model]["kvhybrid"]["words_per_second"] / max(peers))
    return out


def targets_table(settings: List[Setting], workers: int,
                  misses: Optional[list] = None) -> str:
    """Every target of the suite, met or missed: ratios as the median over the rounds
    (range), met when the median reaches the target. Throughput targets missed are
    appended to ``misses`` as (setting, model, peer, target, words per sample of the α
    sweep or None)."""
    rows = []

    def add(what, values, want, at_least=True, fmt="{:.2f}×", miss=None):
        if not values:
            return
        median = statistics.median(values)   # the figure ratio_cell prints
        ok = median >= want if at_least else median <= want
        got = (ratio_cell(values) if fmt == "{:.2f}×" else
               f"{fmt.format(median)} ({fmt.format(min(values))}–{fmt.format(max(values))})")
        rows.append(f"| {what} | {got} | {'≥' if at_least else '≤'} {fmt.format(want)} | "
                    f"{'met' if ok else '**missed**'} |")
        if not ok and miss is not None and misses is not None:
            misses.append(miss)

    for setting in settings:
        kind = _kind(setting, workers)
        for where, model, peer, want in TARGETS:
            if where != kind:
                continue
            values = (_better_ratios(setting, model) if peer == "better" else
                      setting.ratios(model, "kvhybrid", peer))
            add(f"{setting.where}: {model} kvhybrid ÷ "
                f"{'the better peer' if peer == 'better' else peer}", values, want,
                miss=(setting, model, peer, want, None))
        if kind == "loopback":
            for tokens in setting.median_sweep:
                add(f"{setting.where}: lm at {tokens} words per sample, kvhybrid ÷ dist_sync",
                    setting.ratios(tokens, "kvhybrid", "dist_sync", sweep=True), ALPHA_TARGET,
                    miss=(setting, "lm", "dist_sync", ALPHA_TARGET, tokens))
    for setting in settings:
        if not setting.hosts:
            continue
        for model, r in setting.median.items():
            for name in ("kvhybrid", "kvhybrid group-master"):
                if name in r and r[name].get("wire_per_host"):
                    add(f"{setting.where}: {model} {name} bytes per host ÷ Table 3",
                        [x[model][name]["wire_per_host"] / x[model][name]["table3_per_host"]
                         for x in setting.rounds], 1.2, at_least=False)
    for setting in settings:
        for model in setting.median:
            spreads = []
            for r in setting.rounds:
                losses = [x["loss"] for n, x in r[model].items() if n not in UNSYNCED]
                spreads.append((max(losses) - min(losses)) / abs(min(losses)))
            add(f"{setting.where}: {model} losses of the synchronous systems, relative spread",
                spreads, 1e-3, at_least=False, fmt="{:.1e}")
    return "\n".join(["| target | measured | wanted | |", "|---|---:|---:|---|", *rows])


def bits_per_second(rate: str) -> float:
    """tc's rate notation: '1gbit' -> 1e9, '100mbit' -> 1e8."""
    units = {"gbit": 1e9, "mbit": 1e6, "kbit": 1e3, "bit": 1.0}
    for unit, scale in units.items():
        if rate.lower().endswith(unit):
            return float(rate[:-len(unit)]) * scale
    raise ValueError(f"rate {rate!r}: write it as tc does, e.g. 1gbit or 100mbit")


def miss_profiles(misses: list, loop: Optional[Setting]) -> str:
    """For each throughput target missed: where kvhybrid's and the peer's steps go (the
    caller's thread: forward, backward, trainer.step, waitall), the collectives per step,
    the bytes each host's link carried and the time they take at the link's rate, next to
    the compute-only bound (the same processes on loopback, no communication) and the step
    time the target asks for; then where the machine's CPU went (``cpu_roles_row``)."""
    if not misses:
        return "Every throughput target was met."
    out = []
    for setting, model, peer, want, tokens in misses:
        sweep = tokens is not None
        results = setting.median_sweep[tokens] if sweep else setting.median[model]
        if peer == "better":
            peer = max((n for n in ("dist_sync", "Horovod") if n in results),
                       key=lambda n: results[n]["words_per_second"])
        ours, theirs = results["kvhybrid"], results[peer]
        bound = (loop.median.get(model, {}).get("compute only") if loop else None)
        need = theirs["step_seconds"] / want   # the same words per step in both
        title = (f"{model} at {tokens} words per sample" if sweep else model)
        out += [f"### {setting.where}: {title}, kvhybrid ÷ {peer} ≥ {want:.2f}×", "",
                f"The target asks for a kvhybrid step of at most {need * 1e3:.1f} ms."
                + (f" The same processes computing alone on loopback take "
                   f"{bound['step_seconds'] * 1e3:.1f} ms a step (the compute bound on these "
                   f"cores)." if bound and not sweep else ""), "",
                "| system | ms / step | forward | backward | trainer.step | waitall | "
                "caller's-thread collectives / step | engine ops / step | caller's thread CPU ms "
                "/ step | machine CPU ms / step | link MB / host / step | link busy, ms (half "
                "each way) |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        cpu_rows = [f"Where the machine's CPU went, ms a step: {cpu_roles_note()}", "",
                    "| system | a worker's caller's thread | its communication threads | its "
                    "native threads | the workers, all threads | the rest: servers, scheduler, "
                    "launcher | the machine | the machine ÷ its cores |",
                    "|---|---:|---:|---:|---:|---:|---:|---:|"]
        rows = [("kvhybrid", ours), (peer, theirs)]
        if bound and not sweep:
            rows.append(("compute only (loopback)", bound))
        for label, r in rows:
            phases = r.get("phases") or {}
            meetings = r.get("collectives_per_step") or {}
            wire = r.get("wire_per_host")
            cells = [f"{r['step_seconds'] * 1e3:.1f}"]
            cells += [f"{phases[k] * 1e3:.1f}" if k in phases else "" for k in
                      ("forward", "backward", "trainer.step", "waitall")]
            cells += [f"{meetings[k]:.1f}" if k in meetings else "" for k in ("group", "engine")]
            caller = (r.get("cpu_ms_per_step") or {}).get("caller")
            machine = r.get("machine_cpu_ms_per_step")
            cells += [f"{caller:.1f}" if caller is not None else "",
                      f"{machine:.0f}" if machine is not None else ""]
            cells += [f"{wire / 2**20:.2f}" if wire else "",
                      f"{wire / 2 * 8 / bits_per_second(setting.rate) * 1e3:.1f}"
                      if wire and setting.rate else ""]
            out.append(f"| {label} | " + " | ".join(cells) + " |")
            cpu_rows.append(cpu_roles_row(label, r))
        out += ["", *cpu_rows, ""]
    return "\n".join(out)


def cpu_roles_note() -> str:
    return ("each worker's threads by role (the mean over the workers; native: MXNet's engine, "
            "OpenMP, ps-lite and MPI threads), what the rest of the machine used, and the "
            "machine's CPU ÷ its cores: the least a step can take when every core is busy "
            "(read from /proc over the timed steps: each thread to the nanosecond, the machine "
            f"in ticks of {1e3 / os.sysconf('SC_CLK_TCK'):.0f} ms, each worker over its own "
            "steps: a small remainder can come out slightly below zero).")


def cpu_roles_row(label: str, r: dict) -> str:
    """A row of ``miss_profiles``' CPU table: where one run's CPU went, by role."""
    roles = r.get("cpu_ms_per_step") or {}
    machine = r.get("machine_cpu_ms_per_step")
    if not roles or machine is None:
        return f"| {label} |" + " |" * 7
    per_worker = sum(roles.values())
    workers = per_worker * r["workers"]
    cells = [roles.get("caller", 0.0), roles.get("communication", 0.0), roles.get("native", 0.0),
             workers, machine - workers, machine, machine / (os.cpu_count() or 1)]
    return f"| {label} | " + " | ".join(f"{c:.1f}" for c in cells) + " |"


def overlap_tables(loop: Setting) -> str:
    """How much of each engine bucket's allreduce backward hid, and the collectives a step
    makes (kvhybrid on loopback, the median round)."""
    lines = ["| model | bucket | ms from gradients ready to sum done | fraction hidden behind "
             "backward |", "|---|---|---:|---:|"]
    for model, r in loop.median.items():
        for name, ms, fraction in (r.get("kvhybrid", {}).get("hidden") or []):
            lines.append(f"| {model} | {name} | {ms:.1f} | {fraction:.0%} |")
    lines += ["", "| model | group collectives per step on the caller's thread | engine "
              "operations per step |", "|---|---:|---:|"]
    for model, r in loop.median.items():
        meetings = r.get("kvhybrid", {}).get("collectives_per_step") or {}
        lines.append(f"| {model} | {meetings.get('group', 0):.1f} | "
                     f"{meetings.get('engine', 0):.1f} |")
    return "\n".join(lines)


def main(argv=None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    p = argparse.ArgumentParser(prog="python -m benchmarks.models",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--suite", action="store_true",
                   help="the whole comparison in one run: loopback with the α sweep (--alpha-tokens, "
                        "default 10 25 50 100 200), 4 emulated hosts at 1 Gbit/s, and 2 emulated "
                        "hosts × 2 workers at 1 Gbit/s and 100 Mbit/s; writes models*, "
                        "models_1gbit*, models_2x2_* and models_targets.md (every target, met or "
                        "missed)")
    p.add_argument("--rounds", type=int, default=None,
                   help="repeats of every setting, the systems' order alternated (default: 3 "
                        "with --suite, else 1)")
    p.add_argument("--models", nargs="+", choices=sorted(MODELS), default=["lm", "nmt", "cnn"])
    p.add_argument("--systems", nargs="+", choices=list(SYSTEMS),
                   help="default: all but the variants run when named (kvhybrid blocking, "
                        "kvhybrid unprefetched: no kvhybrid.prefetch, as a script that never "
                        "calls it); kvhybrid group-master runs on emulated hosts only, compute "
                        "only on loopback only")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--servers", type=int, dest="servers_wanted",
                   help="default: 1 on loopback, one per emulated host")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--tokens", type=int, default=50, help="words per sample")
    p.add_argument("--waitall", choices=WAITS, default="step",
                   help="step (default): every worker waits for MXNet's engine after each "
                        "step, so each step is timed alone; end: once after the last step, as "
                        "a training loop that never waits (dist_sync's next steps then start "
                        "while its engine still runs)")
    p.add_argument("--alpha-tokens", type=int, nargs="*",
                   help="LM-like: also sweep words per sample (α) for kvhybrid and dist_sync")
    add_host_args(p)
    p.add_argument("--timeout", type=float, default=900)
    p.add_argument("--out", default="docs/benchmarks")
    p.add_argument("--name", default="models", help="file names: NAME.md, NAME.json, NAME.png")
    p.add_argument("--targets-only", action="store_true",
                   help="with --suite: measure nothing, write NAME_targets.md from the settings "
                        "whose NAME*_rounds.json is in --out (it names those not measured yet)")
    p.add_argument("--resume", action="store_true",
                   help="with --suite: keep each setting whose NAME*_rounds.json in --out already "
                        "holds --rounds rounds (a suite stopped part way goes on where it stopped)")
    args = p.parse_args(argv)
    # SIGTERM unwinds like Ctrl-C: the running job is stopped, the emulated hosts deleted
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    if args.rounds is None:
        args.rounds = 3 if args.suite else 1
    if args.rounds < 1:
        p.error(f"--rounds must be at least 1, got {args.rounds}")
    if (args.resume or args.targets_only) and not args.suite:
        p.error(f"--{'resume' if args.resume else 'targets-only'} works on a suite: add --suite")
    if args.steps <= args.warmup:
        p.error(f"--steps ({args.steps}) must exceed --warmup ({args.warmup})")
    hosts = args.hosts
    if args.suite and args.workers % 4:
        p.error(f"--suite needs --workers divisible by 4 (4 and 2 emulated hosts), got "
                f"{args.workers}")
    if hosts and args.workers % hosts:
        p.error(f"--workers ({args.workers}) must be a multiple of the {hosts} hosts")
    # (a suite measures on emulated hosts too; --targets-only measures nothing)
    missing = why_no_hosts() if hosts or (args.suite and not args.targets_only) else None
    if missing:
        p.error(f"--hosts {missing}" if hosts else f"--suite (emulated hosts) {missing}")
    if not args.suite:
        setting = measure(args, args.hosts, args.rate, args.alpha_tokens or [])
        write_setting(args, args.name, setting)
        return
    tokens = [10, 25, 50, 100, 200] if args.alpha_tokens is None else args.alpha_tokens
    # at 100 Mbit/s Horovod's densified LM table (147 MB per host and step) needs 12 s a step
    # on the link alone: its jobs there run SLOW_STEPS (all systems alike, so losses compare)
    slow = (min(args.steps, SLOW_STEPS[0]), min(args.warmup, SLOW_STEPS[1]))
    plan = [(0, args.rate, tokens, "", None), (4, "1gbit", [], "_1gbit", None),
            (2, "1gbit", [], "_2x2_1gbit", None), (2, "100mbit", [], "_2x2_100mbit", slow)]
    settings, missing = [], []
    for i, (hosts, rate, sweep, suffix, few) in enumerate(plan):
        saved = Path(args.out) / f"{args.name}{suffix}_rounds.json"
        if args.targets_only and not saved.exists():
            missing.append(setting_name(hosts, rate, args.workers, args.delay))
            continue
        if (args.resume or args.targets_only) and saved.exists():
            kept = load_setting(saved, hosts, rate, args.servers_wanted or hosts or 1,
                                args.workers, args.delay)
            if len(kept.rounds) == args.rounds or args.targets_only:
                log.info("models: suite, setting %d of %d: %s, kept from %s", i + 1, len(plan),
                         kept.where, saved)
                settings.append(kept)
                write_setting(args, args.name + suffix, kept)   # its tables as this code writes them
                continue
        log.info("models: suite, setting %d of %d", i + 1, len(plan))
        settings.append(measure(args, hosts, rate, sweep, *(few or (None, None))))
        write_setting(args, args.name + suffix, settings[-1])
    misses: list = []
    table = targets_table(settings, args.workers, misses)
    loop = next((x for x in settings if not x.hosts), None)
    rounds = sorted({len(x.rounds) for x in settings})
    text = "\n".join([
        f"# Model-level targets, {'/'.join(map(str, rounds))} round(s) per "
        "setting", "",
        *([f"**Not measured yet:** {', '.join(missing)} (`--suite --resume` measures them)", ""]
          if missing else []),
        table, "",
        "Measured: kvhybrid's throughput ÷ the peer's in the same round, median over the rounds "
        "(range); a target is met when the median reaches it.", "",
        *(["## Dense sums hidden behind backward, and meetings per step (loopback)", "",
            overlap_tables(loop), "",
            "Buckets in the order they are summed (last layer first); the last can hide "
            "nothing.", ""] if loop else []),
        "## Profiles of the throughput targets missed", "",
        "Medians of the run with the median throughput. Phases: the caller's thread's time per "
        "step in ms (a blocking pull shows in forward; work left to MXNet's engine shows in "
        "waitall).", "", miss_profiles(misses, loop), "",
        "Tables: " + ", ".join(f"`{args.name}{suffix}.md`" for hosts, rate, _, suffix, _ in plan
                               if setting_name(hosts, rate, args.workers, args.delay)
                               not in missing)
        + f", `{args.name}_alpha.md`.", "", *footer("models")]) + "\n"
    (Path(args.out) / f"{args.name}_targets.md").write_text(text)
    print(text)
    log.info("models: wrote %s/%s_targets.md", args.out, args.name)


if __name__ == "__main__":
    main()
