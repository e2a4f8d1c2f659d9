"""kvhybrid-launch: the mpirun command it builds, its errors, and a real job through it."""
import subprocess
import sys

import pytest

from mpirun import ROOT, WORKERS, job_env

from kvhybrid.launch.mpirun import MpiJob, build_command

LAUNCH = [sys.executable, "-m", "kvhybrid.launch.cli"]


def launch(*args, timeout=120):
    return subprocess.run(LAUNCH + list(args), capture_output=True, text=True, timeout=timeout,
                          env=job_env(), cwd=ROOT)


def test_openmpi_command_forwards_settings_and_oversubscribes():
    job = MpiJob(64, ["python", "train.py"])
    cmd = build_command(job, "mpirun", "openmpi", {"KVHYBRID_TIMEOUT": "9", "HOME": "/root",
                                                   "GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"})
    assert cmd[:3] == ["mpirun", "-np", "64"]
    assert "--oversubscribe" in cmd and "--tag-output" in cmd
    assert cmd[cmd.index("KVHYBRID_TIMEOUT") - 1] == "-x"
    assert "GLIBC_TUNABLES" in cmd and "HOME" not in cmd
    assert cmd[-2:] == ["python", "train.py"]


def test_mpich_command_uses_hosts_and_genvlist():
    job = MpiJob(4, ["python", "t.py"], hosts="a:2,b:2")
    cmd = build_command(job, "mpiexec", "mpich", {"KVHYBRID_TIMEOUT": "9"})
    assert cmd[cmd.index("-hosts") + 1] == "a:2,b:2"
    assert cmd[cmd.index("-genvlist") + 1] == "KVHYBRID_TIMEOUT"


@pytest.mark.parametrize("args,message", [
    (["-n", "0", "python", "x.py"], "-n must be at least 1"),
    (["-n", "2", "python", "no/such/script.py"], "script 'no/such/script.py' not found"),
    (["-n", "2"], "missing the command to run"),
    (["-n", "2", "--servers", "2", "python", "examples/train_mlp.py"], "only --servers 0"),
    (["-n", "2", "--hostfile", "/no/such/hostfile", "python", "examples/train_mlp.py"], "no such file"),
])
def test_bad_arguments_exit_2_with_one_line(args, message):
    r = launch(*args)
    assert r.returncode == 2
    assert message in r.stderr
    assert "running:" not in r.stderr  # nothing was started


def test_runs_a_job_and_passes_settings_to_every_rank():
    r = launch("-n", "3", "python", str(WORKERS / "create_store.py"))
    assert r.returncode == 0, r.stdout + r.stderr
    for rank in range(3):
        assert f"store rank={rank} num_workers=3" in r.stdout


def test_failing_job_exit_code_is_passed_on():
    r = launch("-n", "2", "python", str(WORKERS / "faults.py"), "raise", "1")
    assert r.returncode != 0
    assert "rank 1 raised RuntimeError" in r.stdout + r.stderr
