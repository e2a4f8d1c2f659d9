"""kvhybrid-launch with MPICH's mpirun (Hydra) instead of Open MPI's: real jobs, ranks that
load MPICH's library through mpi4py, and real ps-lite servers.

MPICH comes from its pip wheel, installed by scripts/run_tests.sh under ``.venv/mpich``;
the tests put its ``bin`` first on PATH and its ``lib`` on LD_LIBRARY_PATH (mpi4py loads
the first ``libmpi.so`` it finds), as a user of that wheel would.
"""
import pytest

from tests.support.jobs import assert_every_worker_done, assert_printed_lines_whole, run_launcher
from tests.support.netns import netns_available
from tests.support.other_mpis import MPICH, assert_a_group_across_namespace_hosts_is_refused

pytestmark = MPICH.needed


def test_the_ranks_run_mpich(tmp_path):
    assert all(line.startswith("MPICH") for line in MPICH.libraries(tmp_path))


def test_pure_mpi_job_with_mpich():
    r = run_launcher(["-n", 3], "lifecycle.py", ["ok"], timeout=180, env=MPICH.env())
    assert_every_worker_done(r, 3)
    assert "-prepend-rank" in _dry_run(["-n", 3])   # MPICH's command line, not Open MPI's


def test_an_unbuffered_print_of_several_pieces_arrives_as_one_line_with_mpich():
    # Hydra's -prepend-rank puts "[r] " before each piece it reads of a rank's output
    r = run_launcher(["-n", 2], "print_lines.py", timeout=120,
                     env={**MPICH.env(), "PYTHONUNBUFFERED": "1"})
    assert_printed_lines_whole(r, "[{rank}] ")


def test_groups_and_servers_with_mpich_train_as_one_process(tmp_path):
    """Two MPICH groups of 2 with 2 servers, a SparseEmbedding and dense layers: the weights
    equal one process trained on every worker's batch."""
    from tests.mpi.test_sparse import PER_DEVICE, STEPS, assert_matches_single_process
    r = run_launcher(["-n", 4, "--clients", 2, "--servers", 2], "train_sparse.py",
                     [tmp_path, 1, STEPS, PER_DEVICE, "weight"], timeout=240, env=MPICH.env())
    assert r.returncode == 0, r.output[-4000:]
    assert_matches_single_process(tmp_path, "weight", 4, 1)


@pytest.mark.skipif(not netns_available(),
                    reason="needs root and Linux network namespaces (ip netns add)")
def test_mpich_group_across_namespace_hosts_is_refused_before_anything_starts(tmp_path):
    assert_a_group_across_namespace_hosts_is_refused(MPICH, tmp_path, "MPICH 5.0.2")


def _dry_run(args) -> str:
    r = run_launcher([*args, "--dry-run"], "lifecycle.py", ["ok"], timeout=120, env=MPICH.env())
    assert r.returncode == 0, r.output[-3000:]
    return r.output


def test_mpich_under_slurm_is_refused_before_anything_starts(monkeypatch):
    from kvhybrid.launch import cli
    from kvhybrid.launch.hosts import Host
    from kvhybrid.launch.mpirun import MpiUnsupported
    from kvhybrid.launch.sizing import JobSpec, plan_job
    monkeypatch.setenv("PATH", MPICH.env()["PATH"])
    plan = plan_job(JobSpec(4, 2, 2, (Host("node1", 2), Host("node2", 2)), "slurm"))
    with pytest.raises(MpiUnsupported, match=r"--launcher slurm is tested with Open MPI \(4 and 5\) only"):
        cli.Job(plan, ["python", "train.py"], [])
