"""Fault injection for tests: a real ``kvhybrid-launch`` job, and a fault at a chosen step.

    job = LaunchedJob(["-n", 4, "--clients", 2, "--servers", 1], "fault_train.py", ["200"])
    job.inject("kill", "server", 0, at_step=5)     # SIGKILL server 0 when rank 0 logs step 5
    result = job.finish(timeout=60)                 # exit code, output, seconds since the fault
    assert job.leftovers() == [] and job.port_free(job.scheduler_port())

Roles and ranks: ``scheduler``; ``server`` i (the launcher's "server i"); ``client`` c (the
mpirun of client group c); ``worker`` r (global rank r = c * group size + rank in group).
Actions: ``kill`` (SIGKILL, a crash), ``term`` (SIGTERM, a polite stop), ``stall``
(SIGSTOP: alive but silent, as a deadlocked or swapped-out process), ``close_port``
(the process's listening TCP ports drop every packet: a firewall or a dead link; needs the
job to run in a network namespace of its own, ``netns=``).

Workers must print ``rank R step S`` at each step (``tests/mpi/workers/fault_train.py`` does).
"""
from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import List, Optional, Sequence

import psutil

from kvhybrid.procnet import listening_ports
from tests.support.jobs import ROOT, WORKERS, job_env

LAUNCH = [sys.executable, "-m", "kvhybrid.launch.cli"]
_STARTED = re.compile(r"started (scheduler|server \d+|client \d+) on (\S+) \(pid (\d+)\)")
SIGNALS = {"kill": signal.SIGKILL, "term": signal.SIGTERM, "stall": signal.SIGSTOP}


@dataclass
class Result:
    returncode: int
    output: str
    seconds: float          # from the fault (or the start) to the launcher's exit


