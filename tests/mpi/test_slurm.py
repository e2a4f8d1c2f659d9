"""``kvhybrid-launch --launcher slurm`` on a real Slurm (slurm-wlm 22.05, munge).

slurmctld runs on an emulated login node and a slurmd on each of two emulated compute
nodes (tests/support/slurm_cluster.py); jobs are submitted from the login node with salloc and
sbatch as a user would, and the launcher takes its nodes and tasks from the allocation.
"""
import subprocess
import sys

import pytest

from tests.support.jobs import ROOT, WORKERS, job_env
from tests.support.netns import netns_available
from tests.support.other_mpis import OPEN_MPI_5
from tests.support.slurm_cluster import SlurmCluster, slurm_available

pytestmark = [
    pytest.mark.skipif(not netns_available(),
                       reason="needs root and Linux network namespaces (ip netns add)"),
    pytest.mark.skipif(not slurm_available(),
                       reason="needs Slurm and munge: apt-get install slurm-wlm "
                              "(scripts/run_tests.sh installs it)"),
]


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    with SlurmCluster(tmp_path_factory.mktemp("slurm")) as cluster:
        yield cluster


def _run(slurm, cmd, timeout=300, extra_env=None):
    env = {k: v for k, v in job_env({**slurm.env, **(extra_env or {})}).items()
           if not k.startswith("SLURM_JOB")}
    return subprocess.run(slurm.on_login(cmd), capture_output=True, text=True, timeout=timeout,
                          env=env, cwd=ROOT)


def test_salloc_job_equals_one_process_on_the_union_batch(slurm, tmp_path):
    """Inside `salloc -N2 --ntasks-per-node=2`, with no -n and no -H: 4 workers in two groups,
    one per node, a server on each node; weights equal one process trained on every batch."""
    from tests.mpi.test_sparse import PER_DEVICE, STEPS, assert_matches_single_process
    a, b = slurm.nodes
    r = _run(slurm, ["salloc", "--quiet", "-N2", "--ntasks-per-node=2", sys.executable, "-m",
                     "kvhybrid.launch.cli", "--launcher", "slurm", "--clients", "2", "--servers",
                     "2", "python", WORKERS / "train_sparse.py", tmp_path, 1, STEPS, PER_DEVICE,
                     "weight"])
    output = r.stdout + r.stderr
    assert r.returncode == 0, output[-4000:]
    assert "4 workers = 2 client group(s) x 2 workers" in output
    assert f"scheduler     {a}" in output and f"started server 1 on {b}" in output
    assert f"client 0      {a}:2" in output and f"client 1      {b}:2" in output
    assert_matches_single_process(tmp_path, "weight", 4, 1)


@OPEN_MPI_5.needed
def test_salloc_job_with_open_mpi_5_equals_one_process_on_the_union_batch(slurm, tmp_path):
    """The same allocation with Open MPI 5's mpirun first on PATH: PRRTE starts its daemons
    with srun (sharing the nodes' CPUs with the servers' steps, by --prtemca)."""
    from tests.mpi.test_sparse import PER_DEVICE, STEPS, assert_matches_single_process
    r = _run(slurm, ["salloc", "--quiet", "-N2", "--ntasks-per-node=2", sys.executable, "-m",
                     "kvhybrid.launch.cli", "--launcher", "slurm", "--clients", "2", "--servers",
                     "2", "python", WORKERS / "train_sparse.py", tmp_path, 1, STEPS, PER_DEVICE,
                     "weight"], extra_env=OPEN_MPI_5.env())
    output = r.stdout + r.stderr
    assert r.returncode == 0, output[-4000:]
    assert_matches_single_process(tmp_path, "weight", 4, 1)
    plan = _run(slurm, ["salloc", "--quiet", "-N2", "--ntasks-per-node=2", sys.executable, "-m",
                        "kvhybrid.launch.cli", "--launcher", "slurm", "--clients", "2",
                        "--servers", "2", "--dry-run", "python", WORKERS / "lifecycle.py"],
                extra_env=OPEN_MPI_5.env())
    client1 = next(line for line in plan.stdout.splitlines() if "client 1:" in line)
    assert f"{OPEN_MPI_5.mpirun} -np 2" in client1, plan.stdout + plan.stderr


def test_tune_inside_salloc_tries_shapes_on_the_allocation_and_runs_in_the_pick(slurm,
                                                                               tmp_path):
    """--tune in an allocation: the trials are the job on its two nodes through srun, each
    stopped once rank 0's store wrote its steps; the job then runs in the fastest shape."""
    from tests.mpi.test_shape_tune import assert_tuned_then_ran, dense_args
    a, b = slurm.nodes
    r = _run(slurm, ["salloc", "--quiet", "-N2", "--ntasks-per-node=2", sys.executable, "-m",
                     "kvhybrid.launch.cli", "--launcher", "slurm", "--tune", "--tune-budget",
                     "90", "python", WORKERS / "train_budget.py",
                     *map(str, dense_args(tmp_path))],
             timeout=400, extra_env={"KVHYBRID_CACHE_DIR": str(tmp_path / "cache")})
    output = r.stdout + r.stderr
    assert r.returncode == 0, output[-4000:]
    assert "shape tuning: 4 workers on 2 host(s);" in output, output[-4000:]
    assert_tuned_then_ran(output, tmp_path / "cache", hosts=(a, b))
    assert (tmp_path / "loss.json").exists()


def test_the_documented_sbatch_script_trains_the_main_example(slurm, tmp_path):
    out = tmp_path / "job.out"
    r = _run(slurm, ["sbatch", "--wait", f"--output={out}", "examples/slurm_job.sbatch",
                     "--epochs", "1", "--samples", "4096"])
    log = out.read_text() if out.exists() else "(no output file)"
    assert r.returncode == 0, r.stdout + r.stderr + log[-4000:]
    assert "weights identical on the 2 ranks of this client group: yes" in log, log[-4000:]
    assert f"started server 1 on {slurm.nodes[1]}" in log
