"""Checkpoints: train k steps, save, kill everything, resume in a new job, train to n — the
weights equal those of an uninterrupted n-step run.

Real launched jobs (scheduler, ps-lite servers, one mpirun per client group). The model
(tests/mpi/workers/sparse_models.py) has a SparseEmbedding and dense layers trained with SGD
and momentum, so the optimizer state matters: on the ranks, and on the servers for the keys
they update (dropping the servers' momentum moves the weights by 30-60 %).
"""
import numpy as np
import pytest

from tests.support.faultinject import LaunchedJob, kill_leftover_jobs
from tests.support.jobs import run_launcher

STEPS, SAVE_AT = 12, 6
SHAPES = {
    "pure_mpi": ["-n", 2],
    "one_group_and_a_server": ["-n", 2, "--servers", 1],           # table rows on the server
    "two_groups_two_servers": ["-n", 4, "--clients", 2, "--servers", 2],   # everything there
}


@pytest.fixture(autouse=True)
def _no_job_left_behind():
    yield
    kill_leftover_jobs()


def train(shape, out, *extra, env=None):
    r = run_launcher(SHAPES[shape], "fault_train.py", [out, STEPS, *extra], timeout=180, env=env)
    assert r.returncode == 0, r.output[-3000:]
    return r


def save_then_kill_everything(shape, out, env=None):
    job = LaunchedJob(SHAPES[shape], "fault_train.py",
                      [out, STEPS, "--save-at", SAVE_AT, "--sleep", 0.5], env=env)
    job.wait_for(rf"rank 0 checkpoint saved at step {SAVE_AT}")
    job.wait_for(rf"rank 0 step {SAVE_AT + 1}\b")      # training went on after the save
    job.kill_everything()
    assert job.leftovers() == []


@pytest.mark.parametrize("shape", list(SHAPES))
def test_resumed_run_equals_uninterrupted_run(shape, tmp_path):
    resume_equals_whole(shape, tmp_path, {"KVHYBRID_PARTITIONS": "2"} if "servers" in shape else None)


def test_resumed_run_with_packed_keys_equals_uninterrupted_run(tmp_path):
    """kvhybrid.DistributedTrainer across 2 groups: the dense keys travel packed (packs.py),
    the checkpoint reads them from the packs, the resumed job packs them again."""
    r = resume_equals_whole("two_groups_two_servers", tmp_path, {"KVHYBRID_TEST_FUSED": "1"})
    assert "rank 0 packed keys 4" in r.output, r.output[-3000:]


def resume_equals_whole(shape, tmp_path, env):
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    whole.mkdir(), cut.mkdir()
    train(shape, whole, env=env)
    save_then_kill_everything(shape, cut, env=env)
    assert not (cut / "final.npz").exists()
    r = train(shape, cut, "--resume", env=env)
    assert f"rank 0 resumed at step {SAVE_AT}" in r.output
    want, got = np.load(whole / "final.npz"), np.load(cut / "final.npz")
    assert sorted(want) == sorted(got)
    for name in want:
        error = np.abs(got[name] - want[name]).max() / np.abs(want[name]).max()
        assert error <= 1e-6, f"{name}: relative error {error:.2e}"
    return r


def test_a_checkpoint_resumes_only_a_job_of_its_shape(tmp_path):
    save_then_kill_everything("two_groups_two_servers", tmp_path,
                              env={"KVHYBRID_PARTITIONS": "2"})
    r = run_launcher(SHAPES["two_groups_two_servers"], "fault_train.py",
                     [tmp_path, STEPS, "--resume"], timeout=120, env={"KVHYBRID_PARTITIONS": "1"})
    assert r.returncode != 0
    assert "was saved with partitions=2, this job has 1: set KVHYBRID_PARTITIONS=2" in r.output
    r = run_launcher(["-n", 4, "--clients", 2, "--servers", 1], "fault_train.py",
                     [tmp_path, STEPS, "--resume"], timeout=120, env={"KVHYBRID_PARTITIONS": "2"})
    assert r.returncode != 0
    assert "was saved with servers=2, this job has 1: start as many servers" in r.output


def test_no_checkpoint_is_an_error_naming_the_folder(tmp_path):
    r = run_launcher(["-n", 2], "fault_train.py", [tmp_path, STEPS, "--resume"], timeout=120)
    assert r.returncode != 0
    assert f"no checkpoint at '{tmp_path}/ckpt'" in r.output
    assert "pass the folder save_checkpoint wrote" in r.output
