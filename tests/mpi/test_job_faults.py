"""Faults injected into real launched synchronous jobs (2 client groups of 2 + 1 server, or
a client group and a server): each ends the whole job non-zero within 30 s, names the
culprit, and leaves no process behind and no port bound.

The harness (tests/support/faultinject.py) waits for the chosen step in the workers' output, then
kills (SIGKILL), stops politely (SIGTERM) or stalls (SIGSTOP) a chosen process, or drops
every packet to its listening ports.
"""
import re

import pytest

from tests.support.faultinject import LaunchedJob, kill_leftover_jobs
from tests.support.netns import TwoHosts, netns_available

LIMIT = 30          # seconds from the fault to the launcher's exit
HYBRID = ["-n", 4, "--clients", 2, "--servers", 1]
TRAIN = ["1000", "--sleep", "0.05"]
TIMEOUT = {"KVHYBRID_TIMEOUT": "8"}   # a stalled peer is reported after 8 s of silence


@pytest.fixture(autouse=True)
def _no_job_left_behind():
    yield
    kill_leftover_jobs()


def fault(tmp_path, action, role, rank, launch=HYBRID, env=TIMEOUT, netns=None):
    job = LaunchedJob(launch, "fault_train.py", [tmp_path, *TRAIN], env=env, netns=netns)
    port = job.wait_for(r"^scheduler\s+\S+\s+-\s+port (\d+)") and job.scheduler_port()
    job.inject(action, role, rank, at_step=5)
    result = job.finish(timeout=LIMIT + 30)
    assert result.returncode != 0, result.output[-3000:]
    assert result.seconds < LIMIT, f"took {result.seconds:.1f} s:\n{result.output[-3000:]}"
    assert "rank 0 finished" not in result.output
    assert job.leftovers() == []
    if port:
        assert job.port_free(port), \
            f"the scheduler's port {port} is still bound:\n{job.port_holders(port)}"
    return result.output


@pytest.mark.parametrize("action,signal", [("kill", 9), ("term", 15)])
def test_dead_worker_ends_the_job_naming_its_group_and_rank(tmp_path, action, signal):
    out = fault(tmp_path, action, "worker", 3)
    assert "client 1 on localhost" in out and "stopping the job" in out
    assert f"rank 1 with PID" in out or "rank 1 (pid" in out        # rank 1 of group 1


@pytest.mark.parametrize("action,signal", [("kill", 9), ("term", 15)])
def test_dead_server_ends_the_job_naming_it(tmp_path, action, signal):
    out = fault(tmp_path, action, "server", 0)
    assert f"server 0 on localhost" in out and f"was killed by signal {signal}" in out


def test_dead_scheduler_ends_the_job_naming_it(tmp_path):
    out = fault(tmp_path, "kill", "scheduler", 0)
    assert "scheduler on localhost" in out and "was killed by signal 9" in out


def test_stalled_server_ends_the_job_naming_the_wait_and_the_stopped_process(tmp_path):
    out = fault(tmp_path, "stall", "server", 0)
    assert "timed out after 12 s waiting for the parameter servers" in out
    assert "server 0 on localhost" in out and "is stopped" in out


def test_stalled_server_ends_a_job_of_one_rank_groups_naming_the_wait(tmp_path):
    # a client group per worker hands its dense round trips to MXNet's engine and waits for
    # none of them (a model with no rows: nothing else waits for the servers): the watchdog
    # times the servers' answers all the same
    job = LaunchedJob(["-n", 2, "--clients", 2, "--servers", 1], "fault_train.py",
                      [tmp_path, *TRAIN, "--kind", "dense"],
                      env={**TIMEOUT, "KVHYBRID_TEST_FUSED": "1"})
    job.wait_for(r"^scheduler\s+\S+\s+-\s+port (\d+)")
    job.inject("stall", "server", 0, at_step=5)
    result = job.finish(timeout=LIMIT + 30)
    out = result.output
    assert result.returncode != 0 and result.seconds < LIMIT, out[-3000:]
    assert re.search(r"timed out after 12 s waiting for the parameter servers' answers to the "
                     r"pushpull of keys \d+\.\.\d+", out), out[-3000:]
    assert "server 0 on localhost" in out and "is stopped" in out
    assert job.leftovers() == []


def test_stalled_worker_ends_the_job_naming_the_laggard(tmp_path):
    out = fault(tmp_path, "stall", "worker", 1)
    assert "timed out after 8 s" in out
    # named by its group's ranks: before the wait they are in, or stopped inside it
    assert re.search(r"rank 1 \(pid \d+ on \S+\) (is still before it|is stopped)", out), out


@pytest.mark.skipif(not netns_available(),
                    reason="needs root and Linux network namespaces (ip netns add) to drop "
                           "one process's traffic without touching the machine's own")
def test_server_port_dropping_packets_ends_the_job_naming_the_wait(tmp_path):
    with TwoHosts() as hosts:
        hostfile = tmp_path / "hosts"
        hostfile.write_text(f"{hosts.names[0]} slots=4\n")
        out = fault(tmp_path, "close_port", "server", 0, netns=hosts.names[0],
                    launch=HYBRID + ["--launcher", "netns", "--hostfile", hostfile])
    # the master times out on the servers, naming the scheduler's address (its peers, who wait
    # for the master, defer: the rank at the end of the chain reports)
    assert "timed out after 12 s waiting for the parameter servers to return" in out, out
    assert f"scheduler at {hosts.addresses[0]}" in out
