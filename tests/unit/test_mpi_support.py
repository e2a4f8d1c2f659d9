"""Which mpirun kvhybrid-launch accepts: read from ``mpirun --version``, refused before
anything starts when its command line is not the one the launcher writes.

The mpiruns here are scripts that print a version and nothing else: what is tested is the
reading of that text and the launcher's answer, not MPI (tests/mpi runs the real ones)."""
import os
import subprocess
import sys

import pytest

from kvhybrid.launch.mpirun import (MpiImplementation, MpiUnsupported, check_supported,
                                    find_mpirun, implementation)
from tests.support.jobs import ROOT, job_env

OPEN_MPI = "mpirun (Open MPI) {}\n\nReport bugs to http://www.open-mpi.org/community/help/\n"
HYDRA = "HYDRA build details:\n    Version:                                 {}\n    CC: cc\n"
INTEL = "Intel(R) MPI Library for Linux* OS, Version 2021.10 Build 20230619\n"


def fake_mpirun(folder, text: str) -> str:
    path = folder / "mpirun"
    path.write_text(f"#!/bin/sh\ncat <<'END'\n{text}END\n")
    path.chmod(0o755)
    return str(path)


@pytest.mark.parametrize("text,kind,version", [
    (OPEN_MPI.format("4.1.4"), "openmpi", (4, 1, 4)),
    (OPEN_MPI.format("4.1.6"), "openmpi", (4, 1, 6)),
    (HYDRA.format("4.0.2"), "mpich", (4, 0, 2)),
    (HYDRA.format("5.0.2"), "mpich", (5, 0, 2)),
])
def test_supported_mpiruns_are_read_and_accepted(tmp_path, text, kind, version):
    mpirun = fake_mpirun(tmp_path, text)
    mpi = implementation(mpirun)
    assert mpi == MpiImplementation(kind, version)
    check_supported(mpi, mpirun)     # no error


@pytest.mark.parametrize("text,message", [
    (OPEN_MPI.format("5.0.3"), "is Open MPI 5.0.3, and kvhybrid-launch writes mpirun lines "
                               "for Open MPI 4.x"),
    (OPEN_MPI.format("3.1.6"), "is Open MPI 3.1.6"),
    (HYDRA.format("3.3.2"), "is MPICH 3.3.2, and kvhybrid-launch needs"),
    (INTEL, "is not an mpirun kvhybrid-launch knows ('Intel(R) MPI Library"),
])
def test_other_mpiruns_are_refused_naming_what_is_supported(tmp_path, text, message):
    mpirun = fake_mpirun(tmp_path, text)
    with pytest.raises(MpiUnsupported) as err:
        check_supported(implementation(mpirun), mpirun)
    assert message in str(err.value)
    assert "(tested: 4.1.4)" in str(err.value) and "(tested: 5.0.2)" in str(err.value)


def test_the_launcher_refuses_open_mpi_5_before_starting_anything(tmp_path):
    fake_mpirun(tmp_path, OPEN_MPI.format("5.0.3"))
    env = job_env({"PATH": f"{tmp_path}{os.pathsep}{os.environ['PATH']}"})
    r = subprocess.run([sys.executable, "-m", "kvhybrid.launch.cli", "-n", "4", "--clients",
                        "2", "--servers", "2", "python", "examples/train_mlp.py"],
                       capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)
    assert r.returncode == 2, r.stdout + r.stderr
    errors = [line for line in r.stderr.splitlines() if "error" in line]
    assert len(errors) == 1 and "is Open MPI 5.0.3" in errors[0], r.stderr
    assert r.stdout == "" and "started" not in r.stderr


def test_this_machines_mpirun_is_supported():
    mpirun = find_mpirun()
    check_supported(implementation(mpirun), mpirun)
