"""Client groups that die in asynchronous and elastic jobs: the others train on, the launcher
restarts the group (``--restarts``), it rejoins ps-lite in its old place, takes the servers'
current values (the center variables) and training finishes.

Real launched jobs: 2 client groups of 2 workers, 1 ps-lite server, the digits task of
``python -m experiments`` with mpi-ESGD.
"""
import random
import re
import subprocess

import pytest

from tests.support.faultinject import LAUNCH, LaunchedJob, kill_leftover_jobs
from tests.support.jobs import ROOT, job_env

JOB = ["-n", 4, "--clients", 2, "--servers", 1]
WORKER = "experiments.worker"


@pytest.fixture(autouse=True)
def _no_job_left_behind():
    yield
    kill_leftover_jobs()


def digits(out, store="hybrid-mpi-elastic", epochs=40):
    return ["--task", "digits", "--store", store, "--out", out, "--epochs", epochs,
            "--log-steps", "--step-sleep", 0.01]


def accuracies(output: str):
    return [float(a) for a in re.findall(r"rank \d finished, validation accuracy ([\d.]+)",
                                         output)]


def test_elastic_group_killed_at_a_random_step_rejoins_and_reaches_the_same_accuracy(tmp_path):
    (tmp_path / "whole").mkdir(), (tmp_path / "cut").mkdir()
    whole = LaunchedJob(JOB, WORKER, digits(tmp_path / "whole"))
    clean = whole.finish(timeout=200)
    assert clean.returncode == 0, clean.output[-3000:]

    # worker 2 (client group 1) dies at a random step of the surviving group 0, early enough
    # that group 0 still has seconds of training left while group 1 is down (groups run at
    # their own pace)
    step = random.randint(50, 150)
    job = LaunchedJob(JOB + ["--restarts", 1], WORKER, digits(tmp_path / "cut"))
    job.inject("kill", "worker", 2, at_step=step, step_client=0)
    result = job.finish(timeout=200)
    out = result.output
    assert result.returncode == 0, f"killed at step {step}:\n{out[-3000:]}"
    died = out.index("the others go on, and it restarts in 5 s")
    back = out.index("restarted client")
    assert "KVHYBRID_RESTART=1" in out[back:back + 200]
    assert "client 1 on localhost" in out[died - 200:died]
    steps_meanwhile = re.findall(r"\[client 0\] \S+rank \d step", out[died:back])
    assert len(steps_meanwhile) > 20, "the other group did not train on during the outage"
    got, want = accuracies(out), accuracies(clean.output)
    assert len(got) == len(want) == 4, out[-3000:]
    assert abs(sum(got) / 4 - sum(want) / 4) <= 0.01, \
        f"killed at step {step}: accuracy {got} against {want} without the fault"


def test_a_synchronous_job_refuses_a_restarted_group_and_stops_when_restarts_run_out(tmp_path):
    job = LaunchedJob(JOB + ["--restarts", 1], "fault_train.py", [tmp_path, 1000, "--sleep", 0.05])
    job.inject("kill", "worker", 3, at_step=5, step_rank=3)
    result = job.finish(timeout=90)
    assert result.returncode != 0
    assert "restarts in 5 s (restart 1, 0 more allowed)" in result.output
    assert "the synchronous hybrid-mpi store cannot take it back" in result.output
    assert "Resume it from a checkpoint (kvhybrid.load_checkpoint)" in result.output
    assert "stopping the job" in result.output
    assert job.leftovers() == []


def test_restarts_without_servers_is_refused_before_starting_anything():
    r = subprocess.run(LAUNCH + ["-n", "2", "--restarts", "1", "python", "-c", "pass"],
                       capture_output=True, text=True, timeout=60, env=job_env(), cwd=ROOT)
    assert r.returncode == 2
    assert "--restarts restarts a failed client group" in r.stderr
    assert "add --servers, or drop --restarts" in r.stderr


def test_more_than_one_restart_is_refused_naming_ps_lites_limit():
    r = subprocess.run(LAUNCH + ["-n", "4", "--clients", "2", "--servers", "1", "--restarts", "2",
                                 "python", "-c", "pass"],
                       capture_output=True, text=True, timeout=60, env=job_env(), cwd=ROOT)
    assert r.returncode == 2
    assert "--restarts must be 0 or 1, got 2: ps-lite (MXNet 1.9.1) takes back one" in r.stderr