class LaunchedJob:
    """A launcher job in the background: its output as it arrives, its processes by role."""

    def __init__(self, launch_args: Sequence, script: str, args: Sequence = (),
                 env: Optional[dict] = None, netns: Optional[str] = None):
        # a worker script in tests/mpi/workers, or a module to run with python -m
        program = [str(WORKERS / script)] if script.endswith(".py") else ["-m", script]
        cmd = LAUNCH + [str(a) for a in launch_args] + [sys.executable, *program,
                                                        *map(str, args)]
        self.netns = netns
        self.popen = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True, env=job_env(env), cwd=ROOT,
                                      start_new_session=True)
        self.lines: List[str] = []
        self.pids: set = set()
        self.started = {}                     # "server 0" -> pid
        self.fault_time: Optional[float] = None
        self._start = time.monotonic()
        self._changed = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()
        _ALIVE.append(self)

    def _read(self) -> None:
        for line in self.popen.stdout:
            m = _STARTED.search(line)
            with self._changed:
                if m:
                    self.started[m.group(1)] = int(m.group(3))
                self.lines.append(line.rstrip("\n"))
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def wait_for(self, pattern: str, timeout: float = 90) -> re.Match:
        """The first output line matching ``pattern``; fails if the job ends or time runs out."""
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout
        seen = 0
        with self._changed:
            while True:
                for line in self.lines[seen:]:
                    m = regex.search(line)
                    if m:
                        return m
                seen = len(self.lines)
                if self.popen.poll() is not None and seen == len(self.lines):
                    raise AssertionError(f"the job ended before printing {pattern!r}:\n"
                                         f"{self.output[-3000:]}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"no {pattern!r} in {timeout} s:\n{self.output[-3000:]}")
                self._changed.wait(min(left, 0.5))

    # -- the job's processes -------------------------------------------------------------
    def _collect(self) -> None:
        self.pids |= descendants(self.popen.pid)

    def process(self, role: str, rank: int = 0) -> psutil.Process:
        if role in ("scheduler", "server", "client"):
            name = role if role == "scheduler" else f"{role} {rank}"
            pid = self.started.get(name)
            if pid is None:
                raise AssertionError(f"the launcher started no {name}:\n{self.output[-2000:]}")
            return psutil.Process(pid)
        if role != "worker":
            raise ValueError(f"role must be scheduler, server, client or worker, got {role!r}")
        self._collect()
        for pid in sorted(self.pids):
            try:
                p = psutil.Process(pid)
                env = p.environ()
                # Open MPI's rank variables, or Hydra's (MPICH, Intel MPI)
                names = next((n for n in (("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
                                          ("PMI_RANK", "PMI_SIZE")) if n[0] in env), None)
                if names is None or "python" not in p.name():
                    continue
                client = int(env.get("KVHYBRID_CLIENT_ID", "0"))
                if client * int(env[names[1]]) + int(env[names[0]]) == rank:
                    return p
            except (psutil.NoSuchProcess, psutil.AccessDenied, KeyError):
                continue
        raise AssertionError(f"no worker of rank {rank} found")

    def inject(self, action: str, role: str, rank: int = 0, at_step: int = 0,
               step_rank: int = 0, step_client: Optional[int] = None) -> psutil.Process:
        """Wait until worker ``step_rank`` logs step ``at_step`` (or, with ``step_client``, any
        worker of that client group: the store numbers ranks by the groups' ps-lite order,
        which varies from run to run), then hit ``role`` ``rank``."""
        if action not in SIGNALS and action != "close_port":
            raise ValueError(f"action must be one of {sorted(SIGNALS) + ['close_port']}")
        if step_client is None:
            self.wait_for(rf"rank {step_rank} step {at_step}\b")
        else:
            self.wait_for(rf"^\[client {step_client}\] \S*rank \d+ step {at_step}\b")
        target = self.process(role, rank)
        self.fault_time = time.monotonic()
        if action == "close_port":
            self._close_ports(target)
        else:
            target.send_signal(SIGNALS[action])
        return target

    def _close_ports(self, target: psutil.Process) -> None:
        if not self.netns:
            raise ValueError("close_port changes the namespace's traffic control: run the job "
                             "in a namespace of its own (netns=)")
        ports = listening_ports(target.pid)
        assert ports, f"{target.pid} listens on no TCP port"
        # packets to those ports go to a class that passes 8 bit/s into a one-packet queue:
        # a drop (this kernel's tc has no drop action and no prio qdisc, but htb and tbf)
        tc = self._in_job_netns(["tc"])
        for args in (["qdisc", "add", "dev", "lo", "root", "handle", "1:", "htb", "default", "1"],
                     ["class", "add", "dev", "lo", "parent", "1:", "classid", "1:1", "htb",
                      "rate", "10gbit"],
                     ["class", "add", "dev", "lo", "parent", "1:", "classid", "1:2", "htb",
                      "rate", "8bit", "ceil", "8bit"],
                     ["qdisc", "add", "dev", "lo", "parent", "1:2", "handle", "20:", "tbf",
                      "rate", "8bit", "burst", "1600", "limit", "1"],
                     *[["filter", "add", "dev", "lo", "parent", "1:", "protocol", "ip", "u32",
                        "match", "ip", "dport", str(port), "0xffff", "flowid", "1:2"]
                       for port in ports]):
            subprocess.run(tc + args, check=True, capture_output=True)

    # -- the end -----------------------------------------------------------------------------
    def finish(self, timeout: float) -> Result:
        """Wait for the launcher to exit; kill everything if it does not in ``timeout``."""
        try:
            self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill_everything()
            raise AssertionError(f"the launcher still ran {timeout} s after the fault (killed "
                                 f"it and its processes):\n{self.output[-3000:]}") from None
        ended = time.monotonic()
        time.sleep(0.2)   # the reader's last lines
        return Result(self.popen.returncode, self.output,
                      ended - (self.fault_time or self._start))

    def kill_everything(self) -> None:
        """SIGKILL the launcher and every process it started (a machine losing power)."""
        self._collect()
        for pid in self.pids | {self.popen.pid}:
            try:
                p = psutil.Process(pid)
                p.send_signal(signal.SIGCONT)
                p.kill()
            except psutil.NoSuchProcess:
                pass
        self.popen.wait()

    def leftovers(self) -> List[str]:
        """The job's processes still alive, described."""
        time.sleep(0.5)
        alive = []
        for pid in self.pids | set(self.started.values()):
            try:
                p = psutil.Process(pid)
                if p.status() != psutil.STATUS_ZOMBIE:
                    alive.append(f"{pid} {' '.join(p.cmdline())[:120]}")
            except psutil.NoSuchProcess:
                pass
        return alive

    def scheduler_port(self) -> Optional[int]:
        m = re.search(r"^scheduler\s+\S+\s+-\s+port (\d+)", self.output, re.M)
        return int(m.group(1)) if m else None

    def _in_job_netns(self, cmd: List[str]) -> List[str]:
        """``cmd`` run where the job runs: in its namespace, if it has one."""
        return ["ip", "netns", "exec", self.netns, *cmd] if self.netns else cmd

    def port_free(self, port: int, within: float = 2.0) -> bool:
        """Whether ``port`` can be bound again on this machine (in the job's namespace),
        tried for ``within`` seconds: the kernel may finish closing a dead process's
        sockets just after the job's exit."""
        code = ("import socket; s = socket.socket(); "
                "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
                f"s.bind(('0.0.0.0', {port})); s.close()")
        cmd = self._in_job_netns([sys.executable, "-c", code])
        deadline = time.monotonic() + within
        while subprocess.run(cmd, capture_output=True).returncode != 0:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.2)
        return True

    def port_holders(self, port: int) -> str:
        """The sockets on ``port`` with their states and processes (``ss``), for a failure's
        message: a listener left behind, or another connection that took the port."""
        try:
            out = subprocess.run(self._in_job_netns(["ss", "-tanp"]), capture_output=True,
                                 text=True).stdout
        except OSError as exc:   # (no ss here: the failure keeps its own message)
            return f"(not listed: {exc})"
        return "\n".join(line for line in out.splitlines() if f":{port} " in line) or "none"


def descendants(pid: int) -> set:
    """Every process below ``pid`` now (none if it is gone)."""
    try:
        return {child.pid for child in psutil.Process(pid).children(recursive=True)}
    except psutil.NoSuchProcess:
        return set()


_ALIVE: List[LaunchedJob] = []


def kill_leftover_jobs() -> None:
    """For a fixture: whatever a test asserted, nothing it started keeps running."""
    while _ALIVE:
        job = _ALIVE.pop()
        if job.popen.poll() is None or job.leftovers():
            job.kill_everything()
