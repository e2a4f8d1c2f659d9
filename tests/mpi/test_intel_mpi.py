"""kvhybrid-launch with Intel MPI's mpirun (its Hydra, which takes MPICH's options): real
jobs, ranks that load Intel MPI's library through mpi4py, and real ps-lite servers.

Intel MPI comes from its pip wheel (``impi-rt``, the runtime), installed by
scripts/run_tests.sh under ``.venv/impi``; the tests put its ``bin`` first on PATH and its
``lib`` on LD_LIBRARY_PATH (mpi4py loads the first ``libmpi.so`` it finds), as a user of
that wheel would. The ssh transport's test is in test_ssh.py.
"""
import pytest

from tests.support.jobs import run_launcher
from tests.support.netns import TwoHosts, netns_available
from tests.support.other_mpis import (INTEL_MPI, assert_a_dead_worker_ends_the_job,
                                      assert_a_group_across_namespace_hosts_is_refused,
                                      assert_trains_as_one_process)

pytestmark = INTEL_MPI.needed


def test_the_ranks_run_intel_mpi(tmp_path):
    assert all(line.startswith("Intel(R) MPI Library 2021")
               for line in INTEL_MPI.libraries(tmp_path))


def test_groups_and_servers_with_intel_mpi_train_as_one_process(tmp_path):
    """Two groups of 2 with 2 servers, a SparseEmbedding and dense layers: the weights
    equal one process trained on every worker's batch; the command lines are Hydra's."""
    job = ["-n", 4, "--clients", 2, "--servers", 2]
    assert_trains_as_one_process(INTEL_MPI, tmp_path, job)
    plan = run_launcher([*job, "--dry-run"], "lifecycle.py", ["ok"], timeout=120,
                        env=INTEL_MPI.env())
    assert plan.returncode == 0, plan.output[-3000:]
    client1 = next(line for line in plan.output.splitlines() if "client 1:" in line)
    assert f"{INTEL_MPI.mpirun} -np 2 -prepend-rank" in client1


@pytest.mark.parametrize("shape", [["-n", 2], ["-n", 4, "--clients", 4, "--servers", 1]],
                         ids=["pure-mpi", "pure-ps"])
def test_the_other_shapes_with_intel_mpi_train_as_one_process(tmp_path, shape):
    """Pure MPI (one group, no server) and pure PS (a group per worker)."""
    assert_trains_as_one_process(INTEL_MPI, tmp_path, shape)


def test_a_dead_worker_ends_an_intel_mpi_job_naming_it(tmp_path):
    assert_a_dead_worker_ends_the_job(INTEL_MPI, tmp_path)


@pytest.mark.skipif(not netns_available(),
                    reason="needs root and Linux network namespaces (ip netns add)")
def test_intel_mpi_group_across_namespace_hosts_is_refused_before_anything_starts(tmp_path):
    assert_a_group_across_namespace_hosts_is_refused(INTEL_MPI, tmp_path,
                                                     "Intel MPI 2021.19.0")


@pytest.mark.skipif(not netns_available(),
                    reason="needs root and Linux network namespaces (ip netns add)")
def test_intel_mpi_groups_one_per_namespace_host_train_as_one_process(tmp_path):
    """A group on each of two namespace hosts (each group's mpirun runs inside its host),
    servers on both: the weights equal one process trained on every worker's batch."""
    with TwoHosts() as hosts:
        hostfile = tmp_path / "hosts"
        hostfile.write_text("".join(f"{name} slots=2\n" for name in hosts.names))
        r = assert_trains_as_one_process(INTEL_MPI, tmp_path, [
            "-n", 4, "--clients", 2, "--servers", 2, "--launcher", "netns", "--hostfile",
            hostfile])
        assert f"client 1      {hosts.names[1]}:2" in r.output
