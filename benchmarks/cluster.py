"""An emulated cluster on one machine: hosts as Linux network namespaces joined by
rate-limited links, so the benchmarks can show the regime the papers measured (a network
that limits), which loopback cannot.

Each host ``<prefix>h<i>`` has one interface with an address in 10.233.<tag>.0/24 (a
subnet that exists only between these namespaces), plugged into a bridge that lives in
its own namespace ``<prefix>sw`` (the switch). Both directions of every host's link are
shaped: ``tbf rate`` (bandwidth) and optionally ``netem delay`` (latency). Nothing is
routed anywhere else. Everything is deleted on exit, on an exception, and on SIGTERM.

    with EmulatedCluster(hosts=4, rate="1gbit") as cluster:
        cluster.hostfile(path, slots=1)     # for kvhybrid-launch --launcher netns
"""
from __future__ import annotations

import argparse
import atexit
import logging
import contextlib
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import List, Optional

log = logging.getLogger("benchmarks")


def _ip(*args: str, ns: Optional[str] = None) -> None:
    cmd = ["ip"] + (["-n", ns] if ns else []) + list(args)
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
    if r.returncode != 0:
        raise RuntimeError(f"`{' '.join(cmd)}` failed: {r.stderr.strip()}")


def _tc(ns: str, dev: str, rate: str, delay: Optional[str]) -> None:
    """Shape ``dev``'s egress in ``ns``: netem delay (if any), then a tbf of ``rate``."""
    base = ["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev]
    steps = []
    if delay:
        steps.append((base + ["root", "handle", "1:", "netem", "delay", delay],
                      "a link latency needs the kernel's netem qdisc (sch_netem): load it "
                      "(modprobe sch_netem) or leave out the delay"))
    parent = ["parent", "1:", "handle", "2:"] if delay else ["root"]
    steps.append((base + parent + ["tbf", "rate", rate, "burst", "256kb", "latency", "50ms"],
                  f"check the rate {rate!r} (tc's units: 1gbit, 100mbit)"))
    for cmd, fix in steps:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
        if r.returncode != 0:
            raise RuntimeError(f"`{' '.join(cmd[4:])}` failed ({r.stderr.strip()}): {fix}")


class EmulatedCluster:
    def __init__(self, hosts: int = 4, rate: Optional[str] = "1gbit", delay: Optional[str] = None,
                 prefix: str = "kvc"):
        if hosts < 1:
            raise ValueError(f"hosts must be at least 1, got {hosts}")
        tag = os.getpid() % 250
        self.prefix = f"{prefix}{tag}"
        self.names: List[str] = [f"{self.prefix}h{i}" for i in range(hosts)]
        self.addresses = [f"10.233.{tag}.{i + 1}" for i in range(hosts)]
        self.switch = f"{self.prefix}sw"
        self.rate, self.delay = rate, delay
        self._old_term = None

    def __enter__(self) -> "EmulatedCluster":
        self.close()
        atexit.register(self.close)
        self._old_term = signal.signal(signal.SIGTERM, self._on_term)
        try:
            _ip("netns", "add", self.switch)
            _ip("link", "add", "br0", "type", "bridge", ns=self.switch)
            _ip("link", "set", "br0", "up", ns=self.switch)
            for i, (name, addr) in enumerate(zip(self.names, self.addresses)):
                _ip("netns", "add", name)
                _ip("link", "set", "lo", "up", ns=name)
                host_end, switch_end = f"eth{i}", f"p{i}"
                _ip("link", "add", host_end, "netns", name, "type", "veth", "peer", "name",
                    switch_end, "netns", self.switch)
                _ip("addr", "add", f"{addr}/24", "dev", host_end, ns=name)
                _ip("link", "set", host_end, "up", ns=name)
                _ip("link", "set", switch_end, "master", "br0", ns=self.switch)
                _ip("link", "set", switch_end, "up", ns=self.switch)
                if self.rate:   # None: links as fast as the veth pairs
                    _tc(name, host_end, self.rate, self.delay)          # host -> switch
                    _tc(self.switch, switch_end, self.rate, self.delay)  # switch -> host
        except Exception:
            self.close()
            raise
        log.info("cluster: %d hosts (%s) at %s%s", len(self.names), ", ".join(self.names),
                 self.rate or "full speed", f", {self.delay} latency" if self.delay else "")
        return self

    def _on_term(self, signum, frame) -> None:
        # unwind: the running job is stopped first (bench.common.run_job), the hosts
        # deleted last (__exit__), so no process is left in a deleted namespace
        raise SystemExit(128 + signum)

    def hostfile(self, path: Path, slots: int) -> Path:
        Path(path).write_text("".join(f"{name} slots={slots}\n" for name in self.names))
        return Path(path)

    def close(self) -> None:
        """Stop whatever still runs on the hosts, then delete them: a job stopped in a hurry
        (a second SIGTERM cuts its launcher's grace short) can leave a host's ``orted`` and
        its ranks, which a deleted namespace hides but does not stop."""
        names = self.names + [self.switch]
        stop_processes_in(names)
        for name in names:
            subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=20)

    def __exit__(self, *exc) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)   # (a further SIGTERM: clean up anyway)
        try:
            self.close()
            atexit.unregister(self.close)   # (kept where closing failed: tried again at exit)
        finally:
            signal.signal(signal.SIGTERM, self._old_term if self._old_term is not None
                          else signal.SIG_DFL)


