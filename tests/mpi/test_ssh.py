"""``kvhybrid-launch --launcher ssh`` against real OpenSSH servers.

Two emulated machines (network namespaces) each run their own sshd, and the launcher runs
on a third, the login node (tests/support/ssh_hosts.py). The scheduler and servers are started
with ``ssh -tt``, and each client group's mpirun reaches its ranks through ssh as on a
cluster: nothing on this path uses the netns shortcut.
"""
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.support.bare_path import SLURM, path_without
from tests.support.jobs import (ROOT, assert_every_worker_done, job_env, launcher_command,
                                run_launcher)
from tests.support.netns import netns_available
from tests.support.other_mpis import INTEL_MPI, MPICH, OPEN_MPI_5
from tests.support.ssh_hosts import SshHosts, sshd_available

pytestmark = [
    pytest.mark.skipif(not netns_available(),
                       reason="needs root and Linux network namespaces (ip netns add)"),
    pytest.mark.skipif(not sshd_available(),
                       reason="needs OpenSSH's server: apt-get install openssh-server "
                              "(scripts/run_tests.sh installs it)"),
]

MAIN_EXAMPLE = ROOT / "examples" / "train_mlp.py"


@pytest.fixture(scope="module")
def machines(tmp_path_factory):
    with SshHosts(tmp_path_factory.mktemp("ssh")) as hosts:
        yield hosts


def _job(machines) -> list:
    a, b = machines.hosts
    return ["-n", 4, "--launcher", "ssh", "-H", f"{a}:2,{b}:2", "--clients", 2, "--servers", 2]


def _environ(pid: int) -> dict:
    try:
        raw = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
    except OSError:
        return {}
    return dict(x.decode(errors="replace").split("=", 1) for x in raw if b"=" in x)


def _left_behind(machines, seconds: float = 15) -> dict:
    """The processes still running on any machine once ``seconds`` have passed."""
    deadline = time.monotonic() + seconds
    while True:
        left = {name: pids for name, pids in machines.processes().items() if pids}
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def test_main_example_over_ssh_each_process_on_its_host(machines):
    a, b = machines.hosts
    r = run_launcher(_job(machines), MAIN_EXAMPLE, ["--epochs", 1, "--samples", 4096],
                     timeout=240, via=machines.on_login([]))
    assert r.returncode == 0, r.output[-4000:]
    assert "weights identical on the 2 ranks of this client group: yes" in r.output
    assert f"scheduler     {a}" in r.output
    assert f"started server 0 on {a}" in r.output and f"started server 1 on {b}" in r.output
    assert f"client 0      {a}:2" in r.output and f"client 1      {b}:2" in r.output
    assert not _left_behind(machines)
    # the commands: ssh for the scheduler and servers, plain mpirun -H (which uses ssh) for
    # the groups; no namespace shortcut
    plan = run_launcher([*_job(machines), "--dry-run"], MAIN_EXAMPLE, via=machines.on_login([]))
    assert plan.returncode == 0, plan.output
    lines = plan.output.splitlines()
    server1 = next(line for line in lines if "server 1:" in line)
    assert f"ssh -o BatchMode=yes -o ConnectTimeout=10 -tt {b}" in server1
    client1 = next(line for line in lines if "client 1:" in line)
    assert f"-H {b}:2" in client1
    assert "netns" not in plan.output


def test_a_job_over_ssh_with_a_remote_scheduler_needs_no_slurm(machines, tmp_path):
    """A cluster without Slurm: no srun on PATH. The scheduler runs on a host that is not
    the launching machine, so its free port is asked of that host (over ssh alone)."""
    a, _ = machines.hosts
    env = {"PATH": path_without(tmp_path / "bin-no-slurm", [SLURM])}
    r = run_launcher(_job(machines), "lifecycle.py", ["ok"], timeout=240, env=env,
                     via=machines.on_login([]))
    assert_every_worker_done(r, 4)
    assert f"scheduler     {a}" in r.output


