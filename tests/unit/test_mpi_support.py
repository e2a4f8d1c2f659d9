"""Which mpirun kvhybrid-launch accepts: read from ``mpirun --version``, refused before
anything starts when its command line is not the one the launcher writes.

The mpiruns here are scripts that print a version and nothing else: what is tested is the
reading of that text and the launcher's answer, not MPI (tests/mpi runs the real ones)."""
import os
import subprocess
import sys

import pytest

from kvhybrid.launch.mpirun import (MpiImplementation, MpiUnsupported, check_supported,
                                    find_mpirun, implementation, runtime_setting)
from tests.support.jobs import ROOT, job_env

OPEN_MPI = "mpirun (Open MPI) {}\n\nReport bugs to http://www.open-mpi.org/community/help/\n"
HYDRA = "HYDRA build details:\n    Version:                                 {}\n    CC: cc\n"
INTEL = "Intel(R) MPI Library for Linux* OS, Version {} Build 20230619\n"
OTHER = "MVAPICH2 Version      :\t2.3.7\n"


def fake_mpirun(folder, text: str) -> str:
    path = folder / "mpirun"
    path.write_text(f"#!/bin/sh\ncat <<'END'\n{text}END\n")
    path.chmod(0o755)
    return str(path)


@pytest.mark.parametrize("text,kind,version", [
    (OPEN_MPI.format("4.1.4"), "openmpi", (4, 1, 4)),
    (OPEN_MPI.format("4.1.6"), "openmpi", (4, 1, 6)),
    (OPEN_MPI.format("5.0.11"), "openmpi", (5, 0, 11)),
    (HYDRA.format("4.0.2"), "mpich", (4, 0, 2)),
    (HYDRA.format("5.0.2"), "mpich", (5, 0, 2)),
    (INTEL.format("2021.10"), "intel", (2021, 10)),
    (INTEL.format("2021.19.0"), "intel", (2021, 19, 0)),
])
def test_supported_mpiruns_are_read_and_accepted(tmp_path, text, kind, version):
    mpirun = fake_mpirun(tmp_path, text)
    mpi = implementation(mpirun)
    assert mpi == MpiImplementation(kind, version)
    check_supported(mpi, mpirun)     # no error


@pytest.mark.parametrize("text,message", [
    (OPEN_MPI.format("6.0.0"), "is Open MPI 6.0.0, and kvhybrid-launch writes mpirun lines "
                               "for Open MPI 4.x (tested: 4.1.4) or 5.x"),
    (OPEN_MPI.format("3.1.6"), "is Open MPI 3.1.6"),
    (HYDRA.format("3.3.2"), "is MPICH 3.3.2, and kvhybrid-launch needs"),
    (INTEL.format("2019 Update 9"), "is Intel MPI 2019, and kvhybrid-launch needs"),
    (OTHER, "is not an mpirun kvhybrid-launch knows ('MVAPICH2 Version"),
])
def test_other_mpiruns_are_refused_naming_what_is_supported(tmp_path, text, message):
    mpirun = fake_mpirun(tmp_path, text)
    with pytest.raises(MpiUnsupported) as err:
        check_supported(implementation(mpirun), mpirun)
    assert message in str(err.value)
    assert "(tested: 4.1.4)" in str(err.value) and "(tested: 5.0.11)" in str(err.value) \
        and "(tested: 5.0.2)" in str(err.value)


def test_the_launcher_refuses_an_unknown_open_mpi_before_starting_anything(tmp_path):
    fake_mpirun(tmp_path, OPEN_MPI.format("3.1.6"))
    env = job_env({"PATH": f"{tmp_path}{os.pathsep}{os.environ['PATH']}"})
    r = subprocess.run([sys.executable, "-m", "kvhybrid.launch.cli", "-n", "4", "--clients",
                        "2", "--servers", "2", "python", "examples/train_mlp.py"],
                       capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)
    assert r.returncode == 2, r.stdout + r.stderr
    errors = [line for line in r.stderr.splitlines() if "error" in line]
    assert len(errors) == 1 and "is Open MPI 3.1.6" in errors[0], r.stderr
    assert r.stdout == "" and "started" not in r.stderr


@pytest.mark.parametrize("version,expected", [
    ((4, 1, 4), ["--mca", "orte_tmpdir_base", "/t"]),
    ((5, 0, 11), ["--prtemca", "prte_tmpdir_base", "/t"]),
])
def test_launcher_settings_are_written_as_that_open_mpi_names_them(version, expected):
    """Open MPI 5 ignores ORTE's names without a word: they must be PRRTE's, by --prtemca."""
    mpi = MpiImplementation("openmpi", version)
    assert runtime_setting(mpi, "orte_tmpdir_base", "/t") == expected
    agent = runtime_setting(mpi, "plm_rsh_agent", "/a")
    assert agent == (["--prtemca", "plm_ssh_agent", "/a"] if mpi.prrte
                     else ["--mca", "plm_rsh_agent", "/a"])


def test_this_machines_mpirun_is_supported():
    mpirun = find_mpirun()
    check_supported(implementation(mpirun), mpirun)


@pytest.mark.parametrize("env,spans", [
    ({"OMPI_COMM_WORLD_LOCAL_SIZE": "2", "OMPI_COMM_WORLD_SIZE": "4"}, True),
    ({"OMPI_COMM_WORLD_LOCAL_SIZE": "4", "OMPI_COMM_WORLD_SIZE": "4"}, False),
    ({"MPI_LOCALNRANKS": "3", "PMI_SIZE": "3"}, False),
    ({"MPI_LOCALNRANKS": "1", "PMI_SIZE": "3"}, True),
    ({"MV2_COMM_WORLD_LOCAL_SIZE": "2", "MV2_COMM_WORLD_SIZE": "2"}, False),
    ({}, True)])   # (a launcher that says nothing: assume other hosts)
def test_whether_the_job_spans_hosts_is_read_from_the_launchers_variables(monkeypatch, env,
                                                                           spans):
    from kvhybrid.tensor_collectives.mpi_env import job_spans_hosts
    for var in ("OMPI_COMM_WORLD_LOCAL_SIZE", "OMPI_COMM_WORLD_SIZE", "MPI_LOCALNRANKS",
                "PMI_SIZE", "MV2_COMM_WORLD_LOCAL_SIZE", "MV2_COMM_WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    assert job_spans_hosts() is spans
