"""Starting real MPI jobs from tests: ``mpirun`` on this machine, with a hard timeout."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Optional, Sequence

from kvhybrid.launch.mpirun import find_mpirun, flavour

ROOT = Path(__file__).resolve().parents[2]
#: the scripts the MPI tests run
WORKERS = ROOT / "tests" / "mpi" / "workers"


@dataclass
class JobResult:
    returncode: int
    output: str
    seconds: float


def mpirun_command(n: int) -> list:
    """Plain mpirun (not kvhybrid-launch), allowed more ranks than cores."""
    mpirun = find_mpirun()
    cmd = [mpirun, "-np", str(n)]
    if flavour(mpirun) == "openmpi":
        cmd += ["--oversubscribe", "--bind-to", "none", "--tag-output"]
    return cmd


def job_env(extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    env = dict(os.environ)
    env.update({
        "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
        "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""),
    })
    env.update(extra or {})
    return env


def _descendants(pid: int) -> list:
    """Every process below ``pid`` (from /proc): the launcher starts its scheduler, servers
    and mpirun in sessions of their own, which a kill of its process group misses."""
    children: Dict[int, list] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _kill_tree(pid: int) -> None:
    """SIGKILL ``pid``'s process group and every process below it, so that a job killed
    for its timeout leaves no workers or servers behind to slow the tests after it."""
    below = _descendants(pid)
    for target in below:
        try:
            os.kill(target, signal.SIGKILL)
        except ProcessLookupError:
            pass
    os.killpg(pid, signal.SIGKILL)


def _run_killable(cmd, what: str, timeout: float, env) -> JobResult:
    """Run ``cmd`` in its own session; kill its whole process tree after ``timeout``."""
    start = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=job_env(env), start_new_session=True, cwd=ROOT)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_tree(proc.pid)
        out, _ = proc.communicate()
        raise AssertionError(f"{what} still running after {timeout} s (killed):\n{out[-4000:]}")
    return JobResult(proc.returncode, out, time.monotonic() - start)


def run_job(n: int, script: str, args: Sequence[str] = (), timeout: float = 240,
            env: Optional[Dict[str, str]] = None) -> JobResult:
    """Run ``tests/mpi/workers/<script>`` on ``n`` ranks with plain mpirun."""
    cmd = mpirun_command(n) + [sys.executable, str(WORKERS / script), *map(str, args)]
    return _run_killable(cmd, f"mpirun job {script} {list(args)}", timeout, env)


def run_python(code: str, timeout: float = 60, env: Optional[Dict[str, str]] = None) -> JobResult:
    """Run ``python -c code`` as a plain process (no MPI launcher)."""
    start = time.monotonic()
    base = job_env(env)
    for var in [v for v in base if v.startswith(("OMPI_COMM_WORLD", "PMI", "PMIX"))]:
        del base[var]
    proc = subprocess.run([sys.executable, "-c", code], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, env=base, timeout=timeout)
    return JobResult(proc.returncode, proc.stdout, time.monotonic() - start)


def launcher_command(launcher_args: Sequence[str], script: str, args: Sequence[str] = ()) -> list:
    """``kvhybrid-launch LAUNCHER_ARGS python SCRIPT ARGS``, SCRIPT under tests/mpi/workers
    unless it is an absolute path."""
    return [sys.executable, "-m", "kvhybrid.launch.cli", *map(str, launcher_args),
            "python", str(WORKERS / script), *map(str, args)]


def run_launcher(launcher_args: Sequence[str], script: str, args: Sequence[str] = (),
                 timeout: float = 240, env: Optional[Dict[str, str]] = None,
                 via: Sequence[str] = ()) -> JobResult:
    """Run ``kvhybrid-launch LAUNCHER_ARGS python tests/mpi/workers/<script> ARGS``, prefixed by
    ``via`` (e.g. ``ip netns exec HOST``: the launcher on an emulated machine)."""
    cmd = [*via, *launcher_command(launcher_args, script, args)]
    return _run_killable(cmd, f"kvhybrid-launch {list(launcher_args)} {script}", timeout, env)


def assert_printed_lines_whole(result: JobResult, tag: str, ranks: int = 2) -> None:
    """A ``print_lines.py`` job (tests/mpi/workers) ended well, and each of its ranks' lines
    came out whole, tagged once (``tag``: the rank's tag, with ``{rank}`` in it)."""
    assert result.returncode == 0, result.output[-3000:]
    lines = result.output.splitlines()
    for rank in range(ranks):
        prefix = "[client 0] " + tag.format(rank=rank)
        for i in range(30):
            want = f"{prefix}rank {rank} line {i} checksum {1234.5 * i}"
            assert want in lines, (want, result.output[-3000:])
        assert f"{prefix}rank {rank} last words" in lines, result.output[-3000:]


def assert_every_worker_done(result: JobResult, workers: int) -> None:
    """A ``lifecycle.py ok`` job (tests/mpi/workers) ended well: exit 0, and each of its
    ``workers`` ranks printed the sum over all of them (a line's text, so interleaved lines
    from several ranks still count)."""
    assert result.returncode == 0, result.output[-4000:]
    for rank in range(workers):
        assert f"worker rank {rank} done, sum {workers}" in result.output, result.output[-4000:]