#: how long the processes on a host get to end after SIGTERM before SIGKILL
STOP_GRACE = 5.0


def stop_processes_in(names: List[str], grace: float = STOP_GRACE) -> List[int]:
    """SIGTERM to every process in the network namespaces ``names``, then SIGKILL to those
    still there after ``grace`` seconds; returns the first ones' pids."""
    pids = _pids_in(names)
    _signal_all(pids, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(_running(p) for p in pids):
        time.sleep(0.1)
    # (listed again: a pid that ended may be another process's now, outside the hosts)
    _signal_all([p for p in _pids_in(names) if _running(p)], signal.SIGKILL)
    if pids:
        log.warning("cluster: stopped %d process(es) left on hosts %s", len(pids),
                    ", ".join(names))
    return pids


def _pids_in(names: List[str]) -> List[int]:
    pids = []
    for name in names:   # (none where the namespace is gone)
        listed = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True,
                                timeout=20)
        pids += [int(p) for p in listed.stdout.split() if p.isdigit()]
    return [p for p in pids if p != os.getpid()]


def _signal_all(pids: List[int], signum: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)


def _running(pid: int) -> bool:
    """Whether ``pid`` is alive and not a zombie (which only waits for its parent)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def setting_name(hosts: int, rate: str, workers: int, delay: Optional[str] = None) -> str:
    """A setting's name in the tables: loopback, or its emulated hosts and links."""
    if not hosts:
        return "loopback"
    per_host = workers // hosts
    return (f"{hosts} emulated hosts" + (f" × {per_host} workers" if per_host > 1 else "")
            + f" at {rate}" + (f", {delay} latency" if delay else ""))


def add_host_args(p: argparse.ArgumentParser) -> None:
    """``--hosts``, ``--rate`` and ``--delay``: the emulated hosts a benchmark runs on."""
    p.add_argument("--hosts", type=int, default=0,
                   help="emulate this many hosts (network namespaces, root only) joined by "
                        "links of --rate; 0: everything on loopback")
    p.add_argument("--rate", default="1gbit", help="emulated link bandwidth (tc tbf rate)")
    p.add_argument("--delay", help="emulated link latency each way (tc netem delay), e.g. 100us")


def why_no_hosts() -> Optional[str]:
    """Why emulated hosts cannot be made on this machine, fix named (None: they can): the
    words that follow a tool's ``--hosts``."""
    if os.geteuid() != 0:
        return ("needs root: the emulated hosts are network namespaces (run as root, or leave "
                "--hosts out to run on loopback)")
    if shutil.which("ip") is None or shutil.which("tc") is None:
        return "needs iproute2's ip and tc on PATH (apt-get install iproute2)"
    return None


def check_host_args(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse ``--hosts`` that cannot split ``--workers`` evenly or cannot be made here."""
    if args.hosts < 0 or (args.hosts and args.workers % args.hosts):
        p.error(f"--hosts must be 0 (loopback) or divide --workers {args.workers}, got "
                f"{args.hosts}")
    missing = why_no_hosts() if args.hosts else None
    if missing:
        p.error(f"--hosts {missing}")


def launcher_args_on_hosts(stack: contextlib.ExitStack, hosts: int, rate: str,
                           delay: Optional[str], workers: int, folder: Path) -> List[str]:
    """``kvhybrid-launch``'s arguments that spread ``workers`` evenly over ``hosts`` emulated
    hosts, made now and entered on ``stack`` (deleted on its exit, an exception and SIGTERM),
    their hostfile in ``folder``; none for 0 hosts (loopback)."""
    if not hosts:
        return []
    cluster = stack.enter_context(EmulatedCluster(hosts, rate, delay))
    hostfile = cluster.hostfile(Path(folder) / "hosts", workers // hosts)
    return ["--launcher", "netns", "--hostfile", str(hostfile)]
