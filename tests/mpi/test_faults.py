"""A rank that dies, raises, stalls or leaves early ends the job quickly, with the culprit named.

Real mpirun jobs of 3 ranks; rank 1 misbehaves at step 3 while ranks 0 and 2
wait for it in a collective. Without kvhybrid's guards they would wait forever.
"""
import subprocess
import sys
import time

import pytest

from tests.support.jobs import run_job

LIMIT = 30  # seconds: the others must be gone by then


def run_fault(mode: str, **env):
    return run_job(3, "faults.py", [mode, 1], timeout=LIMIT + 30, env=env)


@pytest.mark.parametrize("mode,named", [
    ("kill", "rank 1 (pid"),                 # named by the watchdog of the waiting ranks
    ("exit", "rank 1 (pid"),
    ("raise", "rank 1 raised RuntimeError"),  # named by the failing rank before it aborts
])
def test_others_exit_nonzero_quickly_naming_the_rank(mode, named):
    result = run_fault(mode, KVHYBRID_TIMEOUT="120")  # far above LIMIT: the timeout is not what ends it
    assert result.returncode != 0, result.output[-3000:]
    assert result.seconds < LIMIT, f"took {result.seconds:.0f} s"
    assert named in result.output, result.output[-3000:]
    assert "finished all steps" not in result.output


def test_kill_is_reported_by_the_waiting_ranks():
    result = run_fault("kill", KVHYBRID_TIMEOUT="120")
    assert "rank 1 (pid" in result.output and "has exited while rank" in result.output


def test_stalled_rank_times_out_naming_the_wait_and_the_laggard():
    result = run_fault("stall", KVHYBRID_TIMEOUT="4", KVHYBRID_STALL_WARNING="1")
    assert result.returncode != 0
    assert result.seconds < LIMIT
    out = result.output
    assert "has waited" in out                        # the stall warning came first
    assert "timed out after 4 s waiting for the ranks to agree on pushpull of key 0" in out
    assert "rank 1 (pid" in out and "is still before it" in out
    assert "raise KVHYBRID_TIMEOUT" in out


def test_a_rank_whose_mpi_abort_never_returns_still_exits():
    """mpi4py's ``Abort`` holds the GIL; if Open MPI never returns from it, the rank must still
    leave (after the grace period) so mpirun sees it gone. Stand-in: an ``Abort`` that spins
    inside the regex engine, which holds the GIL exactly as a blocked C call does."""
    script = (
        "import re, types\n"
        "from kvhybrid.tensor_collectives import watchdog\n"
        "watchdog._ABORT_GRACE_SECONDS = 1\n"
        "spin = lambda code: re.match(r'(a+)+$', 'a' * 60 + 'b')\n"
        "MPI = types.SimpleNamespace(COMM_WORLD=types.SimpleNamespace(Abort=spin))\n"
        "watchdog.abort_job(MPI, 'kvhybrid: giving up on purpose')\n")
    start = time.monotonic()
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1, r.stderr[-2000:]
    assert time.monotonic() - start < 30
    assert "giving up on purpose" in r.stderr
