"""Nobody outside the job runs code on its servers: a real attacker process (tests/support/attacker.py)
sends a pickled command to a running job's parameter server as a ps-lite worker would; the
same bytes sent to MXNet's own server loop run their code there (the attack is real).
A job whose processes hold different secrets stops at once, naming the secret.
"""
import os
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from tests.support.attacker import payload, send_command
from tests.support.faultinject import LaunchedJob, kill_leftover_jobs
from kvhybrid.procnet import listening_ports
from tests.support.jobs import ROOT, WORKERS, job_env, mpirun_command

HYBRID = ["-n", 2, "--clients", 2, "--servers", 1]
TRAIN = ["30", "--sleep", "0.1"]


@pytest.fixture(autouse=True)
def _no_job_left_behind():
    yield
    kill_leftover_jobs()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ps_env(port: int, workers: int = 1, **extra) -> dict:
    return job_env({"DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_PS_ROOT_PORT": str(port),
                    "DMLC_NUM_SERVER": "1", "DMLC_NUM_WORKER": str(workers),
                    "DMLC_NODE_HOST": "127.0.0.1", "PS_VERBOSE": "0", **extra})


def _wait_listening(pid: int, timeout: float = 60) -> list:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ports = listening_ports(pid)
        if ports:
            return ports
        time.sleep(0.2)
    raise AssertionError(f"process {pid} opened no port in {timeout} s")


def test_a_pickled_command_from_outside_the_job_is_refused_and_training_is_unchanged(tmp_path):
    target = tmp_path / "created-by-the-attacker"
    outputs = {}
    for name, attack in (("clean", False), ("attacked", True)):
        out = tmp_path / name
        out.mkdir()
        job = LaunchedJob(HYBRID, "fault_train.py", [out, *TRAIN])
        if attack:
            job.wait_for(r"rank 0 step 5")
            ports = listening_ports(job.started["server 0"])
            assert len(ports) == 1, ports
            attacker = send_command("127.0.0.1", ports[0], 0, payload(str(target)))
        result = job.finish(timeout=180)
        assert result.returncode == 0, result.output[-3000:]
        outputs[name] = result.output
    assert not target.exists(), "the server unpickled the attacker's command"
    refusals = [line for line in outputs["attacked"].splitlines() if "refused" in line]
    assert len(refusals) == 1 and "an unsigned command" in refusals[0], refusals
    assert "server 0" in refusals[0] and f"from {attacker} " in refusals[0], refusals
    want, got = np.load(tmp_path / "clean" / "final.npz"), np.load(tmp_path / "attacked" / "final.npz")
    assert sorted(want) == sorted(got)
    for key in want:
        np.testing.assert_allclose(got[key], want[key], rtol=1e-6, atol=1e-7, err_msg=key)


WAITING_WORKER = """
import os, sys, time
import mxnet as mx
kv = mx.kv.create("dist_sync")
kv.init(3, mx.nd.ones((2,)))
print("ready", flush=True)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.1)
"""


def test_the_same_bytes_run_their_code_on_mxnets_own_server_loop(tmp_path):
    """The control: MXNet's default server (``python -c 'import mxnet'``) unpickles them."""
    target, done = tmp_path / "created-by-the-attacker", tmp_path / "done"
    env = _ps_env(_free_port())
    procs = [subprocess.Popen([sys.executable, "-c", "import mxnet"], cwd=ROOT,
                              env={**env, "DMLC_ROLE": role}, start_new_session=True)
             for role in ("scheduler", "server")]
    worker = subprocess.Popen([sys.executable, "-c", WAITING_WORKER, str(done)], cwd=ROOT,
                              env={**env, "DMLC_ROLE": "worker"}, stdout=subprocess.PIPE,
                              text=True, start_new_session=True)
    try:
        assert worker.stdout.readline().strip() == "ready"
        for port in _wait_listening(procs[1].pid):
            send_command("127.0.0.1", port, 0, payload(str(target)))
        deadline = time.monotonic() + 20
        while not target.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert target.exists(), "MXNet's server did not run the payload: the attack is not real"
    finally:
        done.touch()
        for p in [worker, *procs]:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, 9)


def test_a_job_whose_processes_got_different_secrets_stops_naming_the_secret(tmp_path):
    port = _free_port()
    env = _ps_env(port, KVHYBRID_SECRET="a" * 64)
    nodes = [subprocess.Popen([sys.executable, "-m", "kvhybrid.kvstore.ps.node"], cwd=ROOT,
                              env={**env, "DMLC_ROLE": role}, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, start_new_session=True)
             for role in ("scheduler", "server")]
    worker_env = {**env, "DMLC_ROLE": "worker", "KVHYBRID_SECRET": "b" * 64,
                  "KVHYBRID_TIMEOUT": "20"}
    start = time.monotonic()
    try:
        r = subprocess.run(mpirun_command(1) + [sys.executable, str(WORKERS / "fault_train.py"),
                                                str(tmp_path), "5"],
                           cwd=ROOT, env=worker_env, capture_output=True, text=True, timeout=120)
        took = time.monotonic() - start
    finally:   # ps-lite's nodes wait for the worker that left: end them
        for p in nodes:
            os.killpg(p.pid, 9)
        out = nodes[1].communicate()[0]
    assert r.returncode != 0
    assert "KVHYBRID_SECRET" in r.stdout + r.stderr, (r.stdout + r.stderr)[-3000:]
    assert took < 60, f"took {took:.0f} s"
    assert "signed with another secret" in out, out[-2000:]


@pytest.mark.parametrize("value, says", [("", "is not set"), ("short", "at least 16")])
def test_a_server_without_a_usable_secret_exits_at_once_saying_how_to_fix_it(value, says):
    env = _ps_env(_free_port(), DMLC_ROLE="server", KVHYBRID_SECRET=value)
    r = subprocess.run([sys.executable, "-m", "kvhybrid.kvstore.ps.node"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and says in r.stderr and "KVHYBRID_SECRET" in r.stderr, r.stderr
