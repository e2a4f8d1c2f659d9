"""kvhybrid-launch with MPICH's mpirun (Hydra) instead of Open MPI's: real jobs, ranks that
load MPICH's library through mpi4py, and real ps-lite servers.

MPICH comes from its pip wheel, installed by scripts/run_tests.sh under ``.venv/mpich``;
the tests put its ``bin`` first on PATH and its ``lib`` on LD_LIBRARY_PATH (mpi4py loads
the first ``libmpi.so`` it finds), as a user of that wheel would.
"""
import os
import subprocess
import sys

import pytest

from tests.support.jobs import ROOT, assert_every_worker_done, run_launcher
from tests.support.netns import TwoHosts, netns_available

MPICH = ROOT / ".venv" / "mpich"

needs_mpich = pytest.mark.skipif(
    not (MPICH / "bin" / "mpirun").exists(),
    reason=f"MPICH is not installed under {MPICH}: scripts/run_tests.sh installs it "
           "(pip install --prefix .venv/mpich mpich==5.0.2)")
pytestmark = needs_mpich


def mpich_env() -> dict:
    return {"PATH": f"{MPICH / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
            "LD_LIBRARY_PATH": f"{MPICH / 'lib'}{os.pathsep}"
                               f"{os.environ.get('LD_LIBRARY_PATH', '')}"}


def test_the_ranks_run_mpich():
    r = subprocess.run([str(MPICH / "bin" / "mpirun"), "-np", "2", sys.executable, "-c",
                        "from mpi4py import MPI; print(MPI.Get_library_version().split()[0])"],
                       capture_output=True, text=True, timeout=120,
                       env={**os.environ, **mpich_env()})
    assert r.returncode == 0, r.stdout + r.stderr
    # (counted: Hydra may forward the two ranks' lines unseparated, "MPICHMPICH")
    assert r.stdout.count("MPICH") == 2 and "Open MPI" not in r.stdout, r.stdout + r.stderr


def test_pure_mpi_job_with_mpich():
    r = run_launcher(["-n", 3], "lifecycle.py", ["ok"], timeout=180, env=mpich_env())
    assert_every_worker_done(r, 3)
    assert "-prepend-rank" in _dry_run(["-n", 3])   # MPICH's command line, not Open MPI's


def test_groups_and_servers_with_mpich_train_as_one_process(tmp_path):
    """Two MPICH groups of 2 with 2 servers, a SparseEmbedding and dense layers: the weights
    equal one process trained on every worker's batch."""
    from tests.mpi.test_sparse import PER_DEVICE, STEPS, assert_matches_single_process
    r = run_launcher(["-n", 4, "--clients", 2, "--servers", 2], "train_sparse.py",
                     [tmp_path, 1, STEPS, PER_DEVICE, "weight"], timeout=240, env=mpich_env())
    assert r.returncode == 0, r.output[-4000:]
    assert_matches_single_process(tmp_path, "weight", 4, 1)


@pytest.mark.skipif(not netns_available(),
                    reason="needs root and Linux network namespaces (ip netns add)")
def test_mpich_group_across_namespace_hosts_is_refused_before_anything_starts(tmp_path):
    with TwoHosts() as hosts:
        hostfile = tmp_path / "hosts"
        hostfile.write_text("".join(f"{name} slots=2\n" for name in hosts.names))
        r = run_launcher(["-n", 4, "--servers", 1, "--launcher", "netns", "--hostfile",
                          hostfile], "lifecycle.py", ["ok"], timeout=120, env=mpich_env())
    assert r.returncode == 2, r.output[-3000:]
    assert "is MPICH 5.0.2: --launcher netns runs a client group across namespaces with " \
           "Open MPI's rsh agent only" in r.output
    assert "started" not in r.output


def _dry_run(args) -> str:
    r = run_launcher([*args, "--dry-run"], "lifecycle.py", ["ok"], timeout=120, env=mpich_env())
    assert r.returncode == 0, r.output[-3000:]
    return r.output


def test_mpich_under_slurm_is_refused_before_anything_starts(monkeypatch):
    from kvhybrid.launch import cli
    from kvhybrid.launch.hosts import Host
    from kvhybrid.launch.mpirun import MpiUnsupported
    from kvhybrid.launch.sizing import JobSpec, plan_job
    monkeypatch.setenv("PATH", mpich_env()["PATH"])
    plan = plan_job(JobSpec(4, 2, 2, (Host("node1", 2), Host("node2", 2)), "slurm"))
    with pytest.raises(MpiUnsupported, match="--launcher slurm is tested with Open MPI only"):
        cli.Job(plan, ["python", "train.py"], [])