def test_tune_over_ssh_runs_each_trial_on_both_machines_and_leaves_nothing_behind(machines,
                                                                                tmp_path):
    """--tune over ssh: every trial is the job on the two machines, stopped once rank 0's
    store wrote its steps (into the launcher's KVHYBRID_CACHE_DIR); the job then runs in the
    fastest shape, and no trial leaves a process on any machine."""
    from tests.mpi.test_shape_tune import assert_tuned_then_ran, dense_args
    a, b = machines.hosts
    env = {"KVHYBRID_CACHE_DIR": str(tmp_path / "cache")}
    r = run_launcher(["-n", 4, "--launcher", "ssh", "-H", f"{a}:2,{b}:2", "--tune",
                      "--tune-budget", 90], "train_budget.py", dense_args(tmp_path),
                     timeout=400, env=env, via=machines.on_login([]))
    assert r.returncode == 0, r.output[-4000:]
    assert "shape tuning: 4 workers on 2 host(s);" in r.output, r.output[-4000:]
    assert "of the 90 s budget" in r.output
    assert_tuned_then_ran(r.output, tmp_path / "cache", hosts=(a, b))
    assert (tmp_path / "loss.json").exists()
    assert not _left_behind(machines)


@MPICH.needed
def test_mpich_groups_over_ssh_train_as_one_process(machines, tmp_path):
    """The same two groups on two machines with MPICH's mpirun (Hydra reaches each group's
    host over ssh): the weights equal one process trained on every worker's batch."""
    from tests.mpi.test_sparse import PER_DEVICE, STEPS, assert_matches_single_process
    r = run_launcher(_job(machines), "train_sparse.py", [tmp_path, 1, STEPS, PER_DEVICE, "weight"],
                     timeout=240, via=machines.on_login([], named=True), env=MPICH.env())
    assert r.returncode == 0, r.output[-4000:]
    assert_matches_single_process(tmp_path, "weight", 4, 1)


@INTEL_MPI.needed
def test_intel_mpi_groups_over_ssh_train_as_one_process(machines, tmp_path):
    """The same two groups on two machines with Intel MPI's mpirun (its Hydra reaches each
    group's host over ssh, as MPICH's): the weights equal one process trained on every
    worker's batch."""
    from tests.mpi.test_sparse import PER_DEVICE, STEPS, assert_matches_single_process
    r = run_launcher(_job(machines), "train_sparse.py", [tmp_path, 1, STEPS, PER_DEVICE, "weight"],
                     timeout=240, via=machines.on_login([], named=True), env=INTEL_MPI.env())
    assert r.returncode == 0, r.output[-4000:]
    assert_matches_single_process(tmp_path, "weight", 4, 1)
    assert not _left_behind(machines)
    plan = run_launcher([*_job(machines), "--dry-run"], "lifecycle.py", ["ok"],
                        via=machines.on_login([], named=True), env=INTEL_MPI.env())
    client1 = next(line for line in plan.output.splitlines() if "client 1:" in line)
    assert f"{INTEL_MPI.mpirun} -np 2 -prepend-rank -f " in client1   # counts per host


@OPEN_MPI_5.needed
def test_open_mpi_5_groups_over_ssh_train_as_one_process(machines, tmp_path):
    """The same two groups on two machines with Open MPI 5's mpirun (PRRTE starts its
    daemon on each group's host over ssh): the weights equal one process trained on every
    worker's batch."""
    from tests.mpi.test_sparse import PER_DEVICE, STEPS, assert_matches_single_process
    r = run_launcher(_job(machines), "train_sparse.py", [tmp_path, 1, STEPS, PER_DEVICE, "weight"],
                     timeout=240, via=machines.on_login([]), env=OPEN_MPI_5.env())
    assert r.returncode == 0, r.output[-4000:]
    assert_matches_single_process(tmp_path, "weight", 4, 1)
    assert not _left_behind(machines)
    plan = run_launcher([*_job(machines), "--dry-run"], "lifecycle.py", ["ok"],
                        via=machines.on_login([]), env=OPEN_MPI_5.env())
    client1 = next(line for line in plan.output.splitlines() if "client 1:" in line)
    assert f"{OPEN_MPI_5.mpirun} -np 2" in client1 and "--prtemca" in client1


