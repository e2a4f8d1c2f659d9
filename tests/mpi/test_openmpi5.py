"""kvhybrid-launch with Open MPI 5's mpirun (PRRTE) instead of Open MPI 4's (ORTE): real
jobs, ranks that load Open MPI 5's library through mpi4py, and real ps-lite servers.

Open MPI 5 comes from its pip wheel, installed by scripts/run_tests.sh under
``.venv/ompi5``; the tests put its ``bin`` first on PATH and its ``lib`` on
LD_LIBRARY_PATH (mpi4py loads the first ``libmpi.so`` it finds), as a user of that wheel
would. The ssh transport's test is in test_ssh.py, beside Open MPI 4's and MPICH's.
"""
import pytest

from tests.support.bare_path import SLURM, SSH, path_without
from tests.support.jobs import run_launcher
from tests.support.netns import netns_available
from tests.support.other_mpis import (OPEN_MPI_5, assert_a_dead_worker_ends_the_job,
                                      assert_trains_as_one_process)

pytestmark = OPEN_MPI_5.needed


def test_the_ranks_run_open_mpi_5(tmp_path):
    assert all(line.startswith("Open MPI v5.")
               for line in OPEN_MPI_5.libraries(tmp_path, "--allow-run-as-root"))


def test_groups_and_servers_with_open_mpi_5_train_as_one_process(tmp_path):
    """Two groups of 2 with 2 servers on one machine, a SparseEmbedding and dense layers:
    the weights equal one process trained on every worker's batch; the command lines are
    PRRTE's (its session directory by --prtemca, no ORTE launcher)."""
    job = ["-n", 4, "--clients", 2, "--servers", 2]
    r = assert_trains_as_one_process(OPEN_MPI_5, tmp_path, job)
    assert "Error" not in r.output, r.output[-4000:]   # (no rank's UCX complaint)
    plan = run_launcher([*job, "--dry-run"], "lifecycle.py", ["ok"], timeout=120,
                        env=OPEN_MPI_5.env())
    assert plan.returncode == 0, plan.output[-3000:]
    client1 = next(line for line in plan.output.splitlines() if "client 1:" in line)
    assert f"{OPEN_MPI_5.mpirun} -np 2" in client1
    assert "--prtemca prte_tmpdir_base" in client1 and "orte_" not in client1
    assert "plm" not in client1


@pytest.mark.parametrize("shape", [["-n", 2], ["-n", 4, "--clients", 4, "--servers", 1]],
                         ids=["pure-mpi", "pure-ps"])
def test_the_other_shapes_with_open_mpi_5_train_as_one_process(tmp_path, shape):
    """Pure MPI (one group, no server) and pure PS (a group per worker)."""
    assert_trains_as_one_process(OPEN_MPI_5, tmp_path, shape)


@pytest.mark.skipif(not netns_available(),
                    reason="needs root and Linux network namespaces (ip netns add)")
def test_a_group_spanning_emulated_hosts_with_open_mpi_5_and_no_ssh_trains_as_one_process(
        tmp_path):
    """One group across two namespace hosts (PRRTE starts its daemon on the second through
    the launcher's rsh agent), a server on each, on a machine with neither ssh nor srun:
    the weights equal one process trained on every worker's batch."""
    from benchmarks.cluster import EmulatedCluster
    bare = path_without(tmp_path / "bin", [SSH, SLURM])
    with EmulatedCluster(hosts=2, rate="1gbit") as cluster:
        hostfile = cluster.hostfile(tmp_path / "hosts", slots=2)
        r = assert_trains_as_one_process(
            OPEN_MPI_5, tmp_path, ["-n", 4, "--clients", 1, "--servers", 2, "--launcher",
                                   "netns", "--hostfile", hostfile], env=OPEN_MPI_5.env(bare))
        assert f"client 0      {cluster.names[0]}:2,{cluster.names[1]}:2" in r.output
        plan = run_launcher(["-n", 4, "--clients", 1, "--servers", 2, "--launcher", "netns",
                             "--hostfile", hostfile, "--dry-run"], "lifecycle.py", ["ok"],
                            timeout=120, env=OPEN_MPI_5.env(bare))
    assert "--prtemca plm_ssh_agent" in plan.output and "--prtemca oob_tcp_if_exclude lo" \
        in plan.output, plan.output[-3000:]


def test_a_dead_worker_ends_an_open_mpi_5_job_naming_it(tmp_path):
    out = assert_a_dead_worker_ends_the_job(OPEN_MPI_5, tmp_path)
    assert "rank 1 with PID" in out or "rank 1 (pid" in out        # rank 1 of group 1
