"""Running a job's processes: prefixed logs, and teardown when one fails.

In a synchronous job every process is needed: when any exits non-zero, the
others are stopped (SIGTERM, then SIGKILL after a grace period) and the
launcher reports which process failed with the tail of its output. Ctrl-C
stops everything the same way. A process started with ``restarts`` (a client
group of an asynchronous or elastic job, ``kvhybrid-launch --restarts``) is
started again instead, after a backoff, while the others go on; only when its
restarts are spent does its failure stop the job. Each process runs in its own session, so its
whole process tree (mpirun and its ranks) is signalled together.
"""
from __future__ import annotations

import collections
import contextlib
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Deque, Dict, List, Optional

log = logging.getLogger("kvhybrid.launch")


GRACE_SECONDS = 4.0
#: the delay before a restart: ps-lite's scheduler must have
#: declared the dead node dead (PS_HEARTBEAT_TIMEOUT, see launch/cli.py) before the new
#: one registers, or it is never given the old node's place
RESTART_DELAY = 5.0


def _stopped(pid: int) -> bool:
    """Whether ``pid`` (or a process below it: mpirun's ranks) is stopped (state T)."""
    pids = [pid]
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            pids += [int(c) for c in f.read().split()]
    except OSError:
        pass
    for p in pids:
        try:
            with open(f"/proc/{p}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] in ("T", "t"):
                    return True
        except (OSError, IndexError):
            continue
    return False


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


class TaggedLines:
    """Each rank's lines from an mpirun that tags its ranks' output (``tag``: the tag's
    regular expression, ``mpirun.output_tag``), each tagged once. mpirun tags every piece it
    reads, and an unbuffered ``print(a, b)`` writes each argument on its own, so one line of
    a rank arrives as tagged pieces, between other ranks' pieces: each tag's pieces are
    joined, and a newline in the stream ends the line of the tag before it."""

    def __init__(self, tag: Optional[str] = None):
        self._tag = re.compile(tag) if tag else None
        self._open: Dict[str, str] = {}   # tag -> the start of its line

    def feed(self, line: str) -> List[str]:
        """The lines that one line of the stream (without its newline) completes."""
        tags = self._tag.findall(line) if self._tag else []
        if not tags:   # mpirun's own words, or a process that does not tag
            return [line]
        pieces = self._tag.split(line)
        done = [pieces[0]] if pieces[0] else []   # (untagged text before the first tag)
        for tag, piece in zip(tags, pieces[1:]):
            self._open[tag] = self._open.get(tag, "") + piece
        done.append(tags[-1] + self._open.pop(tags[-1]))
        return done

    def rest(self) -> List[str]:
        """Lines the stream left unfinished (a rank's last write had no newline)."""
        done = [tag + text for tag, text in self._open.items()]
        self._open.clear()
        return done


class Terminated(KeyboardInterrupt):
    """The launcher got SIGTERM."""


def _interrupt(signum, frame):
    raise Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()


@contextlib.contextmanager
def signals_interrupt():
    """Inside: SIGINT raises KeyboardInterrupt and SIGTERM raises ``Terminated``, whatever
    handlers the process inherited (a shell starts background commands with SIGINT
    ignored, and a launcher that cannot be interrupted leaves its job behind)."""
    previous = {sig: signal.signal(sig, _interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@dataclass
class Managed:
    name: str                        # "scheduler", "server 1", "client 0"
    host: str
    popen: subprocess.Popen
    essential: bool                  # the job is done when every essential one has exited 0
    tail: Deque[str] = field(default_factory=lambda: collections.deque(maxlen=30))
    cmd: List[str] = field(default_factory=list)
    env: Dict[str, str] = field(default_factory=dict)
    restarts_left: int = 0
    attempt: int = 0
    restart_at: Optional[float] = None   # when a failed one is started again
    tag: Optional[str] = None            # how its ranks' pieces are tagged (TaggedLines)


class Supervisor:
    def __init__(self, out=None):
        self.procs: List[Managed] = []
        self._out = out or sys.stdout
        self._lock = threading.Lock()

    def start(self, name: str, host: str, cmd: List[str], env: Dict[str, str],
              essential: bool, restarts: int = 0, tag: Optional[str] = None) -> Managed:
        """Start a process of the job; ``tag``: how mpirun tags its ranks' output
        (``mpirun.output_tag``), None for a process that does not."""
        proc = Managed(name, host, self._popen(cmd, env), essential, cmd=cmd, env=env,
                       restarts_left=restarts, tag=tag)
        self.procs.append(proc)
        threading.Thread(target=self._pump, args=(proc, proc.popen), daemon=True).start()
        log.info("started %s on %s (pid %d)", name, host, proc.popen.pid)
        return proc

    @staticmethod
    def _popen(cmd: List[str], env: Dict[str, str]) -> subprocess.Popen:
        return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True, text=True,
                                bufsize=1, errors="replace")

    def _schedule_restart(self, proc: Managed, rc: int) -> None:
        how = f"was killed by signal {-rc}" if rc < 0 else f"exited with code {rc}"
        proc.attempt += 1
        proc.restarts_left -= 1
        delay = RESTART_DELAY
        _kill_group(proc.popen.pid)   # whatever the failed job left (its other ranks)
        log.warning("%s on %s (pid %d) %s; the others go on, and it restarts in %.0f s "
                    "(restart %d, %d more allowed). Its last output:\n%s", proc.name, proc.host,
                    proc.popen.pid, how, delay, proc.attempt, proc.restarts_left,
                    "\n".join(f"    {line}" for line in list(proc.tail)[-8:]))
        proc.restart_at = time.monotonic() + delay
        for other in self.procs:   # ps-lite's scheduler takes back one node per job
            other.restarts_left = 0

    def _restart(self, proc: Managed) -> None:
        proc.restart_at = None
        proc.popen = self._popen(proc.cmd, {**proc.env, "KVHYBRID_RESTART": str(proc.attempt)})
        threading.Thread(target=self._pump, args=(proc, proc.popen), daemon=True).start()
        log.info("restarted %s on %s (pid %d, KVHYBRID_RESTART=%d)", proc.name, proc.host,
                 proc.popen.pid, proc.attempt)

    def _pump(self, proc: Managed, popen: subprocess.Popen) -> None:
        lines = TaggedLines(proc.tag)
        for line in popen.stdout:
            # (ssh -tt hands lines over a pseudo-terminal, which ends them with "\r\n")
            self._write(proc, lines.feed(line.rstrip("\r\n")))
        self._write(proc, lines.rest())

    def _write(self, proc: Managed, lines: List[str]) -> None:
        for line in lines:
            proc.tail.append(line)
        if lines:
            with self._lock:
                self._out.write("".join(f"[{proc.name}] {line}\n" for line in lines))
                self._out.flush()

    def wait(self, poll: float = 0.1) -> int:
        """Run until the essential processes are done (0) or one process fails (its code).

        Ctrl-C (SIGINT) and SIGTERM stop every process of the job (``signals_interrupt``).
        """
        with signals_interrupt():
            return self._wait(poll)

    def _wait(self, poll: float) -> int:
        try:
            while True:
                for proc in self.procs:
                    if proc.restart_at is not None:
                        if time.monotonic() >= proc.restart_at:
                            self._restart(proc)
                        continue
                    rc = proc.popen.poll()
                    if rc is not None and rc != 0:
                        if proc.restarts_left > 0:
                            self._schedule_restart(proc, rc)
                            continue
                        return self._fail(proc, rc)
                if all(p.popen.poll() == 0 and p.restart_at is None
                       for p in self.procs if p.essential):
                    self._finish()
                    return 0
                time.sleep(poll)
        except KeyboardInterrupt as exc:
            how = "terminated (SIGTERM)" if isinstance(exc, Terminated) else "interrupted"
            log.error("%s: stopping every process of the job", how)
            self.stop_all()
            return 143 if isinstance(exc, Terminated) else 130

    def _fail(self, proc: Managed, rc: int) -> int:
        how = f"was killed by signal {-rc}" if rc < 0 else f"exited with code {rc}"
        if rc == 255 and proc.cmd[:1] == ["ssh"]:
            how += " (ssh's own code: the remote process was killed by a signal, or the " \
                   "connection to its host was lost)"
        time.sleep(0.3)  # let its last lines arrive
        tail = "\n".join(f"    {line}" for line in list(proc.tail)[-15:]) or "    (no output)"
        log.error("%s on %s (pid %d) %s; stopping the job. Its last output:\n%s",
                  proc.name, proc.host, proc.popen.pid, how, tail)
        for other in self._stuck():
            log.error("%s on %s (pid %d) is stopped (SIGSTOP, or a debugger): the others may "
                      "have waited for it", other.name, other.host, other.popen.pid)
        self.stop_all()
        return rc if rc > 0 else 128 - rc

    def _stuck(self) -> List[Managed]:
        """Processes of the job that are alive but stopped: a stalled peer, named when the
        job fails, since the ranks waiting for it only know what they waited for."""
        stuck = []
        for p in self.procs:
            if p.popen.poll() is None and _stopped(p.popen.pid):
                stuck.append(p)
        return stuck

    def _finish(self) -> None:
        """The workers are done: give the scheduler and servers a moment to leave on their own."""
        deadline = time.monotonic() + GRACE_SECONDS
        while time.monotonic() < deadline and any(p.popen.poll() is None for p in self.procs):
            time.sleep(0.1)
        self.stop_all()

    def stop_all(self) -> None:
        for p in self.procs:
            p.restart_at = None
        alive = [p for p in self.procs if p.popen.poll() is None]
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for p in alive:
                try:
                    os.killpg(p.popen.pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + GRACE_SECONDS
            while time.monotonic() < deadline and any(p.popen.poll() is None for p in alive):
                time.sleep(0.05)
            alive = [p for p in alive if p.popen.poll() is None]
            if not alive:
                break
        for p in self.procs:
            p.popen.wait()