def test_training_over_ssh_equals_one_process_on_the_union_batch(machines, tmp_path):
    """Dense layers and a SparseEmbedding, two groups on two machines with a server each:
    the weights equal one process trained on every worker's batch."""
    from tests.mpi.test_sparse import PER_DEVICE, STEPS, assert_matches_single_process
    r = run_launcher(_job(machines), "train_sparse.py", [tmp_path, 1, STEPS, PER_DEVICE, "weight"],
                     timeout=240, via=machines.on_login([]))
    assert r.returncode == 0, r.output[-4000:]
    assert_matches_single_process(tmp_path, "weight", 4, 1)


def test_a_killed_remote_server_ends_the_job_naming_it(machines):
    a, b = machines.hosts
    cmd = machines.on_login(launcher_command(_job(machines), MAIN_EXAMPLE, ["--epochs", 1000]))
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=job_env(), cwd=ROOT, start_new_session=True)
    lines = []
    try:
        for line in proc.stdout:          # training is under way once an epoch ended
            lines.append(line)
            if "epoch 1/1000" in line:
                break
        else:
            raise AssertionError("the job ended before its first epoch:\n" + "".join(lines[-40:]))
        on = machines.processes()
        ranks = {h: [p for p in on[h] if "OMPI_COMM_WORLD_RANK" in _environ(p)]
                 for h in (machines.login, a, b)}
        # every group's ranks run on their own machine, none on the login node
        assert len(ranks[a]) == 2 and len(ranks[b]) == 2 and not ranks[machines.login], ranks
        server1 = [p for p in on[b] if _environ(p).get("DMLC_ROLE") == "server"]
        assert len(server1) == 1, on[b]
        # the job's secret reached the remote server in a file only its user reads, and is
        # on no command line of any machine
        secret_file = _environ(server1[0]).get("KVHYBRID_SECRET_FILE")
        assert secret_file and os.stat(secret_file).st_mode & 0o777 == 0o600
        secret = open(secret_file).read().strip()
        assert len(secret) == 64 and "KVHYBRID_SECRET" not in _environ(server1[0])
        for pids in on.values():
            for pid in pids:
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as f:
                        assert secret.encode() not in f.read(), pid
                except FileNotFoundError:   # ended since it was listed
                    pass
        killed = time.monotonic()
        os.kill(server1[0], signal.SIGKILL)
        out, _ = proc.communicate(timeout=60)
        seconds = time.monotonic() - killed
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    output = "".join(lines) + out
    assert proc.returncode != 0, output[-4000:]
    assert seconds < 30, f"the job took {seconds:.1f} s to end"
    failed = [line for line in output.splitlines() if "stopping the job" in line]
    assert failed and f"server 1 on {b} (pid" in failed[0], output[-4000:]
    print(f"killed server ended the job in {seconds:.1f} s: {failed[0]}")
    assert not os.path.exists(secret_file), "the launcher leaves no secret behind"
    left = _left_behind(machines)
    assert not left, {h: [open(f"/proc/{p}/cmdline").read() for p in pids
                          if os.path.exists(f"/proc/{p}")] for h, pids in left.items()}


@pytest.mark.parametrize("which", ["unknown name", "no machine at its address", "no sshd there"])
def test_an_unreachable_host_fails_fast_with_one_line_naming_it(machines, which):
    a = machines.hosts[0]
    bad = {"unknown name": "nosuchhost", "no machine at its address": machines.ghost,
           "no sshd there": machines.login}[which]
    start = time.monotonic()
    r = subprocess.run(machines.on_login([sys.executable, "-m", "kvhybrid.launch.cli",
                                          "--launcher", "ssh", "-H", f"{a}:2,{bad}:2",
                                          "--clients", "2", "--servers", "2", "-n", "4",
                                          "python", str(MAIN_EXAMPLE)]),
                       capture_output=True, text=True, timeout=120, env=job_env(), cwd=ROOT)
    seconds = time.monotonic() - start
    assert r.returncode == 2, r.stdout + r.stderr
    errors = [line for line in r.stderr.splitlines() if "error" in line]
    assert len(errors) == 1 and f"host {bad!r} cannot be reached over ssh" in errors[0], r.stderr
    assert "started" not in r.stderr + r.stdout
    assert seconds < 25, f"{seconds:.1f} s to fail"
    assert not _left_behind(machines, seconds=1)
