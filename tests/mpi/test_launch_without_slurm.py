"""kvhybrid-launch on a machine without Slurm, and without ssh where the launcher does not
need it: PATH holds neither tool here, as on most users' machines (CI's machine has both,
installed by scripts/run_tests.sh for the Slurm and ssh tests)."""
import os

import pytest

from tests.support.bare_path import SLURM, SSH, path_without
from tests.support.jobs import assert_every_worker_done, run_launcher
from tests.support.netns import TwoHosts, netns_available

needs_netns = pytest.mark.skipif(not netns_available(),
                                 reason="needs root and Linux network namespaces (ip netns add)")

HYBRID = ["-n", 4, "--clients", 2, "--servers", 2]


@pytest.fixture
def no_slurm(tmp_path) -> dict:
    return {"PATH": path_without(tmp_path / "bin-no-slurm", [SLURM])}


@pytest.fixture
def no_slurm_no_ssh(tmp_path) -> dict:
    return {"PATH": path_without(tmp_path / "bin-bare", [SLURM, SSH])}


def _dry_run(args, env) -> str:
    r = run_launcher([*args, "--dry-run"], "lifecycle.py", ["ok"], timeout=120, env=env)
    assert r.returncode == 0, r.output[-3000:]
    return r.output


def _runs(out: str, tool: str) -> bool:
    """Whether a printed command line runs ``tool`` (a word of it, with or without a path)."""
    return tool in {os.path.basename(word.strip("'\"")) for word in out.split()}


def test_the_bare_path_really_lacks_srun_and_ssh(no_slurm_no_ssh):
    import shutil
    path = no_slurm_no_ssh["PATH"]
    assert shutil.which("srun", path=path) is None and shutil.which("ssh", path=path) is None
    assert shutil.which("mpirun", path=path) and shutil.which("ip", path=path)


def test_local_dry_run_and_job_need_neither_srun_nor_ssh(no_slurm_no_ssh):
    """Open MPI 4 ends at once without ssh or rsh on PATH unless told that every rank is
    local (its isolated launcher), even for a one-machine job."""
    out = _dry_run(HYBRID, no_slurm_no_ssh)
    assert "DMLC_ROLE=scheduler" in out and out.count("mpirun -np 2") == 2
    assert not _runs(out, "srun") and not _runs(out, "ssh")
    r = run_launcher(HYBRID, "lifecycle.py", ["ok"], timeout=180, env=no_slurm_no_ssh)
    assert_every_worker_done(r, 4)


def test_ssh_dry_run_needs_no_srun(no_slurm):
    # addresses that resolve but are not this machine's names: the commands go over ssh
    out = _dry_run([*HYBRID, "--launcher", "ssh", "-H", "127.0.0.2:2,127.0.0.3:2"], no_slurm)
    assert "ssh -o BatchMode=yes -o ConnectTimeout=10 -tt 127.0.0.3" in out
    assert "-H 127.0.0.3:2" in out and not _runs(out, "srun")


def test_slurm_launcher_without_srun_is_refused_naming_srun(no_slurm):
    env = {**no_slurm, "SLURM_JOB_NODELIST": "node1", "SLURM_TASKS_PER_NODE": "4"}
    for extra in ([], ["--dry-run"]):
        r = run_launcher([*HYBRID, "--launcher", "slurm", *extra], "lifecycle.py", ["ok"],
                         timeout=120, env=env)
        assert r.returncode == 2, r.output[-3000:]
        assert "--launcher slurm needs srun on PATH" in r.output
        assert "started" not in r.output


@needs_netns
def test_netns_dry_run_and_job_need_neither_srun_nor_ssh(no_slurm_no_ssh, tmp_path):
    """Two groups and two servers on two namespace hosts; the scheduler's host is not the
    launching machine, so its free port is asked of that host (through ``ip netns`` alone)."""
    with TwoHosts() as hosts:
        hostfile = tmp_path / "hosts"
        hostfile.write_text("".join(f"{name} slots=2\n" for name in hosts.names))
        args = [*HYBRID, "--launcher", "netns", "--hostfile", hostfile]
        out = _dry_run(args, no_slurm_no_ssh)
        assert f"ip netns exec {hosts.names[1]}" in out
        assert not _runs(out, "srun") and not _runs(out, "ssh")
        r = run_launcher(args, "lifecycle.py", ["ok"], timeout=180, env=no_slurm_no_ssh)
    assert_every_worker_done(r, 4)
    assert f"scheduler     {hosts.names[0]}" in r.output


@needs_netns
def test_a_group_of_two_emulated_hosts_by_four_workers_runs_end_to_end(no_slurm_no_ssh, tmp_path):
    """The benchmarks' 2 × 4 shape: one group of 8 ranks, 4 on each host (mpirun reaches the
    second namespace as a remote host), a server on each host, each host's first rank a
    row master; on a PATH without srun or ssh."""
    from benchmarks.cluster import EmulatedCluster
    with EmulatedCluster(hosts=2, rate="1gbit") as cluster:
        hostfile = cluster.hostfile(tmp_path / "hosts", slots=4)
        r = run_launcher(["-n", 8, "--servers", 2, "--launcher", "netns", "--hostfile",
                          hostfile], "lifecycle.py", ["ok"], timeout=300, env=no_slurm_no_ssh)
    assert_every_worker_done(r, 8)
    assert f"client 0      {cluster.names[0]}:4,{cluster.names[1]}:4" in r.output
    assert "each host's first rank is a ps-lite worker (2 in all)" in r.output
