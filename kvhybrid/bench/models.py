"""Model-level benchmark: kvhybrid against MXNet's parameter server and Horovod, trained side
by side on the same models, data, batch and worker count (Parallax §6).

    python -m kvhybrid.bench.models                   # loopback, 4 workers, every model
    python -m kvhybrid.bench.models --models lm --alpha-tokens 10 50 200
    python -m kvhybrid.bench.models --hosts 4 --rate 1gbit --name models_1gbit
    python -m kvhybrid.bench.models --suite   # both, the α sweep and every target, one run

Systems (each a job through ``kvhybrid-launch``):

* ``kvhybrid``: ``hybrid-mpi``, one client group + servers: dense keys by allreduce,
  row_sparse keys routed by their α, the group's master aggregating and pushing the rows;
* ``kvhybrid host-masters`` (emulated hosts only; on one host it is ``kvhybrid``): the same,
  but each host's first rank aggregates and pushes its host's rows (``--row-masters host``,
  Parallax's local aggregation per machine);
* ``kvhybrid all-AR``: every key by allreduce (tables forced ``dense``; no servers);
* ``kvhybrid all-PS``: every key on the servers (a client group per worker);
* ``dist_sync``: MXNet's own store (tables as ``SparseEmbedding``), a client per worker;
* ``Horovod``: ``horovod.mxnet.DistributedTrainer`` (dense embeddings, as Horovod needs).

Reports the median step time after warm-up, words (or images) per second, the ratio to each
peer, the loss after the fixed number of steps (synchronous systems must agree), and the
bytes kvhybrid handed to MPI and the servers per worker and step; on emulated hosts also
the bytes each host's link carried per step, counted, next to Parallax's Table 3 for the
system's routing (``wire.py``). Writes
``NAME.{md,json,png}`` (``--name``, default ``models``) and, with ``--alpha-tokens``,
``NAME_alpha.{md,json,png}`` into ``--out``. ``--hosts 4 --rate 1gbit`` runs every job on
an emulated cluster (``cluster.py``: network namespaces joined by shaped links; root only).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import sys
import tempfile
from pathlib import Path
from typing import Dict, List

from .cluster import EmulatedCluster
from .common import footer, grouped_bars, run_job, save_figure, write_outputs
from .model_zoo import MODELS
from .wire import describe, per_host, table3

log = logging.getLogger("kvhybrid.bench")

#: settings a system runs with (the blocking path: dense sums after backward, issue 16's
#: "before")
SYSTEM_ENV = {"kvhybrid blocking": {"KVHYBRID_ENGINE": "0"}}

#: name -> (worker system, launcher shape, tables forced to allreduce)
SYSTEMS = {
    "kvhybrid": ("hybrid", "group+servers", False),
    "kvhybrid host-masters": ("hybrid", "host-masters", False),
    "kvhybrid all-AR": ("hybrid", "group", True),
    "kvhybrid all-PS": ("hybrid", "per-worker+servers", False),
    "kvhybrid blocking": ("hybrid", "group+servers", False),
    "dist_sync": ("dist_sync", "per-worker+servers", False),
    "Horovod": ("horovod", "group", False),
}


def launcher_args(shape: str, workers: int, servers: int) -> List[str]:
    if shape == "group":
        return ["-n", str(workers)]
    if shape == "host-masters":
        return ["-n", str(workers), "--clients", "1", "--servers", str(servers),
                "--row-masters", "host"]
    clients = 1 if shape == "group+servers" else workers
    return ["-n", str(workers), "--clients", str(clients), "--servers", str(servers)]


def run_system(args, model: str, name: str, tokens: int, tmp: str) -> dict:
    system, shape, all_ar = SYSTEMS[name]
    out = tempfile.mkdtemp(dir=tmp)
    cmd = [sys.executable, "-m", "kvhybrid.launch.cli",
           *launcher_args(shape, args.workers, args.servers), *args.launcher_args,
           "python", "-m", "kvhybrid.bench.model_worker", "--model", model, "--system", system,
           "--out", out, "--steps", str(args.steps), "--warmup", str(args.warmup),
           "--batch-size", str(args.batch_size), "--tokens", str(tokens)]
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
    machines = args.hosts or args.workers
    result["table3_per_host"] = table3("dense" if all_ar or system == "horovod" else "rows",
                                       result["dense_bytes"], result["table_bytes"],
                                       result["alpha"], machines)
    log.info("models: %-4s %-16s %8.1f ms/step %12s words/s  loss %.5f", model, name,
             result["step_seconds"] * 1e3, f"{result['words_per_second']:,.0f}", result["loss"])
    return result


def ratio_table(results: Dict[str, Dict[str, dict]], steps: int) -> str:
    lines = ["| model | system | ms / step | words / s | kvhybrid ÷ this | loss after "
             f"{steps} steps | MB / worker / step (MPI, servers) |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for model, systems in results.items():
        ours = systems.get("kvhybrid")
        for name, r in systems.items():
            vs = (f"{ours['words_per_second'] / r['words_per_second']:.2f}×"
                  if ours and name != "kvhybrid" else "")
            sent = r.get("bytes_sent") or {}
            mb = (f"{(sent.get('dense', 0) + sent.get('rows', 0)) / r['steps'] / 2**20:.3f}, "
                  f"{sent.get('servers', 0) / r['steps'] / 2**20:.3f}" if sent else "")
            lines.append(f"| {model} | {name} | {r['step_seconds'] * 1e3:.1f} | "
                         f"{r['words_per_second']:,.0f} | {vs} | {r['loss']:.5f} | {mb} |")
    return "\n".join(lines)


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


def measure(args, hosts: int, rate: str, alpha_tokens: List[int]):
    """Every model under every system (and the α sweep) in one setting: loopback
    (``hosts`` 0) or ``hosts`` emulated hosts joined by links of ``rate``. Returns the
    setting's description, the results and the sweep."""
    args = argparse.Namespace(**vars(args))
    args.hosts, args.rate = hosts, rate
    args.servers = args.servers_wanted or hosts or 1
    systems = args.systems or [n for n in SYSTEMS if (hosts or n != "kvhybrid host-masters")
                               and n not in SYSTEM_ENV]
    with tempfile.TemporaryDirectory(prefix="kvhybrid-models-") as tmp, \
            contextlib.ExitStack() as stack:
        args.launcher_args = []
        where = "loopback"
        if hosts:
            cluster = stack.enter_context(EmulatedCluster(hosts, rate, args.delay))
            hostfile = cluster.hostfile(Path(tmp) / "hosts", args.workers // hosts)
            args.launcher_args = ["--launcher", "netns", "--hostfile", str(hostfile)]
            where = f"{hosts} emulated hosts at {rate}" + (f", {args.delay} latency"
                                                          if args.delay else "")
        log.info("models: %s, %d workers, %d server(s)", where, args.workers, args.servers)
        results = {m: {n: run_system(args, m, n, args.tokens, tmp) for n in systems}
                   for m in args.models}
        sweep = {str(t): {n: run_system(args, "lm", n, t, tmp) for n in ("kvhybrid", "dist_sync")}
                 for t in alpha_tokens}
    return where, args.servers, results, sweep


def write_setting(args, name: str, where: str, servers: int, results, sweep) -> None:
    table = "\n".join([
        f"# Model-level throughput, {where}: {args.workers} workers, {servers} server(s), batch "
        f"{args.batch_size} per worker, {args.tokens} words per sample", "",
        ratio_table(results, args.steps), "",
        "Median step after warm-up. Loss: on one fixed batch after the run (synchronous "
        "systems take the same steps). MB: what kvhybrid handed to MPI collectives and "
        "pushed to the servers, per worker and step (pulls not counted).", "",
        bytes_table(results, where), "",
        *footer("models")]) + "\n"
    write_outputs(args.out, name, table, results, plot)
    if sweep:
        lines = [f"# LM-like, {where}: kvhybrid and dist_sync against α", "",
                 "| words per sample | kvhybrid words/s | dist_sync words/s | speedup |",
                 "|---:|---:|---:|---:|"]
        for t, r in sweep.items():
            a, b = r["kvhybrid"]["words_per_second"], r["dist_sync"]["words_per_second"]
            lines.append(f"| {t} | {a:,.0f} | {b:,.0f} | {a / b:.2f}× |")
        write_outputs(args.out, f"{name}_alpha", "\n".join(lines + ["", *footer("models")]) + "\n",
                      sweep, plot_alpha)


#: issue 8's throughput targets on the emulated network: (model, peer, kvhybrid ÷ peer at least)
NETWORK_TARGETS = [("lm", "dist_sync", 2.0), ("lm", "Horovod", 4.0), ("nmt", "dist_sync", 1.5),
                   ("nmt", "Horovod", 1.5), ("cnn", "Horovod", 0.95), ("cnn", "dist_sync", 1.3)]


def targets_table(loop, sweep, net, net_where: str) -> str:
    """Every target of the suite, met or missed, from one run's results."""
    rows = []

    def speed(r, name):
        return r[name]["words_per_second"] if name in r else None

    def add(what, got, want, at_least=True, fmt="{:.2f}×"):
        ok = got >= want if at_least else got <= want
        rows.append(f"| {what} | {fmt.format(got)} | {'≥' if at_least else '≤'} "
                    f"{fmt.format(want)} | {'met' if ok else '**missed**'} |")

    for model, peer, want in NETWORK_TARGETS:
        r = net.get(model, {})
        if speed(r, "kvhybrid") and speed(r, peer):
            add(f"{net_where}: {model} kvhybrid ÷ {peer}", speed(r, "kvhybrid") / speed(r, peer),
                want)
    for model, r in loop.items():
        peers = [n for n in ("dist_sync", "Horovod") if n in r]
        if "kvhybrid" in r and peers:
            best = max(peers, key=lambda n: speed(r, n))
            add(f"loopback: {model} kvhybrid ÷ the better peer ({best})",
                speed(r, "kvhybrid") / speed(r, best), 0.95)
    for tokens, r in sweep.items():
        add(f"loopback: lm at {tokens} words per sample, kvhybrid ÷ dist_sync",
            speed(r, "kvhybrid") / speed(r, "dist_sync"), 0.95)
    for model, r in net.items():
        for name in ("kvhybrid", "kvhybrid host-masters"):
            if name in r and r[name].get("wire_per_host"):
                add(f"{net_where}: {model} {name} bytes per host ÷ Table 3",
                    r[name]["wire_per_host"] / r[name]["table3_per_host"], 1.2, at_least=False)
    for where, results in (("loopback", loop), (net_where, net)):
        for model, r in results.items():
            losses = [x["loss"] for x in r.values()]
            spread = (max(losses) - min(losses)) / abs(min(losses))
            add(f"{where}: {model} losses of the synchronous systems, relative spread",
                spread, 1e-3, at_least=False, fmt="{:.1e}")
    return "\n".join(["| target | measured | wanted | |", "|---|---:|---:|---|", *rows])


def main(argv=None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    p = argparse.ArgumentParser(prog="python -m kvhybrid.bench.models",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--suite", action="store_true",
                   help="the whole comparison in one run: loopback with the α sweep (--alpha-tokens, "
                        "default 10 25 50 100 200), then 4 emulated hosts at 1 Gbit/s; writes "
                        "models*, models_1gbit* and models_targets.md (every target, met or missed)")
    p.add_argument("--models", nargs="+", choices=sorted(MODELS), default=["lm", "nmt", "cnn"])
    p.add_argument("--systems", nargs="+", choices=list(SYSTEMS),
                   help="default: all (kvhybrid host-masters only on emulated hosts)")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--servers", type=int, dest="servers_wanted",
                   help="default: 1 on loopback, one per emulated host")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--tokens", type=int, default=50, help="words per sample")
    p.add_argument("--alpha-tokens", type=int, nargs="*",
                   help="LM-like: also sweep words per sample (α) for kvhybrid and dist_sync")
    p.add_argument("--hosts", type=int, default=0,
                   help="emulate this many hosts (network namespaces, root only) joined by "
                        "links of --rate; 0: everything on loopback")
    p.add_argument("--rate", default="1gbit", help="emulated link bandwidth (tc tbf rate)")
    p.add_argument("--delay", help="emulated link latency each way (tc netem delay), e.g. 100us")
    p.add_argument("--timeout", type=float, default=900)
    p.add_argument("--out", default="docs/benchmarks")
    p.add_argument("--name", default="models", help="file names: NAME.md, NAME.json, NAME.png")
    args = p.parse_args(argv)
    # SIGTERM unwinds like Ctrl-C: the running job is stopped, the emulated hosts deleted
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    if args.steps <= args.warmup:
        p.error(f"--steps ({args.steps}) must exceed --warmup ({args.warmup})")
    hosts = 4 if args.suite else args.hosts
    if hosts and args.workers % hosts:
        p.error(f"--workers ({args.workers}) must be a multiple of the {hosts} hosts")
    if not args.suite:
        where, servers, results, sweep = measure(args, args.hosts, args.rate,
                                                 args.alpha_tokens or [])
        write_setting(args, args.name, where, servers, results, sweep)
        return
    tokens = [10, 25, 50, 100, 200] if args.alpha_tokens is None else args.alpha_tokens
    where, servers, loop, sweep = measure(args, 0, args.rate, tokens)
    write_setting(args, args.name, where, servers, loop, sweep)
    net_where, net_servers, net, _ = measure(args, hosts, "1gbit", [])
    write_setting(args, f"{args.name}_1gbit", net_where, net_servers, net, {})
    text = "\n".join([f"# Model-level targets (issue 8), one run: loopback and {net_where}", "",
                      targets_table(loop, sweep, net, net_where), "",
                      f"Tables: `{args.name}.md`, `{args.name}_alpha.md`, `{args.name}_1gbit.md`.",
                      "", *footer("models")]) + "\n"
    (Path(args.out) / f"{args.name}_targets.md").write_text(text)
    print(text)
    log.info("models: wrote %s/%s_targets.md", args.out, args.name)


if __name__ == "__main__":
    main()
