"""``--launcher slurm`` without a cluster: Slurm's variables read, and the commands built,
against environments recorded from salloc and sbatch (Slurm 22.05). The real cluster is
tested in test_slurm.py."""
import os
import subprocess
import sys

import pytest

from kvhybrid.launch.hosts import Host, HostError
from kvhybrid.launch.slurm import (allocation_hosts, check_hosts_in_allocation, expand_counts,
                                   expand_nodelist)
from tests.support.jobs import ROOT, job_env

#: `env | grep ^SLURM_` in `salloc -N2 --ntasks-per-node=2` (test_slurm.py's cluster)
SALLOC = {"SLURM_JOB_NODELIST": "p[2-3]", "SLURM_JOB_NUM_NODES": "2", "SLURM_NTASKS": "4",
          "SLURM_NTASKS_PER_NODE": "2", "SLURM_TASKS_PER_NODE": "2(x2)",
          "SLURM_JOB_CPUS_PER_NODE": "2(x2)", "SLURM_JOB_ID": "1"}
#: sbatch -n 5 on nodes of unequal size: no SLURM_NTASKS_PER_NODE, uneven tasks
SBATCH_UNEVEN = {"SLURM_JOB_NODELIST": "gpu[08-10],cpu1", "SLURM_TASKS_PER_NODE": "2,1(x2),1",
                 "SLURM_NTASKS": "5", "SLURM_JOB_ID": "7"}


@pytest.mark.parametrize("text,nodes", [
    ("p[2-3]", ["p2", "p3"]),
    ("node1", ["node1"]),
    ("gpu[08-10],cpu1", ["gpu08", "gpu09", "gpu10", "cpu1"]),
    ("a[1,3-4]-ib,b", ["a1-ib", "a3-ib", "a4-ib", "b"]),
    ("rack[1-2]-n[01-02]", ["rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02"]),
])
def test_node_lists_expand_as_slurm_writes_them(text, nodes):
    assert expand_nodelist(text) == nodes


def test_task_counts_expand():
    assert expand_counts("2(x3),1") == [2, 2, 2, 1]
    with pytest.raises(HostError, match="2\\(x3\\),1"):
        expand_counts("two")


def test_allocation_hosts_from_salloc_and_sbatch():
    assert allocation_hosts(SALLOC) == [Host("p2", 2), Host("p3", 2)]
    assert allocation_hosts(SBATCH_UNEVEN) == [Host("gpu08", 2), Host("gpu09", 1),
                                               Host("gpu10", 1), Host("cpu1", 1)]
    with pytest.raises(HostError, match="start it from salloc or an sbatch script"):
        allocation_hosts({})
    with pytest.raises(HostError, match="2 counts for the 4 nodes"):
        allocation_hosts({**SBATCH_UNEVEN, "SLURM_TASKS_PER_NODE": "2,3"})


def test_named_hosts_must_be_nodes_of_the_allocation_with_their_slots():
    check_hosts_in_allocation([Host("p3", 2)], SALLOC)
    with pytest.raises(HostError, match="'p9' is not a node of this Slurm allocation"):
        check_hosts_in_allocation([Host("p9", 1)], SALLOC)
    with pytest.raises(HostError, match="given 3 slots, and the allocation has 2"):
        check_hosts_in_allocation([Host("p2", 3)], SALLOC)


def _dry_run(tmp_path, env, *args):
    """The launcher's dry run inside a recorded allocation, with an srun that records its
    arguments instead of reaching a cluster (it is not called by a dry run)."""
    fake = tmp_path / "bin"
    fake.mkdir(exist_ok=True)
    (fake / "srun").write_text("#!/bin/sh\n[ \"$1\" = --help ] && echo '--overlap' && exit 0\n"
                               "echo \"srun $*\" >> " + str(tmp_path / "calls") + "\nexit 1\n")
    (fake / "srun").chmod(0o755)
    full = {k: v for k, v in job_env().items() if not k.startswith("SLURM_")}  # not ours
    full.update({**env, "PATH": f"{fake}{os.pathsep}{os.environ['PATH']}"})
    return subprocess.run([sys.executable, "-m", "kvhybrid.launch.cli", "--launcher", "slurm",
                           *args, "--dry-run", "python", "examples/train_mlp.py"],
                          capture_output=True, text=True, timeout=120, env=full, cwd=ROOT)


def test_the_job_is_sized_from_the_allocation(tmp_path):
    r = _dry_run(tmp_path, {**SALLOC, "SLURM_JOB_NODELIST": "localhost,127.0.0.1"},
                 "--clients", "2", "--servers", "2")
    assert r.returncode == 0, r.stderr
    assert "4 workers = 2 client group(s) x 2 workers" in r.stdout   # -n from the allocation
    lines = r.stdout.splitlines()
    server1 = next(line for line in lines if "server 1:" in line)
    assert "srun --overlap --nodes=1 --ntasks=1 --nodelist=127.0.0.1 --kill-on-bad-exit=1" in server1
    client1 = next(line for line in lines if "client 1:" in line)
    assert "-H 127.0.0.1:2" in client1 and "plm_slurm_args --overlap" in client1
    assert not (tmp_path / "calls").exists()     # a dry run starts nothing


@pytest.mark.parametrize("env,args,message", [
    ({}, ["-n", "2"], "SLURM_JOB_NODELIST is not set"),
    (SALLOC, ["-H", "p9:2", "-n", "2"], "'p9' is not a node of this Slurm allocation"),
    (SALLOC, ["-n", "8", "--clients", "2", "--servers", "1"], "4 slots for 8 workers"),
])
def test_bad_slurm_input_exits_2_naming_the_cause(tmp_path, env, args, message):
    r = _dry_run(tmp_path, env, *args)
    assert r.returncode == 2 and message in r.stderr, r.stdout + r.stderr


@pytest.mark.parametrize("launcher,env,message", [
    ("slurm", SALLOC, "--launcher slurm needs srun on PATH"),
    ("ssh", {}, "--launcher ssh needs the ssh client"),
])
def test_a_missing_srun_or_ssh_is_named_before_anything_starts(launcher, env, message):
    full = {k: v for k, v in job_env().items() if not k.startswith("SLURM_")}
    full.update({**env, "PATH": "/nonexistent"})
    r = subprocess.run([sys.executable, "-m", "kvhybrid.launch.cli", "--launcher", launcher,
                        "-H", "node1:2", "-n", "2", sys.executable, "examples/train_mlp.py"],
                       capture_output=True, text=True, timeout=120, env=full, cwd=ROOT)
    assert r.returncode == 2 and message in r.stderr, r.stdout + r.stderr
    assert "started" not in r.stdout + r.stderr
